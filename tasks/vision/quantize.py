"""quantize, the vision implementation: the prepared graph -> a QDQ graph for QNN HTP
(:func:`tasks.qnn.quantize_arrays.quantize_graph`), calibrated on the family's rendered input set
(:func:`tasks.vision.family.samples`) of the first ``calibration.samples`` lines of
``calibration.file``, in ``calibration.fonts`` at ``calibration.sizes``, preprocessed and read
as the export's ``io.json`` says (its ``preprocess`` and ``decode``: one description, which
enters this key through the export's output digest). The fonts' bytes and Pillow's version
enter the key (they draw the calibration images)."""

from __future__ import annotations

from pathlib import Path

from tasks.contract.common import copy_rest
from tasks.contract.params import CALIBRATION_FILE, CALIBRATION_SAMPLES, OVERRIDES, PER_CHANNEL, PRECISION
from tasks.contract.stage import Stage
from tasks.datafiles import read_lines
from tasks.vision.family import CAL_FONTS, CAL_SIZES, file_lines, io_of, key_files, samples


def feeds_for(model: Path, xs: list) -> list[dict]:
    """{the graph's one input name: x} for each array of ``xs``."""
    import onnx

    init = {i.name for i in onnx.load(str(model), load_external_data=False).graph.initializer}
    name = next(i.name for i in onnx.load(str(model), load_external_data=False).graph.input if i.name not in init)
    return [{name: x} for x in xs]


def run(inputs, files, params, out: Path) -> dict:
    """Quantize ``inputs["model"]/model.onnx`` into ``out/model.onnx``; the other files copied.
    Returns the quantizer's report and the calibration set's size."""
    from tasks.qnn.quantize_arrays import quantize_graph

    cal = params["calibration"]
    lines = read_lines(files["calibration"], cal["samples"])
    src = inputs["model"] / "model.onnx"
    io = io_of(inputs["model"])
    xs = [
        s["x"]
        for s in samples(
            io["decode"], lines, cal["fonts"], cal["sizes"], io["preprocess"], pool=file_lines(files["calibration"])
        )
    ]
    report = quantize_graph(src, out / "model.onnx", feeds_for(src, xs), params)
    copy_rest(inputs["model"], out)
    return {"graphs": {"model.onnx": report}, "calibration_samples": len(xs)}


def key_extra(params: dict) -> dict:
    return {"fonts": key_files(params["calibration"]["fonts"])}


STAGE = Stage(
    kind="quantize",
    module=__name__,
    version=1,
    tools=("onnxruntime", "onnx", "numpy", "pillow"),
    run=run,
    params=(PRECISION, PER_CHANNEL, OVERRIDES, CALIBRATION_SAMPLES, CAL_FONTS, CAL_SIZES),
    files={CALIBRATION_FILE: "calibration"},
    line_samples=("calibration",),
    key_extra=key_extra,
)

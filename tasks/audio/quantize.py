"""quantize, the audio implementation: the prepared graph -> a QDQ graph for QNN HTP
(:func:`tasks.qnn.quantize_arrays.quantize_graph`), calibrated on every call of the clips of the
first ``calibration.samples`` lines of ``calibration.file`` spoken by ``calibration.voices``
(:func:`tasks.audio.family.clip_set`), each call with the state the fp32 graph carried to it.
``quantize.overrides`` matching Conv weights make them per-channel (axis 0) at the bits given:
Silero VAD's encoder.1/.2 convs at 16 bits (the recipe)."""

from __future__ import annotations

from pathlib import Path

from tasks.audio.family import CAL_NOISE, CAL_SEED, CAL_VOICES, clip_set, first_state, io_of, key_material
from tasks.contract.common import copy_rest
from tasks.contract.params import CALIBRATION_FILE, CALIBRATION_SAMPLES, OVERRIDES, PER_CHANNEL, PRECISION
from tasks.contract.stage import Stage
from tasks.datafiles import read_lines


def calibration_feeds(model: Path, io: dict, clips: list[dict]) -> list[dict]:
    """Every call of every clip as fp32 ``model`` sees it: the frame and the recurrent state the
    previous call returned (the first: zeros)."""
    from tasks.qnn.run_arrays import cpu_sequences

    rec = io["stream"]["recurrent"]
    zero = first_state(io)
    seqs = [[{**c["seq"][0], **zero}, *c["seq"][1:]] for c in clips]
    feeds = []
    for seq, outs in zip(seqs, cpu_sequences(model, seqs, rec)):
        state = zero
        for f, o in zip(seq, outs):
            feeds.append({**f, **state})
            state = {i: o[name] for i, name in rec.items()}
    return feeds


def run(inputs, files, params, out: Path) -> dict:
    """Quantize ``inputs["model"]/model.onnx`` into ``out/model.onnx``; the other files copied."""
    from tasks.qnn.quantize_arrays import quantize_graph

    cal = params["calibration"]
    io = io_of(inputs["model"])
    clips = clip_set(
        read_lines(files["calibration"], cal["samples"]), cal["voices"], cal["seed"], cal["noise"], io["stream"]
    )
    src = inputs["model"] / "model.onnx"
    feeds = calibration_feeds(src, io, clips)
    report = quantize_graph(src, out / "model.onnx", feeds, params)
    copy_rest(inputs["model"], out)
    return {"graphs": {"model.onnx": report}, "calibration_clips": len(clips), "calibration_calls": len(feeds)}


def key_extra(params: dict) -> dict:
    return key_material()


STAGE = Stage(
    kind="quantize",
    module=__name__,
    version=1,
    tools=("onnxruntime", "onnx", "numpy"),
    run=run,
    params=(PRECISION, PER_CHANNEL, OVERRIDES, CALIBRATION_SAMPLES, CAL_VOICES, CAL_SEED, CAL_NOISE),
    files={CALIBRATION_FILE: "calibration"},
    line_samples=("calibration",),
    key_extra=key_extra,
)

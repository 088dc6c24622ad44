"""export, the vision implementation: the source's ONNX graph made static and quantizable
(:func:`tasks.qnn.prepare.prepare`: metadata kept aside, dims from ``export.preprocess``,
output shapes fixed, opset raised), written as ``model.onnx``; beside it ``metadata.json`` (the
graph's ``metadata_props``, when it had any: PP-OCR rec's character list, which decoding needs)
and ``io.json`` (inputs, outputs, preprocessing and decoding: what a caller feeds and reads;
shipped, and quoted by the model card)."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.contract.stage import Stage
from tasks.qnn.graphs import list_graphs
from tasks.vision.family import DECODE, PREPROCESS, preflight

#: what each ``export.decode`` means, for io.json and the card
DECODING = {
    "ctc": "text: per time step the argmax over ['blank'] + metadata.json's character list (one per line) + [' '], "
    "repeats collapsed, blanks dropped",
    "db": "text boxes: the probability map > 0.3, dilated 2x2, connected regions with mean probability >= 0.5, "
    "each box grown by area x 1.6 / perimeter (DB unclip)",
    "cls": "orientation: argmax over ['0', '180'] (degrees the line is turned)",
}


def write_io(out: Path, io: dict, extra: dict) -> None:
    """``out/io.json``: the graph's inputs and outputs and ``extra`` (sorted keys, the same bytes
    for the same description)."""
    (out / "io.json").write_text(json.dumps({**io, **extra}, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def source_graph(src: Path) -> Path:
    """The one ONNX graph of a download entry. Raises ValueError when there is not exactly one."""
    graphs = list_graphs(src)
    if len(graphs) != 1:
        raise ValueError(
            f"expected one ONNX graph in the source ({src}), found {len(graphs)}: a vision or audio "
            "recipe's source names one file (source: {package, file} or {path: x.onnx})"
        )
    return graphs[0]


def run(inputs, files, params, out: Path) -> dict:
    """Prepare the source's graph into ``out``: its one image input set to [1, 3, H, W] from
    ``export.preprocess.size``. Returns :func:`tasks.qnn.prepare.prepare`'s report (metadata
    values replaced by their lengths). Raises PrepareError when the graph and the recipe
    disagree (an input that is not [N, 3, H, W], more than one input)."""
    import onnx

    from tasks.qnn import prepare as P

    src = source_graph(inputs["source"])
    io = P.graph_io(onnx.load(str(src), load_external_data=False))
    if len(io["inputs"]) != 1 or len(io["inputs"][0]["shape"]) != 4:
        raise P.PrepareError(f"expected one image input [N, 3, H, W] in {src.name}, found {io['inputs']}")
    pre = params["preprocess"]  # a whole value (tasks.vision.schema.Preprocess)
    H, W = pre["size"]
    rep = P.prepare(src, out / "model.onnx", {io["inputs"][0]["name"]: [1, 3, H, W]}, {})
    if rep["metadata"]:
        (out / "metadata.json").write_text(
            json.dumps(rep["metadata"], indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    write_io(
        out,
        rep["io"],
        {
            "preprocess": params["preprocess"],
            "decode": params["decode"],
            "decoding": DECODING[params["decode"]],
            "metadata": sorted(rep["metadata"]),
            "source": src.name,
        },
    )
    return {**rep, "metadata": {k: len(v) for k, v in rep["metadata"].items()}}


STAGE = Stage(
    kind="export",
    module=__name__,
    version=1,
    tools=("onnx", "onnxruntime"),
    run=run,
    params=(PREPROCESS, DECODE),
    artifacts=("io.json", "metadata.json"),
    preflight=preflight,
)

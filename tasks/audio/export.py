"""export, the audio implementation: the source's ONNX graph made static and quantizable
(:func:`tasks.qnn.prepare.prepare`: ``export.constant_inputs`` folded, an ``If`` on them or on
shapes inlined, ``export.input_shapes`` set, output shapes fixed, opset raised), written as
``model.onnx``, with ``io.json`` beside it (inputs, outputs and ``export.stream``: what a caller
feeds per frame, which state it carries; shipped and quoted by the model card). The recurrent
state stays a plain float input and output: HTP runs it so."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.contract.stage import Param, Stage
from tasks.qnn.graphs import list_graphs
from tasks.audio.family import preflight

INPUT_SHAPES = Param(
    "export",
    "input_shapes",
    dict[str, list[int]],
    {},
    "audio: the dims of graph inputs that are dynamic in the source, {input: [dims]}",
)
CONSTANT_INPUTS = Param(
    "export",
    "constant_inputs",
    dict[str, int | float],
    {},
    "audio: graph inputs fixed to a value and folded, {input: value} (Silero's sr: 16000)",
)
STREAM = Param(
    "export",
    "stream",
    "tasks.audio.schema:OPTIONAL_STREAM",
    None,
    "audio: how the graph is called per frame (rate, frame, context, input, output, recurrent state)",
)


def run(inputs, files, params, out: Path) -> dict:
    """Prepare the source's one graph into ``out``. Returns :func:`tasks.qnn.prepare.prepare`'s
    report. Raises PrepareError (the recipe names inputs the graph lacks, dims stay dynamic,
    the stream's input, output or state is not in the graph)."""
    from tasks.qnn import prepare as P

    graphs = list_graphs(inputs["source"])
    if len(graphs) != 1:
        raise P.PrepareError(f"expected one ONNX graph in the source, found {len(graphs)}")
    rep = P.prepare(graphs[0], out / "model.onnx", params["input_shapes"], params["constant_inputs"])
    st, io = params["stream"], rep["io"]
    ins, outs = {i["name"]: i for i in io["inputs"]}, {o["name"] for o in io["outputs"]}
    bad = [n for n in (st["input"], *st["recurrent"]) if n not in ins] + [
        n for n in (st["output"], *st["recurrent"].values()) if n not in outs
    ]
    if bad:
        raise P.PrepareError(
            f"export.stream: expected inputs {sorted(ins)} and outputs {sorted(outs)} of the graph, found {bad}"
        )
    if ins[st["input"]]["shape"] != [1, st["context"] + st["frame"]]:
        raise P.PrepareError(
            f"export.stream: expected input {st['input']} of [1, context + frame] = "
            f"[1, {st['context'] + st['frame']}], found {ins[st['input']]['shape']}"
        )
    (out / "io.json").write_text(
        json.dumps(
            {
                **io,
                "stream": st,
                "decode": "vad",
                "source": graphs[0].name,
                "decoding": f"{st['output']} > 0.5: the frame holds speech",
            },
            indent=2,
            sort_keys=True,
        )
        + "\n",
        encoding="utf-8",
    )
    return rep


STAGE = Stage(
    kind="export",
    module=__name__,
    version=1,
    tools=("onnx", "onnxruntime"),
    run=run,
    params=(INPUT_SHAPES, CONSTANT_INPUTS, STREAM),
    artifacts=("io.json",),
    preflight=preflight,
)

"""export: HF model folder -> fp32 ONNX graph(s) with static shapes.

The encoder implementation (LLMs: ``tasks/llm/export.py``): optimum's ``main_export``
(``optimum.exporters.onnx``) with ``no_dynamic_axes=True`` and the recipe's ``batch_size`` x
``sequence_length`` as the dummy shapes, so every dim is fixed (QNN HTP has no dynamic shapes:
onnxruntime QNN EP docs). Output ``model.onnx`` plus the tokenizer and config files.

Graph inputs that are int64 become int32 (the ``int64-to-int32`` patch; QNN HTP has no
int64). Weights above 2 GB go to external data (protobuf's 2 GB limit).
"""

from __future__ import annotations

from pathlib import Path

from tasks import patches, progress
from tasks.proc import lazy
from tasks.qnn.graphs import load_model, save_model
from tasks.contract.common import EXPORT_ARTIFACTS, copy_tokenizer
from tasks.contract.stage import Param, Stage
from tasks.contract.params import SEQUENCE_LENGTH

onnx = lazy.module("onnx")


def _one_sequence(v, earlier):
    if v != 1:
        raise ValueError(
            f"expected 1 (quantize and verify feed one sequence per call: "
            f"tasks/encoder/inputs.py encoder_feeds; the LLM graphs are batch 1), found {v}"
        )
    return v


TASK = Param("export", "task", str | None, None, "optimum task; inferred when absent")
OPSET = Param("export", "opset", int, 17, "ONNX opset of the exported graph", limits={"ge": 13, "le": 23})
BATCH_SIZE = Param(
    "export", "batch_size", int, 1, "sequences per call; 1 (the one value the stages feed)", check=_one_sequence
)


def key_extra(params: dict) -> dict:
    return {"int64-to-int32": patches.get("int64-to-int32").version}


def _export_encoder(src: Path, params: dict, out: Path) -> dict:
    import tempfile

    from optimum.exporters.onnx import main_export

    with tempfile.TemporaryDirectory(dir=out.parent) as tmp, progress.bar(what="graphs", total=1, unit="graph") as bar:
        main_export(
            str(src),
            tmp,
            task=params.get("task") or "auto",
            opset=params["opset"],
            no_dynamic_axes=True,
            do_validation=False,
            library_name="transformers",
            local_files_only=True,
            batch_size=params["batch_size"],
            sequence_length=params["sequence_length"],
        )
        model = load_model(Path(tmp) / "model.onnx")
        bar.update()
    res = patches.get("int64-to-int32").fn(model)  # in memory: one save of the graph
    save_model(res.model, out / "model.onnx")
    return {"int64-to-int32": res.note, "graphs": {"model": _io(res.model)}}


def _io(model) -> dict:
    def desc(vi):
        t = vi.type.tensor_type
        return {
            "name": vi.name,
            "dtype": onnx.TensorProto.DataType.Name(t.elem_type).lower(),
            "shape": [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim],
        }

    return {"inputs": [desc(i) for i in model.graph.input], "outputs": [desc(o) for o in model.graph.output]}


def config_shape_problem(src: Path) -> str:
    """ "" when every tensor of the checkpoint in ``src`` that transformers' ``AutoModel`` for its
    ``config.json`` makes (its parameters, built on the ``meta`` device: names and shapes, no
    memory) has the shape the config implies, else the one line of
    :func:`tasks.sources.facts.shape_problem` naming the first that differs. A name may be
    stored under the model's ``base_model_prefix`` (``bert.``); an absent tensor passes
    (transformers initializes it, e.g. a pooler a sentence model never trained). Before this
    check a tensor of another shape was a 40-line RuntimeError traceback out of
    ``load_state_dict`` (issue 51 case 2)."""
    import torch
    from transformers import AutoConfig, AutoModel

    from tasks.sources.facts import shape_problem

    config = AutoConfig.from_pretrained(str(src), local_files_only=True)
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    return shape_problem(
        src,
        [(n, tuple(t.shape)) for n, t in model.named_parameters()],
        type(model).__name__,
        prefix=model.base_model_prefix,
        require=False,
    )


def run(inputs, files, params, out: Path) -> dict:
    """Export the model in ``inputs["source"]`` into ``out``. Returns the graphs' inputs and
    outputs (names, dtypes, shapes). Raises SourceError for NaN/Inf weights, a tensor of another
    shape than the config implies (:func:`config_shape_problem`) or a tokenizer larger than the
    embedding (``tasks.sources.facts``), whatever optimum raises for an unsupported model."""
    from tasks.sources import SourceError
    from tasks.sources.facts import check_finite_weights, check_vocabulary

    src = inputs["source"]
    check_finite_weights(src)
    if bad := config_shape_problem(src):
        raise SourceError(bad)
    check_vocabulary(src)
    info = _export_encoder(src, params, out)
    copy_tokenizer(src, out)
    return info


STAGE = Stage(
    kind="export",
    module=__name__,
    version=1,
    tools=("torch", "transformers", "optimum", "optimum-onnx", "onnx"),
    run=run,
    params=(TASK, OPSET, BATCH_SIZE, SEQUENCE_LENGTH),
    key_extra=key_extra,
    code_deps=("tasks.patches.int64_to_int32",),  # found by name through the patch registry
    artifacts=EXPORT_ARTIFACTS,
)

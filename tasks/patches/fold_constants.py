"""Patch ``fold-constants``: constant folding and simplification with onnxruntime's basic
graph optimizations."""

from __future__ import annotations

import os
import tempfile

import onnx

from . import PatchResult, register

_TWO_GB = 2**31
_LARGE = 1_500_000_000  # serialize through external data above this many bytes of tensors


def _tensor_bytes(model: onnx.ModelProto) -> int:
    n = 0
    for t in model.graph.initializer:
        n += len(t.raw_data) if t.HasField("raw_data") else t.ByteSize()
    for node in model.graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                n += a.t.ByteSize()
    return n


def _signature(model: onnx.ModelProto) -> bytes:
    """What counts as "the graph" when deciding whether anything changed: nodes (op, domain,
    inputs, outputs, attributes), initializers and graph inputs/outputs, ignoring node names,
    doc strings, value_info and producer fields that ORT rewrites on save."""
    g = onnx.GraphProto()
    for n in model.graph.node:
        c = g.node.add()
        c.CopyFrom(n)
        c.name = ""
        c.doc_string = ""
    g.initializer.extend(sorted(model.graph.initializer, key=lambda t: t.name))
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    return g.SerializeToString(deterministic=True)


@register("fold-constants", 1)
def fold_constants(model: onnx.ModelProto, level: str = "basic",
                   external_min_bytes: int = 1024) -> PatchResult:
    """Fold constants and simplify with onnxruntime's *basic* graph optimizations.

    Matches: any model. onnxruntime (``SessionOptions.graph_optimization_level =
    ORT_ENABLE_BASIC``, ``optimized_model_filepath``, CPU EP, no provider-specific fusions)
    folds constant subgraphs (Shape of fixed dims, Cast/Unsqueeze/... of constants), removes
    Identity/Dropout/redundant nodes, eliminates common subexpressions and applies the
    semantics-preserving, EP-independent fusions of that level. The result is read back into
    memory with all tensor data inline.

    Params:
      level: "basic" only (the higher levels write EP-specific ops; rejected).
      external_min_bytes: int, default 1024 (bytes): for models whose tensors exceed ~1.5 GB
        the model is written to and read back from external data, and tensors of at least
        this size go to the external file.

    Models > 2 GB: handled through external data in a temporary directory (input via
    ``onnx.save_model(save_as_external_data=True)``, output via the session config
    ``session.optimized_model_external_initializers_file_name``). The returned ModelProto then
    holds > 2 GB of tensors in memory: it cannot be serialized with ``SerializeToString``;
    save it with ``onnx.save_model(..., save_as_external_data=True)``. Memory use is about
    3x the model size during the call.

    Deterministic: the same input gives the same bytes (checked in tests/test_patches.py).
    Not applicable (changed=False, input returned untouched): ORT's output has the same nodes,
    attributes, initializers and graph inputs/outputs as the input (node names, value_info and
    producer fields ignored).
    Errors: ValueError for level != "basic"; onnxruntime's exceptions (InvalidGraph,
    NotImplemented for an op the CPU EP lacks, e.g. an ``EPContext`` or unknown contrib op).

    Source: onnxruntime docs, "Graph Optimizations in ONNX Runtime"
    (onnxruntime.ai/docs/performance/model-optimizations/graph-optimizations.html: basic
    optimizations are semantics-preserving and EP-independent; online/offline mode with
    optimized_model_filepath); NOTES-qnn.md (pipelines that compiled used "ORT basic
    optimizations" before QDQ).
    """
    if level != "basic":
        raise ValueError(f"level must be 'basic', got {level!r}")
    import onnxruntime as ort

    large = _tensor_bytes(model) >= _LARGE
    with tempfile.TemporaryDirectory(prefix="fold-constants-") as tmp:
        src = os.path.join(tmp, "in.onnx")
        dst = os.path.join(tmp, "out.onnx")
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = dst
        so.log_severity_level = 3
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        if large:
            onnx.save_model(model, src, save_as_external_data=True, all_tensors_to_one_file=True,
                            location="in.onnx.data", size_threshold=external_min_bytes)
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", "out.onnx.data")
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes",
                str(external_min_bytes))
            ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
        else:
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        out = onnx.load_model(dst, load_external_data=True)
    if _signature(out) == _signature(model):
        return PatchResult(model, changed=False, note="onnxruntime basic optimizations changed nothing")
    # keep the caller's metadata that ORT does not carry over
    if not out.metadata_props and model.metadata_props:
        out.metadata_props.extend(model.metadata_props)
    nb, na = len(model.graph.node), len(out.graph.node)
    return PatchResult(out, changed=True,
                       note=f"onnxruntime basic optimizations: {nb} -> {na} nodes, "
                            f"{len(model.graph.initializer)} -> {len(out.graph.initializer)} initializers",
                       counts={"nodes_before": nb, "nodes_after": na})

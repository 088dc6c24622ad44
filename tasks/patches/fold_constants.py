"""Patch ``fold-constants``: constant folding and simplification with onnxruntime's basic
graph optimizations."""

from __future__ import annotations

import os
import tempfile

from tasks.proc import lazy
from tasks.patches import PatchResult, register

onnx = lazy.module("onnx")

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


def _save_external(model: onnx.ModelProto, path: str, location: str, min_bytes: int) -> None:
    """Save a copy of ``model`` with its big non-index initializers in ``location``; int32/int64
    tensors stay inline (onnxruntime's shape inference reads shape/axes inputs from raw data).
    The caller's model is not modified (a copy is made: peak memory ~2x the model here)."""
    from onnx import external_data_helper, numpy_helper

    work = onnx.ModelProto()
    work.CopyFrom(model)
    for t in work.graph.initializer:
        if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            continue
        if not t.HasField("raw_data"):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t), t.name))
        if len(t.raw_data) >= min_bytes:
            external_data_helper.set_external_data(t, location)
    onnx.save_model(work, path)


def _ort_basic(model: onnx.ModelProto, large: bool, external_min_bytes: int) -> onnx.ModelProto:
    """One pass of onnxruntime's basic optimizations; returns a new in-memory model."""
    import onnxruntime as ort

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
            _save_external(model, src, "in.onnx.data", external_min_bytes)
            so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "out.onnx.data")
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes", str(external_min_bytes)
            )
            ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
        else:
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        out = onnx.load_model(dst, load_external_data=True)
    # tensors read back from external data carry explicit data_location/doc_string fields:
    # clear them so the bytes equal those of the inline route
    for t in out.graph.initializer:
        if t.HasField("data_location") and t.data_location == onnx.TensorProto.DEFAULT:
            t.ClearField("data_location")
        if t.HasField("doc_string") and not t.doc_string:
            t.ClearField("doc_string")
    return out


def _signature(model: onnx.ModelProto) -> bytes:
    """What counts as "the graph" when deciding whether anything changed: nodes (op, domain,
    inputs, outputs, attributes), initializers (name, type, dims, data) and graph
    inputs/outputs, ignoring node names, doc strings, value_info and producer fields that ORT
    rewrites on save. 16 bytes: the xxh3-128 of those, each part length-prefixed (hashing the
    tensor data in place is ~10x cheaper than serializing a copy of the graph: MiniLM, 90 MB)."""
    import struct

    import xxhash

    h = xxhash.xxh3_128()

    def part(b: bytes) -> None:
        h.update(struct.pack("<Q", len(b)))
        h.update(b)

    g = onnx.GraphProto()
    for n in model.graph.node:
        c = g.node.add()
        c.CopyFrom(n)
        c.name = ""
        c.doc_string = ""
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    part(g.SerializeToString(deterministic=True))
    for t in sorted(model.graph.initializer, key=lambda t: t.name):
        part(t.name.encode())
        part(struct.pack(f"<i{len(t.dims)}q", t.data_type, *t.dims))
        part(t.raw_data if t.HasField("raw_data") else t.SerializeToString(deterministic=True))
    return h.digest()


@register("fold-constants", 1)
def fold_constants(
    model: onnx.ModelProto, level: str = "basic", external_min_bytes: int = 1024, max_passes: int = 4
) -> PatchResult:
    """Fold constants and simplify with onnxruntime's *basic* graph optimizations.

    Matches: any model. onnxruntime (``SessionOptions.graph_optimization_level =
    ORT_ENABLE_BASIC``, ``optimized_model_filepath``, CPU EP, no provider-specific fusions)
    folds constant subgraphs (Shape of fixed dims, Cast/Unsqueeze/... of constants), removes
    Identity/Dropout/redundant nodes, eliminates common subexpressions and applies the
    semantics-preserving, EP-independent fusions of that level. The result is read back into
    memory with all tensor data inline.

    Params:
      level: "basic" only (the higher levels write EP-specific ops; rejected).
      max_passes: int, default 4: ORT is run again on its own output until the graph stops
        changing (one pass can leave work for the next: e.g. on all-MiniLM-L6-v2 the second
        pass merges the 36 duplicate shape constants the first pass created; the third pass
        is a no-op), at most this many times.
      external_min_bytes: int, default 1024 (bytes): for models whose tensors exceed ~1.5 GB
        the model is written to and read back from external data, and tensors of at least
        this size go to the external file (int32/int64 tensors always stay inline).

    Models > 2 GB: handled through external data in a temporary directory (input: a copy
    with big initializers marked external, written by ``onnx.save_model``, output via the session config
    ``session.optimized_model_external_initializers_file_name``). The returned ModelProto then
    holds > 2 GB of tensors in memory: it cannot be serialized with ``SerializeToString``;
    save it with ``onnx.save_model(..., save_as_external_data=True)``. Peak memory is about
    3x the model size during the call (input, a copy being written, the output read back).

    Deterministic: the same input gives the same bytes (checked in tests/test_patches.py).
    Not applicable (changed=False, input returned untouched): ORT's output has the same nodes,
    attributes, initializers and graph inputs/outputs as the input (node names, value_info and
    producer fields ignored).
    Errors: ValueError for level != "basic" or max_passes < 1; onnxruntime's exceptions (InvalidGraph,
    NotImplemented for an op the CPU EP lacks, e.g. an ``EPContext`` or unknown contrib op).

    Source: onnxruntime docs, "Graph Optimizations in ONNX Runtime"
    (onnxruntime.ai/docs/performance/model-optimizations/graph-optimizations.html: basic
    optimizations are semantics-preserving and EP-independent; online/offline mode with
    optimized_model_filepath); the pipelines that compiled on QNN HTP here ran onnxruntime's
    basic optimizations before QDQ.
    """
    if level != "basic":
        raise ValueError(f"level must be 'basic', got {level!r}")
    if max_passes < 1:
        raise ValueError(f"max_passes must be >= 1, got {max_passes}")

    large = _tensor_bytes(model) >= _LARGE
    cur, sig, passes = model, _signature(model), 0
    for passes in range(1, max_passes + 1):  # noqa: B007 (read after the loop: the passes made)
        nxt = _ort_basic(cur, large, external_min_bytes)
        nsig = _signature(nxt)
        if nsig == sig:
            break
        cur, sig = nxt, nsig
    out = cur
    if out is model:
        return PatchResult(model, changed=False, note="onnxruntime basic optimizations changed nothing")
    # keep the caller's metadata that ORT does not carry over
    if not out.metadata_props and model.metadata_props:
        out.metadata_props.extend(model.metadata_props)
    nb, na = len(model.graph.node), len(out.graph.node)
    return PatchResult(
        out,
        changed=True,
        note=f"onnxruntime basic optimizations ({passes} pass(es)): {nb} -> {na} nodes, "
        f"{len(model.graph.initializer)} -> {len(out.graph.initializer)} initializers",
        counts={"nodes_before": nb, "nodes_after": na},
    )

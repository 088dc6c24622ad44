"""A CPU session that runs an LLM part's QDQ graph (verify's ``cpu-qdq`` side) fast: its
int4 weight MatMuls fused into onnxruntime's ``MatMulNBits`` with pre-packed weights, computed
in fp32.

An LPBQ weight (:func:`tasks.qnn.weights.reencode`) is ``DequantizeLinear(codes int4 [K, N],
scale, axis 0, block_size)`` whose per-block ``scale`` is itself computed by a
``DequantizeLinear`` of the 8-bit block scales (``<w>_block_scales``: ``(bint - zp) * pc``). A
computed scale is not a constant, so onnxruntime does not fuse the pair into ``MatMulNBits``
and every call dequantizes the whole weight to fp32 first: a Qwen2.5-7B part's decode call took
3.4-5.4 s on the 2-core CI machine, and the 7B's verify spent ~22 of its 27 minutes there
(benchmarks/README.md). This module folds each block-scale ``DequantizeLinear`` into a float32
initializer, computed as the operator does (``(bint - zero_point) * pc``: an exact small
integer times a float32, one rounding, the same bits: ONNX ``DequantizeLinear``), so the
weight's ``DequantizeLinear`` has constant inputs and onnxruntime fuses it with its MatMul; with
pre-packing on and accuracy level 1 (:data:`tasks.qnn.precisions.QDQ_MATMUL_FP32`: fp32 compute)
the same decode call takes 0.2 s. The weights' values are the graph's to the bit; the sums
run in another order (MLAS's blocked int4 kernel), so outputs differ from the unfused graph by
fp32 rounding (tests/llm/test_qdq_session.py bounds it on the trained tiny models).

Memory: pre-packing keeps a second, packed copy of the int4 weights (about the codes' size).
"""

from __future__ import annotations

from pathlib import Path

from tasks.qnn.precisions import QDQ_MATMUL_FP32

#: suffix of the node :func:`tasks.qnn.weights.reencode` names for an LPBQ weight's block scales
BLOCK_SCALES = "_block_scales"


def fold_block_scales(model, folder) -> int:
    """Replace every LPBQ block-scale ``DequantizeLinear`` of ``model`` (an onnx ModelProto,
    in place; external data read from ``folder``) by a float32 initializer of its output,
    ``(x - zero_point) * scale`` computed with the operator's per-axis broadcasting; the
    inputs no other node reads are removed. Returns how many were folded. Raises ValueError for
    a block-scale node whose inputs are not initializers."""
    import numpy as np
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.name.endswith(BLOCK_SCALES)]
    for n in nodes:
        missing = [i for i in n.input if i and i not in inits]
        if missing:
            raise ValueError(f"{n.name}: expected initializers as inputs, found computed {missing}")
        x = numpy_helper.to_array(inits[n.input[0]], base_dir=str(folder)).astype(np.int64)
        s = numpy_helper.to_array(inits[n.input[1]], base_dir=str(folder)).astype(np.float32)
        z = (
            numpy_helper.to_array(inits[n.input[2]], base_dir=str(folder)).astype(np.int64)
            if len(n.input) > 2 and n.input[2]
            else np.zeros_like(s, dtype=np.int64)
        )
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1) % x.ndim
        if s.ndim == 1 and x.ndim > 1:  # per-axis: scale and zero point along ``axis``
            shape = [1] * x.ndim
            shape[axis] = -1
            s, z = s.reshape(shape), z.reshape(shape)
        folded = ((x - z).astype(np.float32) * s).astype(np.float32)
        model.graph.initializer.append(numpy_helper.from_array(folded, n.output[0]))
        model.graph.node.remove(n)
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    for n in nodes:
        for name in n.input:
            if name in inits and name not in used:
                model.graph.initializer.remove(inits.pop(name))
    return len(nodes)


def qdq_session(model, optimized_to=None):
    """A CPU ``onnxruntime.InferenceSession`` on the QDQ graph at path ``model`` with its LPBQ
    block scales folded (:func:`fold_block_scales`), its weight MatMuls fused into
    ``MatMulNBits`` with pre-packing on and fp32 compute (module docstring). The graph is read
    and changed in memory; external data stays in ``model``'s folder (nothing is written but
    ``optimized_to``, when given: the graph as onnxruntime runs it, to see the fusions).
    Raises onnxruntime's errors, ValueError from :func:`fold_block_scales`."""
    import onnx
    import onnxruntime as ort

    path = Path(model)
    m = onnx.load(str(path), load_external_data=False)
    fold_block_scales(m, path.parent)
    so = ort.SessionOptions()
    for k, v in {**QDQ_MATMUL_FP32, "session.model_external_initializers_file_folder_path": str(path.parent)}.items():
        so.add_session_config_entry(k, v)
    if optimized_to is not None:
        so.optimized_model_filepath = str(optimized_to)
    # not sessions.cpu_session_on: here the proto goes before the session is made (a 7B part's
    # graph holds ~1 GB inline, that much less at the peak) and pre-packing stays on
    data = m.SerializeToString()
    del m
    return ort.InferenceSession(data, sess_options=so, providers=["CPUExecutionProvider"])

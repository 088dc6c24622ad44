"""tasks/llm/qdq_session.py: verify's cpu-qdq sessions with the LPBQ block scales folded, the
int4 MatMuls fused and pre-packed in fp32."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tasks.qnn import weights
from tasks.llm.qdq_session import fold_block_scales, qdq_session
from tasks.llm.sessions import cpu_session


def _lpbq_matmul(K: int, N: int, block: int, seed: int = 0):
    """(model, W): y = x [1, M, K] @ DQ(w) with w an LPBQ int4 weight of ``block`` rows
    (:func:`tasks.qnn.weights.encode_int4`), named as onnxruntime's quantizer names weights."""
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal((K, N)) * np.exp(rng.standard_normal((K, 1)))).astype(np.float32) * 0.05
    s = (np.abs(W).max(0) / 7.5).astype(np.float32)
    inits = [
        helper.make_tensor(
            "w_quantized", TensorProto.INT4, [K, N], np.clip(np.round(W / s), -8, 7).astype(int).ravel().tolist()
        ),
        numpy_helper.from_array(s, "w_scale"),
        helper.make_tensor("w_zero_point", TensorProto.INT4, [N], [0] * N),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["w_quantized", "w_scale", "w_zero_point"], ["wd"], axis=1),
        helper.make_node("MatMul", ["x", "wd"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "M", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "M", N])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    weights.encode_int4(m, "w", W, block)
    return m


def test_folded_block_scales_are_the_bits_the_operator_computes(tmp_path):
    m = _lpbq_matmul(256, 96, 32)
    onnx.save(m, tmp_path / "q.onnx")
    # what onnxruntime's DequantizeLinear computes for the block scales, nothing fused
    probe = onnx.load(tmp_path / "q.onnx")
    probe.graph.output.append(helper.make_tensor_value_info("w_scale", TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = np.ones((1, 1, 256), np.float32)
    want = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        ["w_scale"], {"x": x}
    )[0]
    assert fold_block_scales(m, tmp_path) == 1
    got = numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == "w_scale"))
    assert (
        got.dtype == np.float32 and got.shape == (8, 96) and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    )
    names = {i.name for i in m.graph.initializer}
    assert not names & {"w_bint", "w_pc", "w_pc_zero_point"} and not any(
        n.op_type == "DequantizeLinear" and n.name.endswith("_block_scales") for n in m.graph.node
    )


@pytest.mark.parametrize("M", [1, 128])
def test_the_session_fuses_the_int4_matmul_and_computes_the_graph_in_fp32(tmp_path, M):
    """decode (1 row) and prefill (128 rows): onnxruntime runs ``MatMulNBits`` where the graph
    as written dequantizes the weight every call, and the output is the as-written graph's to
    fp32 rounding (measured: 1e-6 relative)."""
    onnx.save(_lpbq_matmul(1024, 512, 128), tmp_path / "q.onnx")
    s = qdq_session(tmp_path / "q.onnx", optimized_to=tmp_path / "opt.onnx")
    ops = [n.op_type for n in onnx.load(tmp_path / "opt.onnx").graph.node]
    assert ops == ["MatMulNBits"], ops
    x = np.random.default_rng(1).standard_normal((1, M, 1024)).astype(np.float32)
    got = s.run(None, {"x": x})[0]
    want = cpu_session(tmp_path / "q.onnx").run(None, {"x": x})[0]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), np.abs(got - want).max() / np.abs(want).max()


def test_a_block_scale_node_fed_by_a_computed_tensor_is_refused(tmp_path):
    m = _lpbq_matmul(64, 32, 32)
    dq = next(n for n in m.graph.node if n.name.endswith("_block_scales"))
    m.graph.node.insert(0, helper.make_node("Identity", ["w_pc"], ["pc_copy"]))
    dq.input[1] = "pc_copy"
    with pytest.raises(
        ValueError, match=r"w_block_scales: expected initializers as inputs, found computed \['pc_copy'\]"
    ):
        fold_block_scales(m, tmp_path)

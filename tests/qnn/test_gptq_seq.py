"""Sequential GPTQ (issue 35): each layer's Hessian from the outputs of the layers before it
already quantized, one layer's Hessians at a time, float32 arithmetic that gives float64's
codes, byte-identical re-encodes, and the quantize stage's memory check counting its peak."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tasks import gptq, weights

K0, K1, N1, M = 64, 96, 32, 24  # x [1, M, K0] -> layer 0 [K0, K1] -> Relu -> layer 1 [K1, N1]


def _two_layers(W0, W1, qdq: bool):
    """The fp32 graph (``qdq`` False) or a QDQ graph as onnxruntime's quantizer names its int4
    per-channel weights (``<w>_quantized`` / ``_scale`` / ``_zero_point``) of x -> MatMul
    (model.layers.0.w) -> Relu -> MatMul (model.layers.1.w)."""
    inits, nodes, names = [], [], []
    for i, W in enumerate((W0, W1)):
        w = f"model.layers.{i}.w"
        if qdq:
            s = (np.abs(W).max(0) / 7.5).astype(np.float32)
            q = np.clip(np.round(W / s), -8, 7).astype(np.int8)
            inits += [weights.int4_tensor(w + "_quantized", q), numpy_helper.from_array(s, w + "_scale"),
                      weights.int4_tensor(w + "_zero_point", np.zeros(W.shape[1], np.int8))]
            nodes.append(helper.make_node("DequantizeLinear", [w + "_quantized", w + "_scale", w + "_zero_point"],
                                          [w + "_dq"], axis=1))
            names.append(w + "_dq")
        else:
            inits.append(numpy_helper.from_array(W, w))
            names.append(w)
    nodes += [helper.make_node("MatMul", ["x", names[0]], ["h"], name="/model/layers.0/MatMul"),
              helper.make_node("Relu", ["h"], ["r"], name="/model/layers.0/Relu"),
              helper.make_node("MatMul", ["r", names[1]], ["y"], name="/model/layers.1/MatMul")]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, M, K0])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, M, N1])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _case():
    rng = np.random.default_rng(0)
    mix = rng.standard_normal((K0, K0)) / np.sqrt(K0) + np.eye(K0)
    feeds = [{"x": (rng.standard_normal((1, M, K0)) @ mix).astype(np.float32)} for _ in range(6)]
    W0 = (rng.standard_normal((K0, K1)) * 0.1).astype(np.float32)
    W1 = (rng.standard_normal((K1, N1)) * 0.1).astype(np.float32)
    return feeds, W0, W1


def _reencoded(tmp_path, sub: str, feeds, W0, W1):
    d = tmp_path / sub
    d.mkdir()
    onnx.save(_two_layers(W0, W1, False), str(d / "fp.onnx"))
    onnx.save(_two_layers(W0, W1, True), str(d / "q.onnx"))
    info = weights.reencode(d / "fp.onnx", d / "q.onnx", feeds, 32, "gptq", False)
    assert info["int4_weights"] == 2
    return d / "q.onnx"


def _codes(model, w: str) -> np.ndarray:
    t = next(i for i in model.graph.initializer if i.name == w + "_quantized")
    u = np.frombuffer(t.raw_data, np.uint8)
    lo, hi = (u & 0x0F).astype(np.int8), (u >> 4).astype(np.int8)
    c = np.stack([lo, hi], 1).ravel()[: int(np.prod(t.dims))]
    return np.where(c > 7, c - 16, c).reshape(tuple(t.dims))


def test_layer_1_hessian_comes_from_the_quantized_layer_0_and_reencodes_are_byte_identical(tmp_path):
    """Through :func:`tasks.weights.reencode`: layer 1's codes are GPTQ's codes for the Hessian
    of relu(x @ W0_hat) (W0_hat: layer 0's dequantized GPTQ codes), not of relu(x @ W0) (the
    per-graph method's); the two Hessians differ. Two runs on the same inputs write the same
    bytes."""
    feeds, W0, W1 = _case()
    a = _reencoded(tmp_path, "a", feeds, W0, W1)
    b = _reencoded(tmp_path, "b", feeds, W0, W1)
    assert a.read_bytes() == b.read_bytes()
    q = onnx.load(str(a))
    X = np.concatenate([f["x"].reshape(-1, K0) for f in feeds]).astype(np.float64)
    bint, pc = weights.lpbq_scales(W0, 32)
    S0 = np.repeat(bint.astype(np.float32) * pc, 32, axis=0)
    c0 = gptq.gptq(W0, X.T @ X / len(X), S0)
    assert np.array_equal(_codes(q, "model.layers.0.w"), c0)
    bint, pc = weights.lpbq_scales(W1, 32)
    S1 = np.repeat(bint.astype(np.float32) * pc, 32, axis=0)
    R_seq = np.maximum(X @ (c0 * S0), 0)
    R_fp = np.maximum(X @ W0, 0)
    H_seq, H_fp = R_seq.T @ R_seq / len(X), R_fp.T @ R_fp / len(X)
    assert np.abs(H_seq - H_fp).max() > 0.01 * np.abs(H_fp).max()  # the quantized layer 0 shows
    got = _codes(q, "model.layers.1.w")
    want, per_graph = gptq.gptq(W1, H_seq, S1), gptq.gptq(W1, H_fp, S1)
    assert (got == want).mean() >= 0.999 and (got != per_graph).sum() > (got != want).sum()


def test_a_span_rounds_each_diagonal_block_of_the_hessian_on_its_own(tmp_path):
    """``quantize.gptq_span`` 32: layer 0 (64 inputs) and layer 1 (96) are cut into diagonal
    blocks of 32 (:func:`tasks.gptq.spans`), and each block's codes are
    GPTQ's for that block of rows alone with its own Hessian block (layer 1's from the quantized
    layer 0); they differ from the whole Hessian's codes. A span as wide as the widest input
    writes the bytes of no span."""
    from tasks.stages.params import GPTQ_SPAN

    feeds, W0, W1 = _case()
    with pytest.raises(ValueError, match=f"expected a multiple of {gptq.SPAN_ALIGN}"):  # the load check's rule is spans'
        GPTQ_SPAN.check(gptq.SPAN_ALIGN + 1, {"rounding": "gptq"})
    assert GPTQ_SPAN.check(3 * gptq.SPAN_ALIGN, {"rounding": "gptq"}) == 3 * gptq.SPAN_ALIGN
    assert gptq.spans(K0, 32) == [(0, 32), (32, 64)] and gptq.spans(K1, 32) == [(0, 32), (32, 64), (64, 96)]
    d = tmp_path / "s"
    d.mkdir()
    onnx.save(_two_layers(W0, W1, False), str(d / "fp.onnx"))
    onnx.save(_two_layers(W0, W1, True), str(d / "q.onnx"))
    weights.reencode(d / "fp.onnx", d / "q.onnx", feeds, 32, "gptq", False, span=32)
    q = onnx.load(str(d / "q.onnx"))
    X = np.concatenate([f["x"].reshape(-1, K0) for f in feeds]).astype(np.float64)

    def blockwise(W, Xin, cuts):
        bint, pc = weights.lpbq_scales(W, 32)
        S = np.repeat(bint.astype(np.float32) * pc, 32, axis=0)
        H = Xin.T @ Xin / len(Xin)
        c = np.concatenate([gptq.gptq(W[a:b], H[a:b, a:b], S[a:b]) for a, b in cuts])
        return c, S, gptq.gptq(W, H, S)

    c0, S0, whole0 = blockwise(W0, X, [(0, 32), (32, 64)])
    assert np.array_equal(_codes(q, "model.layers.0.w"), c0) and not np.array_equal(c0, whole0)
    c1, _, whole1 = blockwise(W1, np.maximum(X @ (c0 * S0), 0), [(0, 32), (32, 64), (64, 96)])
    got = _codes(q, "model.layers.1.w")
    assert (got == c1).mean() >= 0.999 and (got != whole1).sum() > (got != c1).sum()

    a = _reencoded(tmp_path, "a", feeds, W0, W1)
    b = tmp_path / "b"
    b.mkdir()
    onnx.save(_two_layers(W0, W1, False), str(b / "fp.onnx"))
    onnx.save(_two_layers(W0, W1, True), str(b / "q.onnx"))
    weights.reencode(b / "fp.onnx", b / "q.onnx", feeds, 32, "gptq", False, span=K1)
    assert (b / "q.onnx").read_bytes() == a.read_bytes()


def test_one_layers_hessians_at_a_time():
    """:func:`tasks.seqgptq.sequential` holds one layer's Hessians: the largest group's float32
    bytes, not the graph's sum; each group's weights come to ``quantize`` once, layer 0 first,
    and the last group is told nothing runs after it."""
    from tasks.seqgptq import sequential

    feeds, W0, W1 = _case()
    import tempfile
    from pathlib import Path

    seen = []

    def quantize(names, U, dead, last):
        seen.append((names, U.shape, last))
        W = {"model.layers.0.w": W0, "model.layers.1.w": W1}
        return {} if last else {n: W[n] for n in names}

    with tempfile.TemporaryDirectory() as d:
        onnx.save(_two_layers(W0, W1, False), str(Path(d) / "fp.onnx"))
        rep = sequential([(Path(d) / "fp.onnx", feeds)], {"model.layers.0.w", "model.layers.1.w"}, quantize, 0.1)
    assert seen == [(["model.layers.0.w"], (K0, K0), False), (["model.layers.1.w"], (K1, K1), True)]
    assert rep["hessian_bytes"] == 4 * K1 * K1 < 4 * (K0 * K0 + K1 * K1)
    assert rep["rows"] == {"layer 0": 6 * M, "layer 1": 6 * M}


def test_float32_gives_float64s_codes_on_correlated_inputs():
    """GPTQ in float32 (Hessian, factor, updates) chooses the codes float64 chooses, but for
    rounding ties (<= 0.1 %), on inputs with outlier channels (scales over two decades) and
    LPBQ blocks of 32; the layer's output error is the same to 0.5 %."""
    rng = np.random.default_rng(1)
    K, N = 512, 256
    X = rng.standard_normal((4096, K)) * np.exp(rng.normal(0, 1, K)) @ (np.eye(K) + rng.standard_normal((K, K)) / K)
    W = (rng.standard_normal((K, N)) * 0.05).astype(np.float32)
    bint, pc = weights.lpbq_scales(W, 32)
    S = np.repeat(bint.astype(np.float32) * pc, 32, axis=0)
    H64 = X.T @ X / len(X)
    H32 = (X.astype(np.float32).T @ X.astype(np.float32)) / np.float32(len(X))
    c64 = gptq.gptq(W, H64, S, dtype="float64")
    c32 = gptq.gptq(W, H32, S, dtype="float32")
    assert (c64 == c32).mean() >= 0.999, (c64 == c32).mean()
    err = lambda c: np.linalg.norm(X @ (W - c * S))  # noqa: E731
    assert abs(err(c32) / err(c64) - 1) < 0.005


QWEN7B = {"hidden_size": 3584, "intermediate_size": 18944, "vocab_size": 152064, "num_attention_heads": 28,
          "num_key_value_heads": 4, "num_hidden_layers": 28, "head_dim": 128, "tie_word_embeddings": False}


def test_the_quantize_check_counts_gptq_and_fails_before_work_in_one_line(monkeypatch):
    """The 7B's quantize with GPTQ on (4 parts, 16 prompts) is estimated under 16 GiB, the
    recipe's budget (sequential GPTQ's peak, 7.0-7.8 GiB + the QDQ graph, is below the
    quantizer's); with a part per layer GPTQ's peak is the larger, and a budget between the two
    estimates stops the stage before work with one line naming ``quantize.rounding``."""
    from tasks.budget import NotEnoughMemory
    from tasks.llm import memory
    from tasks.llm.parts import split_for

    from tasks.llm.part_weights import MAX_TENSOR_ELEMENTS

    assert memory.SPLIT_ELEMENTS == MAX_TENSOR_ELEMENTS
    four = [memory.estimates(QWEN7B, split_for(QWEN7B, 4), 128, 4096, True, 4, p, 16)["quantize"][0]
            for p in range(4)]
    assert max(four) <= 16 * 2**30, max(four) / 2**30
    monkeypatch.setenv("NPUBUILD_MEMORY_GB", "16")
    memory.check_stage("quantize", QWEN7B, parts=4, seq_len=128, context_len=4096, gptq_samples=16)
    kw = dict(parts=28, seq_len=128, context_len=4096, part=5)
    one = memory.estimates(QWEN7B, split_for(QWEN7B, 28), 128, 4096, True, 4, 5, 16)["quantize"][0]
    monkeypatch.setenv("NPUBUILD_MEMORY_GB", str(round(one / 2**30 - 0.5, 1)))
    rtn = memory.check_stage("quantize", QWEN7B, **kw)  # round to nearest fits
    assert rtn < one - 2**30
    with pytest.raises(NotEnoughMemory) as e:
        memory.check_stage("quantize", QWEN7B, **kw, gptq_samples=16)
    assert "\n" not in str(e.value) and "quantize.rounding (now gptq)" in str(e.value), str(e.value)

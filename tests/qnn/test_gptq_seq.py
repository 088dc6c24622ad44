"""Sequential GPTQ (issue 35): each MatMul input's Hessian from the outputs of the weights before
it already quantized (within a layer too), one input's Hessian at a time, float32 arithmetic that gives float64's
codes, byte-identical re-encodes, and the quantize stage's memory check counting its peak."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tasks.qnn import gptq
from tasks.qnn import weights

K0, K1, N1, M = 64, 96, 32, 24  # x [1, M, K0] -> layer 0 [K0, K1] -> Relu -> layer 1 [K1, N1]


TWO_LAYERS = ("model.layers.0.w", "model.layers.1.w")
ONE_LAYER = ("model.layers.0.mlp.up", "model.layers.0.mlp.down")  # two inputs of one layer


def _two_layers(W0, W1, qdq: bool, weight_names=TWO_LAYERS):
    """The fp32 graph (``qdq`` False) or a QDQ graph as onnxruntime's quantizer names its int4
    per-channel weights (``<w>_quantized`` / ``_scale`` / ``_zero_point``) of x -> MatMul
    (``weight_names[0]``) -> Relu -> MatMul (``weight_names[1]``)."""
    inits, nodes, names = [], [], []
    for i, W in enumerate((W0, W1)):
        w = weight_names[i]
        if qdq:
            s = (np.abs(W).max(0) / 7.5).astype(np.float32)
            q = np.clip(np.round(W / s), -8, 7).astype(np.int8)
            inits += [
                weights.int4_tensor(w + "_quantized", q),
                numpy_helper.from_array(s, w + "_scale"),
                weights.int4_tensor(w + "_zero_point", np.zeros(W.shape[1], np.int8)),
            ]
            nodes.append(
                helper.make_node(
                    "DequantizeLinear", [w + "_quantized", w + "_scale", w + "_zero_point"], [w + "_dq"], axis=1
                )
            )
            names.append(w + "_dq")
        else:
            inits.append(numpy_helper.from_array(W, w))
            names.append(w)
    nodes += [
        helper.make_node("MatMul", ["x", names[0]], ["h"], name="/model/layers.0/MatMul"),
        helper.make_node("Relu", ["h"], ["r"], name="/model/layers.0/Relu"),
        helper.make_node("MatMul", ["r", names[1]], ["y"], name="/model/layers.1/MatMul"),
    ]
    g = helper.make_graph(
        nodes,
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, M, K0])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, M, N1])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _case():
    rng = np.random.default_rng(0)
    mix = rng.standard_normal((K0, K0)) / np.sqrt(K0) + np.eye(K0)
    feeds = [{"x": (rng.standard_normal((1, M, K0)) @ mix).astype(np.float32)} for _ in range(6)]
    W0 = (rng.standard_normal((K0, K1)) * 0.1).astype(np.float32)
    W1 = (rng.standard_normal((K1, N1)) * 0.1).astype(np.float32)
    return feeds, W0, W1


def _reencoded(tmp_path, sub: str, feeds, W0, W1, weight_names=TWO_LAYERS):
    d = tmp_path / sub
    d.mkdir()
    onnx.save(_two_layers(W0, W1, False, weight_names), str(d / "fp.onnx"))
    onnx.save(_two_layers(W0, W1, True, weight_names), str(d / "q.onnx"))
    info = weights.reencode(d / "fp.onnx", d / "q.onnx", feeds, 32, "gptq", False)
    assert info["int4_weights"] == 2
    return d / "q.onnx"


def _codes(model, w: str) -> np.ndarray:
    t = next(i for i in model.graph.initializer if i.name == w + "_quantized")
    u = np.frombuffer(t.raw_data, np.uint8)
    lo, hi = (u & 0x0F).astype(np.int8), (u >> 4).astype(np.int8)
    c = np.stack([lo, hi], 1).ravel()[: int(np.prod(t.dims))]
    return np.where(c > 7, c - 16, c).reshape(tuple(t.dims))


@pytest.mark.parametrize("weight_names", [TWO_LAYERS, ONE_LAYER], ids=["two-layers", "one-layer"])
def test_the_second_inputs_hessian_comes_from_the_quantized_first_weight_and_reencodes_are_byte_identical(
    tmp_path, weight_names
):
    """Through :func:`tasks.qnn.weights.reencode`: the second weight's codes are GPTQ's codes for the
    Hessian of relu(x @ W0_hat) (W0_hat: the first weight's dequantized GPTQ codes), not of
    relu(x @ W0) (the per-graph method's); the two Hessians differ. The same when both weights
    are in one layer (the reference's ``--true-sequential``: a layer's later inputs come from its
    quantized earlier weights). Two runs on the same inputs write the same bytes."""
    feeds, W0, W1 = _case()
    a = _reencoded(tmp_path, "a", feeds, W0, W1, weight_names)
    b = _reencoded(tmp_path, "b", feeds, W0, W1, weight_names)
    assert a.read_bytes() == b.read_bytes()
    q = onnx.load(str(a))
    X = np.concatenate([f["x"].reshape(-1, K0) for f in feeds]).astype(np.float64)
    bint, pc = weights.lpbq_scales(W0, 32)
    S0 = np.repeat(bint.astype(np.float32) * pc, 32, axis=0)
    c0 = gptq.gptq(W0, X.T @ X / len(X), S0)
    assert np.array_equal(_codes(q, weight_names[0]), c0)
    bint, pc = weights.lpbq_scales(W1, 32)
    S1 = np.repeat(bint.astype(np.float32) * pc, 32, axis=0)
    R_seq = np.maximum(X @ (c0 * S0), 0)
    R_fp = np.maximum(X @ W0, 0)
    H_seq, H_fp = R_seq.T @ R_seq / len(X), R_fp.T @ R_fp / len(X)
    assert np.abs(H_seq - H_fp).max() > 0.01 * np.abs(H_fp).max()  # the quantized layer 0 shows
    got = _codes(q, weight_names[1])
    want, per_graph = gptq.gptq(W1, H_seq, S1), gptq.gptq(W1, H_fp, S1)
    assert (got == want).mean() >= 0.999 and (got != per_graph).sum() > (got != want).sum()


def test_a_span_rounds_each_diagonal_block_of_the_hessian_on_its_own(tmp_path):
    """``quantize.gptq_span`` 32: layer 0 (64 inputs) and layer 1 (96) are cut into diagonal
    blocks of 32 (:func:`tasks.qnn.gptq.spans`), and each block's codes are
    GPTQ's for that block of rows alone with its own Hessian block (layer 1's from the quantized
    layer 0); they differ from the whole Hessian's codes. A span as wide as the widest input
    writes the bytes of no span."""
    from tasks.contract.params import GPTQ_SPAN

    feeds, W0, W1 = _case()
    with pytest.raises(
        ValueError, match=f"expected a multiple of {gptq.SPAN_ALIGN}"
    ):  # the load check's rule is spans'
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


def test_one_inputs_hessian_at_a_time():
    """:func:`tasks.qnn.seqgptq.sequential` holds one input's Hessian: the largest group's float32
    bytes, not the graph's sum; each group's weights come to ``quantize`` once, in graph order,
    and the last group is told nothing runs after it."""
    from tasks.qnn.seqgptq import sequential

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
    assert rep["rows"] == {"model.layers.0.w": 6 * M, "model.layers.1.w": 6 * M}


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


QWEN7B = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "num_hidden_layers": 28,
    "head_dim": 128,
    "tie_word_embeddings": False,
}


def test_the_quantize_check_counts_gptq_and_fails_before_work_in_one_line(monkeypatch):
    """The 7B's quantize with GPTQ on (4 parts, 16 prompts) is estimated under 16 GiB, the
    recipe's budget (sequential GPTQ's peak, 6.4-7.2 GiB + the QDQ graph, is below the
    quantizer's); with a part per layer GPTQ's peak is the larger, and a budget between the two
    estimates stops the stage before work with one line naming ``quantize.rounding``."""
    from tasks.proc.budget import NotEnoughMemory
    from tasks.llm import memory
    from tasks.llm.parts import split_for

    four = [memory.estimates(QWEN7B, split_for(QWEN7B, 4), 128, 4096, True, 4, p, 16)["quantize"][0] for p in range(4)]
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


def _norm_chain(W0, W1, W2, gamma):
    """x [1, M, K0] -> MatMul (layers.0.a) -> Relu -> MatMul (layers.0.b) -> RMS norm (Mul,
    ReduceMean over the last axis, Add, Sqrt, Div, Mul by ``gamma``) -> MatMul (layers.1.c)."""
    inits = [
        numpy_helper.from_array(W, n)
        for W, n in ((W0, "model.layers.0.a"), (W1, "model.layers.0.b"), (W2, "model.layers.1.c"))
    ]
    inits += [
        numpy_helper.from_array(gamma, "gamma"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "model.layers.0.a"], ["h0"]),
        helper.make_node("Relu", ["h0"], ["r"]),
        helper.make_node("MatMul", ["r", "model.layers.0.b"], ["h"]),
        helper.make_node("Mul", ["h", "h"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "last"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["h", "rms"], ["hn"]),
        helper.make_node("Mul", ["hn", "gamma"], ["n"]),
        helper.make_node("MatMul", ["n", "model.layers.1.c"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, M, K0])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, M, N1])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_a_rowwise_piece_runs_every_feeds_rows_at_once_with_the_same_values(tmp_path, monkeypatch):
    """The piece from layer 0's b input to layer 1's c input (MatMul, an RMS norm) keeps rows
    apart: it runs over all feeds' rows together (``batched`` 1), and the c input's Hessian it
    gives equals the one from running it feed by feed, as does a call per feed
    (``ROWS_PER_CALL`` 1)."""
    from tasks.qnn import seqgptq

    feeds, W0, _ = _case()
    rng = np.random.default_rng(3)
    W1 = (rng.standard_normal((K1, K1)) * 0.1).astype(np.float32)
    W2 = (rng.standard_normal((K1, N1)) * 0.1).astype(np.float32)
    gamma = (1 + rng.standard_normal(K1) * 0.1).astype(np.float32)
    onnx.save(_norm_chain(W0, W1, W2, gamma), str(tmp_path / "fp.onnx"))
    W = {"model.layers.0.a": W0, "model.layers.0.b": W1, "model.layers.1.c": W2}

    def run():
        seen = {}

        def quantize(names, U, dead, last):
            seen[names[0]] = U.numpy().copy()
            return {} if last else {n: np.round(W[n] * 20) / 20 for n in names}

        rep = seqgptq.sequential([(tmp_path / "fp.onnx", feeds)], set(W), quantize, 0.1)
        return rep, seen

    rep, seen = run()
    assert rep["batched"] == 1 and list(seen) == list(W)
    monkeypatch.setattr(seqgptq, "ROWS_PER_CALL", 1)
    one, seen_one = run()
    monkeypatch.setattr(seqgptq, "rowwise", lambda *a: False)
    per_feed, seen_per_feed = run()
    assert one["batched"] == 1 and per_feed["batched"] == 0
    for w in W:
        assert np.allclose(seen[w], seen_per_feed[w], rtol=1e-5, atol=1e-6), w
        assert np.allclose(seen_one[w], seen_per_feed[w], rtol=1e-5, atol=1e-6), w


@pytest.mark.parametrize(
    "change",
    [
        "transpose",
        "matmul-of-two",
        "const-by-row",
        "reduce-rows",
        "no-keepdims",
        "broadcast-adds-an-axis",
        "reduce-of-a-constant",
    ],
)
def test_rowwise_refuses_what_mixes_rows(change):
    """:func:`tasks.qnn.seqgptq.rowwise` says False for a piece where a row's result depends on
    other rows or on its position: a Transpose, a MatMul of two computed tensors, a constant
    that varies by row, a reduction over the rows axis, one that drops the last axis, a
    constant of one more dimension (the broadcast makes axis 2 the rows axis of the norm after
    it), a tensor of constants alone (a reduced [rows, 2] table added to the rows)."""
    from tasks.qnn.seqgptq import rowwise

    F = 8
    inits = [
        numpy_helper.from_array(np.ones((F, F), np.float32), "w"),
        numpy_helper.from_array(np.ones((M, F), np.float32), "by_row"),
        numpy_helper.from_array(np.array([1], np.int64), "rows"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
        numpy_helper.from_array(np.ones((1, 1, 1, F), np.float32), "four_d"),
        numpy_helper.from_array(np.ones((M, 2), np.float32), "table"),
        numpy_helper.from_array(np.ones(F, np.float32), "scale"),
    ]
    ok = [helper.make_node("MatMul", ["h", "w"], ["a"]), helper.make_node("Sigmoid", ["a"], ["y"])]
    bad = {
        "transpose": [helper.make_node("Transpose", ["h"], ["y"], perm=[0, 2, 1])],
        "matmul-of-two": [
            helper.make_node("Transpose", ["h"], ["t"], perm=[0, 2, 1]),
            helper.make_node("MatMul", ["h", "t"], ["y"]),
        ],
        "const-by-row": [helper.make_node("Add", ["h", "by_row"], ["y"])],
        "reduce-rows": [helper.make_node("ReduceMean", ["h", "rows"], ["y"], keepdims=1)],
        "no-keepdims": [helper.make_node("ReduceMean", ["h", "last"], ["y"], keepdims=0)],
        "broadcast-adds-an-axis": [
            helper.make_node("Add", ["h", "four_d"], ["b"]),
            helper.make_node("LayerNormalization", ["b", "scale"], ["y"], axis=2),
        ],
        "reduce-of-a-constant": [
            helper.make_node("ReduceSum", ["table", "last"], ["s"], keepdims=1),
            helper.make_node("Add", ["h", "s"], ["y"]),
        ],
    }
    state = [{"h": np.zeros((1, M, F), np.float32)}, {"h": np.zeros((1, 1, F), np.float32)}]
    for nodes, want in ((ok, True), (bad[change], False)):
        g = helper.make_graph(
            nodes,
            "piece",
            [helper.make_tensor_value_info("h", TensorProto.FLOAT, None)],
            [onnx.ValueInfoProto(name="y")],
            inits,
        )
        assert rowwise(g, ["h"], state) is want, change


def _algorithm1(W, U, dead, S):
    """GPTQ's Algorithm 1 row by row (Frantar et al. 2022), no lazy batch, float64 numpy."""
    W, U, S = np.array(W, np.float64), np.asarray(U, np.float64), np.broadcast_to(np.asarray(S, np.float64), W.shape)
    W[dead] = 0
    Q = np.empty(W.shape, np.int8)
    for k in range(W.shape[0]):
        q = np.clip(np.round(W[k] / S[k]), -8, 7)
        Q[k] = q
        W[k + 1 :] -= np.outer(U[k, k + 1 :], (W[k] - q * S[k]) / U[k, k])
    return Q


@pytest.mark.parametrize("step,block", [(16, 256), (32, 128), (16, 64), (32, 32), (7, 50)])
def test_the_two_level_lazy_batch_gives_algorithm_1s_codes(step, block):
    """:func:`tasks.qnn.gptq.codes` (errors carried within ``step`` rows, then to the rest of the
    ``block``, then to every later row) chooses the codes of the row-by-row algorithm, in
    float64, with a dead input and K not a multiple of either level (the last block and step
    shorter), and output channels in two chunks; (16, 256) is what the quantize stage uses."""
    rng = np.random.default_rng(2)
    K, N = 300, 70
    X = rng.standard_normal((2000, K)) @ (np.eye(K) + rng.standard_normal((K, K)) / np.sqrt(K))
    X[:, 5] = 0  # an input that never varies: its row of W is zeroed
    W = (rng.standard_normal((K, N)) * 0.05).astype(np.float32)
    S = (np.abs(W).max(0) / 7.5).astype(np.float32)
    U, dead = gptq.inverse_factor(X.T @ X / len(X), dtype="float64")
    assert dead[5] and dead.sum() == 1
    want = _algorithm1(W, U.numpy(), dead, S)
    got = gptq.codes(W, U, dead, S, step=step, block=block, chunk_bytes=4 * K * 40)
    assert np.array_equal(got, want), (got != want).sum()
    # and the errors do move codes: round to nearest alone is not what either chose
    assert (want != np.clip(np.round(np.where(dead[:, None], 0, W) / S), -8, 7)).mean() > 0.05

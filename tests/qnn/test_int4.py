"""int4 that keeps its quality (issue 21): LPBQ block-wise weights that the HTP simulator
computes right, GPTQ rounding that lowers a layer's error on data it did not see, 8-bit
embedding tables, and the recipe params that choose them (each a key change from quantize on)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tasks.qnn import ep as qnn
from tasks.qnn import weights


def _qdq_matmul(W: np.ndarray, M: int = 32):
    """x [1, M, K] -> Q/DQ uint16 -> MatMul(DQ(weight)) -> Q/DQ uint16, weight initializers
    named as onnxruntime's quantizer names them (``w_quantized`` / ``_scale`` / ``_zero_point``,
    int4 per-channel to start with)."""
    K, N = W.shape
    s = (np.abs(W).max(0) / 7.5).astype(np.float32)
    q = np.clip(np.round(W / s), -8, 7).astype(np.int8)
    inits = [
        helper.make_tensor("w_quantized", TensorProto.INT4, [K, N], q.ravel().tolist()),
        numpy_helper.from_array(s, "w_scale"),
        helper.make_tensor("w_zero_point", TensorProto.INT4, [N], [0] * N),
        numpy_helper.from_array(np.array(0.002, np.float32), "xs"),
        numpy_helper.from_array(np.array(32768, np.uint16), "xz"),
        numpy_helper.from_array(np.array(0.004, np.float32), "ys"),
        numpy_helper.from_array(np.array(32768, np.uint16), "yz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w_quantized", "w_scale", "w_zero_point"], ["wd"], axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["y"]),
        helper.make_node("QuantizeLinear", ["y", "ys", "yz"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["out"]),
    ]
    g = helper.make_graph(
        nodes,
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, M, K])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, M, N])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def _dequantized(m) -> np.ndarray:
    """The weight the QDQ graph computes with, from its initializers (numpy, not onnxruntime)."""
    t = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    q = t["w_quantized"].astype(np.float32)
    if "w_bint" in t:
        block = q.shape[0] // t["w_bint"].shape[0]
        return q * np.repeat(t["w_bint"].astype(np.float32) * t["w_pc"], block, axis=0)
    return q * t["w_scale"]


def test_lpbq_scale_search_never_loses_to_the_rounded_max_rule():
    """:func:`tasks.qnn.weights.lpbq_scales` searches the per-channel scale and each block's 4-bit
    integer scale for the least squared rounding error; its grid holds the first rule's choice
    (pc = largest block absmax / 7 / 16, bint = round(absmax / 7 / pc)), so per channel its error
    is never larger, and on heavy-tailed weights it is clearly smaller."""
    rng = np.random.default_rng(7)
    for block in (32, 64):
        W = (rng.standard_t(3, (256, 200)) * np.exp(rng.standard_normal((1, 200)))).astype(np.float32)

        def err(bint, pc, W=W, block=block):
            S = np.repeat(bint.astype(np.float32) * pc, block, axis=0)
            return ((W - np.clip(np.round(W / S), -8, 7) * S) ** 2).sum(0)

        blk = np.abs(W.reshape(256 // block, block, 200)).max(1) / 7
        pc_old = blk.max(0) / 16
        old = err(np.clip(np.round(blk / pc_old), 1, 16).astype(np.uint8), pc_old)
        bint, pc = weights.lpbq_scales(W, block)
        assert bint.dtype == np.uint8 and bint.shape == (256 // block, 200) and 1 <= bint.min() and bint.max() <= 16
        new = err(bint, pc)
        assert (new <= old * (1 + 1e-6)).all()
        assert new.sum() < 0.9 * old.sum(), (new.sum(), old.sum())


def test_lpbq_scale_search_is_the_same_on_one_thread_or_two():
    """The search runs on torch's threads; its choice must not depend on how many (the bytes
    of a build would): a 3584 x 1024 weight (Qwen2.5-7B's in-features), block 128."""
    import torch

    W = (np.random.default_rng(3).standard_normal((3584, 1024)) * 0.02).astype(np.float32)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = weights.lpbq_scales(W, 128)
        torch.set_num_threads(2)
        two = weights.lpbq_scales(W, 128)
    finally:
        torch.set_num_threads(n)
    assert one[0].tobytes() == two[0].tobytes() and one[1].tobytes() == two[1].tobytes()
    assert len(np.unique(one[0])) > 3  # the search chose among several integer scales


@pytest.mark.parametrize("block", [16, 32, 128])
def test_lpbq_matmul_runs_all_on_htp_and_computes_its_weights(tmp_path, block):
    """The LPBQ encoding compiles with every node on HTP (CPU fallback disabled) and the
    simulator's output equals x @ (block-dequantized weights) (cosine >= 0.999). With integer
    block scales past 16 the same graph compiled and computed garbage (cosine 0.004), which is
    why :func:`tasks.qnn.weights.lpbq_scales` keeps them in 1..16."""
    rng = np.random.default_rng(block)
    W = (rng.standard_normal((256, 96)) * np.exp(rng.standard_normal((256, 1)))).astype(np.float32) * 0.05
    m = _qdq_matmul(W)
    weights.encode_int4(m, "w", W, block)
    bint = numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == "w_bint"))
    assert bint.shape == (256 // block, 96) and bint.dtype == np.uint8 and 1 <= bint.min() and bint.max() <= 16
    dq = next(n for n in m.graph.node if n.input[0] == "w_quantized")
    assert {a.name: a.i for a in dq.attribute} == {"axis": 0, "block_size": block}
    src = tmp_path / "lpbq.onnx"
    onnx.save(m, str(src))
    ctx = tmp_path / "lpbq_ctx.onnx"
    qnn.compile_in_subprocess(src, ctx, "x-elite")
    x = (rng.standard_normal((1, 32, 256)) * 8).astype(np.float32)
    y = qnn.htp_session(ctx, "x-elite").run(None, {"x": x})[0]
    ref = (np.round(x / 0.002) * 0.002) @ _dequantized(m)
    cos = float((y * ref).sum() / np.linalg.norm(y) / np.linalg.norm(ref))
    assert cos >= 0.999, cos
    # and it is a better fit of W than per-channel int4 (what block-wise is for)
    pc = _qdq_matmul(W)
    err = lambda Wq: float(np.linalg.norm(Wq - W) / np.linalg.norm(W))  # noqa: E731
    assert err(_dequantized(m)) < 0.9 * err(_dequantized(pc))


def test_gptq_lowers_the_layer_error_on_held_out_inputs():
    """GPTQ codes (same per-channel scales as round-to-nearest) give a smaller output error
    ||X (W - Wq)|| than round-to-nearest on inputs drawn apart from the calibration ones; and
    keep every code in int4's range."""
    rng = np.random.default_rng(0)
    K, N = 256, 64
    mix = rng.standard_normal((K, K)) / np.sqrt(K) + np.eye(K)  # correlated input features
    X = rng.standard_normal((2048, K)) @ mix
    Xh = rng.standard_normal((512, K)) @ mix
    W = rng.standard_normal((K, N)) * 0.05
    S = np.abs(W).max(0) / 7.5
    rtn = np.clip(np.round(W / S), -8, 7)
    codes = weights.gptq(W, X.T @ X / len(X), S)
    assert codes.dtype == np.int8 and codes.min() >= -8 and codes.max() <= 7
    err = lambda q: float(np.linalg.norm(Xh @ (W - q * S)))  # noqa: E731
    assert err(codes) < 0.8 * err(rtn), (err(codes), err(rtn))


def test_unfuse_gemm_keeps_the_function():
    """Gemm(A, B, C) -> MatMul + Add gives the same outputs on onnxruntime's CPU EP."""
    import onnxruntime as ort

    rng = np.random.default_rng(1)
    B, C = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gemm", ["a", "B", "C"], ["y"], name="fc")],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [numpy_helper.from_array(B, "B"), numpy_helper.from_array(C, "C")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    a = rng.standard_normal((3, 8)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    assert weights.unfuse_gemm(m) == 1
    assert [n.op_type for n in m.graph.node] == ["MatMul", "Add"]
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _quantize_manifest(project, recipe):
    key = json.loads((project.root / "build" / recipe / "stages.json").read_text())["quantize"]["key"]
    return json.loads((project.cache / "quantize" / key / "manifest.json").read_text())


def test_each_int4_param_rebuilds_from_quantize_on_and_runs_all_on_htp(project):
    """Through the doit CLI on the tiny BERT: w4a16 with block_size 32, GPTQ and 8-bit tables
    builds, compiles with every node on HTP and passes its verify on the simulator; the QDQ
    graph holds LPBQ weights and a uint8 embedding table, and the binary is smaller than the
    per-channel round-to-nearest one's. Changing each param rebuilds quantize, compile and
    verify, never download/export/prepatch."""
    base = project.recipe("t4", precision="w4a16", backend="htp").read_text()
    project.doit("run", "build:t4")
    bin_pc = next((project.root / "build" / "t4").glob("*.bin")).stat().st_size
    text = base.replace("  precision: w4a16\n", "  precision: w4a16\n  block_size: 32\n")
    for step in ("block", "  rounding: gptq\n", "  embedding_bits: 8\n"):
        if step != "block":
            text = text.replace("  block_size: 32\n", "  block_size: 32\n" + step)
        project.recipe("t4", text)
        run = project.doit("run", "build:t4")
        assert run.ran() == ["compile:t4", "quantize:t4", "verify:t4"], (step, run.ran())
    info = _quantize_manifest(project, "t4")["info"]["graphs"]["model.onnx"]
    assert info["block_size"] == 32 and info["rounding"] == "gptq" and info["int4_weights"] == 12
    assert info["unfused_gemm"] == 4 and info["tables_8bit"] == ["embeddings.word_embeddings.weight_quantized"]
    report = json.loads((project.root / "build" / "t4" / "verify.json").read_text())
    assert report["backend"] == "htp" and report["all_on_htp"] is True
    assert report["metrics"]["pooled_cosine_mean"] >= 0.9
    key = json.loads((project.root / "build" / "t4" / "stages.json").read_text())["quantize"]["key"]
    q = onnx.load(str(project.cache / "quantize" / key / "out" / "model.onnx"))
    t = {i.name: i for i in q.graph.initializer}
    assert t["embeddings.word_embeddings.weight_quantized"].data_type == TensorProto.UINT8
    assert sum(n.endswith("_bint") for n in t) == 12
    bin_new = next((project.root / "build" / "t4").glob("*.bin")).stat().st_size
    # the 30522 x 32 table alone is 1.95 MB at 16 bits, 0.98 MB at 8
    assert bin_new < bin_pc - 800_000, (bin_new, bin_pc)


@pytest.mark.parametrize("shape", [(7, 5), (4, 6), (1,)])
def test_int4_tensor_packs_as_onnx_reads_it(shape):
    """Two codes per byte, first in the low nibble: onnx's own reader gives the codes back."""
    codes = np.random.default_rng(0).integers(-8, 8, shape).astype(np.int8)
    t = weights.int4_tensor("c", codes)
    assert t.data_type == TensorProto.INT4 and len(t.raw_data) == (codes.size + 1) // 2
    np.testing.assert_array_equal(numpy_helper.to_array(t), codes)


def test_override_patterns_are_regular_expressions_for_llm_matmuls():
    """An ``overrides`` pattern is a regex (the recipe schema says so) for LLM MatMuls too: it
    used to be a plain substring there, so ``down_proj|v_proj`` matched nothing and the recipe
    built all-int4 without a word."""
    from tasks.qnn.quantconfig import matmul_weight_overrides

    nodes, inits = [], []
    for name in (
        "/model/layers.0/mlp/down_proj/MatMul",
        "/model/layers.0/self_attn/v_proj/MatMul",
        "/model/layers.0/self_attn/q_proj/MatMul",
        "/lm_head/MatMul",
    ):
        w = name.split("/")[-2] + "_w"
        inits.append(numpy_helper.from_array(np.zeros((4, 4), np.float32), w))
        nodes.append(helper.make_node("MatMul", ["x", w], [name + "_out"], name=name))
    m = helper.make_model(helper.make_graph(nodes, "g", [], [], inits))
    got = {
        k: v[0]["quant_type"].name
        for k, v in matmul_weight_overrides(m, "int4", keep_8bit=("down_proj|v_proj",)).items()
    }
    assert got == {"down_proj_w": "QUInt8", "v_proj_w": "QUInt8", "q_proj_w": "QInt4", "lm_head_w": "QInt4"}


def test_int4_weights_are_matmul_weights_only():
    """A Gather table an override made int4 is not a MatMul weight: the block-wise / GPTQ
    re-encode leaves it (it has no in-features; a tester's `.*` at 4 bits crashed on it)."""
    m = _qdq_matmul(np.ones((64, 8), np.float32))
    m.graph.initializer.extend(
        [
            helper.make_tensor("t_quantized", TensorProto.INT4, [4, 8], [1] * 32),
            numpy_helper.from_array(np.array(0.1, np.float32), "t_scale"),
            helper.make_tensor("t_zero_point", TensorProto.INT4, [], [0]),
        ]
    )
    m.graph.node.extend(
        [
            helper.make_node("DequantizeLinear", ["t_quantized", "t_scale", "t_zero_point"], ["t"]),
            helper.make_node("Gather", ["t", "ids"], ["rows"]),
        ]
    )
    fp = {"w": None, "t": None}
    assert weights.int4_weights(m, fp) == ["w"]


def test_per_tensor_w4a16_with_an_8_bit_table_builds_all_on_htp(project):
    """per_channel: false + embedding_bits 8 (no block, no GPTQ): the weights are left as
    onnxruntime wrote them and the graph compiles with every node on HTP (a tester found a
    per-channel scale written beside a per-tensor zero point: an invalid graph)."""
    text = (
        project.recipe("tp", precision="w4a16")
        .read_text()
        .replace("  precision: w4a16\n", "  precision: w4a16\n  per_channel: false\n  embedding_bits: 8\n")
    )
    project.recipe("tp", text)
    project.doit("run", "build:tp")
    info = _quantize_manifest(project, "tp")["info"]["graphs"]["model.onnx"]
    assert info["int4_weights"] == 0 and info["tables_8bit"] == ["embeddings.word_embeddings.weight_quantized"]
    assert (
        json.loads((project.root / "build" / "tp" / "verify.json").read_text())["metrics"]["pooled_cosine_mean"] > 0.9
    )


def test_reencode_leaves_no_stale_external_data(tmp_path):
    """A QDQ graph onnxruntime wrote with external data (LLM parts over 2 GB) that fits inline
    once re-encoded is saved inline, and its old ``.data`` file is removed: the 7B benchmark's
    part 0 kept a 1.86 GB orphan beside each re-encoded graph before this."""
    W = np.random.default_rng(0).standard_normal((128, 96)).astype(np.float32)
    onnx.save(
        _qdq_matmul(W),
        str(tmp_path / "q.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="q.onnx.data",
        size_threshold=0,
    )
    fp = _qdq_matmul(W)
    fp.graph.initializer.append(numpy_helper.from_array(W, "w"))
    onnx.save(fp, str(tmp_path / "fp.onnx"))
    info = weights.reencode(tmp_path / "fp.onnx", tmp_path / "q.onnx", [], 32, "nearest", False)
    assert info["int4_weights"] == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["fp.onnx", "q.onnx"]
    m = onnx.load(str(tmp_path / "q.onnx"))
    assert sum(i.name.endswith("_bint") for i in m.graph.initializer) == 1


def test_fast_int4_packing_is_onnxruntimes_packing():
    """:func:`tasks.qnn.quantconfig.pack_int4` (used inside onnxruntime's quantizer: its own packing
    is a Python loop per byte) gives the bytes onnxruntime's ``pack_bytes_to_4bit`` gives, odd
    and even lengths, signed and unsigned codes; the context restores onnxruntime's function."""
    from onnxruntime.quantization import base_quantizer, quant_utils

    from tasks.qnn.quantconfig import fast_int4_packing, pack_int4

    ort_pack = quant_utils.pack_bytes_to_4bit
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 7, 1000, 1001):
        for codes in (rng.integers(-8, 8, n).astype(np.int8), rng.integers(0, 16, n).astype(np.uint8)):
            assert pack_int4(codes.tobytes()) == ort_pack(codes.tobytes()), n
    with fast_int4_packing():
        assert quant_utils.pack_bytes_to_4bit is pack_int4 and base_quantizer.pack_bytes_to_4bit is pack_int4
    assert quant_utils.pack_bytes_to_4bit is ort_pack and base_quantizer.pack_bytes_to_4bit is ort_pack


def _qdq_gather(q16: np.ndarray, scale: float, zp: int):
    """ids -> Gather(DQ(uint16 table)) -> Q/DQ uint16: the token embedding as onnxruntime's QNN
    quantizer leaves it (a 16-bit per-tensor table, the Gather output's own Q/DQ pair)."""
    rows, cols = q16.shape
    inits = [
        numpy_helper.from_array(q16, "t_quantized"),
        numpy_helper.from_array(np.array(scale, np.float32), "t_scale"),
        numpy_helper.from_array(np.array(zp, np.uint16), "t_zero_point"),
        numpy_helper.from_array(np.array(0.01, np.float32), "gs"),
        numpy_helper.from_array(np.array(32768, np.uint16), "gz"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["t_quantized", "t_scale", "t_zero_point"], ["td"]),
        helper.make_node("Gather", ["td", "ids"], ["g"]),
        helper.make_node("QuantizeLinear", ["g", "gs", "gz"], ["gq"]),
        helper.make_node("DequantizeLinear", ["gq", "gs", "gz"], ["out"]),
    ]
    g = helper.make_graph(
        nodes,
        "emb",
        [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, cols])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_narrowed_table_is_the_whole_tables_rule_block_by_block():
    """The 8-bit table is uint8 per-tensor from the 16-bit table's real min/max (with 0), the
    same bytes whatever the block of rows it is computed on (whole rows, a short last block),
    and the Gather's output pair takes the table's scale and zero point."""
    from tasks.qnn.gather_tables import narrow_gather_tables

    rng = np.random.default_rng(7)
    q16 = rng.integers(9000, 61000, size=(1537, 24), dtype=np.uint16)
    scale, zp = 3.1e-5, 30000
    real = (q16.astype(np.float64) - zp) * scale  # the rule, on the whole table
    lo, hi = min(real.min(), 0.0), max(real.max(), 0.0)
    s8 = np.float32((hi - lo) / 255)
    z8 = np.uint8(np.clip(np.round(-lo / s8), 0, 255))
    want = np.clip(np.round(real / s8) + z8, 0, 255).astype(np.uint8)
    got = {}
    for block in (24 * 100, 24 * 1537 * 4, 7):  # 16 blocks with a short last one; the whole table; a row at a time
        m = _qdq_gather(q16, scale, zp)
        assert narrow_gather_tables(m, block=block) == ["t_quantized"]
        t = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        assert t["t_quantized"].dtype == np.uint8 and t["t_scale"] == s8 and t["t_zero_point"] == z8
        assert t["gs"] == s8 and t["gz"] == z8
        np.testing.assert_array_equal(t["t_quantized"], want)
        got[block] = m.SerializeToString()
    assert len(set(got.values())) == 1


def test_narrowing_a_table_holds_blocks_not_float64_copies_of_it():
    """Narrowing a 4 M-element table allocates (numpy, tracemalloc) less than one float64 copy
    of it: the whole-table computation held several (32 MiB each) at once, which took a 0.86 B
    Qwen2's quantize child to 2.67 GiB (benchmarks/README.md)."""
    import tracemalloc

    from tasks.qnn.gather_tables import narrow_gather_tables

    q16 = np.random.default_rng(0).integers(0, 65535, size=(2048, 2048), dtype=np.uint16)
    m = _qdq_gather(q16, 1e-4, 32768)
    del q16
    tracemalloc.start()
    try:
        narrow_gather_tables(m, block=1 << 18)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    f64 = 2048 * 2048 * 8
    # held: the uint16 table read (8 MiB), its uint8 codes (4 MiB), float64 blocks of 2 MiB
    assert peak < f64, f"{peak / 2**20:.1f} MiB traced, a float64 copy is {f64 / 2**20:.0f} MiB"


@pytest.mark.parametrize("layout", ["per-column", "per-row", "blocked-rows"])
def test_narrowing_reads_the_tables_dequantize_as_onnx_defines_it(layout):
    """Per-axis (axis 1: a scale per column; axis 0: per row) and blocked (opset 21
    ``block_size`` along axis 1, one block a row) DequantizeLinear tables narrow to the rule on
    their real values, whatever the block of rows; a scale that fits none of these raises naming
    the table (a [rows, 1] scale on a per-axis DequantizeLinear was broadcast before)."""
    from tasks.qnn.gather_tables import narrow_gather_tables

    rng = np.random.default_rng(3)
    rows, cols = 9, 5
    q16 = rng.integers(0, 65535, size=(rows, cols), dtype=np.uint16)
    n = cols if layout == "per-column" else rows
    s = rng.uniform(1e-4, 1e-3, n)
    z = rng.integers(20000, 40000, n).astype(np.uint16)
    col = layout == "per-column"
    real = (q16 - (z if col else z[:, None]).astype(np.float64)) * (
        s.astype(np.float32).astype(np.float64) if col else s.astype(np.float32)[:, None]
    )
    lo, hi = min(real.min(), 0.0), max(real.max(), 0.0)
    s8 = np.float32((hi - lo) / 255)
    want = np.clip(np.round(real / s8) + np.uint8(np.clip(np.round(-lo / s8), 0, 255)), 0, 255).astype(np.uint8)

    def model():
        m = _qdq_gather(q16, 0.0, 0)
        t = {i.name: i for i in m.graph.initializer}
        shp = (rows, 1) if layout == "blocked-rows" else (n,)
        t["t_scale"].CopyFrom(numpy_helper.from_array(s.astype(np.float32).reshape(shp), "t_scale"))
        t["t_zero_point"].CopyFrom(numpy_helper.from_array(z.reshape(shp), "t_zero_point"))
        dq = m.graph.node[0]
        dq.attribute.extend(
            [helper.make_attribute("axis", 1 if layout != "per-row" else 0)]
            + ([helper.make_attribute("block_size", cols)] if layout == "blocked-rows" else [])
        )
        return m

    for block in (7, rows * cols):
        m = model()
        onnx.checker.check_model(m, full_check=True)
        assert narrow_gather_tables(m, min_rows=1, block=block) == ["t_quantized"]
        np.testing.assert_array_equal(numpy_helper.to_array(m.graph.initializer[0]), want)
    bad = model()
    for a in list(bad.graph.node[0].attribute):
        if a.name == "block_size":
            bad.graph.node[0].attribute.remove(a)
    if layout == "blocked-rows":  # [rows, 1] on a per-axis DequantizeLinear: not ONNX's layout
        with pytest.raises(
            ValueError, match=r"t_quantized: expected .* of shape \(5,\) or one value .* found \[9, 1\]"
        ):
            narrow_gather_tables(bad, min_rows=1)

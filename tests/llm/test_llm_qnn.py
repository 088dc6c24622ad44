"""w8a16 QDQ -> QNN HTP compile (all nodes on HTP) -> HTP simulator via LLMRunner; weight sharing."""

import numpy as np
import pytest
import torch

from llm_fixtures import PROMPTS, tiny_export, tiny_model


@pytest.fixture(scope="module")
def qwen2_qdq(tmp_path_factory):
    """The tiny Qwen2's part 0 calibrated by the calibrate stage (6 prompts), each graph
    quantized w8a16 by :func:`tasks.llm.qdq.quantize_qdq` on its feeds."""
    from llm_fixtures import calibrate_parts, export_entry, feed_stores
    from tasks.llm import qdq

    mdir, ex = tiny_model("qwen2"), tiny_export("qwen2")
    entry = export_entry(mdir, ex, tmp_path_factory.mktemp("export") / "entry")
    feeds = feed_stores(calibrate_parts(mdir, entry, tmp_path_factory.mktemp("calib"), 6))
    out = tmp_path_factory.mktemp("qdq")
    res = {
        g: qdq.quantize_qdq(ex / "part0" / f"{g}.onnx", out / f"{g}.qdq.onnx", feeds[g][0])
        for g in ("prefill", "decode")
    }
    res["feeds"] = feeds
    return res


def test_compile_and_run_on_htp_simulator(qwen2_qdq, tmp_path):
    from transformers import AutoTokenizer

    from tasks.llm import htp
    from llm_fixtures import hf_reference
    from tasks.metrics import cosine
    from tasks.llm.runner import LLMRunner

    ctx = {g: htp.compile_single(qwen2_qdq[g], tmp_path, name=g) for g in ("prefill", "decode")}
    for c in ctx.values():
        assert c["bin_bytes"] > 100_000
    runner = LLMRunner([(ctx["prefill"]["ctx"], ctx["decode"]["ctx"])], htp.qnn_session_factory())
    mdir = tiny_model("qwen2")
    tok = AutoTokenizer.from_pretrained(mdir)
    prompts = [tok(p)["input_ids"] for p in PROMPTS[:2]]
    matches = []
    for ids, (ref, ref_logits) in zip(prompts, hf_reference(mdir, prompts, 8)):
        got = runner.generate(ids, 8)
        matches += [a == b for a, b in zip(ref, got)]
        cos = cosine(runner.prefill_logits(ids), ref_logits)
        assert cos > 0.99, cos
    assert np.mean(matches) >= 0.75, matches


def test_weight_shared_binary_is_smaller(qwen2_qdq, tmp_path):
    from tasks.llm import htp

    singles = [
        htp.compile_single(qwen2_qdq[g], tmp_path / "single", name=g)["bin_bytes"] for g in ("prefill", "decode")
    ]
    shared = htp.compile_shared(qwen2_qdq["prefill"], qwen2_qdq["decode"], tmp_path / "shared")
    assert len(shared["bins"]) == 1
    assert shared["bin_bytes"] < 0.7 * sum(singles), (shared["bin_bytes"], singles)


def test_w4a16_weights_and_htp_prefill(qwen2_qdq, tmp_path):
    """int4 per-channel MatMul weights, lm_head kept uint8 (all-int4 incl. lm_head breaks on the
    HTP simulator: cosine 0.62 vs the same QDQ model on CPU); prefill logits on HTP stay close."""
    import onnx
    from transformers import AutoModelForCausalLM

    from tasks.llm import htp, qdq

    ex = tiny_export("qwen2")
    q = qdq.quantize_qdq(
        ex / "part0" / "prefill.onnx", tmp_path / "p4.qdq.onnx", qwen2_qdq["feeds"]["prefill"][0], weight_type="int4"
    )
    m = onnx.load(str(q))
    inits = {i.name: i for i in m.graph.initializer}
    deq = {n.output[0]: n for n in m.graph.node if n.op_type == "DequantizeLinear"}
    kinds = {}
    for n in m.graph.node:
        if n.op_type == "MatMul" and n.input[1] in deq and deq[n.input[1]].input[0] in inits:
            d = deq[n.input[1]]
            w, scale = inits[d.input[0]], inits[d.input[1]]
            kinds[n.name] = (onnx.TensorProto.DataType.Name(w.data_type), len(scale.dims) == 1)
    assert kinds.pop("/lm_head/MatMul") == ("UINT8", True)
    assert kinds and set(kinds.values()) == {("INT4", True)}
    ctx = htp.compile_single(q, tmp_path, name="p4")
    sess = htp.make_qnn_session(ctx["ctx"])
    mdir = tiny_model("qwen2")
    hf = AutoModelForCausalLM.from_pretrained(mdir).eval()
    firsts = [f for f in qwen2_qdq["feeds"]["prefill"][0] if f["past_seq_len"][0, 0] == f["input_ids"].shape[1] - 1]
    assert len(firsts) >= 3  # a prompt's first window: nothing cached before it
    for f in firsts[:3]:
        n_real = int((f["input_ids"][0] != 0).sum())  # padded at the end with eos (0)
        got = sess.run(["logits"], f)[0][0, n_real - 1]
        ids = f["input_ids"][0, :n_real].tolist()
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0, -1].numpy()
        cos = float(got @ ref / np.linalg.norm(got) / np.linalg.norm(ref))
        assert cos > 0.98, cos


def test_decode_graph_takes_the_prefills_int4_encodings(qwen2_qdq, tmp_path):
    """A part's decode graph taking the prefill's LPBQ encodings (``same_as``) is the same bytes
    as encoding its own, and the two graphs hold equal weight tensors; a graph whose fp32
    weights are other data is refused."""
    import hashlib

    import onnx

    from tasks.llm import qdq

    ex, feeds = tiny_export("qwen2"), qwen2_qdq["feeds"]
    kw = dict(weight_type="int4", block_size=64, embedding_bits=8)

    def q(g, out, **more):
        return qdq.quantize_qdq(ex / "part0" / f"{g}.onnx", tmp_path / out, feeds[g][0], **kw, **more)

    def sha(p):
        return hashlib.sha256(p.read_bytes()).hexdigest()

    pre = q("prefill", "pre.onnx")
    dec = q("decode", "dec.onnx", same_as=(ex / "part0" / "prefill.onnx", pre))
    assert sha(dec) == sha(q("decode", "dec_own.onnx"))
    enc = {
        i.name: i.raw_data for i in onnx.load(str(pre)).graph.initializer if i.name.endswith(("_bint", "_quantized"))
    }
    got = {i.name: i.raw_data for i in onnx.load(str(dec)).graph.initializer if i.name in enc}
    assert len(enc) > 20 and got == enc
    other = tmp_path / "other"
    other.mkdir()
    onnx.save(onnx.load(str(ex / "part0" / "prefill.onnx")), str(other / "prefill.onnx"))  # weights inline
    with pytest.raises(ValueError, match="expected the same fp32 data for weight"):
        q("decode", "dec_bad.onnx", same_as=(other / "prefill.onnx", pre))


@pytest.mark.parametrize("kw", [dict(block_size=64), dict(rounding="gptq")], ids=["lpbq", "gptq-per-channel"])
def test_int4_weights_reencoded_whole_are_quantized_per_tensor_first_and_leave_the_same_bytes(
    qwen2_qdq, tmp_path, monkeypatch, kw
):
    """When reencode replaces every int4 MatMul weight's encoding (LPBQ blocks, GPTQ codes),
    onnxruntime's quantizer is handed those weights per-tensor (its cheap path,
    :func:`tasks.qnn.quantconfig.per_tensor_4bit`); the QDQ model left is the bytes its per-channel
    path leaves (the override switched back to it for the comparison)."""
    import hashlib

    import onnx

    from tasks.llm import qdq

    ex, feeds = tiny_export("qwen2"), qwen2_qdq["feeds"]

    def q(out):
        return qdq.quantize_qdq(
            ex / "part0" / "prefill.onnx", tmp_path / out, feeds["prefill"][0], weight_type="int4", **kw
        )

    fast = q("fast.onnx")
    calls = []
    monkeypatch.setattr(qdq, "per_tensor_4bit", lambda o: calls.append(o) or o)  # onnxruntime's per-channel path
    slow = q("slow.onnx")
    assert len(calls) == 1 and sum("axis" in s for specs in calls[0].values() for s in specs) >= 14
    assert hashlib.sha256(fast.read_bytes()).digest() == hashlib.sha256(slow.read_bytes()).digest()
    m = onnx.load(str(fast))
    int4 = [i for i in m.graph.initializer if i.data_type == onnx.TensorProto.INT4 and i.name.endswith("_quantized")]
    assert len(int4) >= 14


def test_per_tensor_4bit_drops_the_axis_of_4_bit_weights_only():
    from onnxruntime.quantization import QuantType

    from tasks.qnn.quantconfig import per_tensor_4bit

    o = {
        "a": [{"quant_type": QuantType.QInt4, "axis": 1, "symmetric": True}],
        "b": [{"quant_type": QuantType.QUInt8, "axis": 1, "symmetric": True}],
    }
    assert per_tensor_4bit(o) == {"a": [{"quant_type": QuantType.QInt4, "symmetric": True}], "b": o["b"]}
    assert o["a"][0]["axis"] == 1  # a new dict

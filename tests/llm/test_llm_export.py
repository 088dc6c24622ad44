"""Static prefill/decode ONNX export: shapes, dtypes, op set, determinism, part split."""

import onnx
import pytest

from llm_fixtures import CONTEXT_LEN, SEQ_LEN, tiny_export, tiny_model

_DT = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.INT32: "int32"}
BANNED = {
    "Where",
    "IsNaN",
    "IsInf",
    "Equal",
    "ConstantOfShape",
    "Expand",
    "ScatterND",
    "GatherND",
    "Range",
    "Shape",
    "Cos",
    "Sin",
    "Cast",
}


def _io(vis):
    return [
        (v.name, [d.dim_value for d in v.type.tensor_type.shape.dim], _DT[v.type.tensor_type.elem_type]) for v in vis
    ]


@pytest.mark.parametrize("arch,parts", [("qwen2", 1), ("llama", 2)])
def test_export_contract(arch, parts):
    import json

    ex = tiny_export(arch, parts=parts)
    desc = json.loads((ex / "export.json").read_text())
    assert len(desc["parts"]) == parts
    covered = []
    for p in desc["parts"]:
        covered += list(range(*p["layers"]))
        for g, S in (("prefill", SEQ_LEN), ("decode", 1)):
            m = onnx.load(str(ex / p[g]["path"]))
            ins = _io(m.graph.input)
            outs = _io(m.graph.output)
            assert ins == [(i["name"], i["shape"], i["dtype"]) for i in p[g]["inputs"]]
            assert outs == [(o["name"], o["shape"], o["dtype"]) for o in p[g]["outputs"]]
            names = dict((n, (s, d)) for n, s, d in ins)
            # what onnxruntime-genai's decoder pipeline feeds (tasks/llm/genai.py)
            assert names["past_seq_len"] == ([1, 1], "int32")
            assert names["total_seq_len"] == ([1], "int32")
            assert "attention_mask" not in names and "position_ids" not in names
            lo, hi = p["layers"]
            kv = [1, desc["num_kv_heads"], CONTEXT_LEN, desc["head_dim"]]
            assert names[f"past_key_{lo}"] == (kv, "float32")
            assert sum(n.startswith(("past_key_", "past_value_")) for n in names) == 2 * (hi - lo)
            if p["index"] == 0:
                assert names["input_ids"] == ([1, S], "int32")
            else:
                assert names[f"hidden_states_{p['index'] - 1}"] == ([1, S, desc["hidden_size"]], "float32")
            onames = dict((n, s) for n, s, _ in outs)
            assert ("logits" in onames) == (p["index"] == parts - 1)
            if "logits" in onames:
                assert onames["logits"] == [1, S, desc["vocab_size"]]  # genai reads the last real row
            else:
                assert f"hidden_states_{p['index']}" in onames
            ops = {n.op_type for n in m.graph.node}
            assert not ops & BANNED, ops & BANNED
            assert all(n.domain in ("", "ai.onnx") for n in m.graph.node)
            for n, shape, dt in outs:
                if n.startswith("present_"):
                    assert (shape, dt) == (kv, "float32")  # the whole cache: genai shares past/present
    assert covered == list(range(desc["num_layers"]))


def test_export_is_deterministic(tmp_path):
    from tasks.llm.pipeline_graphs import export_llm

    mdir = tiny_model("qwen2")
    a = export_llm(mdir, tmp_path / "a", seq_len=8, context_len=32)
    export_llm(mdir, tmp_path / "b", seq_len=8, context_len=32)
    for g in ("prefill", "decode"):
        pa = (tmp_path / "a" / a["parts"][0][g]["path"]).read_bytes()
        pb = (tmp_path / "b" / a["parts"][0][g]["path"]).read_bytes()
        assert pa == pb


def test_parts_weigh_the_embedding_and_lm_head():
    """issue 8: Qwen2.5-7B's embedding and LM head each weigh 2.3 layers, so its 4 parts get
    6, 8, 8, 6 layers (heaviest part 8.3 layer-equivalents, not 9.3); with nothing extra the
    split is the even one, the remainder to the earlier parts."""
    from tasks.llm.parts import layer_elements, split_for, split_layers

    qwen7b = dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
    )
    assert layer_elements(qwen7b) == 233_046_016
    assert split_for(qwen7b, 4) == [(0, 6), (6, 14), (14, 22), (22, 28)]
    assert split_for(qwen7b, 4, embed_in_part=False) == [(0, 8), (8, 16), (16, 23), (23, 28)]  # head only
    assert split_layers(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert split_layers(10, 3, 0.0, 4.0) == [(0, 5), (5, 9), (9, 10)]


def test_split_layers():
    from tasks.llm.parts import split_layers

    assert split_layers(4, 1) == [(0, 4)]
    assert split_layers(5, 2) == [(0, 3), (3, 5)]
    with pytest.raises(ValueError):
        split_layers(2, 3)


def test_llama3_rope_scaling_is_honoured(tmp_path):
    """A Llama 3.x ``rope_scaling`` (``rope_type: llama3``) reaches the RoPE table as in
    transformers: the export of the tiny Llama with it matches transformers' logits with it,
    and differs from the same weights without it (so the check can fail)."""
    import json
    import shutil

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from tasks.llm.pipeline_graphs import export_llm
    from tasks.llm.runner import LLMRunner
    from tasks.llm.sessions import cpu_session

    src, d = tiny_model("llama"), tmp_path / "llama3"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    export_llm(d, tmp_path / "ex", seq_len=8, context_len=32)
    got = LLMRunner.from_export(tmp_path / "ex", cpu_session).prefill_logits(list(range(3, 23)))
    with torch.no_grad():
        ref = {
            m: AutoModelForCausalLM.from_pretrained(m, dtype=torch.float32)
            .eval()(torch.tensor([list(range(3, 23))]))
            .logits[0, -1]
            .numpy()
            for m in (d, src)
        }
    np.testing.assert_allclose(got, ref[d], atol=2e-4, rtol=0)
    assert np.abs(got - ref[src]).max() > 1e-2


def test_slots_after_the_call_cannot_reach_attention():
    """What the KV buffer holds after this call's slots changes nothing: the fp32 graphs fed a
    cache whose every slot starts at -1e4 (or random values up to 1e4) give the zero cache's
    logits bit for bit over 2 prompts (one over two prefill windows, the second padded) and 8
    greedy steps, and every ``present_*`` slot after the call's is 0. genai starts an 8-bit
    buffer at zero bytes, -128 x scale with zero point 128 (tasks/llm/quantize.py); before the
    graphs zeroed those slots, -100 in them moved these logits by up to 13.4, -1e4 by 14.1 (the
    additive -100 mask does not hide such a key)."""
    import json

    import numpy as np

    from tasks.llm.runner import LLMRunner
    from tasks.llm.sessions import cpu_session

    ex = tiny_export("qwen2")
    desc = json.loads((ex / "export.json").read_text())
    runner = LLMRunner.from_export(ex, cpu_session, pad_id=desc["pad_token_id"])
    rng = np.random.default_rng(0)
    prompts = [list(range(3, 8)), list(range(10, 10 + SEQ_LEN + 5))]

    def run(fill):
        out = []
        for ids in prompts:
            runner.reset()
            for buf in [*runner.k.values(), *runner.v.values()]:
                buf[...] = fill(buf.shape)
            logits = runner.feed(ids)
            end = -(-len(ids) // SEQ_LEN) * SEQ_LEN  # the last prefill window wrote up to here (pad rows too)
            for _ in range(8):
                out.append(logits)
                for buf in [*runner.k.values(), *runner.v.values()]:
                    assert not buf[:, :, end:].any(), end  # the slots after the last call's: zero
                logits = runner.step(int(np.argmax(logits)))
                end = runner.n
        return np.array(out)

    zero = run(lambda shape: 0.0)
    assert len(set(np.argmax(zero, -1).tolist())) >= 4  # a varied continuation
    np.testing.assert_array_equal(run(lambda shape: -1e4), zero)
    np.testing.assert_array_equal(run(lambda shape: rng.uniform(-1e4, 1e4, shape)), zero)

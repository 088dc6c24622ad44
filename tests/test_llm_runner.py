"""LLMRunner over the fp32 ONNX graphs on the CPU EP == transformers greedy generate; calib feeds."""
import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from llm_fixtures import CONTEXT_LEN, PROMPTS, SEQ_LEN, tiny_export, tiny_model


def cpu(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _hf(arch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = tiny_model(arch)
    return AutoModelForCausalLM.from_pretrained(d).eval(), AutoTokenizer.from_pretrained(d)


# prompt lengths cover < S (left-padded), and > S (two prefill chunks with a real past)
LONG = ("Every morning the farmer milked the cows, fed the chickens, and opened the gate for "
        "the sheep. In the afternoon he")


@pytest.mark.parametrize("arch,parts,embed,lm_head", [
    ("qwen2", 1, "part0", "last"), ("llama", 1, "part0", "last"),
    ("qwen2", 2, "separate", "all")])
def test_runner_matches_transformers_generate(arch, parts, embed, lm_head):
    from tasks.llm.runner import LLMRunner

    from tasks.llm.e2e import hf_reference

    _, tok = _hf(arch)
    runner = LLMRunner.from_export(tiny_export(arch, parts=parts, embed=embed, lm_head=lm_head), cpu)
    prompts = PROMPTS[:4] + [LONG]
    ids_list = [tok(p)["input_ids"] for p in prompts]
    for p, ids, (ref, ref_logits) in zip(prompts, ids_list, hf_reference(tiny_model(arch), ids_list, 16)):
        assert runner.generate(ids, 16) == ref, p
        np.testing.assert_allclose(runner.prefill_logits(ids), ref_logits, atol=2e-4, rtol=0)
    assert len(tok(LONG)["input_ids"]) > SEQ_LEN


def test_runner_kv_cache_matches_hf_past():
    from tasks.llm.runner import LLMRunner

    m, tok = _hf("llama")
    runner = LLMRunner.from_export(tiny_export("llama"), cpu)
    ids = tok(LONG)["input_ids"]
    runner.prefill_logits(ids)
    with torch.no_grad():
        past = m(torch.tensor([ids]), use_cache=True).past_key_values
    n = len(ids)
    for l in range(m.config.num_hidden_layers):
        k_ref, v_ref = past.layers[l].keys[0].numpy(), past.layers[l].values[0].numpy()
        np.testing.assert_allclose(runner.k[l][0, :, :n], k_ref, atol=1e-4)
        np.testing.assert_allclose(runner.v[l][0, :, :n], v_ref, atol=1e-4)
        assert not runner.k[l][0, :, n:].any()


def test_runner_rejects_overflow():
    from tasks.llm.runner import LLMRunner

    runner = LLMRunner.from_export(tiny_export("qwen2"), cpu)
    with pytest.raises(ValueError):
        runner.generate([5] * (CONTEXT_LEN - 4), 16)


def test_calibration_feeds_are_real():
    """Decode feeds carry the real fp32 KV cache of the text (HF torch model); parts>0 get real
    hidden states; same feeds as running the fp32 ONNX."""
    from tasks.llm import calib, fixtures

    mdir, ex = tiny_model("llama"), tiny_export("llama", parts=2)
    kw = dict(n_prompts=4, decode_steps=8, decode_keep=2)
    feeds = calib.collect_calibration_feeds(mdir, ex, fixtures.CORPUS_PATH, **kw)
    assert [len(x) for x in feeds["prefill"]] == [5, 5]  # 4 prompts, one of them 2 chunks
    assert [len(x) for x in feeds["decode"]] == [8, 8]
    for f in feeds["decode"][0]:
        mask = f["attention_mask"][0, 0, 0]
        n = int((mask[:-1] == 0).sum())
        assert n >= 4 and f["position_ids"][0, 0] == n
        assert np.abs(f["past_key_0"][0, :, :n]).min(axis=-1).max() > 0  # real, non-zero
        assert not f["past_key_0"][0, :, n:].any()
    h = feeds["decode"][1][0]["hidden_states_in"]
    assert h.shape == (1, 1, 192) and np.abs(h).max() > 0.1
    onnx_feeds = calib.collect_calibration_feeds(mdir, ex, fixtures.CORPUS_PATH, make_session=cpu,
                                                 **kw)
    for a, b in zip(feeds["decode"][1], onnx_feeds["decode"][1]):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], atol=1e-4)
    reader = calib.FeedsDataReader(feeds["decode"][0])
    assert sum(1 for _ in iter(reader.get_next, None)) == 8


def test_genai_config_writer(tmp_path):
    from tasks.llm.runner import write_genai_config

    desc = json.loads((tiny_export("qwen2") / "export.json").read_text())
    cfg = write_genai_config(desc, tmp_path / "genai_config.json")
    assert cfg["_unverified"] is True
    assert json.loads((tmp_path / "genai_config.json").read_text())["model"]["context_length"] == CONTEXT_LEN

"""LLMRunner over the fp32 ONNX graphs on the CPU EP == transformers greedy generate; calib feeds."""

import json
from pathlib import Path

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


# prompt lengths cover < S (padded at the end), and > S (two prefill windows with a real past)
LONG = (
    "Every morning the farmer milked the cows, fed the chickens, and opened the gate for the sheep. In the afternoon he"
)


@pytest.mark.parametrize(
    "arch,parts,embed",
    [
        ("qwen2", 1, "part0"),
        ("llama", 1, "part0"),
        ("qwen2", 2, "separate"),
        ("qwen3", 1, "part0"),
        ("phi3", 2, "part0"),
        ("gemma", 2, "separate"),
    ],
)
def test_runner_matches_transformers_generate(arch, parts, embed):
    from tasks.llm.runner import LLMRunner

    from llm_fixtures import hf_reference

    _, tok = _hf(arch)
    runner = LLMRunner.from_export(tiny_export(arch, parts=parts, embed=embed), cpu)
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
    ids = tok(LONG)["input_ids"][:-3]  # two windows, the second one padded
    assert len(ids) % SEQ_LEN
    runner.prefill_logits(ids)
    with torch.no_grad():
        past = m(torch.tensor([ids]), use_cache=True).past_key_values
    n = len(ids)
    padded = -(-n // SEQ_LEN) * SEQ_LEN  # the prompt's last window is padded at its end
    assert runner.n == n and padded < CONTEXT_LEN
    for l in range(m.config.num_hidden_layers):
        k_ref, v_ref = past.layers[l].keys[0].numpy(), past.layers[l].values[0].numpy()
        np.testing.assert_allclose(runner.k[l][0, :, :n], k_ref, atol=1e-4)  # slot j = position j
        np.testing.assert_allclose(runner.v[l][0, :, :n], v_ref, atol=1e-4)
        assert not runner.k[l][0, :, padded:].any()


def test_runner_rejects_overflow():
    from tasks.llm.runner import LLMRunner

    runner = LLMRunner.from_export(tiny_export("qwen2"), cpu)
    with pytest.raises(ValueError):
        runner.generate([5] * (CONTEXT_LEN - 4), 16)


def test_calibration_feeds_are_real(tmp_path):
    """Streamed part by part (the calibrate stage of each part, part 1 reading part 0's entry),
    the feeds still carry the real fp32 state of the text: decode feeds' past K/V equal
    transformers' KV cache of the same tokens, part 1's hidden_states_0 equals transformers'
    hidden state after part 0's layers, and the scratch KV caches are cleaned up."""
    from llm_fixtures import calibrate_parts, export_entry, feed_stores, fixtures
    from tasks.llm import calibration_feeds as calib

    m, tok = _hf("llama")
    mdir, ex = tiny_model("llama"), tiny_export("llama", parts=2)
    cal = calibrate_parts(mdir, export_entry(mdir, ex, tmp_path / "export"), tmp_path / "cal", 4)
    feeds = feed_stores(cal)
    assert [len(x) for x in feeds["prefill"]] == [5, 5]  # 4 prompts, one of them 2 chunks
    assert [len(x) for x in feeds["decode"]] == [16, 16]  # 4 kept decode steps of 24 per prompt
    ids, _ = calib.text_ids(mdir, fixtures.CORPUS_PATH)
    sched = calib.schedule(ids, SEQ_LEN, CONTEXT_LEN, n_prompts=4)
    assert json.loads((cal[1] / "schedule.json").read_text())["calls"] == sched  # part 1 took part 0's
    desc = json.loads((ex / "export.json").read_text())
    lo1 = desc["parts"][1]["layers"][0]
    for q in range(2):  # first kept decode step (0) of prompts 0 and 1: past = the prompt
        f0, f1 = feeds["decode"][0][4 * q], feeds["decode"][1][4 * q]
        toks = sched[q]["prompt"]
        n = len(toks)
        assert f0["past_seq_len"][0, 0] == n  # the decode token's slot (genai's convention)
        with torch.no_grad():
            out = m(torch.tensor([toks + [sched[q]["decode"][0]]]), use_cache=True, output_hidden_states=True)
        past = out.past_key_values
        for l in range(2):
            np.testing.assert_allclose(f0[f"past_key_{l}"][0, :, :n], past.layers[l].keys[0, :, :n].numpy(), atol=1e-4)
            assert not f0[f"past_key_{l}"][0, :, -(-n // SEQ_LEN) * SEQ_LEN :].any()  # after the padded prompt
        np.testing.assert_allclose(
            f1[f"past_value_{lo1}"][0, :, :n], past.layers[lo1].values[0, :, :n].numpy(), atol=1e-4
        )
        np.testing.assert_allclose(f1["hidden_states_0"][0, 0], out.hidden_states[lo1][0, n].numpy(), atol=1e-4)
    assert list((cal[0] / "hidden").glob("*.npy")) and not (cal[1] / "hidden").exists()  # the last part writes none
    assert not list(tmp_path.rglob("kv"))
    reader = feeds["decode"][0]
    reader.rewind()
    assert sum(1 for _ in iter(reader.get_next, None)) == 16


def test_calibration_ranges_equal_onnxruntime_minmax(tmp_path):
    """The streamed ranges are onnxruntime's MinMax calibrator's, tensor for tensor."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    from llm_fixtures import calibrate_parts, export_entry, feed_stores
    from tasks.llm import calibration_feeds as calib

    mdir, ex = tiny_model("qwen2"), tiny_export("qwen2")
    feeds = feed_stores(calibrate_parts(mdir, export_entry(mdir, ex, tmp_path / "export"), tmp_path / "w", 3))
    mine = calib.collect_ranges(ex / "part0" / "decode.onnx", feeds["decode"][0]).data
    c = create_calibrator(
        ex / "part0" / "decode.onnx",
        augmented_model_path=str(tmp_path / "aug.onnx"),
        calibrate_method=CalibrationMethod.MinMax,
    )
    feeds["decode"][0].rewind()
    c.collect_data(feeds["decode"][0])
    ref = c.compute_data().data
    assert set(mine) == set(ref) and len(ref) > 100
    for k in ref:
        np.testing.assert_allclose(np.ravel(mine[k].range_value), np.ravel(ref[k].range_value), rtol=1e-5, atol=1e-5)


def test_calibrate_records_the_ranges_quantize_would_stream(tmp_path):
    """The ranges the calibrate stage takes while it runs each part (2 parts, both graphs) are
    the ones :func:`collect_ranges` streams over the feeds it wrote, tensor for tensor and bit
    for bit, and quantize given them writes the bytes it writes when it streams them itself."""
    from llm_fixtures import calibrate_parts, export_entry, feed_stores
    from tasks.llm import calibration_feeds as calib
    from tasks.llm.qdq import quantize_part
    from tasks.qnn.precisions import get as get_precision

    mdir, ex = tiny_model("qwen2"), tiny_export("qwen2", parts=2)
    entry = export_entry(mdir, ex, tmp_path / "export")
    cal = calibrate_parts(mdir, entry, tmp_path / "cal", 3)
    feeds = feed_stores(cal)
    desc = json.loads((ex / "export.json").read_text())
    for k in range(2):
        for g in ("prefill", "decode"):
            mine = calib.load_ranges(cal[k] / "ranges" / f"{g}.json").data
            ref = calib.collect_ranges(entry / f"part{k}" / f"{g}.onnx", feeds[g][k]).data
            assert set(mine) == set(ref) and len(ref) > 50
            assert all(np.array_equal(mine[t].range_value, ref[t].range_value) for t in ref), (k, g)
    params = {"precision": "w8a16", "per_channel": True}
    w8a16 = get_precision(params["precision"])
    quantize_part(
        entry,
        desc["parts"][1],
        cal[1] / "feeds",
        params,
        tmp_path / "a",
        tmp_path / "wa",
        ranges=cal[1] / "ranges",
        precision=w8a16,
    )
    quantize_part(entry, desc["parts"][1], cal[1] / "feeds", params, tmp_path / "b", tmp_path / "wb", precision=w8a16)
    for g in ("prefill", "decode"):
        a, b = (tmp_path / d / "part1" / f"{g}.onnx" for d in "ab")
        assert a.read_bytes() == b.read_bytes(), g


def test_a_calibration_graph_lets_go_of_its_session_and_outputs():
    """What held 10 GiB after a 7B part's calibrate: a RangeTaps that referred to itself (its
    session lived until the garbage collector ran), and a KV cache holding onnxruntime's output
    arrays (which keep the session's memory alive). Now the session goes with the last
    reference (no collection), and the cache holds copies."""
    import gc
    import weakref

    from tasks.llm.calibration_feeds import RangeTaps
    from tasks.llm.kv_cache import KVCache
    from tasks.llm.runner import PartGraph, block_ids

    ex = tiny_export("qwen2")
    desc = json.loads((ex / "export.json").read_text())
    taps = RangeTaps(ex / desc["parts"][0]["prefill"]["path"])
    taps.armed = True
    g = PartGraph(taps.session)
    cache = KVCache(range(desc["num_layers"]), desc["num_kv_heads"], desc["context_len"], desc["head_dim"])
    before = {k: v for k, v in cache.k.items()}
    res = g.call(block_ids(list(range(5, 5 + SEQ_LEN)), g.S), cache)
    assert all(cache.k[l] is before[l] and not np.shares_memory(cache.k[l], res[f"present_key_{l}"]) for l in before)
    assert all(np.array_equal(cache.v[l], res[f"present_value_{l}"]) for l in before) and taps.count == 1
    gone = weakref.ref(taps.sess)
    gc.disable()
    try:
        del g, taps
        assert gone() is None
    finally:
        gc.enable()


_TAPPED_CALL_PEAK = """
import json, sys
import numpy as np
from pathlib import Path
import onnx
from tasks.llm.calibration_feeds import RangeTaps, augment_for_ranges
from tasks.llm.kv_cache import KVCache
from tasks.llm.runner import PartGraph, block_ids
from tasks.llm.sessions import cpu_session_on
from tasks.proc.rss import peak_rss, peak_rss_reset, proc_bytes

ex, order = Path(sys.argv[1]), sys.argv[2]
desc = json.loads((ex / "export.json").read_text())
path = ex / desc["parts"][0]["prefill"]["path"]
taps = RangeTaps(path)
if order == "default":  # the same tapped graph in onnxruntime's default order
    taps.sess = cpu_session_on(augment_for_ranges(onnx.load(str(path), load_external_data=False))[0],
                               path.parent, arena=False)
taps.armed = True
g = PartGraph(taps.session)
cache = KVCache(range(desc["num_layers"]), desc["num_kv_heads"], desc["context_len"], desc["head_dim"])
ids = block_ids(list(range(5, 5 + desc["seq_len"])), g.S)
g.call(ids, cache)  # the first call's one-time allocations
res = g.call(ids, cache)
before = proc_bytes("/proc/self/status", "VmRSS")
peak_rss_reset()  # VmHWM := VmRSS (Linux)
res = g.call(ids, cache)
print(json.dumps({"peak": peak_rss() - before, "lo": taps.lo, "hi": taps.hi,
                  "out": float(np.abs(res[g.out]).sum())}))
"""


def test_a_tapped_calibration_call_frees_its_tensors_as_it_goes():
    """The range taps read almost every tensor of a call; in onnxruntime's default order the
    tapped graph held most of them at once (a 0.86 B part at C=4096: 3.09 GiB a prefill call,
    against 1.82 estimated). RangeTaps runs it in priority-based order: the tiny Qwen2 at S=128,
    C=4096, one prefill call in a fresh process, peak above the resident set before the call
    well under the default order's, and the same taps and outputs, bit for bit."""
    from tasks.proc.child import run_python

    ex = tiny_export("qwen2", seq_len=128, context_len=4096)
    got = {}
    for order in ("default", "priority"):
        r = run_python(f"import sys; sys.argv = ['x', {str(ex)!r}, {order!r}]\n" + _TAPPED_CALL_PEAK)
        assert r.returncode == 0, r.tail()
        got[order] = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["priority"]["lo"] == got["default"]["lo"] and got["priority"]["hi"] == got["default"]["hi"]
    assert got["priority"]["out"] == got["default"]["out"]
    scores = 6 * 128 * 4096 * 4  # one [1, H, S, C] float32 tensor of the tiny Qwen2: 12 MiB
    assert got["default"]["peak"] > 8 * scores, got
    assert got["priority"]["peak"] < got["default"]["peak"] / 2, got


@pytest.mark.parametrize("embed", ["part0", "separate"])
def test_part_stream_one_part_at_a_time_equals_the_runner(embed):
    """PartStream with one part resident gives the LLMRunner's greedy tokens and logits for
    every prompt at once, loading each part once per step; teacher forcing feeds given tokens."""
    from tasks.llm.runner import LLMRunner, PartStream

    ex = tiny_export("llama", parts=2, embed=embed)
    desc = json.loads((ex / "export.json").read_text())
    _, tok = _hf("llama")
    prompts = [tok(p)["input_ids"] for p in PROMPTS[:3]] + [tok(LONG)["input_ids"]]
    embed_table = np.load(ex / desc["embed_file"]) if desc["embed_file"] else None

    def path(i, kind):
        return ex / desc["parts"][i][kind]["path"]

    one = PartStream(desc, path, cpu, resident=1, embed_table=embed_table)
    both = PartStream(desc, path, cpu, resident=2, embed_table=embed_table)
    t1, l1 = one.run(prompts, 6)
    t2, l2 = both.run(prompts, 6)
    assert t1 == t2 and one.loads == 2 + 5 * 2 and both.loads == 4
    runner = LLMRunner.from_export(ex, cpu)
    for ids, toks, rows in zip(prompts, t1, l1):
        assert runner.generate(ids, 6) == toks
        np.testing.assert_allclose(rows[0], runner.prefill_logits(ids), atol=1e-5)
    forced = [[5, 6, 7, 8, 9]] * len(prompts)
    tf, lf = one.run(prompts, 6, forced=forced)
    runner.prefill_logits(prompts[0])
    np.testing.assert_allclose(lf[0][1], runner.step(5), atol=1e-5)
    np.testing.assert_allclose(lf[0][2], runner.step(6), atol=1e-5)


@pytest.mark.parametrize("embed", ["part0", "separate"])
def test_part_stream_score_is_teacher_forcing_in_prefill_windows(embed):
    """``score`` (perplexity's logits through the prefill graphs, a window of S tokens at a
    time, each part loaded once) gives the logits that step-by-step teacher forcing gives, over
    more than one window; fewer than 2 tokens is an error."""
    from tasks.llm.runner import PartStream
    from tasks.metrics import perplexity

    ex = tiny_export("llama", parts=2, embed=embed)
    desc = json.loads((ex / "export.json").read_text())
    _, tok = _hf("llama")
    ids = tok(LONG)["input_ids"][: desc["context_len"] - 1]
    assert len(ids) > desc["seq_len"]  # two windows at least
    embed_table = np.load(ex / desc["embed_file"]) if desc["embed_file"] else None

    def path(i, kind):
        return ex / desc["parts"][i][kind]["path"]

    s = PartStream(desc, path, cpu, resident=1, embed_table=embed_table)
    rows = s.score(ids)
    assert rows.shape == (len(ids) - 1, desc["vocab_size"] if "vocab_size" in desc else rows.shape[1])
    assert s.loads == 2  # each part's prefill graph once
    _, steps = PartStream(desc, path, cpu, resident=2, embed_table=embed_table).run(
        [ids[:1]], len(ids) - 1, forced=[ids[1:]]
    )
    np.testing.assert_allclose(rows, np.stack(steps[0]), atol=2e-4)
    assert abs(perplexity(rows, ids[1:]) / perplexity(steps[0], ids[1:]) - 1) < 1e-4
    with pytest.raises(ValueError, match="expected at least 2 tokens"):
        s.score(ids[:1])


@pytest.mark.parametrize("embed", ["part0", "separate"])
def test_part_stream_teacher_forcing_loads_each_prefill_graph_once(embed):
    """Teacher forcing (what verify's fp32 side runs) goes part-major through the prefill
    graphs: with one part resident each part's prefill graph is made once and no decode graph,
    for 3 steps as for 9 (sessions counted in the factory); forced on the greedy run's own
    tokens it gives that run's tokens, and its logits to fp32 rounding (the prefill graph
    computes at once what the decode graph computes a step at a time). Greedy with every part
    resident loads each graph once too, with one part resident a decode graph per step."""
    from tasks.llm.runner import PartStream

    ex = tiny_export("llama", parts=2, embed=embed)
    desc = json.loads((ex / "export.json").read_text())
    _, tok = _hf("llama")
    prompts = [tok(p)["input_ids"] for p in PROMPTS[:3]] + [tok(LONG)["input_ids"]]
    embed_table = np.load(ex / desc["embed_file"]) if desc["embed_file"] else None
    made = []

    def make(p):
        made.append(p)
        return cpu(p)

    def stream(resident):
        made.clear()
        return PartStream(
            desc, lambda i, kind: ex / desc["parts"][i][kind]["path"], make, resident=resident, embed_table=embed_table
        )

    greedy = {}
    for steps in (3, 9):
        t, l = stream(2).run(prompts, steps)
        assert len(made) == 4 and len(set(made)) == 4, made
        greedy[steps] = (t, l)
        s = stream(1)
        tf, lf = s.run(prompts, steps, forced=[x[:-1] for x in t])
        assert s.loads == len(made) == 2 and all(Path(m).name.startswith("prefill") for m in made), made
        assert tf == t
        for rows, want in zip(lf, l):
            assert len(rows) == steps
            np.testing.assert_allclose(np.stack(rows), np.stack(want), atol=2e-4)
            assert np.array_equal(rows[0], want[0])  # the prompt's last position: the same prefill call
    assert all(len(x) == 9 and len(set(x)) > 2 for x in greedy[9][0])  # real continuations, not one token
    s = stream(1)
    assert s.run(prompts, 9)[0] == greedy[9][0] and s.loads == 2 + 8 * 2
    assert stream(1).run(prompts, 1)[0] == [x[:1] for x in greedy[9][0]] and len(made) == 2
    with pytest.raises(ValueError, match="expected 8 forced tokens for each of 4 prompts"):
        stream(1).run(prompts, 9, forced=[x[:-2] for x in greedy[9][0]])


def test_part_stream_holds_one_session_while_the_next_loads():
    """With one part resident, no other session is alive when a part's session is made (a
    reference left in the step loop kept the previous part's weights while the next loaded: the
    7B verify peaked at 17.2 GiB); ``close`` drops the stream's last one."""
    import gc
    import weakref

    from tasks.llm.runner import PartStream

    ex = tiny_export("llama", parts=2, embed="part0")
    desc = json.loads((ex / "export.json").read_text())
    _, tok = _hf("llama")
    live, seen = weakref.WeakSet(), []

    def make(p):
        gc.collect()
        seen.append(len(live))
        s = cpu(p)
        live.add(s)
        return s

    s = PartStream(desc, lambda i, kind: ex / desc["parts"][i][kind]["path"], make, resident=1)
    s.run([tok(PROMPTS[0])["input_ids"]], 4)
    s.score(tok(LONG)["input_ids"][:40])
    assert len(seen) == 2 * 4 + 2 and max(seen) == 0, seen
    s.close()
    gc.collect()
    assert len(live) == 0

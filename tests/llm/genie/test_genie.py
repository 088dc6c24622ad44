"""Genie (libGenie.so from the onnxruntime-qnn wheel) runs our Genie-layout graphs on the x86_64
HTP simulator and generates transformers' fp32 greedy tokens (tasks/llm/genie/graphs.py,
tasks/llm/genie/host_loop.py, tasks/qnn/libgenie.py, scripts/genie_run.py). Tiny trained Qwen2 fixture (4 layers,
GQA 6/2 heads), AR-16 / AR-1, CL 64."""

from __future__ import annotations

import numpy as np
import pytest

from llm_fixtures import hf_reference, tiny_model

PROMPTS = [
    "The old lighthouse",
    "To plant a tree,",
    "The teacher wrote a question on the board. Every morning the farmer",
]  # 6, 6, 19 tokens


@pytest.fixture(scope="module")
def qwen2():
    from transformers import AutoTokenizer

    m = tiny_model("qwen2")
    tok = AutoTokenizer.from_pretrained(str(m))
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    return m, ids, [t for t, _ in hf_reference(m, ids, 8)]


def _cpu(path):
    import onnxruntime as ort

    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def test_genie_graphs_ignore_leftovers_in_the_cache(qwen2, tmp_path):
    """fp32 graphs on the CPU EP, fed as Genie feeds them, give transformers' tokens, also when
    every unwritten cache slot holds 7e34 (what Genie's uncleared buffers held once): the
    sanitized graph zeroes masked slots; without it the additive -1000 mask does not hide them."""
    from tasks.llm.genie.graphs import export_genie
    from tasks.llm.genie.host_loop import GenieHostLoop

    model, ids, hf = qwen2
    for sanitize in (True, False):
        out = tmp_path / f"s{int(sanitize)}"
        desc = export_genie(model, out, seq_len=16, context_len=64, sanitize_past=sanitize)
        assert desc["parts"][0]["prompt"]["graph"] == "prompt_ar16_cl64_1_of_1"
        assert [i["shape"] for i in desc["parts"][0]["token"]["inputs"][:6]] == [
            [1, 1],
            [1, 1, 1, 64],
            [1, 1, 1, 16],
            [1, 1, 1, 16],
            [2, 1, 32, 63],
            [2, 1, 63, 32],
        ]
        clean = [GenieHostLoop(out, _cpu).generate(i, 8) for i in ids]
        assert clean == hf
        poisoned = GenieHostLoop(out, _cpu, fill=7e34).generate(ids[2], 8)
        assert (poisoned == hf[2]) is sanitize


@pytest.mark.parametrize("seq,ctx,n_prompts,parts", [(16, 64, 3, 1), (4, 16, 2, 1), (16, 64, 3, 2)])
def test_genie_on_htp_simulator_generates_fp32_tokens(qwen2, tmp_path, seq, ctx, n_prompts, parts):
    """Export -> one context binary per graph -> genie_config.json -> GenieDialog_tokenQuery on
    the HTP simulator: the same 8 greedy tokens as transformers on every prompt (one prompt
    takes two AR-16 chunks), at Genie log level 2 (the level an earlier toy model failed at).
    AR-4 / CL-16: the configuration where Genie's uncleared first-prefill ``past_key_0_in`` held
    leftovers up to 3e35 and the unsanitized graphs gave wrong tokens from the first one (at log
    levels none, 1 and 2); the sanitized graphs must not care. 2 parts: 4 binaries, the splits
    ordered by the graph names :func:`tasks.llm.genie.binaries.rename_graph` writes."""
    import json

    import genie_run

    model, ids, hf = qwen2
    ids, hf = ids[:n_prompts], hf[:n_prompts]
    genie_run.build(model, tmp_path, seq, ctx, parts, True)
    cfg = json.loads((tmp_path / "bundle" / "genie_config.json").read_text())["dialog"]
    assert cfg["engine"]["model"]["binary"]["ctx-bins"] == [
        f"{k}_ar{s}_cl{ctx}_{i}_of_{parts}.bin" for k, s in (("prompt", seq), ("token", 1)) for i in range(1, parts + 1)
    ]
    assert cfg["context"]["bos-token"] == -1 and cfg["engine"]["backend"]["QnnHtp"]["pos-id-dim"] == 16
    create, rows, rc, err = genie_run.run_genie(tmp_path / "bundle", ids, 8, 2, timeout=600)
    assert rc == 0, err
    assert [r["status"] for r in rows] == [0] * len(ids)
    assert [r["tokens"] for r in rows] == hf
    assert len(set(np.concatenate(hf).tolist())) > 8  # varied predictions, not one token repeated

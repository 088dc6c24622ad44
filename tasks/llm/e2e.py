"""End-to-end check: fixture -> export -> calib -> QDQ -> per-graph QNN compile -> HTP simulator.

Usage: ``python -m tasks.llm.e2e OUT_DIR [--arch qwen2 llama] [--wtype uint8 int4] [--tokens 16]
[--seq-len 16 --context-len 64] [--model-dir-qwen2 DIR --model-dir-llama DIR]``

For each arch and weight type it reports, over the prompts in :data:`PROMPTS`:
greedy-token agreement with fp32 ``transformers`` ``generate()`` (percent of positions matching,
and the matching prefix length), prefill-logits cosine (HTP vs fp32 torch), the same for the QDQ
model on the CPU EP (separates quantization loss from compile loss), compile seconds, binary
bytes and simulator seconds. Writes ``OUT_DIR/e2e-results.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from ..metrics import agreement, cosine  # noqa: F401  (shared with verify)

PROMPTS = [
    "The old lighthouse",
    "Every morning the farmer",
    "The teacher wrote a question on the board.",
    "In the autumn the",
    "A purple dog walked into the bakery and",
    "To plant a tree,",
]


def hf_reference(model_dir, prompts_ids, max_new_tokens):
    """fp32 transformers greedy continuations and last-position logits."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts_ids:
            x = torch.tensor([ids])
            g = m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                           do_sample=False, min_new_tokens=max_new_tokens)
            out.append((g[0, len(ids):].tolist(), m(x).logits[0, -1].numpy()))
    return out


def evaluate(runner, refs, prompts_ids, max_new_tokens):
    rows = []
    for ids, (ref, ref_logits) in zip(prompts_ids, refs):
        t = time.perf_counter()
        logits = runner.prefill_logits(ids)
        t_pre = time.perf_counter() - t
        t = time.perf_counter()
        got = runner.generate(ids, max_new_tokens)
        t_gen = time.perf_counter() - t
        frac, pre = agreement(ref, got)
        rows.append({"match": frac, "prefix": pre, "cos": cosine(logits, ref_logits),
                     "prefill_s": t_pre, "generate_s": t_gen, "got": got, "ref": ref})
    return {"match_pct": 100 * float(np.mean([r["match"] for r in rows])),
            "prefix_mean": float(np.mean([r["prefix"] for r in rows])),
            "cos_mean": float(np.mean([r["cos"] for r in rows])),
            "cos_min": float(np.min([r["cos"] for r in rows])), "rows": rows}


def run(out_dir, arch="qwen2", wtype="uint8", *, model_dir=None, seq_len=16, context_len=64,
        max_new_tokens=16, prompts=PROMPTS) -> dict:
    """One arch x weight type. Returns the result dict (see module docstring)."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    from . import calib, export, fixtures, qnn, quant
    from .runner import LLMRunner

    out = Path(out_dir) / f"{arch}-{wtype}"
    out.mkdir(parents=True, exist_ok=True)
    res = {"arch": arch, "weight_type": wtype, "activation_type": "uint16", "seq_len": seq_len,
           "context_len": context_len}
    if model_dir is None:
        model_dir = fixtures.make_tiny_model(arch, out / "model")
    ex = out / "export"
    desc = export.export_llm(model_dir, ex, seq_len=seq_len, context_len=context_len)
    t = time.perf_counter()
    feeds = calib.collect_calibration_feeds(model_dir, ex, fixtures.CORPUS_PATH, out / "calib")
    res["calib_s"] = time.perf_counter() - t
    res["calib_counts"] = {k: [len(v) for v in vs] for k, vs in feeds.items()}
    part = desc["parts"][0]
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts_ids = [tok(p)["input_ids"] for p in prompts]
    refs = hf_reference(model_dir, prompts_ids, max_new_tokens)
    ctx, qdq = {}, {}
    for g in ("prefill", "decode"):
        t = time.perf_counter()
        qdq[g] = quant.quantize_qdq(ex / part[g]["path"], out / "qdq" / f"{g}.qdq.onnx",
                                    feeds[g][0], weight_type=wtype)
        res[f"quant_{g}_s"] = time.perf_counter() - t
        c = qnn.compile_single(qdq[g], out / "ctx", name=g)
        res[f"compile_{g}"] = {"seconds": c["seconds"], "bin_bytes": c["bin_bytes"]}
        ctx[g] = c["ctx"]
    cpu = lambda p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
    res["qdq_cpu"] = evaluate(LLMRunner([(qdq["prefill"], qdq["decode"])], cpu, pad_id=0),
                              refs, prompts_ids, max_new_tokens)
    res["htp_sim"] = evaluate(
        LLMRunner([(ctx["prefill"], ctx["decode"])], qnn.qnn_session_factory(), pad_id=0),
        refs, prompts_ids, max_new_tokens)
    (out / "result.json").write_text(json.dumps(res, indent=1))
    return res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--arch", nargs="+", default=["qwen2", "llama"])
    ap.add_argument("--wtype", nargs="+", default=["uint8"])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--context-len", type=int, default=64)
    ap.add_argument("--model-dir-qwen2")
    ap.add_argument("--model-dir-llama")
    a = ap.parse_args(argv)
    allres = []
    for arch in a.arch:
        for w in a.wtype:
            r = run(a.out_dir, arch, w, model_dir=getattr(a, f"model_dir_{arch}"),
                    seq_len=a.seq_len, context_len=a.context_len, max_new_tokens=a.tokens)
            allres.append(r)
            for k in ("qdq_cpu", "htp_sim"):
                print(f"{arch} w{w} {k}: match {r[k]['match_pct']:.1f}% prefix "
                      f"{r[k]['prefix_mean']:.2f} cos mean {r[k]['cos_mean']:.5f} "
                      f"min {r[k]['cos_min']:.5f}", flush=True)
    Path(a.out_dir, "e2e-results.json").write_text(json.dumps(allres, indent=1))


if __name__ == "__main__":
    main()

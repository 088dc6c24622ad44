"""verify for decoder LLMs: greedy generation on the compiled graphs against fp32 transformers.

For each verify prompt (the first ``samples`` lines of the recipe's data file) both sides
generate ``max_new_tokens`` tokens greedily: the compiled model through
:class:`tasks.llm.runner.LLMRunner` (backend ``htp``: the per-graph context binaries on QNN
HTP, the simulator on x86_64; ``cpu-qdq``: the QDQ graphs on the CPU EP) and the fp32 HF model
through ``generate()``. Metrics (``verify.json``):

- ``token_agreement``: share of generated positions equal to fp32's (mean over prompts);
- ``prefix_match_mean``: mean length of the common greedy prefix;
- ``logits_cosine_mean`` / ``_min``: cosine of the last prefill position's logits [V];
- ``perplexity_ratio``: perplexity of the compiled model over a short text (teacher forced,
  one prefill token then decode steps) divided by fp32's perplexity over the same tokens;
- ``reference_distinct_tokens`` per prompt: a continuation that repeats one token makes the
  agreement test unable to fail (NOTES-qnn.md), so tests check it.

Shared (weight-shared) binaries: on x86_64 loading a context binary that holds two graphs
crashes the HTP simulator (NOTES-qnn.md; reproduced by tasks/llm/qnn.load_shared_probe),
so verify runs the per-graph binaries compiled from the same QDQ graphs and checks the shipped
shared binary separately: the graphs it holds, their inputs/outputs, its size. ``verify.json``
says which it did under ``"ran"``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _prompts(files, params, tok) -> tuple[list[str], list[list[int]]]:
    from ..stages.quantize import read_lines

    texts = read_lines(files["data"], params["data"]["samples"])
    return texts, [tok(t)["input_ids"] for t in texts]


def shared_binary_report(compiled: Path) -> list[dict]:
    """For each part's weight-shared binary: the EPContext models that reference it, their
    graph inputs/outputs (name, dtype, shape) and the binary's size in bytes."""
    import onnx

    out = []
    for d in sorted(p for p in (compiled / "shared").glob("part*") if p.is_dir()):
        graphs, bins = [], set()
        for ctx in sorted(d.glob("*_ctx.onnx")):
            m = onnx.load(str(ctx), load_external_data=False)
            io = lambda vs: [{"name": v.name, "dtype": onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type),
                              "shape": [x.dim_value for x in v.type.tensor_type.shape.dim]} for v in vs]
            for n in m.graph.node:
                if n.op_type == "EPContext":
                    bins |= {a.s.decode() for a in n.attribute if a.name == "ep_cache_context"}
            graphs.append({"model": ctx.name, "inputs": io(m.graph.input), "outputs": io(m.graph.output)})
        out.append({"part": d.name, "binaries": sorted(bins), "graphs": graphs,
                    "bytes": sum((d / b).stat().st_size for b in bins)})
    return out


def perplexity(logits_rows: list[np.ndarray], targets: list[int]) -> float:
    """exp(mean negative log-likelihood) of ``targets`` under rows of logits [V]."""
    nll = []
    for lg, t in zip(logits_rows, targets):
        lg = lg.astype(np.float64).ravel()
        m = lg.max()
        nll.append(m + np.log(np.exp(lg - m).sum()) - lg[t])
    return float(np.exp(np.mean(nll)))


def verify_llm(inputs: dict, files: dict, params: dict) -> dict:
    """Measure the compiled LLM against fp32 (see module docstring). Returns the report dict."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .. import targets
    from . import e2e, qnn as llm_qnn
    from .runner import LLMRunner

    model_dir = inputs["source"]
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    texts, prompts = _prompts(files, params, tok)
    K = params["max_new_tokens"]
    refs = e2e.hf_reference(model_dir, prompts, K)
    if params["backend"] == "htp":
        t = targets.get(params["target"])
        runner = LLMRunner.from_export(inputs["compiled"], llm_qnn.qnn_session_factory(
            soc_model=t.soc_model, htp_arch=t.htp_arch), suffix="_ctx.onnx")
        ran = "per-graph context binaries compiled from the same QDQ graphs (the shared binary crashes the simulator)"
    else:
        cpu = lambda p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        runner = LLMRunner.from_export(inputs["qdq"], cpu, suffix=".onnx")
        ran = "QDQ graphs on the CPU EP (quantization only)"
    ev = e2e.evaluate(runner, refs, prompts, K)
    samples = [{"text": txt, "token_agreement": r["match"], "prefix_match": r["prefix"],
                "logits_cosine": r["cos"], "tokens": r["got"], "reference": r["ref"],
                "reference_distinct_tokens": len(set(r["ref"]))} for txt, r in zip(texts, ev["rows"])]
    metrics = {"token_agreement": ev["match_pct"] / 100, "prefix_match_mean": ev["prefix_mean"],
               "logits_cosine_mean": ev["cos_mean"], "logits_cosine_min": ev["cos_min"]}
    if "perplexity_text" in files:
        ids = tok(Path(files["perplexity_text"]).read_text(encoding="utf-8"))["input_ids"]
        ids = ids[: min(len(ids), runner.C - 1, 64)]
        runner.reset()
        rows = [runner.feed(ids[:1])]
        rows += [runner.step(t) for t in ids[1:-1]]
        m = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        with torch.no_grad():
            ref_logits = m(torch.tensor([ids])).logits[0].numpy()
        p_c, p_r = perplexity(rows, ids[1:]), perplexity(list(ref_logits[:-1]), ids[1:])
        metrics.update(perplexity=p_c, perplexity_fp32=p_r, perplexity_ratio=p_c / p_r,
                       perplexity_tokens=len(ids) - 1)
    return {"backend": params["backend"], "target": params["target"], "ran": ran, "metrics": metrics,
            "samples": samples, "max_new_tokens": K,
            "shared_binaries": shared_binary_report(inputs["compiled"]),
            "all_on_htp": True if params["backend"] == "htp" else None}


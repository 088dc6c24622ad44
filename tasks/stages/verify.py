"""verify: run the compiled model and the fp32 export on the verify set; compare; judge.

Backends: ``htp`` runs the EPContext model through the QNN EP (on x86_64 Linux: the HTP
simulator; on a Snapdragon machine: the NPU); ``cpu-qdq`` runs the QDQ model on the CPU EP
(checks quantization only; fast, for models too big for the simulator). The reference is
the fp32 export on the CPU EP.

Metrics, per sample and aggregated (``verify.json``):

- ``pooled_cosine`` (embedding models, task ``feature-extraction``/``sentence-similarity``):
  cosine between attention-mask-weighted mean-pooled embeddings, as sentence-transformers'
  ``Pooling(mean)`` computes them;
- ``cosine``: cosine of the flattened first output over the real (unpadded) tokens;
- ``max_abs_error``: max |compiled - fp32| over the real tokens;
- ``top1_agreement``: share of real tokens whose argmax over the last axis agrees;
- LLMs (``family: llm``): token agreement of greedy continuations, logits cosine on prefill
  and perplexity against fp32 (``tasks/llm/verify.py``).

Thresholds are not part of the key (``KEY_EXCLUDE``): they judge a result, they don't change
it. :func:`check` fails the build with the metric, the threshold and the worst sample.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .. import lazy, progress, qnn
from ..metrics import cosine
from .quantize import encoder_feeds, read_lines

np = lazy.module("numpy")
onnx = lazy.module("onnx")

VERSION = 1
TOOLS = ("onnxruntime", "onnxruntime-qnn", "qnn-sdk", "transformers", "tokenizers", "numpy", "torch",
         "onnxruntime-genai")
KEY_EXCLUDE = ("thresholds",)


def key_extra(params: dict) -> dict:
    """The target's resolved QNN provider options (see ``tasks.stages.compile.key_extra``); the
    name stays in the params, since ``verify.json`` reports it."""
    return {"provider_options": qnn.provider_options(params["target"])}

# name -> (direction, per-sample metric used to name the worst sample, description)
THRESHOLDS = {
    "pooled_cosine_mean": ("min", "pooled_cosine", "mean over samples of the mean-pooled embedding cosine"),
    "pooled_cosine_min": ("min", "pooled_cosine", "worst sample's mean-pooled embedding cosine"),
    "cosine_mean": ("min", "cosine", "mean over samples of the output cosine"),
    "cosine_min": ("min", "cosine", "worst sample's output cosine"),
    "max_abs_error": ("max", "max_abs_error", "largest |compiled - fp32| over all samples"),
    "top1_agreement": ("min", "top1_agreement", "share of tokens whose argmax agrees"),
    "token_agreement": ("min", "token_agreement", "LLM: share of greedy tokens equal to fp32's"),
    "prefix_match_mean": ("min", "prefix_match", "LLM: mean length of the matching greedy prefix"),
    "logits_cosine_mean": ("min", "logits_cosine", "LLM: mean prefill logits cosine"),
    "perplexity_ratio": ("max", None, "LLM: perplexity(compiled) / perplexity(fp32)"),
    "genai_runner_agreement": ("min", None, "LLM, runtime genai: share of prompts where onnxruntime-genai's "
                                            "tokens equal LLMRunner's on the same graphs"),
}


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[1, L, H] float, [1, L] {0,1} -> [H]: the mask-weighted mean over tokens."""
    m = mask.astype(np.float64)[..., None]
    return (hidden.astype(np.float64) * m).sum(axis=1)[0] / max(m.sum(), 1e-9)


def compare(ref: np.ndarray, got: np.ndarray, mask: np.ndarray) -> dict:
    """Per-sample metrics between fp32 output ``ref`` and ``got`` ([1, L, H]) over the real
    tokens of ``mask`` ([1, L])."""
    keep = mask[0].astype(bool)
    r, g = ref[0][keep], got[0][keep]
    return {
        "pooled_cosine": cosine(mean_pool(ref, mask), mean_pool(got, mask)),
        "cosine": cosine(r, g),
        "max_abs_error": float(np.abs(r - g).max()),
        "top1_agreement": float((r.argmax(-1) == g.argmax(-1)).mean()),
        "tokens": int(keep.sum()),
    }


def _aggregate(samples: list[dict]) -> dict:
    agg = {}
    for name in ("pooled_cosine", "cosine", "top1_agreement"):
        vals = [s[name] for s in samples]
        agg[f"{name}_mean"] = float(np.mean(vals))
        agg[f"{name}_min"] = float(np.min(vals))
    agg["max_abs_error"] = float(max(s["max_abs_error"] for s in samples))
    agg["top1_agreement"] = agg["top1_agreement_mean"]
    return agg


def run(inputs, files, params, out: Path) -> dict:
    """Measure; write ``out/verify.json``. Returns {"backend", "samples"}."""
    if params["family"] == "llm":
        from ..llm.memory import available_bytes, check_export_stage
        from ..llm.verify import verify_llm

        check_export_stage("verify", inputs["reference"])
        avail = available_bytes()
        report = verify_llm(inputs, files, params, budget_bytes=None if avail is None else avail // 2)
        run_info = report.pop("_run")
    else:
        report = _verify_encoder(inputs, files, params)
    (out / "verify.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    info = {"backend": report["backend"], "samples": len(report.get("samples", []))}
    if params["family"] == "llm":
        info.update(run_info)
    return info


def _verify_encoder(inputs, files, params) -> dict:
    d = params["data"]
    texts = read_lines(files["data"], d["samples"])
    ref_model = inputs["reference"] / "model.onnx"
    feeds = encoder_feeds(ref_model, inputs["source"], texts, d["max_length"])
    ref = qnn.cpu_session(ref_model)
    if params["backend"] == "htp":
        ctx = inputs["compiled"] / "model_ctx.onnx"
        got = qnn.htp_session(ctx, params["target"])
        m = onnx.load(str(ctx), load_external_data=False)
        placement = {"all_on_htp": all(n.op_type == "EPContext" for n in m.graph.node),
                     "nodes": [n.op_type for n in m.graph.node]}
    else:
        got = qnn.cpu_session(inputs["qdq"] / "model.onnx")
        placement = {"all_on_htp": None, "nodes": []}
    out_name = ref.get_outputs()[0].name
    samples = []
    for text, feed in progress.bar(list(zip(texts, feeds)), "samples", unit="sample"):
        r = ref.run([out_name], feed)[0]
        g = got.run([out_name], feed)[0]
        s = compare(r, g, feed["attention_mask"])
        s["text"] = text if len(text) <= 60 else text[:57] + "..."
        samples.append(s)
    return {"backend": params["backend"], "target": params["target"], "output": out_name,
            "sequence_length": d["max_length"], "metrics": _aggregate(samples), "samples": samples,
            **placement}


def check(out: Path, manifest: dict, params: dict) -> list[str]:
    """Failures of ``out/verify.json`` against ``params["thresholds"]``: one line per failed
    threshold naming the metric, its value, the threshold and the worst sample. Also fails an
    htp run where some node did not run on HTP."""
    report = json.loads((out / "verify.json").read_text(encoding="utf-8"))
    fails = []
    if report.get("all_on_htp") is False:
        fails.append(f"not every node ran on HTP: {report.get('nodes')}")
    for name, bar in sorted(params.get("thresholds", {}).items()):
        direction, per_sample, _ = THRESHOLDS[name]
        value = report["metrics"].get(name)
        if value is None:
            fails.append(f"{name}: not measured by this verify")
            continue
        bad = not math.isfinite(value) or (value < bar if direction == "min" else value > bar)
        if bad:
            worst = ""
            samples = report.get("samples") or []
            if per_sample and samples and per_sample in samples[0]:
                pick = min if direction == "min" else max
                w = pick(range(len(samples)), key=lambda i: samples[i][per_sample])
                worst = f"; worst sample #{w} ({per_sample}={samples[w][per_sample]:.4f}): {samples[w].get('text', '')!r}"
            fails.append(f"{name} = {value:.4f}{' (not a number: the compiled model gave NaN/inf)' if not math.isfinite(value) else ''}, threshold {'>=' if direction == 'min' else '<='} {bar}{worst}")
    return fails

"""verify, the LLM implementation (encoders: ``tasks/encoder/verify.py``): greedy generation
of the verify prompts through the compiled bundle (onnxruntime-genai or our ``LLMRunner``,
``verify.runtime``) against the fp32 export graphs: token agreement, prefill logits cosine,
perplexity ratio (:func:`tasks.llm.compare.verify_llm`, on the parts' entries joined by
:func:`joined_views`); judged by the shared :func:`tasks.contract.common.checker`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from tasks.contract import common
from tasks.contract.stage import Param, Stage, Threshold
from tasks.contract.params import BACKEND, DATA_FILE, DATA_SAMPLES, THRESHOLDS as THRESHOLDS_PARAM
from tasks.llm.memory import plan_estimate
from tasks.llm.verify_memory import memory_plan

RUNTIME = Param(
    "verify",
    "runtime",
    Literal["runner", "genai"],
    "runner",
    "what generates on the compiled graphs: our LLMRunner, or onnxruntime-genai driving them "
    "through genai_config.json (tasks/llm/genai.py)",
)
MAX_NEW_TOKENS = Param("verify", "max_new_tokens", int, 16, "greedy tokens per prompt", limits={"ge": 1, "le": 4096})
PERPLEXITY_TEXT = Param("verify", "perplexity_text", str | None, None, "text file for perplexity vs fp32")
#: the bars this verify measures (``verify.thresholds``)
THRESHOLDS = (
    Threshold(
        "token_agreement",
        "min",
        "token_agreement",
        "share of greedy tokens equal to fp32's choice after the same tokens",
        "a share of tokens",
        0.0,
        True,
        1.0,
    ),
    Threshold(
        "prefix_match_mean",
        "min",
        "prefix_match",
        "mean length of the matching greedy prefix",
        "a number of tokens up to verify.max_new_tokens",
        0.0,
        True,
        None,
    ),
    Threshold("logits_cosine_mean", "min", "logits_cosine", "mean prefill logits cosine", "a cosine", 0.0, False, 1.0),
    Threshold(
        "perplexity_ratio",
        "max",
        None,
        "perplexity(compiled) / perplexity(fp32)",
        "a ratio of perplexities",
        0.0,
        False,
        math.inf,
    ),
    Threshold(
        "genai_runner_agreement",
        "min",
        None,
        "runtime genai: share of prompts where onnxruntime-genai's tokens equal LLMRunner's on the same graphs",
        "a share of prompts",
        0.0,
        False,
        1.0,
    ),
    Threshold(
        "genie_runner_agreement",
        "min",
        None,
        "runtime genie: share of prompts where Genie's tokens (its "
        "graphs, on the simulator) equal LLMRunner's on the genai graphs",
        "a share of prompts",
        0.0,
        False,
        1.0,
    ),
)


def preflight(recipe) -> list[tuple[str, str]]:
    """The verify prompts' room: one prompt window and ``max_new_tokens`` fit the context (issue
    51: a recipe beyond it failed with a ValueError after 84 s of stages). ``verify.runtime:
    genai`` needs what onnxruntime-genai can drive (tasks/llm/genai.py): the
    embedding in part 0 (genai's pipeline starts from input_ids), a context length that is a
    multiple of the prefill length (padded prompt windows must fit the cache), and the
    onnxruntime-genai package."""
    import importlib.util

    e, v = recipe.export, recipe.verify
    if e.sequence_length + v.max_new_tokens > e.context_length - 1:  # the runners' bound (tasks/llm/runner.py)
        return [
            (
                "verify.max_new_tokens",
                f"expected verify.max_new_tokens + export.sequence_length (one padded prompt "
                f"window) <= export.context_length - 1 = {e.context_length - 1}, found "
                f"{v.max_new_tokens} + {e.sequence_length} = "
                f"{v.max_new_tokens + e.sequence_length}",
            )
        ]
    if recipe.verify.runtime != "genai":
        return []
    bad = []  # (what runtime genai needs, what the recipe has)
    if e.embedding != "first-part":
        bad.append(("export.embedding: first-part", f"export.embedding: {e.embedding}"))
    if e.context_length % e.sequence_length:
        bad.append(
            (
                f"export.context_length a multiple of export.sequence_length ({e.sequence_length})",
                f"export.context_length: {e.context_length}",
            )
        )
    if importlib.util.find_spec("onnxruntime_genai") is None:
        bad.append(("the onnxruntime-genai package (pip install onnxruntime-genai==0.18.0)", "not installed"))
    if bad:
        return [
            (
                "verify.runtime",
                f"expected {', '.join(b[0] for b in bad)} for runtime genai, found {', '.join(b[1] for b in bad)}",
            )
        ]
    return []


def joined_views(inputs: dict, tmp: Path) -> dict:
    """The parts' entries seen as the whole-model folders :func:`verify_llm` reads: for each
    side (``reference`` = the fp32 exports, ``qdq`` = the quantized (patched) parts,
    ``compiled``) a folder under ``tmp`` holding the bundle's ``export.json`` (and host-side
    embedding table), part 0's ``config.json`` and quantize.json, and ``part{k}`` (and, for
    ``compiled``, ``shared/part{k}``) as symbolic links into part k's entry. Returns
    {"reference", "qdq", "compiled": Path, "compiled_parts": [entry folders], "source",
    "bundle"}."""
    import json
    import os

    bundle = Path(inputs["bundle"])
    desc = json.loads((bundle / "export.json").read_text())
    P = len(desc["parts"])
    views = {
        "source": inputs["source"],
        "bundle": bundle,
        "compiled_parts": [Path(inputs[f"compiled.part{k}"]) for k in range(P)],
    }
    for side in ("reference", "qdq", "compiled"):
        v = Path(tmp) / side
        (v / "shared").mkdir(parents=True)
        for f in ["export.json"] + ([desc["embed_file"]] if desc.get("embed_file") else []):
            os.symlink(bundle / f, v / f)
        for k in range(P):
            entry = Path(inputs[f"{side}.part{k}"])
            if (entry / f"part{k}").is_dir():  # a weight-shared compile without per-graph binaries has none
                os.symlink(entry / f"part{k}", v / f"part{k}", target_is_directory=True)
            if (entry / "shared" / f"part{k}").is_dir():
                os.symlink(entry / "shared" / f"part{k}", v / "shared" / f"part{k}", target_is_directory=True)
        first = Path(inputs[f"{side}.part0"])
        for f in ("config.json", "quantize.json"):
            if (first / f).is_file():
                os.symlink(first / f, v / f)
        views[side] = v
    if "genie.part0" in inputs:  # bundle.runtimes: genie
        views["genie_parts"] = [Path(inputs[f"genie.part{k}"]) for k in range(P)]
    return views


def run(inputs, files, params, out: Path) -> dict:
    """Generate, measure, write ``out/verify.json``, from the parts' entries
    (``reference.part{k}``, ``qdq.part{k}``, ``compiled.part{k}``, the ``bundle``:
    :func:`joined_views`). Returns {"backend", "samples", and the run's per-part figures}.
    Raises :class:`tasks.proc.budget.NotEnoughMemory` before work when no way of running it fits
    the memory available (:func:`tasks.llm.verify_memory.memory_plan`)."""
    import tempfile

    from tasks.llm.compare import verify_llm

    with tempfile.TemporaryDirectory(prefix="verify-parts-") as tmp:
        views = joined_views(inputs, Path(tmp))
        resident, phases = memory_plan(views, files, params)
        report = verify_llm(views, files, params, resident=resident)
    run_info = report.pop("_run")
    run_info["memory_phases"] = {
        k: {"estimate": phases[k], **run_info.get("memory_phases", {}).get(k, {})} for k in phases
    }
    report["boundary"] = boundary_report(report.get("binaries") or {}, params.get("runtimes") or ["genai"])
    return {**common.write_report(out, report), **run_info}


#: why a float32 tensor is left at a shipped graph's boundary, by runtime and tensor name
FLOAT_WHY = {
    ("genai", "logits"): "onnxruntime-genai reads logits as float32 or float16 only (src/models/logits.cpp)",
    ("genai", "hidden_states"): "the parts' quantize stages do not tie one encoding for the tensor two genai "
    "graphs share (Genie's parts do: tasks/llm/genie/quantize.py)",
}


def boundary_report(binaries: dict, runtimes) -> dict:
    """``verify.json`` ``"boundary"``: per runtime of the bundle, what its shipped binaries
    (read back) move per decode call and prefill window (:func:`tasks.llm.figures.layout_traffic`,
    bytes) and every float32 tensor left at a shipped graph's boundary, with why
    (:data:`FLOAT_WHY`; "not narrowed" where no reason is known)."""
    from tasks.llm.boundary import kv_cache
    from tasks.llm.figures import layout_traffic, shipped_binaries

    out = {}
    for rt in runtimes:
        left = []
        for rel, b in sorted(shipped_binaries(binaries, rt).items()):
            for gname, g in b.get("graphs", {}).items():
                for t in g.get("inputs", []) + g.get("outputs", []):
                    if t[1] == "FLOAT":
                        why = (
                            "the recipe's quantize.kv_bits: 32 (a float32 KV cache)"
                            if kv_cache(t[0])
                            else FLOAT_WHY.get((rt, t[0].rstrip("0123456789").rstrip("_")), "not narrowed")
                        )
                        left.append(
                            {"binary": rel, "graph": gname.lstrip("_"), "tensor": t[0], "shape": t[2], "why": why}
                        )
        out[rt] = {"traffic": layout_traffic(binaries, rt), "float32": left}
    return out


STAGE = Stage(
    kind="verify",
    module=__name__,
    version=8,  # 8: "boundary" (traffic, float32 tensors left)
    tools=(
        "onnxruntime",
        "onnxruntime-qnn",
        "qnn-sdk",
        "transformers",
        "tokenizers",
        "numpy",
        "torch",
        "onnxruntime-genai",
    ),
    run=run,
    params=(BACKEND, RUNTIME, DATA_SAMPLES, MAX_NEW_TOKENS, THRESHOLDS_PARAM),
    files={DATA_FILE: "data", PERPLEXITY_TEXT: "perplexity_text"},
    line_samples=("data",),
    wired=("target", "task", "runtimes"),
    key_exclude=("thresholds",),  # bars judge a result, not change it
    key_extra=common.target_key_extra,
    check=common.checker(THRESHOLDS),
    thresholds=THRESHOLDS,
    preflight=preflight,
    artifacts=common.VERIFY_ARTIFACTS,
    memory_estimate=plan_estimate,
)

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

RUNTIME = Param("verify", "runtime", Literal["runner", "genai"], "runner",
                "what generates on the compiled graphs: our LLMRunner, or onnxruntime-genai driving them "
                "through genai_config.json (tasks/llm/genai.py)")
MAX_NEW_TOKENS = Param("verify", "max_new_tokens", int, 16, "greedy tokens per prompt", limits={"ge": 1, "le": 4096})
PERPLEXITY_TEXT = Param("verify", "perplexity_text", str | None, None, "text file for perplexity vs fp32")
#: the bars this verify measures (``verify.thresholds``)
THRESHOLDS = (
    Threshold("token_agreement", "min", "token_agreement",
              "share of greedy tokens equal to fp32's choice after the same tokens",
              "a share of tokens", 0.0, True, 1.0),
    Threshold("prefix_match_mean", "min", "prefix_match", "mean length of the matching greedy prefix",
              "a number of tokens up to verify.max_new_tokens", 0.0, True, None),
    Threshold("logits_cosine_mean", "min", "logits_cosine", "mean prefill logits cosine", "a cosine", 0.0, False, 1.0),
    Threshold("perplexity_ratio", "max", None, "perplexity(compiled) / perplexity(fp32)", "a ratio of perplexities",
              0.0, False, math.inf),
    Threshold("genai_runner_agreement", "min", None, "runtime genai: share of prompts where onnxruntime-genai's "
              "tokens equal LLMRunner's on the same graphs", "a share of prompts", 0.0, False, 1.0),
    Threshold("genie_runner_agreement", "min", None, "runtime genie: share of prompts where Genie's tokens (its "
              "graphs, on the simulator) equal LLMRunner's on the genai graphs", "a share of prompts", 0.0, False, 1.0),
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
        return [("verify.max_new_tokens", f"expected verify.max_new_tokens + export.sequence_length (one padded prompt "
                                          f"window) <= export.context_length - 1 = {e.context_length - 1}, found "
                                          f"{v.max_new_tokens} + {e.sequence_length} = "
                                          f"{v.max_new_tokens + e.sequence_length}")]
    if recipe.verify.runtime != "genai":
        return []
    bad = []  # (what runtime genai needs, what the recipe has)
    if e.embedding != "first-part":
        bad.append(("export.embedding: first-part", f"export.embedding: {e.embedding}"))
    if e.context_length % e.sequence_length:
        bad.append((f"export.context_length a multiple of export.sequence_length ({e.sequence_length})",
                    f"export.context_length: {e.context_length}"))
    if importlib.util.find_spec("onnxruntime_genai") is None:
        bad.append(("the onnxruntime-genai package (pip install onnxruntime-genai==0.18.0)", "not installed"))
    if bad:
        return [("verify.runtime", f"expected {', '.join(b[0] for b in bad)} for runtime genai, found "
                                   f"{', '.join(b[1] for b in bad)}")]
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
    views = {"source": inputs["source"], "bundle": bundle,
             "compiled_parts": [Path(inputs[f"compiled.part{k}"]) for k in range(P)]}
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
    the memory available (:func:`memory_plan`)."""
    import tempfile

    from tasks.llm.compare import verify_llm

    with tempfile.TemporaryDirectory(prefix="verify-parts-") as tmp:
        views = joined_views(inputs, Path(tmp))
        resident, phases = memory_plan(views, files, params)
        report = verify_llm(views, files, params, resident=resident)
    run_info = report.pop("_run")
    run_info["memory_phases"] = {k: {"estimate": phases[k], **run_info.get("memory_phases", {}).get(k, {})}
                                 for k in phases}
    report["boundary"] = boundary_report(report.get("binaries") or {}, params.get("runtimes") or ["genai"])
    return {**common.write_report(out, report), **run_info}


#: what this process's resident set may grow by between the memory plan and the runtimes'
#: children (the tokenizer, the read-back's figures): 64 MiB (measured: under 4 MiB on the tiny
#: Qwen2, benchmarks/README.md for the 0.86 B)
CHILD_HELD_MARGIN = 64 << 20


def memory_plan(views: dict, files: dict, params: dict) -> tuple[int, dict]:
    """How the verify runs within the memory available, decided before work: the parts the
    compiled side keeps open (the most that fit) and each phase's estimated peak of the whole
    process tree (:func:`tasks.llm.verify.verify_phases`: the read-back, onnxruntime-genai and
    Genie in children of their own, the compiled side, the fp32 side), checked against the
    budget with what this process holds (:func:`tasks.proc.budget.check`: recorded in the manifest,
    printed to the log). Returns (resident parts, {phase: bytes}). Raises
    :class:`tasks.proc.budget.NotEnoughMemory` (one line: the phases over the budget and the recipe
    keys that lower them) when one part at a time does not fit either."""
    import json

    from tasks.proc.budget import check, held_bytes
    from tasks.proc.tree import rss_now
    from tasks.llm.genie.names import genie_files, joined_genie_description

    desc = json.loads((Path(views["reference"]) / "export.json").read_text())
    P, backend = len(desc["parts"]), params["backend"]
    side, suffix = (views["compiled"], "_ctx.onnx") if backend == "htp" else (views["qdq"], ".onnx")

    def paths(folder, suf):
        return {(i, kind): Path(folder) / (desc["parts"][i][kind]["path"][:-len(".onnx")] + suf)
                for i in range(P) for kind in ("prefill", "decode")}

    graphs = {"compiled": paths(side, suffix), "reference": paths(views["reference"], ".onnx")}
    prompts = params["data"]["samples"] + (1 if "perplexity_text" in files else 0)
    genie = None
    if views.get("genie_parts"):
        gdesc = joined_genie_description(views["genie_parts"])
        genie = [graph_bytes(e / rel) for rel in genie_files(gdesc, False) for e in views["genie_parts"]
                 if (e / rel).is_file()]
    # what this process holds while a runtime's child runs: with the modules verify_llm loads
    # before the children start, and what the read-back leaves (tokenizer, read-back figures)
    import onnxruntime  # noqa: F401
    import transformers  # noqa: F401

    from tasks.qnn import ep  # noqa: F401
    from tasks.llm import htp, runner  # noqa: F401

    held, rss = held_bytes(False), (rss_now() or 0) + CHILD_HELD_MARGIN

    def phases_for(resident: int) -> dict:
        return verify_phases(graphs, desc, backend, prompts, resident, genai=params.get("runtime") == "genai",
                             genie_bytes=genie, held_start=held, held_children=rss)

    resident, phases = verify_plan(phases_for, P, keys={"parts": P, "context": desc["context_len"],
                                                          "samples": params["data"]["samples"]})
    check("verify", max(phases.values()) - held, None, recipe_keys=None, held=held)  # recorded; fits by now
    print("memory: verify phases (GiB) " + ", ".join(f"{k} {v / (1 << 30):.2f}" for k, v in phases.items())
          + f"; compiled side keeps {resident} of {P} parts open", flush=True)
    return resident, phases


# ------------------------------------------------------------------ verify: every runtime it runs

#: bytes a child process takes before it loads a graph (Python, onnxruntime, onnxruntime-genai or
#: libGenie and the QNN libraries), measured on the tiny Qwen2 (4 parts of one layer, whose
#: binaries are a few MB): genai's child 0.187 GiB, Genie's 0.153 GiB
CHILD_BASE = 1 << 28
#: bytes a session holds per byte of the graph files it loads (the context binary and its
#: ``_ctx.onnx``; the QDQ graph and its data) once made, and the bytes more per file byte while
#: it is made (the file read whole), by backend. ``htp``, the QNN HTP simulator: a 179 MB
#: per-graph binary of the 0.86 B Qwen2's part 0 (benchmarks/README.md) made a session that
#: holds 1.05 x its bytes and took 1.0 x more while made, one after the other; 1.25 leaves room
#: for a call's buffers. ``cpu-qdq``, onnxruntime's CPU EP on a QDQ graph: 2.2 once made, 3.2
#: while made (:data:`tasks.llm.compare.SESSION_BYTES_PER_FILE_BYTE`)
SESSION_HOLDS = {"htp": 1.25, "cpu-qdq": 2.5}
SESSION_MAKING = {"htp": 1.0, "cpu-qdq": 1.0}


def sessions_bytes(backend: str, sizes) -> int:
    """Peak bytes of sessions made one after the other and all kept open, from their graph
    files' ``sizes`` (bytes): every one's :data:`SESSION_HOLDS` plus the largest one's
    :data:`SESSION_MAKING` (the one being made)."""
    sizes = list(sizes)
    return int(SESSION_HOLDS[backend] * sum(sizes) + SESSION_MAKING[backend] * max(sizes, default=0))


def graph_bytes(path) -> int:
    """Bytes of a graph's files: ``path`` and the files beside it whose names start with its
    stem (its external data, or the context binary of a ``*_ctx.onnx``)."""
    g = Path(path)
    return sum(f.stat().st_size for f in g.parent.iterdir() if f.name.startswith(g.stem) and f.is_file())


def verify_phases(graphs: dict, desc: dict, backend: str, prompts: int, resident: int, *,
                  genai: bool, genie_bytes: list[int] | None, held_start: int, held_children: int) -> dict:
    """Estimated peak bytes of each phase of the LLM verify (:func:`tasks.llm.compare.verify_llm`),
    the whole process tree's, for ``resident`` parts of the compiled side kept open (1..parts):
    {phase: bytes} for "read_back", "genai" (``genai``), "genie" (``genie_bytes``: the Genie
    per-graph binaries' sizes, None without Genie), "compiled" and "reference".

    ``graphs``: {"compiled": {(part, "prefill"|"decode"): path}, "reference": {...}} (the graphs
    each side runs); ``desc``: the bundle's ``export.json`` (KV shapes and dtypes, S, V);
    ``prompts``: verify prompts (+1 for a perplexity text); ``held_start``: what the stage's
    process holds above :data:`BASE` when the check runs (:func:`tasks.proc.budget.held_bytes`);
    ``held_children``: what it holds (its whole resident set) while a runtime's child runs.

    - read_back: the largest binary read whole, twice (the file and libQnnSystem's parse).
    - genai / genie (each in a child, the stage process waiting): :data:`CHILD_BASE` + every
      part's prefill and decode graphs at once (:func:`sessions_bytes`) + one prompt's KV
      cache twice + a prefill window's logits.
    - compiled: the larger of one prefill session and ``resident`` decode sessions, + every
      prompt's KV cache for every part + two prefill windows' float32 logits [S, V] per prompt
      (the last part's output and its copy).
    - reference: the largest fp32 part's weight files (memory-mapped, all touched) + its
      activations and the same logits.
    """
    import numpy as np

    from tasks.llm.boundary import kv_cache
    from tasks.llm.memory import BASE

    P = len(desc["parts"])
    S, V = desc["seq_len"], desc.get("vocab_size") or 0
    kv = [sum(int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize for t in p["decode"]["inputs"]
              if kv_cache(t["name"])) for p in desc["parts"]]
    logits = 2 * prompts * S * V * 4
    comp = graphs["compiled"]
    pre = max(graph_bytes(comp[(i, "prefill")]) for i in range(P))
    dec = sorted((graph_bytes(comp[(i, "decode")]) for i in range(P)), reverse=True)
    bins = [graph_bytes(g) for g in comp.values()]
    out = {"read_back": BASE + held_start + 2 * max(bins),
           "compiled": BASE + held_start + max(sessions_bytes(backend, [pre]), sessions_bytes(backend, dec[:resident]))
           + prompts * sum(kv) + logits}
    ref = graphs["reference"]
    fp32 = max(graph_bytes(ref[(i, "prefill")]) for i in range(P))
    out["reference"] = BASE + held_start + fp32 + 2 * max(kv) + logits
    if genai:
        out["genai"] = held_children + CHILD_BASE + sessions_bytes(backend, bins) + 2 * sum(kv) + S * V * 4
    if genie_bytes is not None:
        out["genie"] = held_children + CHILD_BASE + sessions_bytes("htp", genie_bytes) + 2 * sum(kv) + S * V * 4
    return out


#: what lowers each verify phase's peak (the recipe keys named when it does not fit)
VERIFY_LOWERS = {
    "read_back": "export.parts (now {parts}: smaller binaries)",
    "genai": "verify.runtime (now genai: runner does not load every part at once) or "
             "export.context_length (now {context})",
    "genie": "bundle.runtimes (now with genie: Genie loads every part at once) or "
             "export.context_length (now {context})",
    "compiled": "export.parts (now {parts}), verify.data.samples (now {samples}) or "
                "export.context_length (now {context})",
    "reference": "export.parts (now {parts}) or verify.data.samples (now {samples})",
}


def verify_plan(phases_for, parts: int, *, stage: str = "verify", keys: dict) -> tuple[int, dict]:
    """Choose how many parts the LLM verify's compiled side keeps open: the most (``parts``
    down to 1) whose phases (``phases_for(resident) -> {phase: bytes}``, :func:`verify_phases`)
    all fit the memory available (:func:`tasks.proc.budget.available_bytes`); unknown memory: 1.
    Returns (resident, phases). Raises :class:`NotEnoughMemory` before work when even one part
    at a time does not fit: one line naming the stage, each phase over the budget with its
    figure, and the recipe keys that lower them (``keys``: {"parts", "context", "samples"}:
    their values now, :data:`VERIFY_LOWERS`)."""
    from tasks.proc.budget import NotEnoughMemory, available_bytes
    from tasks.errors import apart
    from tasks.llm.memory import GiB

    avail = available_bytes()
    if avail is None:
        return 1, phases_for(1)
    for r in range(parts, 0, -1):
        ph = phases_for(r)
        if max(ph.values()) <= avail:
            return r, ph
    from tasks.proc.budget import budget_gib

    src = "NPUBUILD_MEMORY_GB" if budget_gib() is not None else "MemAvailable now"
    over = sorted(((k, v) for k, v in ph.items() if v > avail), key=lambda kv: -kv[1])
    need, have = apart(over[0][1] / GiB, avail / GiB)
    what = ", ".join(f"{k} {apart(v / GiB, avail / GiB)[0]}" for k, v in over)
    lowers = "; ".join(f"{k}: change {VERIFY_LOWERS[k].format(**keys)}" for k, _ in over)
    raise NotEnoughMemory(f"{stage} needs about {need} GiB with one part at a time (GiB over the budget by phase: "
                          f"{what}), {have} GiB is available ({src}); to lower it, {lowers}, "
                          "or raise NPUBUILD_MEMORY_GB")


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
                        why = ("the recipe's quantize.kv_bits: 32 (a float32 KV cache)" if kv_cache(t[0])
                               else FLOAT_WHY.get((rt, t[0].rstrip("0123456789").rstrip("_")), "not narrowed"))
                        left.append({"binary": rel, "graph": gname.lstrip("_"), "tensor": t[0], "shape": t[2],
                                     "why": why})
        out[rt] = {"traffic": layout_traffic(binaries, rt), "float32": left}
    return out


STAGE = Stage(
    kind="verify", module=__name__, version=8,  # 8: "boundary" (traffic, float32 tensors left)
    tools=("onnxruntime", "onnxruntime-qnn", "qnn-sdk", "transformers", "tokenizers", "numpy", "torch",
           "onnxruntime-genai"), run=run,
    params=(BACKEND, RUNTIME, DATA_SAMPLES, MAX_NEW_TOKENS, THRESHOLDS_PARAM),
    files={DATA_FILE: "data", PERPLEXITY_TEXT: "perplexity_text"}, line_samples=("data",),
    wired=("target", "task", "runtimes"), key_exclude=("thresholds",),  # bars judge a result, not change it
    key_extra=common.target_key_extra, check=common.checker(THRESHOLDS), thresholds=THRESHOLDS,
    preflight=preflight, artifacts=common.VERIFY_ARTIFACTS,
    memory_estimate=plan_estimate,
)

"""The LLM verify's memory plan (the ``verify`` stage: :mod:`tasks.llm.verify`), decided before
work: each phase's estimated peak of the whole process tree (:func:`verify_phases`: the
read-back, onnxruntime-genai and Genie in children of their own, the compiled side, the fp32
side) from the graphs' file sizes, and how many parts the compiled side keeps open
(:func:`verify_plan`, the most that fit); :func:`memory_plan` runs both for a stage's inputs.
"""

from __future__ import annotations

from pathlib import Path


#: what this process's resident set may grow by between the memory plan and the runtimes'
#: children (the tokenizer, the read-back's figures): 64 MiB (measured: under 4 MiB on the tiny
#: Qwen2, benchmarks/README.md for the 0.86 B)
CHILD_HELD_MARGIN = 64 << 20


def memory_plan(views: dict, files: dict, params: dict) -> tuple[int, dict]:
    """How the verify runs within the memory available, decided before work: the parts the
    compiled side keeps open (the most that fit) and each phase's estimated peak of the whole
    process tree (:func:`verify_phases`: the read-back, onnxruntime-genai and
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
        return {
            (i, kind): Path(folder) / (desc["parts"][i][kind]["path"][: -len(".onnx")] + suf)
            for i in range(P)
            for kind in ("prefill", "decode")
        }

    graphs = {"compiled": paths(side, suffix), "reference": paths(views["reference"], ".onnx")}
    prompts = params["data"]["samples"] + (1 if "perplexity_text" in files else 0)
    genie = None
    if views.get("genie_parts"):
        gdesc = joined_genie_description(views["genie_parts"])
        genie = [
            graph_bytes(e / rel)
            for rel in genie_files(gdesc, False)
            for e in views["genie_parts"]
            if (e / rel).is_file()
        ]
    # what this process holds while a runtime's child runs: with the modules verify_llm loads
    # before the children start, and what the read-back leaves (tokenizer, read-back figures)
    import onnxruntime  # noqa: F401
    import transformers  # noqa: F401

    from tasks.qnn import ep  # noqa: F401
    from tasks.llm import htp, runner  # noqa: F401

    held, rss = held_bytes(False), (rss_now() or 0) + CHILD_HELD_MARGIN

    def phases_for(resident: int) -> dict:
        return verify_phases(
            graphs,
            desc,
            backend,
            prompts,
            resident,
            genai=params.get("runtime") == "genai",
            genie_bytes=genie,
            held_start=held,
            held_children=rss,
        )

    resident, phases = verify_plan(
        phases_for, P, keys={"parts": P, "context": desc["context_len"], "samples": params["data"]["samples"]}
    )
    check("verify", max(phases.values()) - held, None, recipe_keys=None, held=held)  # recorded; fits by now
    print(
        "memory: verify phases (GiB) "
        + ", ".join(f"{k} {v / (1 << 30):.2f}" for k, v in phases.items())
        + f"; compiled side keeps {resident} of {P} parts open",
        flush=True,
    )
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


def verify_phases(
    graphs: dict,
    desc: dict,
    backend: str,
    prompts: int,
    resident: int,
    *,
    genai: bool,
    genie_bytes: list[int] | None,
    held_start: int,
    held_children: int,
) -> dict:
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
    kv = [
        sum(
            int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize
            for t in p["decode"]["inputs"]
            if kv_cache(t["name"])
        )
        for p in desc["parts"]
    ]
    logits = 2 * prompts * S * V * 4
    comp = graphs["compiled"]
    pre = max(graph_bytes(comp[(i, "prefill")]) for i in range(P))
    dec = sorted((graph_bytes(comp[(i, "decode")]) for i in range(P)), reverse=True)
    bins = [graph_bytes(g) for g in comp.values()]
    out = {
        "read_back": BASE + held_start + 2 * max(bins),
        "compiled": BASE
        + held_start
        + max(sessions_bytes(backend, [pre]), sessions_bytes(backend, dec[:resident]))
        + prompts * sum(kv)
        + logits,
    }
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
    raise NotEnoughMemory(
        f"{stage} needs about {need} GiB with one part at a time (GiB over the budget by phase: "
        f"{what}), {have} GiB is available ({src}); to lower it, {lowers}, "
        "or raise NPUBUILD_MEMORY_GB"
    )

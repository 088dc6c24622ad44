"""Peak-memory estimates for the LLM stages, checked before a stage starts (issue 8).

Every LLM stage holds one part at a time, so its peak follows the largest part, not the model.
The estimates below are from the part's shape (``config.json``) and the recipe, with factors
measured on this project's benchmarks (benchmarks/README.md: Qwen2.5-0.5B and Qwen2.5-7B
shapes; the factor each term uses is named next to it). They are meant to catch a build that
cannot fit before it spends an hour, not to predict to the MiB.

When an estimate exceeds the memory available (``MemAvailable`` from ``/proc/meminfo``, or
``NPUBUILD_MEMORY_GB`` when set), :func:`check` raises :class:`NotEnoughMemory` naming the recipe
keys that lower it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..proc.rss import proc_bytes as _proc_bytes

GiB = 1 << 30
BASE = int(0.8 * GiB)  # Python + torch/onnxruntime/transformers imports, measured: 0.6-0.8 GiB


class NotEnoughMemory(RuntimeError):
    """A stage's estimated peak exceeds the memory available; the message says what to change."""


#: the largest budget taken (GiB): 1e300 passed as a number and overflowed every stage (a tester)
MAX_BUDGET_GIB = 1 << 20


def budget_gib() -> float | None:
    """The user's memory budget, ``NPUBUILD_MEMORY_GB`` (GiB), or None when unset. Raises
    ValueError naming the variable for a value that is not a finite number > 0 (checked when
    doit starts: :func:`tasks.dodo_tasks.environment_problems`)."""
    import math

    env = os.environ.get("NPUBUILD_MEMORY_GB", "").strip()
    if not env:
        return None
    try:
        v = float(env) if "_" not in env else math.nan  # Python's float() reads "1_0" as 10
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and 0 < v <= MAX_BUDGET_GIB):
        raise ValueError(f"NPUBUILD_MEMORY_GB: expected a number of GiB > 0 and at most {MAX_BUDGET_GIB}, found {env!r}")
    return v


def available_bytes() -> int | None:
    """Memory a stage may use: ``NPUBUILD_MEMORY_GB`` (GiB, float) if set, else Linux's
    ``MemAvailable``; None when neither is known (then nothing is checked). Raises ValueError
    for a budget that is not a number > 0 (:func:`budget_gib`)."""
    gib = budget_gib()
    if gib is not None:
        return int(gib * GiB)
    return _proc_bytes("/proc/meminfo", "MemAvailable")


def budget_line() -> str:
    """How ``doit explain`` states the memory budget (issue 22 item 6): the user's
    ``NPUBUILD_MEMORY_GB``, which every LLM stage's estimate is checked against and which
    decides whether the LLM verify keeps every part resident (when the fp32 weights fit in half
    of it), else that there is none and what stands in for it (``MemAvailable``, which varies
    with what else runs)."""
    gib = budget_gib()
    if gib is not None:
        return (f"{gib:g} GiB (NPUBUILD_MEMORY_GB): LLM stages whose estimate exceeds it stop before work; "
                f"LLM verify keeps every part resident only when the fp32 weights fit in {gib / 2:g} GiB")
    avail = available_bytes()
    now = f", {avail / GiB:.1f} GiB now" if avail is not None else ""
    return (f"none set (NPUBUILD_MEMORY_GB): LLM stages are checked against the memory available{now}, "
            "which changes with what else runs; set NPUBUILD_MEMORY_GB for a peak you can plan for")


def part_params(config: dict, lo: int, hi: int, first: bool, last: bool, embed_in_part: bool) -> int:
    """Parameters of one part: layers lo..hi-1, plus the embedding table (first part, when it
    holds it) and the final norm + LM head (last part)."""
    D, I, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    H = config["num_attention_heads"]
    d = config.get("head_dim") or D // H
    kv = (config.get("num_key_value_heads") or H) * d
    layer = D * H * d * 2 + D * kv * 2 + 3 * D * I + 2 * D + H * d + 2 * kv
    n = (hi - lo) * layer
    if first and embed_in_part:
        n += V * D
    if last:
        n += V * D + D
    return n


def estimates(config: dict, ranges: list[tuple[int, int]], seq_len: int, context_len: int,
              embed_in_part: bool = True, weight_bits: int = 4, only: int | None = None) -> dict:
    """Estimated peak bytes per LLM stage: ``{stage: (bytes, part index)}``, the largest part's
    (``only``: part ``only``'s, for a stage that builds one part).

    - export: the part's largest tensor (the embedding table in part 0, where a host-side
      lookup's ``.npy`` is written too, and the LM head in the last part; else the MLP's
      ``hidden x intermediate``) at 6 bytes per element: the float32 copy and what writing it
      adds. Measured: Qwen2.5-7B parts 0 and 3 (545 M-element tables) 3.09-3.51 GiB, parts
      1-2 1.21-1.23 GiB (estimated: 3.85 and 1.18); Qwen2.5-0.5B parts 0 and 3 1.35-1.38 GiB
      (1.56), parts 1-2 0.42 (0.82) (benchmarks/README.md, issue 22). Was 8 bytes per element
      of the model's largest tensor for every part: 4.9 GiB for each 7B part (a tester).
    - quantize: onnxruntime's quantizer holds the part's float32 weights once, plus the
      quantized copies (<= 2 bytes per weight: 16-bit Gather tables), plus one call's
      activations: the attention scores [1, H, S, C] float32 a few times over and the part's
      KV cache; the fp32 calibration run maps the same weights (file-backed pages).
    - compile: the QDQ graph of the part (weight_bits per weight, 16 bits for the embedding
      table) x 8: the weight-shared compile holds both graphs, each with the QNN HTP prepare's
      copies. Measured (benchmarks/README.md): Qwen2.5-7B part 0, 1.9 GB QDQ graph, shared
      compile 15.6 GiB, single-graph compiles 5.2 GiB; Qwen2.5-0.5B part 0, 3.70 GiB.
    - calibrate: one fp32 part (mapped) + one call's activations + a prompt's KV cache twice
      (the fp32 run of the quantize estimate, without the quantizer).
    - verify: one fp32 part (mapped) + one QDQ part + the KV caches of the verify prompts.
    """
    H = config["num_attention_heads"]
    D = config["hidden_size"]
    d = config.get("head_dim") or D // H
    kvh = config.get("num_key_value_heads") or H
    V = config["vocab_size"]
    best = {"export": (0, 0), "calibrate": (0, 0), "quantize": (0, 0), "compile": (0, 0), "verify": (0, 0)}
    for i, (lo, hi) in enumerate(ranges):
        if only is not None and i != only:
            continue
        largest = V * D if i in (0, len(ranges) - 1) else D * max(config["intermediate_size"], H * d)
        n = part_params(config, lo, hi, i == 0, i == len(ranges) - 1, embed_in_part)
        table = V * D if (i == 0 and embed_in_part) else 0
        layers = hi - lo
        kv = layers * 2 * kvh * context_len * d * 4
        act = 4 * H * seq_len * context_len * 4 + 2 * kv
        qdq = (n - table) * weight_bits // 8 + table * 2
        cand = {"export": BASE + 6 * largest, "calibrate": BASE + 4 * n + act,
                "quantize": BASE + 4 * n + 2 * n + act, "compile": BASE + 8 * qdq,
                "verify": BASE + 4 * n + qdq + 6 * kv + act}
        for k, v in cand.items():
            if v > best[k][0]:
                best[k] = (v, i)
    return best


def check(stage: str, estimate: int, part: int, *, recipe_keys: str | None) -> None:
    """Raise :class:`NotEnoughMemory` when ``estimate`` exceeds :func:`available_bytes`, naming
    the stage, the part, both figures (with the decimals that tell them apart) and
    ``recipe_keys`` (what to change; None: no recipe key lowers it, so more memory is the fix)."""
    from ..metrics import apart

    avail = available_bytes()
    if avail is not None and estimate > avail:
        src = "NPUBUILD_MEMORY_GB" if budget_gib() is not None else "MemAvailable now"
        more = "raise NPUBUILD_MEMORY_GB" if src == "NPUBUILD_MEMORY_GB" else "free memory or use a larger machine"
        if avail <= BASE:
            fix = f"the budget is below the {BASE / GiB:.1f} GiB any stage takes (Python and its libraries): {more}"
        elif recipe_keys is None:
            fix = f"no recipe key lowers it: {more}"
        else:
            fix = f"to lower it change {recipe_keys}"
        need, have = apart(estimate / GiB, avail / GiB)
        raise NotEnoughMemory(f"{stage}: part {part} needs about {need} GiB, {have} GiB is available ({src}); {fix}")


def check_stage(stage: str, config: dict, *, parts: int, seq_len: int, context_len: int,
                embed_in_part: bool = True, weight_bits: int = 4, part: int | None = None) -> int:
    """Estimate ``stage``'s peak for this model and export shape and :func:`check` it; returns
    the estimate in bytes. ``weight_bits``: of the quantized weights (``tasks/precisions.py``;
    compile and verify read them from the quantize output: :func:`weight_bits_of`, issue 22).
    ``part``: the one part the stage builds (default: the largest part's estimate). Raises :class:`NotEnoughMemory` (naming ``export.parts``,
    ``export.context_length``, ``export.sequence_length`` with their values; for export, whose
    peak follows the model's largest tensor, that no recipe key lowers it) or ValueError
    for a bad ``parts``."""
    from .parts import split_for

    ranges = split_for(config, parts, embed_in_part)
    est, part = estimates(config, ranges, seq_len, context_len, embed_in_part, weight_bits, part)[stage]
    # the export holds one tensor at a time: its size is the model's, not the recipe's
    check(stage, est, part, recipe_keys=None if stage == "export" else
          f"export.parts (now {parts}: more parts, smaller parts), export.context_length (now {context_len}) or "
          f"export.sequence_length (now {seq_len})")
    return est


#: what the LLM quantize stage writes beside its graphs: {"precision", "weight_bits"}, so the
#: stages after it count the weights at the recipe's own bits (issue 22, item 5)
QUANTIZED_AS = "quantize.json"


def weight_bits_of(folder, default: int = 4) -> int:
    """The weight bits a quantize output ``folder`` was made with (:data:`QUANTIZED_AS`), else
    ``default`` (4: what the memory checks assumed before the file existed)."""
    import json

    f = Path(folder) / QUANTIZED_AS
    return int(json.loads(f.read_text())["weight_bits"]) if f.is_file() else default


def check_export_stage(stage: str, export_dir, weight_bits: int = 4, part: int | None = None) -> int:
    """:func:`check_stage` for a stage whose input is an export (or a copy of one): the model
    config and the export shape are read from ``export_dir`` (``config.json``, ``export.json``).
    ``part``: the one part the stage builds (default: the largest part)."""
    import json

    export_dir = Path(export_dir)
    desc = json.loads((export_dir / "export.json").read_text())
    cfg = json.loads((export_dir / "config.json").read_text(encoding="utf-8"))
    return check_stage(stage, cfg, parts=len(desc["parts"]), seq_len=desc["seq_len"],
                       context_len=desc["context_len"], embed_in_part=desc["embed"] == "part0",
                       weight_bits=weight_bits, part=part)


# What a non-LLM stage asks of a cluster worker: the encoders built here (MiniLM-sized) peak
# well under 1 GiB above the imports (BASE); 2 GiB leaves room for a BERT-large.
ENCODER_BYTES = 2 * GiB


def source_config(download_params: dict) -> dict:
    """The model's ``config.json`` from a download stage's params, without building anything:
    a local folder's (``path``/``package``), the facts kept in the repo for a Hub model at its
    revision (``recipes/models/``: :mod:`tasks.sources.model_facts`), or the Hub's single file
    (``hf_hub_download``, from the local Hub cache when ``HF_HUB_OFFLINE=1``). Raises OSError / the Hub's errors
    when it cannot be read."""
    import json

    if download_params.get("hf"):
        from ..sources.model_facts import config_of

        kept = config_of(download_params["hf"], download_params.get("revision"))
        if kept is not None:  # the facts kept in the repo (recipes/models/): no Hub needed
            return kept
        from huggingface_hub import hf_hub_download

        f = hf_hub_download(download_params["hf"], "config.json", revision=download_params.get("revision"))
    else:
        from ..sources import local_folder

        f = local_folder(download_params) / "config.json"
    return json.loads(Path(f).read_text(encoding="utf-8"))


def plan_estimate(specs: dict, stage: str) -> int:
    """Estimated peak bytes of ``stage`` of a recipe's plan (``{stage name: StageSpec}``, as
    ``tasks.plan.expand`` makes it), known before any stage runs: what a cluster build asks
    of a worker's ``MEMORY`` resource. LLMs: :func:`estimates` from the source's config.json
    and the export params (a patch stage counts as the quantize (before it) or compile (after
    it) of its model, download as BASE); encoders: :data:`ENCODER_BYTES`. Raises what
    :func:`source_config` raises for an LLM whose config cannot be read."""
    spec = specs[stage]
    if spec.family != "llm":
        return ENCODER_BYTES
    if spec.kind in ("download", "bundle"):
        return BASE
    by_kind = {s.kind: s for s in specs.values()}
    ex = by_kind["export"].params
    from .parts import split_for

    cfg = source_config(by_kind["download"].params)
    from ..precisions import get as get_precision

    bits = get_precision(by_kind["quantize"].params["precision"]).weight_bits
    embed_in_part = ex.get("embedding", "first-part") == "first-part"
    est = estimates(cfg, split_for(cfg, ex["parts"], embed_in_part), ex["sequence_length"],
                    ex["context_length"], embed_in_part, bits, spec.part)
    kind = spec.kind
    if kind == "patch":
        kind = "quantize" if specs[spec.inputs["model"]].kind == "export" else "compile"
    return est[kind][0]

"""Peak-memory estimates for the LLM stages, checked before a stage starts against the budget
(:mod:`tasks.proc.budget`) and asked by a cluster build (the ``memory_estimate`` hook of every
LLM stage implementation: :func:`plan_estimate`).

Every LLM stage holds one part at a time, so its peak follows the largest part, not the model.
The estimates below are from the part's shape (``config.json``) and the recipe, with factors
measured on this project's benchmarks (benchmarks/README.md: Qwen2.5-0.5B and Qwen2.5-7B
shapes; the factor each term uses is named next to it). They are meant to catch a build that
cannot fit before it spends an hour, not to predict to the MiB.

When an estimate exceeds the memory available, :func:`tasks.proc.budget.check` raises
:class:`tasks.proc.budget.NotEnoughMemory` naming the recipe keys that lower it.
"""

from __future__ import annotations

from pathlib import Path

from tasks.proc.budget import BASE, GiB, NotEnoughMemory, available_bytes, check, held_bytes  # noqa: F401  (what the stages use)


#: what onnxruntime's quantizer and the quantize child add beyond BASE whatever the part's size:
#: the tiny Qwen2's quantize.part0 tree peak reached 0.824 GiB against 0.815 GiB estimated without
#: it (a fresh-clone CI run, 2026-12-07); 64 MiB keeps the estimate an upper bound
QUANTIZER = 64 << 20


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


def gptq_peak(config: dict, lo: int, hi: int, last: bool, seq_len: int, samples: int, qdq: int) -> int:
    """Peak bytes of sequential GPTQ (:mod:`tasks.qnn.seqgptq`) on part layers lo..hi-1 (+ the LM
    head when ``last``) with ``samples`` calibration prompts, after onnxruntime's quantizer has
    returned its memory, in the quantize child of the prefill graph: the QDQ graph (``qdq``
    bytes) + one input's Hessian in float32 (the widest of hidden, heads x head_dim and
    intermediate, squared: 1.34 GiB for Qwen2.5-7B's down_proj input) + torch's K x K workspace
    of its factor + the largest group's float32 weights twice (the piece's session and their
    dequantized GPTQ values: gate and up, 2 x hidden x intermediate) + 13 bytes per element of the
    largest single weight (its float32 values, scales, codes and dequantized values; an LM head
    is its widest chunk, :func:`tasks.llm.parts.split_sizes`: 77.8 M of a 0.86 B Qwen2's 155.6 M
    elements, GPTQ'd chunk by chunk) + 768 MiB of GPTQ chunks + the carried tensors (the
    residual stream and the next input, at most hidden + intermediate float32 values per row, per
    prefill feed [S rows] and decode feed [1 row]: at most 2 prefill and 4 decode feeds per
    prompt, :func:`tasks.llm.calibration_feeds.schedule`). With ``quantize.gptq_span`` the wide
    inputs' Hessians are diagonal blocks, smaller than counted here: the figure is then an upper
    bound."""
    from tasks.llm.parts import split_sizes

    D, I, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    H = config["num_attention_heads"]
    d = config.get("head_dim") or D // H
    kv = (config.get("num_key_value_heads") or H) * d
    widest = max(D, H * d, I) if hi > lo else D
    group = max(D * (H * d + 2 * kv), H * d * D, 2 * D * I) if hi > lo else 0
    biggest = max(D * I, H * d * D, D * max(split_sizes(D, V)) if last else 0)
    state = 4 * (D + max(H * d, I)) * (2 * samples * seq_len + 4 * samples)
    return BASE + qdq + 8 * widest * widest + 8 * group + 13 * biggest + 768 * 2**20 + state


def estimates(
    config: dict,
    ranges: list[tuple[int, int]],
    seq_len: int,
    context_len: int,
    embed_in_part: bool = True,
    weight_bits: int = 4,
    only: int | None = None,
    gptq_samples: int | None = None,
) -> dict:
    """Estimated peak bytes per LLM stage: ``{stage: (bytes, part index)}``, the largest part's
    (``only``: part ``only``'s, for a stage that builds one part).

    - export: the larger of the part's table (the embedding table in part 0, where a host-side
      lookup's ``.npy`` is written too, and the LM head in the last part) at 6 bytes per element
      (the float32 copy and what writing it adds) and its largest Linear weight
      (``hidden x max(intermediate, heads x head_dim)``) at 12: the float32 tensor read (4), its
      transposed contiguous copy (4; written without another copy: ``_WeightFile.add``), the
      bf16 tensor while it converts (2), with room. Measured: Qwen2.5-7B parts 0 and 3 (545
      M-element tables) 3.09-3.78 GiB (estimated 3.85); parts 1-2 1.32-1.35 GiB (1.56), and
      1.21-1.48 when writing copied the tensor once more (1.18 estimated then: over);
      Qwen2.5-0.5B parts 0 and 3 1.35-1.38 GiB (1.56), parts 1-2 0.42 (0.82)
      (benchmarks/README.md). Per part, not per model: the model's largest tensor at 8 bytes
      per element would be 4.9 GiB for each 7B part.
    - quantize: onnxruntime's quantizer holds the part's float32 weights once, plus the
      quantized copies (<= 2 bytes per weight: 16-bit Gather tables), plus one call's
      activations: the attention scores [1, H, S, C] float32 a few times over and the part's
      KV cache; the fp32 calibration run maps the same weights (file-backed pages).
      With GPTQ (``gptq_samples``: the calibration prompts), the larger of that and
      :func:`gptq_peak`.
    - compile: the QDQ graph of the part (weight_bits per weight, 16 bits for the embedding
      table) x 8: the weight-shared compile holds both graphs, each with the QNN HTP prepare's
      copies. Measured (benchmarks/README.md): Qwen2.5-7B part 0, 1.9 GB QDQ graph, shared
      compile 15.6 GiB, single-graph compiles 5.2 GiB; Qwen2.5-0.5B part 0, 3.70 GiB.
    - calibrate: one fp32 part (mapped) + 5 % + one call's activations + a prompt's KV cache
      twice (the fp32 run of the quantize estimate, without the quantizer; the 0.86 B Qwen2's
      parts 1-2 measured 1.63 GiB against 1.62 without the 5 %, benchmarks/README.md).
    - verify: one fp32 part (mapped) + one QDQ part + the KV caches of the verify prompts (the
      compiled side keeps every part's decode graph open only when they fit in the memory
      available: :func:`tasks.llm.compare.resident_bytes`).
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
        linear = D * max(config["intermediate_size"], H * d)  # the largest Linear weight
        edge_table = V * D if i in (0, len(ranges) - 1) else 0  # the embedding table / LM head
        n = part_params(config, lo, hi, i == 0, i == len(ranges) - 1, embed_in_part)
        table = V * D if (i == 0 and embed_in_part) else 0
        layers = hi - lo
        kv = layers * 2 * kvh * context_len * d * 4
        act = 4 * H * seq_len * context_len * 4 + 2 * kv
        qdq = (n - table) * weight_bits // 8 + table * 2
        cand = {
            "export": BASE + max(6 * edge_table, 12 * linear),
            "calibrate": BASE + int(4.2 * n) + act,
            "quantize": BASE + QUANTIZER + 4 * n + 2 * n + act,
            "compile": BASE + 8 * qdq,
            "verify": BASE + 4 * n + qdq + 6 * kv + act,
        }
        if gptq_samples is not None:
            cand["quantize"] = max(
                cand["quantize"], gptq_peak(config, lo, hi, i == len(ranges) - 1, seq_len, gptq_samples, qdq)
            )
        for k, v in cand.items():
            if v > best[k][0]:
                best[k] = (v, i)
    return best


def genie_quantize_estimate(
    config: dict,
    ranges: list[tuple[int, int]],
    seq_len: int,
    context_len: int,
    weight_bits: int,
    part: int,
    gptq_samples: int | None,
) -> int:
    """Estimated peak bytes of ``genie_quantize.part{part}`` (:mod:`tasks.llm.genie_quantize`) in
    a fresh process, whose children run one after the other: the larger of its first child's
    (the Genie export of parts 0..``part``, one tensor at a time: the largest export estimate
    among them; then the fp32 Genie graphs of every one of those parts open at once,
    :class:`tasks.llm.genie.host_loop.GenieHostLoop`: their weights mapped + 5 %, plus part
    ``part``'s calibrate activations) and its quantize child's (part ``part``'s quantize
    estimate, :func:`estimates`). The embedding is in part 0 (Genie's graphs take input_ids)."""
    per = [estimates(config, ranges, seq_len, context_len, True, weight_bits, i, gptq_samples) for i in range(part + 1)]
    n = [part_params(config, lo, hi, i == 0, i == len(ranges) - 1, True) for i, (lo, hi) in enumerate(ranges)]
    act = per[part]["calibrate"][0] - BASE - int(4.2 * n[part])  # the part's calls (estimates' calibrate)
    prep = max(max(e["export"][0] for e in per), BASE + int(4.2 * sum(n[: part + 1])) + act)
    return max(prep, per[part]["quantize"][0])


def check_genie_stage(
    stage: str,
    config: dict,
    *,
    parts: int,
    seq_len: int,
    context_len: int,
    part: int,
    weight_bits: int = 4,
    gptq_samples: int | None = None,
) -> int:
    """Check ``genie_quantize`` (:func:`genie_quantize_estimate`) or ``genie_compile`` (the
    compile estimate of the same part: the Genie graphs hold the genai graphs' weights) of part
    ``part`` against the budget, with everything this process holds (:func:`held_bytes`: their
    work runs in children). Returns the estimate in bytes; raises :class:`NotEnoughMemory`
    naming the recipe keys that lower it."""
    from tasks.llm.parts import split_for

    ranges = split_for(config, parts, True)
    if stage == "genie_quantize":
        est = genie_quantize_estimate(config, ranges, seq_len, context_len, weight_bits, part, gptq_samples)
    else:
        est = estimates(config, ranges, seq_len, context_len, True, weight_bits, part)["compile"][0]
    keys = f"export.parts (now {parts}: more parts, smaller parts) or export.context_length (now {context_len})"
    if stage == "genie_quantize":
        keys = (
            f"bundle.runtimes (now with genie: its calibration holds parts 0..{part} at once), "
            + keys
            + (
                f", quantize.calibration.samples (now {gptq_samples}) or quantize.rounding (now gptq)"
                if gptq_samples is not None
                else ""
            )
        )
    check(stage, est, part, held=held_bytes(True), recipe_keys=keys)
    return est


def check_stage(
    stage: str,
    config: dict,
    *,
    parts: int,
    seq_len: int,
    context_len: int,
    embed_in_part: bool = True,
    weight_bits: int = 4,
    part: int | None = None,
    gptq_samples: int | None = None,
    held: int = 0,
) -> int:
    """Estimate ``stage``'s peak for this model and export shape and :func:`check` it; returns
    the estimate in bytes. ``weight_bits``: of the quantized weights (``tasks/qnn/precisions.py``;
    compile and verify read them from the quantize output: :func:`weight_bits_of`).
    ``part``: the one part the stage builds (default: the largest part's estimate). ``held``:
    bytes the process running the stage holds already (:func:`tasks.proc.budget.held_bytes`), added
    to the estimate for the check. Raises :class:`NotEnoughMemory` (naming ``export.parts``,
    ``export.context_length``, ``export.sequence_length`` with their values; for export, whose
    peak follows the model's largest tensor, that no recipe key lowers it) or ValueError
    for a bad ``parts``."""
    from tasks.llm.parts import split_for

    ranges = split_for(config, parts, embed_in_part)
    est, part = estimates(config, ranges, seq_len, context_len, embed_in_part, weight_bits, part, gptq_samples)[stage]
    # the export holds one tensor at a time: its size is the model's, not the recipe's
    check(
        stage,
        est,
        part,
        held=held,
        recipe_keys=None
        if stage == "export"
        else f"export.parts (now {parts}: more parts, smaller parts), export.context_length (now {context_len}) or "
        f"export.sequence_length (now {seq_len})"
        + (
            f", quantize.calibration.samples (now {gptq_samples}) or quantize.rounding (now gptq)"
            if gptq_samples is not None and stage == "quantize"
            else ""
        ),
    )
    return est


#: what the LLM quantize stage writes beside its graphs: {"precision", "weight_bits"}, so the
#: stages after it count the weights at the recipe's own bits
QUANTIZED_AS = "quantize.json"


def weight_bits_of(folder, default: int = 4) -> int:
    """The weight bits a quantize output ``folder`` was made with (:data:`QUANTIZED_AS`), else
    ``default`` (4: what the memory checks assumed before the file existed)."""
    import json

    f = Path(folder) / QUANTIZED_AS
    return int(json.loads(f.read_text())["weight_bits"]) if f.is_file() else default


def check_export_stage(
    stage: str,
    export_dir,
    weight_bits: int = 4,
    part: int | None = None,
    gptq_samples: int | None = None,
    in_child: bool = False,
) -> int:
    """:func:`check_stage` for a stage whose input is an export (or a copy of one): the model
    config and the export shape are read from ``export_dir`` (``config.json``, ``export.json``).
    ``part``: the one part the stage builds (default: the largest part). What this process
    holds already is added (:func:`tasks.proc.budget.held_bytes`; ``in_child``: the stage's work
    runs in child processes, as quantize's and compile's)."""
    import json

    export_dir = Path(export_dir)
    desc = json.loads((export_dir / "export.json").read_text())
    cfg = json.loads((export_dir / "config.json").read_text(encoding="utf-8"))
    return check_stage(
        stage,
        cfg,
        parts=len(desc["parts"]),
        seq_len=desc["seq_len"],
        context_len=desc["context_len"],
        embed_in_part=desc["embed"] == "part0",
        weight_bits=weight_bits,
        part=part,
        gptq_samples=gptq_samples,
        held=held_bytes(in_child),
    )


def source_config(download_params: dict) -> dict:
    """The model's ``config.json`` from a download stage's params, without building anything:
    a local folder's (``path``/``package``), the facts kept in the repo for a Hub model at its
    revision (``recipes/models/``: :mod:`tasks.sources.model_facts`), or the Hub's single file
    (``hf_hub_download``, from the local Hub cache when ``HF_HUB_OFFLINE=1``). Raises OSError / the Hub's errors
    when it cannot be read."""
    import json

    if download_params.get("hf"):
        from tasks.sources.model_facts import config_of

        kept = config_of(download_params["hf"], download_params.get("revision"))
        if kept is not None:  # the facts kept in the repo (recipes/models/): no Hub needed
            return kept
        from huggingface_hub import hf_hub_download

        f = hf_hub_download(download_params["hf"], "config.json", revision=download_params.get("revision"))
    else:
        from tasks.sources import local_folder

        f = local_folder(download_params) / "config.json"
    return json.loads(Path(f).read_text(encoding="utf-8"))


def shape_download_estimate(config: dict) -> int:
    """Peak bytes of a shape build's download (:func:`tasks.sources.shape.write_checkpoint`):
    a shard of up to :data:`tasks.sources.shape.SHARD_BYTES` of bf16 tensors plus the tensor
    that passes it (2 bytes per element), while the next tensor is drawn (its float32 values
    and their scaled copy, then the bf16 copy: 10 bytes per element), and safetensors' bytes of
    the shard while it is saved (the shard again): with L the largest tensor's elements (the
    embedding table or LM head, V x D) and a shard no larger than the model's bf16 bytes (a
    small model is one shard), BASE + 2 x (shard + 2 L) + 10 L."""
    from tasks.sources.shape import SHARD_BYTES

    D, I, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    largest = max(V * D, D * I)
    shard = min(SHARD_BYTES, 2 * part_params(config, 0, config["num_hidden_layers"], True, True, True))
    return BASE + 2 * (shard + 2 * largest) + 10 * largest


def plan_estimate(specs: dict, stage: str) -> int:
    """Estimated peak bytes of ``stage`` of an LLM recipe's plan (``{stage name: StageSpec}``,
    as ``tasks.recipe.plan.expand`` makes it), known before any stage runs: the ``memory_estimate``
    hook of the LLM stages, what a cluster build asks of a worker's ``MEMORY`` resource.
    :func:`estimates` from the source's config.json and the export params (a patch stage
    counts as the quantize (before it) or compile (after it) of its model, ``genie_quantize``
    as :func:`genie_quantize_estimate`, ``genie_compile`` as its part's compile, a shape build's
    download as :func:`shape_download_estimate`, another download and the bundle as BASE).
    Raises what :func:`source_config` raises
    when the config cannot be read."""
    spec = specs[stage]
    if spec.kind == "download" and spec.params.get("shape"):
        return shape_download_estimate(source_config(spec.params))
    if spec.kind in ("download", "bundle"):
        return BASE
    by_kind = {s.kind: s for s in specs.values()}
    ex = by_kind["export"].params
    from tasks.llm.parts import split_for

    cfg = source_config(by_kind["download"].params)
    from tasks.qnn.precisions import get as get_precision

    bits = get_precision(by_kind["quantize"].params["precision"]).weight_bits
    embed_in_part = ex.get("embedding", "first-part") == "first-part"
    q = by_kind["quantize"].params
    samples = by_kind["calibrate"].params["calibration"]["samples"] if "calibrate" in by_kind else 0
    est = estimates(
        cfg,
        split_for(cfg, ex["parts"], embed_in_part),
        ex["sequence_length"],
        ex["context_length"],
        embed_in_part,
        bits,
        spec.part,
        samples if q.get("rounding") == "gptq" else None,
    )
    if spec.kind == "genie_quantize":
        return genie_quantize_estimate(
            cfg,
            split_for(cfg, ex["parts"], True),
            ex["sequence_length"],
            ex["context_length"],
            bits,
            spec.part,
            samples if q.get("rounding") == "gptq" else None,
        )
    kind = spec.kind.removeprefix("genie_")
    if kind == "patch":
        kind = "quantize" if specs[spec.inputs["model"]].kind == "export" else "compile"
    return est[kind][0]


def plan_keys(specs: dict, stage: str) -> str | None:
    """The recipe keys that lower :func:`plan_estimate` of ``stage``, with their values now, as
    the stage's own check names them (the LLM family's ``memory_keys`` hook): None for
    the download, the bundle and the export (its peak follows the model's largest tensor)."""
    spec = specs[stage]
    if spec.kind in ("download", "bundle", "export"):
        return None
    by_kind = {s.kind: s for s in specs.values()}
    ex, q = by_kind["export"].params, by_kind["quantize"].params
    keys = (
        f"export.parts (now {ex['parts']}: more parts, smaller parts), export.context_length (now "
        f"{ex['context_length']}) or export.sequence_length (now {ex['sequence_length']})"
    )
    gptq = q.get("rounding") == "gptq" and "calibrate" in by_kind
    if spec.kind in ("quantize", "genie_quantize") and gptq:
        samples = by_kind["calibrate"].params["calibration"]["samples"]
        keys += f", quantize.calibration.samples (now {samples}) or quantize.rounding (now gptq)"
    if spec.kind == "genie_quantize":
        keys = f"bundle.runtimes (now with genie: its calibration holds parts 0..{spec.part} at once), " + keys
    if spec.kind == "verify":
        keys += f", verify.data.samples (now {spec.params['data']['samples']})"
    return keys

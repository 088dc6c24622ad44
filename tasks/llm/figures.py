"""On-device figures of an LLM recipe per target: what its bundle weighs, what it holds in
memory on the device, and two **ceilings** from the target's published figures
(:mod:`tasks.qnn.targets`). They bound what a device can do; they are not measurements (nothing
here runs on a Snapdragon). Units: bytes, GB/s = 10^9 bytes/s, TOPS = 10^12 ops/s, seconds.

- **bundle bytes**: once built, the sum of the shipped context binaries' sizes as verify read
  them back (``verify.json`` ``"binaries"``: the weight-shared ``shared/part*`` binaries, else
  all); before, estimated from the model's config and the precision: every MatMul weight at
  ``weight_bits`` plus one 4-bit scale per ``block_size`` weights (LPBQ), the token table at
  ``embedding_bits`` (4-bit precision) or 16 bits, norms and biases at 16 bits
  (:func:`estimated_bundle_bytes`; Qwen2.5-7B w4a16: 4.14 GB estimated vs 4.37 GB built,
  README "LLMs").
- **per runtime layout** (``"runtimes"``: ``genai``, and ``genie`` when the bundle serves it):
  what one decode (AR-1) call and one prefill window (AR-S) move across the graphs' boundary,
  bytes read (inputs) and written (outputs), the KV cache's among them, and the KV cache held on
  the device. Once built, from the read-back shipped binaries' I/O tensors (dtype and shape as
  libQnnSystem reports them: :func:`layout_traffic`); before, from the config: genai's graphs
  read and rewrite the whole [1, Hkv, C, d] buffer per layer every call (onnxruntime-genai
  0.18.0 gives a pipeline model no new-slots-only cache: :mod:`tasks.llm.genai`), Genie's read
  C - AR slots and write the AR new ones (Genie keeps the cache: :mod:`tasks.llm.genie.graphs`), each at
  ``quantize.kv_bits`` (8: uint8).
- **memory on the device** = weights (bundle bytes) + KV cache at its real type + spill-fill +
  I/O buffers other than the cache (the largest graph of each binary; unknown before a build)
  + the runtime's own, which is *not included*: not measured here and no public figure was found.
- **decode ceiling** (tokens/s) = DRAM bandwidth / bytes moved per decoded token, where bytes
  moved = the weights every token streams (the binaries holding a decode graph, less the token
  table, of which one row is read; without weight sharing the prefill graphs' own binaries are
  not read per token) + what the decode graphs read and write at their boundary (the KV cache above; once
  built, every I/O tensor). Compute, caches and the runtime can only make it slower. The
  top-level figures are those of the recipe's runtime that moves the fewest bytes per token
  (``"runtime"``).
- **first-token lower bound** (s) for a prompt of ``export.sequence_length`` tokens = the
  prefill graph's ops / the NPU's peak: 2 ops per multiply-add of every MatMul weight (the LM
  head included, the table lookup not) per token, plus the attention's 2 x 2 x heads x
  head_dim x S x C (scores and weighted sum over the static context). The peak is the INT8
  TOPS figure; w4a16 MatMuls run with 16-bit activations, no faster than that, so it bounds.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.llm.boundary import kv_cache
from tasks.llm.memory import part_params
from tasks.qnn.precisions import Precision

CEILING_NOTE = (
    "ceilings, not measurements: decode tokens/s = DRAM bandwidth / bytes read and written per token; first-token "
    "time >= prefill ops / NPU peak ops; the runtime's own memory is not included (not measured, no public "
    "figure found)"
)
RUNTIME_NOTE = (
    "not included: the runtime's own memory (QNN libraries, HTP sessions, onnxruntime-genai) is not "
    "measured here and no public figure was found"
)


def _dims(c: dict) -> tuple[int, int, int, int, int, int]:
    H = c["num_attention_heads"]
    d = c.get("head_dim") or c["hidden_size"] // H
    return c["num_hidden_layers"], c["hidden_size"], H, c.get("num_key_value_heads") or H, d, c["vocab_size"]


def parameters(config: dict) -> int:
    """The model's parameters from its config (a tied LM head counted once), as the Hub counts."""
    L, D, H, Hkv, d, V = _dims(config)
    n = part_params(config, 0, L, True, True, True)
    return n - (V * D if config.get("tie_word_embeddings") else 0)


def _table_bits(recipe, precision: Precision) -> int:
    return recipe.quantize.embedding_bits if precision.weight_bits == 4 else 16


def estimated_bundle_bytes(config: dict, recipe, precision: Precision) -> int:
    """Bytes of the bundle's weights estimated from ``config`` and the recipe's ``precision``
    (its ``quantize.precision`` resolved): the embedding table in part 0 at the table bits, every
    other weight element (the LM head a copy of its own even when tied) at ``weight_bits``, plus
    4 bits per ``block_size`` elements (LPBQ scales) when block-wise."""
    L, D, H, Hkv, d, V = _dims(config)
    n = part_params(config, 0, L, True, True, recipe.export.embedding == "first-part")
    table = V * D if recipe.export.embedding == "first-part" else 0
    rest = n - table
    scales = rest // recipe.quantize.block_size // 2 if recipe.quantize.block_size else 0
    return rest * precision.weight_bits // 8 + scales + table * _table_bits(recipe, precision) // 8


def kv_cache_bytes(config: dict, context: int, element_bytes: int = 1) -> int:
    """Bytes of the KV cache at ``context`` positions: every layer's K and V, ``element_bytes``
    each (1: ``quantize.kv_bits`` 8)."""
    L, D, H, Hkv, d, V = _dims(config)
    return L * 2 * Hkv * context * d * element_bytes


def estimated_traffic(config: dict, recipe, runtime: str) -> dict:
    """The KV cache's figures of ``runtime``'s layout before a build (module docstring):
    {"kv_dtype", "kv_cache_bytes", "decode": {"kv_read", "kv_written"}, "prefill": {...},
    "from"}; bytes."""
    ex = recipe.export
    b = recipe.quantize.kv_bits // 8
    C, S = ex.context_length, ex.sequence_length
    kv = lambda n: kv_cache_bytes(config, n, b)  # noqa: E731
    if runtime == "genie":
        decode, prefill = {"kv_read": kv(C - 1), "kv_written": kv(1)}, {"kv_read": kv(C - S), "kv_written": kv(S)}
    else:
        decode = prefill = {"kv_read": kv(C), "kv_written": kv(C)}
    return {
        "kv_dtype": {1: "uint8", 2: "uint16", 4: "float32"}[b],
        "kv_cache_bytes": kv(C),
        "decode": dict(decode),
        "prefill": dict(prefill),
        "from": "estimated from the config (not built): the KV cache only",
    }


def prefill_ops(config: dict, seq: int, context: int) -> int:
    """Ops (multiply and add counted apart) of one prefill call of ``seq`` tokens over a static
    ``context``: 2 x MatMul weights (no table lookup) x seq + 4 x layers x heads x head_dim x
    seq x context (attention scores and weighted sum)."""
    L, D, H, Hkv, d, V = _dims(config)
    weights = part_params(config, 0, L, True, True, False)  # no embedding table, LM head included
    return 2 * weights * seq + 4 * L * H * d * seq * context


def shipped_binaries(binaries: dict, runtime: str = "genai") -> dict:
    """The binaries ``runtime``'s bundle layout ships, from ``verify.json`` ``"binaries"``
    ({path: figures}): genai's weight-shared ``shared/part*`` ones, else its per-graph
    ``part*/``; Genie's ``genie/*_part_{i}_of_{N}.bin``, else its per-graph ``genie/part*/``."""
    if runtime == "genie":
        own = {k: v for k, v in binaries.items() if k.startswith("genie/")}
        shared = {k: v for k, v in own.items() if k.count("/") == 1}
    else:
        own = {k: v for k, v in binaries.items() if not k.startswith("genie/")}
        shared = {k: v for k, v in own.items() if k.startswith("shared/")}
    return shared or own


def _ar(graph: dict) -> int | None:
    """Tokens per call of a read-back graph: the second dim of its first input (``input_ids``
    [1, S] or ``hidden_states_{i}`` [1, S, D])."""
    ins = graph.get("inputs") or []
    return ins[0][2][1] if ins and len(ins[0][2]) >= 2 else None


def layout_traffic(binaries: dict, runtime: str) -> dict | None:
    """What ``runtime``'s shipped binaries (:func:`shipped_binaries`) move and hold, from their
    read-back I/O tensors ([name, dtype, shape, bytes] per tensor,
    :meth:`tasks.qnn.context_binary.ContextBinary.figures`): {"kv_dtype", "kv_cache_bytes", "decode" / "prefill":
    {"read", "written", "kv_read", "kv_written", "tokens"}, "io_buffer_bytes", "spill_fill_bytes", "bundle_bytes",
    "decode_binary_bytes" (the binaries holding a decode graph: what a decoded token streams),
    "from"};
    bytes, summed over the parts' graphs of that AR. The KV cache held = the decode graphs' KV
    inputs, plus their KV outputs for Genie (one buffer per layer holds both: Genie's
    ``KVCache``; genai shares the past and present buffer, which the graph rewrites whole); I/O
    buffers = the other tensors of each binary's largest graph. None when no shipped binary
    lists its tensors (built before they were recorded)."""
    shipped = shipped_binaries(binaries, runtime)
    graphs = [(b, g) for b in shipped.values() for g in b.get("graphs", {}).values()]
    if not graphs or not all("inputs" in g for _, g in graphs):
        return None
    kv = lambda ts: sum(t[3] for t in ts if kv_cache(t[0]))  # noqa: E731
    names = {"FLOAT": "float32", "FLOAT16": "float16"}
    out = {
        "kv_dtype": ", ".join(
            sorted({names.get(t[1], t[1].lower()) for _, g in graphs for t in g["inputs"] if kv_cache(t[0])})
        ),
        "from": f"read back: {len(shipped)} shipped context binaries",
    }
    for kind, test in (("decode", lambda n: n == 1), ("prefill", lambda n: n is not None and n > 1)):
        gs = [g for _, g in graphs if test(_ar(g))]
        out[kind] = {
            "read": sum(t[3] for g in gs for t in g["inputs"]),
            "written": sum(t[3] for g in gs for t in g["outputs"]),
            "kv_read": sum(kv(g["inputs"]) for g in gs),
            "kv_written": sum(kv(g["outputs"]) for g in gs),
            "tokens": max((_ar(g) for g in gs), default=None),
        }
    out["kv_cache_bytes"] = out["decode"]["kv_read"] + (out["decode"]["kv_written"] if runtime == "genie" else 0)
    other = lambda g: sum(t[3] for t in g["inputs"] + g["outputs"] if not kv_cache(t[0]))  # noqa: E731
    out["io_buffer_bytes"] = sum(max(other(g) for g in b["graphs"].values()) for b in shipped.values() if b["graphs"])
    out["spill_fill_bytes"] = sum(
        max((g.get("spill_fill_bytes") or 0 for g in b["graphs"].values()), default=0) for b in shipped.values()
    )
    out["bundle_bytes"] = sum(b.get("bytes") or 0 for b in shipped.values())
    # what a decoded token streams: the binaries that hold a decode graph (a weight-shared
    # binary whole; without weight sharing the decode graph's own binary, not the prefill's)
    out["decode_binary_bytes"] = sum(
        b.get("bytes") or 0 for b in shipped.values() if any(_ar(g) == 1 for g in b.get("graphs", {}).values())
    )
    return out


def device_figures(config: dict, recipe, target: str, binaries: dict | None = None) -> dict:
    """The on-device figures of ``recipe`` (model ``config``) on ``target`` (module docstring:
    formulas, units, what is and is not included), each with where it came from: per runtime
    of ``bundle.runtimes`` under ``"runtimes"``, and at the top level those of the runtime that
    moves the fewest bytes per decoded token (``"runtime"``)."""
    from tasks.qnn.precisions import get as get_precision
    from tasks.qnn.targets import get as get_target

    t = get_target(target)
    precision = get_precision(recipe.quantize.precision)
    ex = recipe.export
    L, D, H, Hkv, d, V = _dims(config)
    table_bits = _table_bits(recipe, precision)
    table_bytes = (V * D * table_bits // 8) if ex.embedding == "first-part" else 0
    ops = prefill_ops(config, ex.sequence_length, ex.context_length)
    per = {}
    for rt in recipe.bundle.runtimes:
        traffic = layout_traffic(binaries or {}, rt)
        built = traffic is not None
        if not built:
            traffic = estimated_traffic(config, recipe, rt)
            bundle = estimated_bundle_bytes(config, recipe, precision)
            bundle_from = "estimated from the model's config and the recipe's precision (not built)"
            spill = io = None
            dec = {"read": traffic["decode"]["kv_read"], "written": traffic["decode"]["kv_written"]}
            streamed = bundle
        else:
            bundle, spill, io = traffic["bundle_bytes"], traffic["spill_fill_bytes"], traffic["io_buffer_bytes"]
            bundle_from = traffic["from"]
            dec = traffic["decode"]
            streamed = traffic["decode_binary_bytes"]
        weights_read = streamed - table_bytes + (D * table_bits // 8 if table_bytes else 0)
        per_token = weights_read + dec["read"] + dec["written"]
        kv = traffic["kv_cache_bytes"]
        per[rt] = {
            "bundle_bytes": bundle,
            "bundle_bytes_from": bundle_from,
            "kv_dtype": traffic["kv_dtype"],
            "kv_cache_bytes": kv,
            "context_length": ex.context_length,
            "spill_fill_bytes": spill,
            "io_bytes": io,
            "memory_bytes": bundle + kv + (spill or 0) + (io or 0),
            "memory_includes": ["weights", "kv_cache"] + (["spill_fill", "io_buffers"] if built else []),
            "memory_note": (
                "weights + KV cache + spill-fill + I/O buffers (read back)"
                if built
                else "weights + KV cache; spill-fill and I/O buffers are known once built (read back from the binaries)"
            )
            + "; "
            + RUNTIME_NOTE,
            "weight_bytes_read_per_token": weights_read,
            "kv_bytes_read_per_token": traffic["decode"]["kv_read"],
            "kv_bytes_written_per_token": traffic["decode"]["kv_written"],
            "io_bytes_read_per_token": dec["read"],
            "io_bytes_written_per_token": dec["written"],
            "bytes_per_token": per_token,
            "bytes_per_token_over_weights": per_token / weights_read,
            "prefill_window": traffic["prefill"],
            "decode_tokens_per_s_ceiling": (t.dram_gbps * 1e9 / per_token) if t.dram_gbps else None,
        }
    best = min(per, key=lambda rt: per[rt]["bytes_per_token"])
    return {
        **per[best],
        "runtime": best,
        "runtimes": per,
        "runtime_bytes": None,
        "runtime_note": RUNTIME_NOTE,
        "dram_gbps": t.dram_gbps,
        "dram_source": t.dram_source,
        "npu_tops": t.npu_tops,
        "npu_source": t.npu_source,
        "prefill_length": ex.sequence_length,
        "prefill_ops": ops,
        "first_token_s_lower_bound": (ops / (t.npu_tops * 1e12)) if t.npu_tops else None,
        "note": CEILING_NOTE,
    }


def recipe_config(recipe, download_out: Path | None = None) -> tuple[dict | None, str]:
    """(config, where it was read) of an LLM recipe's model without building anything: the
    download entry's ``config.json`` when given, a local source's, or the facts kept in the repo
    for a Hub model (``recipes/models/``); (None, why) when none can be read."""
    from tasks.sources import SourceError, local_folder
    from tasks.sources.model_facts import find

    src = recipe.source
    files = [(download_out / "config.json" if download_out else None, "the download's config.json")]
    if src.path is not None or src.package is not None:
        try:
            files.append((local_folder(src.model_dump(exclude_none=True)) / "config.json", "the source's config.json"))
        except SourceError:
            pass
    for f, where in files:
        if f is not None and Path(f).is_file():
            try:
                return json.loads(Path(f).read_text(encoding="utf-8")), where
            except (OSError, ValueError):
                continue
    hit = find(recipe.source.hf, recipe.source.revision)
    if hit:
        return dict(hit[1]["config"]), f"recipes/models/{hit[0].name} ({hit[1].get('config_source', '')})"
    return None, "no config.json readable offline and no facts kept in recipes/models/"


def plan_lines(recipe) -> list[str]:
    """What ``doit explain`` prints of an LLM recipe before any stage runs: its parts (layer
    ranges), each stage's estimated peak memory (:func:`tasks.llm.memory.estimates`, the largest
    part) and disk (checkpoint, fp32 export, QDQ graphs, bundle), and the on-device figures per
    target (the LLM family's ``plan_lines``); one line saying why when the config cannot be read."""
    from tasks.qnn.precisions import get
    from tasks.llm.memory import GiB, estimates
    from tasks.llm.parts import split_for

    cfg, where = recipe_config(recipe)
    if cfg is None:
        return [f"plan: unknown ({where})"]
    ex = recipe.export
    embed = ex.embedding == "first-part"
    ranges = split_for(cfg, ex.parts, embed)
    precision = get(recipe.quantize.precision)
    est = estimates(cfg, ranges, ex.sequence_length, ex.context_length, embed, precision.weight_bits)
    n = part_params(cfg, 0, cfg["num_hidden_layers"], True, True, embed)
    bundle = estimated_bundle_bytes(cfg, recipe, precision)
    out = [
        f"model: {where}",
        f"parameters: {parameters(cfg) / 1e9:.2f} B; parts: {ex.parts}, layers "
        + ", ".join(f"[{lo}, {hi})" for lo, hi in ranges),
        "memory estimate per stage (largest part, GiB): "
        + ", ".join(f"{k} {v / GiB:.2f} (part {p})" for k, (v, p) in est.items()),
        f"disk estimate (GB): checkpoint {parameters(cfg) * 2 / 1e9:.1f} (bf16), fp32 export {n * 4 / 1e9:.1f}, "
        f"QDQ graphs {bundle / 1e9:.1f}, bundle {bundle / 1e9:.2f}",
    ]
    for t in recipe.compile.targets:
        f = device_figures(cfg, recipe, t)
        dec = (
            f"{f['decode_tokens_per_s_ceiling']:.1f} tokens/s"
            if f["decode_tokens_per_s_ceiling"]
            else "unknown (no DRAM figure)"
        )
        ftl = (
            f"{f['first_token_s_lower_bound'] * 1000:.0f} ms"
            if f["first_token_s_lower_bound"]
            else "unknown (no NPU figure)"
        )
        out.append(
            f"on {t} ({f['runtime']} layout): memory {f['memory_bytes'] / 1e9:.2f} GB (weights + KV cache at "
            f"{ex.context_length}, {f['kv_dtype']}), {f['bytes_per_token'] / 1e9:.2f} GB moved per token "
            f"({f['bytes_per_token_over_weights']:.3f} x the weights read), decode ceiling {dec}, first token "
            f">= {ftl} for {ex.sequence_length} tokens (ceilings)"
        )
    return out


def catalog_figures(recipe, download_out: Path | None, binaries: dict) -> dict:
    """The catalog row's ``parameters_estimate`` and ``device`` (per target of the recipe,
    :func:`device_figures`, with that target's read-back binaries when ``binaries`` has them);
    nulls when the model's config cannot be read offline (:func:`recipe_config`)."""
    cfg, _ = recipe_config(recipe, download_out)
    if cfg is None:
        return {"parameters_estimate": None, "device": None}
    return {
        "parameters_estimate": parameters(cfg),
        "device": {t: device_figures(cfg, recipe, t, binaries.get(t)) for t in recipe.compile.targets},
    }

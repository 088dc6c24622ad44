"""How a decoder's layers are split into parts (the unit of memory and of NPU sessions), and
how a part's widest weights are split into chunks (:func:`split_sizes`): the arithmetic that
both the exporter and the memory estimates (:mod:`tasks.llm.memory`) follow."""

from __future__ import annotations

from functools import lru_cache

from tasks.errors import InputError

# Largest weight initializer, in elements. onnxruntime's quantizer holds about four float copies
# of the tensor it is quantizing (quant_utils.quantize_nparray: astype, divide, round, add), so a
# 545 M-element table (Qwen2.5-7B's embedding or LM head, 2.2 GB in float32) alone cost ~9 GB
# (measured: 2.4 GB peak for a 0.55 GB Gather table). Wider tables are split along their output
# axis into equal chunks (then a Concat): exact in float32, and per-channel weight scales are
# unchanged; a 16-bit Gather table gets one scale per column group instead of one.
MAX_TENSOR_ELEMENTS = 1 << 27


def split_sizes(rows: int, cols: int, limit: int = MAX_TENSOR_ELEMENTS) -> list[int]:
    """Column counts of the chunks a [rows, cols] weight is split into so that each chunk has at
    most ``limit`` elements: the fewest equal chunks (a divisor of ``cols``), else near-equal."""
    if rows * cols <= limit:
        return [cols]
    k = -(-rows * cols // limit)
    for n in range(k, cols + 1):
        if cols % n == 0 and rows * (cols // n) <= limit:
            return [cols // n] * n
    base, rem = divmod(cols, k)
    return [base + (1 if i < rem else 0) for i in range(k)]


def layer_elements(config: dict) -> int:
    """Weight elements of one decoder layer from a HF ``config.json`` dict: the q, k, v, o
    projections and the three MLP projections (norm scales and biases are negligible)."""
    D, H = config["hidden_size"], config["num_attention_heads"]
    d = config.get("head_dim") or D // H
    kv = config.get("num_key_value_heads") or H
    return D * H * d * 2 + D * kv * d * 2 + 3 * D * config["intermediate_size"]


def split_for(config: dict, parts: int, embed_in_part: bool = True) -> list[tuple[int, int]]:
    """The parts of a model: :func:`split_layers` with part 0 also weighing the token
    embedding (when it is in part 0) and the last part the LM head, each ``vocab x hidden``
    elements counted in layers (:func:`layer_elements`). Qwen2.5-7B in 4 parts: the
    embedding and the head weigh 2.3 layers each, so (6, 8, 8, 6) layers instead of 7 each:
    part 0 holds 1.9 (not 2.2) billion elements, as do parts 1 and 2 (with equal layer counts,
    part 0's compile would be the stage over its memory bar)."""
    table = config["vocab_size"] * config["hidden_size"] / layer_elements(config)
    return split_layers(config["num_hidden_layers"], parts, table if embed_in_part else 0.0, table)


def split_layers(n_layers: int, parts: int, first_extra: float = 0.0, last_extra: float = 0.0) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) ranges of ``n_layers`` layers in ``parts`` parts, each with at least
    one layer, that make the heaviest part as light as possible when part 0 weighs
    ``first_extra`` layers more and the last part ``last_extra`` more (the embedding and the LM
    head: :func:`split_for`). Among equally good splits, earlier parts get more layers; with no
    extras that is the even split, the remainder going to the earlier parts. Raises ValueError if
    parts < 1 or parts > n_layers."""
    if not 1 <= parts <= n_layers:
        raise InputError(f"parts must be in [1, {n_layers}], got {parts}")
    sizes = _best(n_layers, parts, round(first_extra, 6), round(last_extra, 6))[1]
    out, lo = [], 0
    for s in sizes:
        out.append((lo, lo + s))
        lo += s
    return out


@lru_cache(maxsize=256)
def _best(n: int, parts: int, first: float, last: float) -> tuple[float, tuple[int, ...]]:
    """(heaviest part's weight, sizes) over splits of n layers into parts parts: exhaustive by
    dynamic programming on the first part's size (n and parts are small: tens of layers)."""
    if parts == 1:  # ``first``: what the part being sized weighs beyond its layers
        return (n + first + last, (n,))
    best = None
    for k in range(n - parts + 1, 0, -1):  # larger first parts first: they win ties
        rest = _best(n - k, parts - 1, 0.0, last)
        cand = (max(k + first, rest[0]), (k, *rest[1]))
        if best is None or cand[0] < best[0] - 1e-9:
            best = cand
    return best

"""How a decoder's layers are split into parts (the unit of memory and of NPU sessions)."""

from __future__ import annotations


def split_layers(n_layers: int, parts: int) -> list[tuple[int, int]]:
    """Even split of ``n_layers`` into ``parts`` contiguous [lo, hi) ranges (earlier parts get the
    remainder). Raises ValueError if parts < 1 or parts > n_layers."""
    if not 1 <= parts <= n_layers:
        raise ValueError(f"parts must be in [1, {n_layers}], got {parts}")
    base, rem = divmod(n_layers, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + base + (1 if i < rem else 0)
        out.append((lo, hi))
        lo = hi
    return out

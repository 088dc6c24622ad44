"""The catalog's states in their order and its number formats (no import of the package: the
page's tables use them without the row schema)."""

from __future__ import annotations

#: what the catalog says of a recipe, best first
STATES = ("verified", "verify-failed", "built-no-bars", "stale", "not-built", "shape-built", "unsupported")


def state_order(state: str) -> int:
    """The sort value of a state: its place in :data:`STATES` (best first), a state not
    listed there after them."""
    return STATES.index(state) if state in STATES else len(STATES)


def human_bytes(n) -> str:
    """Bytes in decimal units (kB, MB, GB = 10^3, 10^6, 10^9 bytes), one decimal; "" for None."""
    if n is None:
        return ""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def human_count(n) -> str:
    """A parameter count in B (10^9) or M (10^6); "" for None."""
    if n is None:
        return ""
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else str(n)

"""A process's peak resident set size, from Linux's ``/proc`` (None elsewhere): what the stage
table of ``benchmarks/bench_llm.py`` and the LLM stages' per-part rows report."""

from __future__ import annotations

from pathlib import Path


def proc_bytes(path: str, field: str) -> int | None:
    """A ``<field>: <n> kB`` line of a Linux /proc file, in bytes; None where it is absent."""
    try:
        for ln in Path(path).read_text().splitlines():
            if ln.startswith(field + ":"):
                return int(ln.split()[1]) * 1024
    except OSError:
        return None
    return None


def peak_rss() -> int | None:
    """This process's peak resident set size in bytes (VmHWM) since start or the last
    :func:`peak_rss_reset`; None where ``/proc`` is absent."""
    return proc_bytes("/proc/self/status", "VmHWM")


#: the largest :func:`peak_rss` a reset cleared since :func:`peak_rss_restart` (what a stage's
#: tree peak keeps when code inside the stage resets VmHWM to measure a part of its own)
_CLEARED = 0


def peak_rss_reset() -> None:
    """Reset this process's peak RSS (VmHWM) so :func:`peak_rss` measures from now on
    (Linux ``/proc/self/clear_refs`` value 5, since Linux 4.0); the peak it clears is kept for
    :func:`peak_rss_since_restart`. A no-op elsewhere."""
    global _CLEARED
    _CLEARED = max(_CLEARED, peak_rss() or 0)
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_rss_restart() -> None:
    """Reset this process's peak RSS and forget the peaks earlier resets cleared: a stage
    starts (:class:`tasks.proc.tree.TreeMeter`)."""
    global _CLEARED
    peak_rss_reset()
    _CLEARED = 0


def peak_rss_since_restart() -> int | None:
    """This process's peak resident set size since :func:`peak_rss_restart`, whatever resets
    came between (an LLM export resets VmHWM per part it writes); None where ``/proc`` is absent."""
    now = peak_rss()
    return None if now is None else max(now, _CLEARED)

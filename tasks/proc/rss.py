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


def peak_rss_reset() -> None:
    """Reset this process's peak RSS (VmHWM) so :func:`peak_rss` measures from now on
    (Linux ``/proc/self/clear_refs`` value 5, since Linux 4.0). A no-op elsewhere."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass

"""Why npubuild refuses doit's thread mode (:data:`THREAD_MODE`) and how it is asked for
(:func:`thread_mode`): said when doit starts and by a stage task run in a thread."""

from __future__ import annotations

THREAD_MODE = (
    "-P thread: npubuild runs stages in processes: use `doit -n N` without `-P thread` (a stage "
    "redirects its process's stdout/stderr into its log, and the exporters are not "
    "thread-safe: concurrent exports failed in thread mode)"
)


def thread_mode(argv: list[str]) -> bool:
    """Whether a doit command line asks for thread-parallel tasks (``-P thread``, ``-Pthread``,
    ``--parallel-type thread``, ``--parallel-type=thread``): refused when doit starts, as a
    no-op too (else a no-op passes and a stale build fails at its first stage)."""
    for i, a in enumerate(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if a in ("-P", "--parallel-type") and nxt == "thread" or a in ("-Pthread", "--parallel-type=thread"):
            return True
    return False

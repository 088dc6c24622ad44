"""Whether a process of this host is alive: what lock and temp-file cleanup ask before they
take what a dead process left (cache key locks, the plan cache's and doit's temp files)."""

from __future__ import annotations

import os
from pathlib import Path


def process_state(pid: int) -> str:
    """ "running", "stopped" (SIGSTOP'd or traced: state T/t in ``/proc/<pid>/stat``) or "gone"
    for a process of this host. Without ``/proc`` a live process counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return "running"
    return {"T": "stopped", "t": "stopped", "Z": "gone", "X": "gone"}.get(fields[0], "running")

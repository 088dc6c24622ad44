"""Peak RSS of a whole process tree for the benchmarks: VmRSS summed over a process and its
descendants (from /proc), sampled on a thread. Pages shared between a parent and its child
count twice; a peak shorter than the sampling period is missed."""

from __future__ import annotations

import os
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss(root: int) -> int:
    """Bytes of VmRSS summed over ``root`` and its descendants (from /proc)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            pass
        todo += kids.get(p, [])
    return total


class TreeSampler:
    """Samples :func:`tree_rss` of ``pid`` every ``period`` seconds on a daemon thread until
    :meth:`stop`: ``samples`` is a list of (epoch seconds, bytes)."""

    def __init__(self, pid: int, period: float = 1.0):
        self.pid, self.period, self.samples = pid, period, []
        self._done = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)
        self._th.start()

    def _run(self) -> None:
        while True:
            self.samples.append((time.time(), tree_rss(self.pid)))
            if self._done.wait(self.period):
                return

    def stop(self) -> None:
        self._done.set()
        self._th.join()

    @property
    def peak(self) -> int:
        return max((b for _, b in self.samples), default=0)

    def peak_between(self, start: float, end: float) -> int | None:
        """The largest sample taken in [start, end] (epoch seconds), None when there is none."""
        got = [b for t, b in self.samples if start <= t <= end]
        return max(got) if got else None

"""The peak memory of a stage's whole process tree: the stage's process and the children it
starts (:mod:`tasks.proc.child`), what the memory budget promises (``NPUBUILD_MEMORY_GB``:
:mod:`tasks.proc.budget`) and what each stage's manifest records beside its estimate.

Measured, not sampled: the stage's process reports its own peak resident set (``VmHWM``, reset
when the stage starts: :func:`tasks.proc.rss.peak_rss_reset`) and every child its own (``VmHWM``
read at its exit, :mod:`tasks.proc.child`); while a child runs, the stage's process waits for
it, holding what it held when the child started (its ``VmRSS`` then, or when the child ended,
whichever is larger). So the tree's peak is at most the largest of the stage process's peak and,
for each child, what the stage process held around it plus the peaks of every child that ran
at the same time (the encoder verify runs its HTP children side by side). A figure no lower
than the tree's real peak, exact when children run one at a time and peak while the stage
process waits; a sample taken every so often can miss a peak shorter than its period.

Children of children are not counted: none of the stages' children starts processes of its
own (the QNN EP, onnxruntime-genai and Genie run inside the child). Linux only (``/proc``);
elsewhere every figure is None.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from tasks.proc.rss import peak_rss, peak_rss_reset, peak_rss_restart, peak_rss_since_restart, proc_bytes


def rss_now() -> int | None:
    """This process's resident set now (``VmRSS``, bytes); None where ``/proc`` is absent."""
    return proc_bytes("/proc/self/status", "VmRSS")


@dataclass
class _Child:
    start: float
    held: int  # this process's VmRSS when the child started (then the larger of that and at its end)
    end: float = float("inf")
    peak: int | None = None


@dataclass
class TreeMeter:
    """Measures one stage's tree from :meth:`start` on (one meter at a time per process:
    :func:`measure`). :meth:`figures` gives {"tree_peak", "stage_peak", "children_peak",
    "children"} in bytes (None where unknown)."""

    children: list[_Child] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: {name: figures} of the phases measured apart (:meth:`phase`)
    phases: dict = field(default_factory=dict)

    def start(self) -> None:
        """Reset this process's peak (``VmHWM``): the stage's own from here (resets inside
        the stage keep what they clear: :func:`tasks.proc.rss.peak_rss_since_restart`)."""
        peak_rss_restart()

    @contextmanager
    def phase(self, name: str):
        """Measure one phase of the stage apart (the verify stage's runtimes, one after the
        other): this process's peak from the phase's start (``VmHWM`` reset then; the stage's
        own peak keeps what came before) and the children started in it, as :meth:`figures`
        bounds the tree. Yields a dict that gets {"peak", "stage_peak", "children_peak"} (bytes)
        when the phase ends, also kept in :attr:`phases` under ``name``."""
        peak_rss_reset()
        with self.lock:
            first = len(self.children)
        out: dict = {}
        try:
            yield out
        finally:
            with self.lock:
                kids = self.children[first:]
            own = peak_rss()
            out.update(
                peak=_bound(own, kids),
                stage_peak=own,
                children_peak=max((c.peak for c in kids if c.peak is not None), default=None),
            )
            self.phases[name] = dict(out)

    def child_started(self) -> _Child:
        c = _Child(time.monotonic(), rss_now() or 0)
        with self.lock:
            self.children.append(c)
        return c

    def child_ended(self, c: _Child, peak: int | None) -> None:
        c.held = max(c.held, rss_now() or 0)
        c.end, c.peak = time.monotonic(), peak

    def figures(self) -> dict:
        """{"tree_peak", "stage_peak", "children_peak", "children"}: the bound the module
        docstring describes, this process's own peak, the largest child's and how many ran.
        A child that reported no peak (killed) counts as 0: a stage whose child was killed
        failed, and its figures are not recorded."""
        own = peak_rss_since_restart()
        with self.lock:
            kids = list(self.children)
        tree = _bound(own, kids)
        peaks = [c.peak for c in kids if c.peak is not None]
        return {
            "tree_peak": tree,
            "stage_peak": own,
            "children_peak": max(peaks) if peaks else None,
            "children": len(kids),
        }


def _bound(own: int | None, kids: list[_Child]) -> int | None:
    """The tree's peak bound (module docstring) from this process's peak ``own`` and ``kids``."""
    tree = own
    for c in kids:
        together = [o for o in kids if o.start < c.end and c.start < o.end]  # c and those beside it
        bound = max(o.held for o in together) + sum(o.peak or 0 for o in together)
        tree = bound if tree is None else max(tree, bound)
    return tree


_CURRENT: TreeMeter | None = None


def measure() -> TreeMeter:
    """A new meter for the stage about to run in this process, started now; the children
    :mod:`tasks.proc.child` starts from here on report to it (:func:`current`)."""
    global _CURRENT
    _CURRENT = TreeMeter()
    _CURRENT.start()
    return _CURRENT


def current() -> TreeMeter | None:
    """The meter of the stage running in this process, or None (outside a stage)."""
    return _CURRENT

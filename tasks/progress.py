"""Progress bars for the long steps of a stage: tqdm on the terminal, nothing elsewhere.

:func:`bar` is the one helper the stages use. It returns a ``tqdm`` writing to the terminal's
stderr, or a no-op with the same surface (iterate, ``update``, ``close``, ``with``) when bars
are off. Bars are on when stderr is a terminal (so CI logs and pipes stay clean), unless
``NPUBUILD_PROGRESS`` says otherwise: ``0`` turns them off, ``1`` on even without a terminal.

While a stage runs, its file descriptors 1 and 2 go to its log (``tasks/store/stagelog.py``); that
module points :data:`_console` at the terminal's stderr and :data:`_label` at the stage's task
name (``verify:minilm-l6-w8a16``), which prefixes every bar. Bars do not stay on the screen
once done (``leave=False``): the stage's one summary line does.
"""

from __future__ import annotations

import os
import sys

_console = None  # the terminal's stderr while a stage's output is captured (set by tasks.store.stagelog)
_label = ""  # the running stage's task name


def console():
    """Where bars go: the terminal's stderr (also during a captured stage)."""
    return _console if _console is not None else sys.stderr


def enabled() -> bool:
    """``NPUBUILD_PROGRESS`` = 0/1 if set, else whether :func:`console` is a terminal."""
    v = os.environ.get("NPUBUILD_PROGRESS", "").strip().lower()
    if v in ("0", "false", "no", "off"):
        return False
    if v in ("1", "true", "yes", "on"):
        return True
    try:
        return console().isatty()
    except (AttributeError, ValueError, OSError):
        return False


class _NoBar:
    """What :func:`bar` returns when bars are off: iterates ``iterable``, ignores the rest."""

    def __init__(self, iterable=None):
        self._it = iterable

    def __iter__(self):
        return iter(self._it if self._it is not None else ())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        pass

    def close(self):
        pass

    def set_postfix_str(self, s="", refresh=True):
        pass


def bar(iterable=None, what: str = "", *, total: int | None = None, unit: str = "it"):
    """A progress bar over ``iterable`` (or a manual one with ``total`` and ``update``),
    described as "<stage task> <what>"; a no-op when bars are off (:func:`enabled`)."""
    if not enabled():
        return _NoBar(iterable)
    from tqdm import tqdm

    desc = " ".join(s for s in (_label, what) if s)
    return tqdm(iterable, desc=desc, total=total, unit=unit, file=console(), leave=False, dynamic_ncols=True)

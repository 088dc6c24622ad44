"""Ctrl-C (SIGINT) and SIGTERM in the doit process and its stage workers.

Python turns SIGINT into KeyboardInterrupt wherever the main thread happens to be, and some
libraries swallow it there: numpy's C-level import turns it into an ImportError ("numpy._core
.umath failed to import"), so a Ctrl-C landing in the first numpy import of a process would be
ignored, or become a false "not a valid ONNX model" error. The
handler here also *remembers* the signal (:func:`seen`), so ``tasks.core.run.run_stage`` stops the
build after the stage whatever the libraries did with the exception, and it kills the stage's
child processes at once (``tasks.proc.child``), so a stage waiting on them (verify's HTP children in
a thread pool, an LLM quantize) stops now rather than when they finish.

SIGTERM is handled the same way: doit's parallel runner (``doit -n 2``) stops its workers with
SIGTERM after a Ctrl-C, and a stage that gets it cleans up like on Ctrl-C (its temp folder and
key lock removed) instead of dying mid-cleanup.
"""

from __future__ import annotations

import signal
import threading

_SEEN = threading.Event()


def _handler(signum, frame):
    from tasks.proc import child

    _SEEN.set()
    child.kill_all()
    raise KeyboardInterrupt(signal.Signals(signum).name)


def install() -> bool:
    """Install the SIGINT and SIGTERM handlers (main thread only: elsewhere Python refuses;
    then returns False and changes nothing)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)
    return True


def seen() -> bool:
    """True once this process got SIGINT or SIGTERM through :func:`install`'s handler."""
    return _SEEN.is_set()

"""Python child processes: the one runner for work that must happen in a fresh interpreter.

Stage code runs a named function of a real module in the child (:func:`run_function`:
``python -m tasks.proc.child`` unpickles ``(function, args, kwargs)`` from its stdin and calls it),
never source text: the function's module is imported by the stage's own code, so the import
graph, and with it the stage key's code digest, covers what the child runs (text passed to
``python -c`` would be in no key).
:func:`run_python` (a code string) is left for benchmarks and tests.

Used by the encoder compile (``tasks/qnn/ep.py``: the QNN EP numbers tensors with process-wide
counters, so each graph compiles in a new process), the LLM quantize and compile (one graph's
memory at a time, and a peak that belongs to that graph) and the benchmarks. Imports nothing
of either family, so both sit above it.

A child dies with the process that started it (Linux ``PR_SET_PDEATHSIG``): a stage's
process killed alone must not leave its quantize or compile running beside the next build.

A child reports its own peak RSS (``VmHWM`` from ``/proc/self/status``, read at exit; Linux
only, None elsewhere): ``ru_maxrss`` of a child started by (v)fork + exec can report the
parent's peak instead (measured on Linux with the LLM benchmarks of benchmarks/README.md).
Inside a stage every child reports to the stage's tree meter (:mod:`tasks.proc.tree`), so the
manifest's tree peak counts it beside what the stage's process held meanwhile.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

_PEAK = "NPUBUILD_PEAK_RSS="
_PARENT = "NPUBUILD_PARENT_PID"  # the pid a child checks its parent against (it dies with it)
_REPORT_PEAK = (
    "import atexit, sys\n"
    "def _npubuild_peak():\n"
    "    try:\n"
    "        for ln in open('/proc/self/status'):\n"
    "            if ln.startswith('VmHWM:'):\n"
    f"                print('{_PEAK}' + str(int(ln.split()[1]) * 1024), file=sys.stderr, flush=True)\n"
    "    except OSError:\n"
    "        pass\n"
    "atexit.register(_npubuild_peak)\n"
    # a terminal's Ctrl-C reaches the child too: it ends quietly, the parent reports it
    "def _npubuild_quiet(t, v, tb, _d=sys.excepthook):\n"
    "    if not issubclass(t, KeyboardInterrupt):\n"
    "        _d(t, v, tb)\n"
    "sys.excepthook = _npubuild_quiet\n"
    # dies with its parent (Linux PR_SET_PDEATHSIG): a doit process killed alone would leave
    # its child (a 7B quantize) running beside the next build, writing into the dead build's
    # temp folder; and ends at once if the parent was gone before this line
    "import os as _o\n"
    "if sys.platform.startswith('linux'):\n"
    "    try:\n"
    "        import ctypes, signal\n"
    "        ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"
    "    except (OSError, AttributeError):\n"
    "        pass\n"
    f"    if str(_o.getppid()) != _o.environ.get('{_PARENT}', str(_o.getppid())):\n"
    "        _o._exit(137)\n"
)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding tasks/ (this file: tasks/proc/child.py)


_RUNNING: set[subprocess.Popen] = set()  # children of run_python / run_function still running (any thread)


def kill_all() -> int:
    """Kill every child :func:`run_python` or :func:`run_function` is waiting on, in any thread (SIGKILL: what they
    were writing is in their stage's temp folder, which the stage's cleanup removes). Called on
    Ctrl-C (``tasks/proc/interrupt.py``). Returns how many were running."""
    running = list(_RUNNING)
    for p in running:
        try:
            p.kill()
        except OSError:
            pass
    return len(running)


@dataclass
class Result:
    """What a child left: ``returncode`` (negative: the signal that killed it, e.g. -11 =
    SIGSEGV), its ``stdout`` and ``stderr`` (text, the peak line removed) and ``peak_rss``
    (bytes, or None when it could not report, e.g. killed)."""

    returncode: int
    stdout: str
    stderr: str
    peak_rss: int | None

    def tail(self, n: int = 4000) -> str:
        """The last ``n`` characters of stdout + stderr, for error messages."""
        return (self.stdout + self.stderr)[-n:]


def run_python(
    code: str, *, cwd=None, env: dict | None = None, timeout: float | None = None, forward: bool = False
) -> Result:
    """Run python ``code`` in a child process of this interpreter, with this package importable
    (``PYTHONPATH`` starts with :data:`PACKAGE_ROOT`) and ``env`` added to this process's
    environment; in ``cwd`` if given. ``forward``: write the child's stdout / stderr to ours once
    it ended (inside a stage they go to its log). Raises subprocess.TimeoutExpired after
    ``timeout`` seconds (the child is killed). Stage code uses :func:`run_function`."""
    return _run([sys.executable, "-c", _REPORT_PEAK + code], None, cwd, env, timeout, forward)


def run_function(
    fn, *args, cwd=None, env: dict | None = None, timeout: float | None = None, forward: bool = False, **kwargs
) -> Result:
    """Call ``fn(*args, **kwargs)`` in a child process (``python -m tasks.proc.child``), as
    :func:`run_python` runs code: same environment, ``cwd``, ``timeout`` and ``forward``, the
    same :class:`Result` (exit code 1 and the traceback on stderr when ``fn`` raises). Raises
    OSError (ENOSPC) when ``fn`` met a full disk or quota: the child says so in one line, with
    no traceback (:data:`DISK_FULL_EXIT`).

    ``fn`` must be a module-level function (it is pickled by reference: module and name) and
    ``args`` / ``kwargs`` picklable (paths, numbers, dicts, :class:`tasks.llm.feed_store.FeedStore`).
    The caller imports ``fn`` itself, so the module the child runs is in the caller's import
    graph (the stage key's code digest, ``tasks.core.keys.code_modules``). Raises
    pickle.PicklingError (a lambda) or AttributeError (a nested function) before any child
    starts. ``cwd``, ``env``, ``timeout`` and ``forward`` are the runner's; ``fn`` cannot take
    keyword arguments of those names."""
    payload = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    return _run([sys.executable, "-m", "tasks.proc.child"], payload, cwd, env, timeout, forward)


def _run(argv, payload: bytes | None, cwd, env, timeout, forward) -> Result:
    full = dict(os.environ, **(env or {}))
    full.setdefault("PYTHONIOENCODING", "utf-8")  # the pipe's bytes are decoded as UTF-8 below (Windows: cp1252)
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), full.get("PYTHONPATH")]))
    full[_PARENT] = str(os.getpid())
    from tasks.proc import tree

    meter = tree.current()
    started = meter.child_started() if meter is not None else None
    with subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if payload is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=full,
        cwd=None if cwd is None else str(cwd),
    ) as p:
        _RUNNING.add(p)
        try:
            out_b, err_b = p.communicate(input=payload, timeout=timeout)
        except BaseException:  # a timeout, or Ctrl-C in this thread: the child goes too
            p.kill()
            p.wait()
            raise
        finally:
            _RUNNING.discard(p)
    stdout, stderr = (b.decode("utf-8", "replace").replace("\r\n", "\n") for b in (out_b, err_b))
    peak, err = None, []
    for ln in stderr.splitlines(keepends=True):
        if ln.startswith(_PEAK):
            peak = int(ln[len(_PEAK) :])
        else:
            err.append(ln)
    r = Result(p.returncode, stdout, "".join(err), peak)
    if started is not None:  # the stage's tree peak counts this child beside what this process held
        meter.child_ended(started, peak)
    if payload is not None and r.returncode == DISK_FULL_EXIT:
        import errno

        raise OSError(errno.ENOSPC, f"no space left on device in a child process ({r.stdout.strip()[-300:]})")
    if forward:
        sys.stdout.write(r.stdout)
        sys.stdout.flush()
        sys.stderr.write(r.stderr)
        sys.stderr.flush()
    return r


#: a folder: every stage process and :func:`run_function` child writes the ``tasks`` modules
#: it had loaded there (``<stage task>.<who>.json``), for the test that a stage's key covers
#: the code it runs (tests/test_keys.py). Unset: nothing is written.
TRACE_ENV, TRACE_STAGE_ENV = "NPUBUILD_TRACE_MODULES", "NPUBUILD_TRACE_STAGE"


def write_trace(who: str, modules, task: str | None = None) -> None:
    """With :data:`TRACE_ENV` set, write ``{"task", "who", "modules"}`` (the sorted ``tasks``
    module names of ``modules``; task: ``task`` or :data:`TRACE_STAGE_ENV`) to a new file in
    ``$NPUBUILD_TRACE_MODULES``. A trace that cannot be written is skipped (it never fails a
    stage)."""
    folder = os.environ.get(TRACE_ENV)
    if not folder:
        return
    names = sorted(m for m in modules if m == "tasks" or m.startswith("tasks."))
    task = task or os.environ.get(TRACE_STAGE_ENV, "")
    try:
        Path(folder, f"{who}-{os.getpid()}-{len(list(Path(folder).iterdir()))}.json").write_text(
            json.dumps({"task": task, "who": who, "modules": names})
        )
    except OSError:
        pass


#: a child's exit code for "the disk is full" (its OSError's line on stdout, no traceback):
#: the parent raises an OSError with ENOSPC, which the cache reports as one DiskFull line
DISK_FULL_EXIT = 28


def _main() -> None:  # python -m tasks.proc.child: the child side of run_function
    import errno

    exec(_REPORT_PEAK, {})
    fn, args, kwargs = pickle.load(sys.stdin.buffer)
    try:
        fn(*args, **kwargs)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # a full disk is not a bug: one line, not a traceback on the console before the
        # parent's DiskFull line
        print(f"{type(e).__name__}: {e}", flush=True)
        sys.exit(DISK_FULL_EXIT)
    finally:
        write_trace("child", list(sys.modules))


if __name__ == "__main__":
    _main()

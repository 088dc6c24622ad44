"""Exclusive locks on cache keys that say who holds them (:class:`KeyLock`), and how long a
stopped or gone holder is waited for (:func:`lock_timeout`, ``NPUBUILD_LOCK_TIMEOUT``)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from filelock import FileLock, Timeout

from tasks.errors import InputError, UserError
from tasks.proc.processes import process_state as _process_state

LOCK_TIMEOUT_DEFAULT = 600.0  # seconds a stopped or gone lock holder is waited for


class LockTimeout(UserError):
    """A key lock stayed held by a stopped or dead holder for longer than the lock timeout."""


def lock_timeout() -> float:
    """Seconds to wait for a key lock whose holder is stopped or gone:
    ``NPUBUILD_LOCK_TIMEOUT`` (default 600). Raises ValueError for a value that is not a
    non-negative number."""
    v = os.environ.get("NPUBUILD_LOCK_TIMEOUT", "")
    if not v:
        return LOCK_TIMEOUT_DEFAULT
    try:
        t = float(v)
    except ValueError:
        t = -1.0
    if not t >= 0:
        raise InputError(f"NPUBUILD_LOCK_TIMEOUT: expected a number of seconds >= 0, found {v!r}")
    return t


class KeyLock:
    """An exclusive lock on one cache key (a ``filelock.FileLock`` on ``path``) that says who
    holds it. The holder writes {pid, host, since, what} into the lock file; a waiter prints
    who it waits for (once per holder) and raises :class:`LockTimeout` when that holder, on
    this host, has been stopped or gone for :func:`lock_timeout` seconds. On release the lock
    file is removed while still held (filelock 4 retries a lock taken on an unlinked file), so
    lock files do not pile up."""

    POLL = 0.5  # seconds between attempts while waiting

    def __init__(self, path: Path, what: str):
        self.path, self.what = Path(path), what
        self._lock = FileLock(str(path))

    def holder(self) -> dict | None:
        """What the current holder wrote into the lock file, or None (none, or not yet)."""
        try:
            h = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return h if isinstance(h, dict) and isinstance(h.get("pid"), int) else None

    def try_acquire(self) -> bool:
        """Take the lock if it is free now; never waits. Raises only what the file system raises."""
        try:
            self._lock.acquire(timeout=0)
        except (Timeout, RuntimeError):  # RuntimeError: held by this very process (would deadlock)
            return False
        self._stamp()
        return True

    def acquire(self) -> None:
        """Take the lock, waiting as the class says. Raises LockTimeout."""
        if self.try_acquire():
            return
        limit, told, stuck_since = lock_timeout(), None, None
        while True:
            try:
                self._lock.acquire(timeout=self.POLL)
                break
            except Timeout:
                pass
            h = self.holder()
            here = h is not None and h.get("host") == socket.gethostname()
            state = _process_state(h["pid"]) if here else "running"
            who = (
                (
                    f"pid {h['pid']} on host {h.get('host')} since "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(h.get('since', 0)))}"
                    f"{' (' + state + ')' if state != 'running' else ''}"
                )
                if h
                else "another process"
            )
            if (h and (h["pid"], h.get("since"), state)) != told:
                told = h and (h["pid"], h.get("since"), state)
                print(
                    f"npubuild: waiting for the lock of {self.what} ({self.path}), held by {who}",
                    file=sys.stderr,
                    flush=True,
                )
            if state == "running":
                stuck_since = None
                continue
            stuck_since = stuck_since or time.monotonic()
            if time.monotonic() - stuck_since >= limit:
                raise LockTimeout(
                    f"{self.path}: gave up waiting for the lock of {self.what} after {limit:g} s: "
                    f"held by {who}, which is {state}; resume it (kill -CONT {h['pid']}) or end it, "
                    f"then run again (NPUBUILD_LOCK_TIMEOUT sets the wait)"
                )
        self._stamp()

    def _stamp(self) -> None:
        self.path.write_text(
            json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "what": self.what})
            + "\n",
            encoding="utf-8",
        )

    def release(self) -> None:
        try:
            self.path.unlink(missing_ok=True)  # still held: nobody else can be using this file
        finally:
            self._lock.release()

    def __enter__(self) -> KeyLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

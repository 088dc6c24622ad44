"""File-system operations of the cache: removing a tree of read-only files (:func:`rmtree`),
writing a manifest (:func:`write_json`), a stage's temp area (:func:`temp_area`) and telling a
full disk (:class:`DiskFull`, :func:`is_disk_full`, :func:`free_bytes`)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import sys
from contextlib import contextmanager
from pathlib import Path

from tasks.errors import UserError


def rmtree(path: Path) -> None:
    """Remove ``path`` and what is in it: read-only files and folders too (the cache's files
    are read-only; Windows will not unlink them otherwise), and what another process removes
    at the same time is taken as removed (two doit processes that start together both clean
    the same dead build's temp folder, and the slower one must not fail its stage)."""

    def onexc(func, p, exc):
        if isinstance(exc, FileNotFoundError):
            return
        try:
            os.chmod(p, stat.S_IWRITE | stat.S_IREAD | stat.S_IEXEC)
            func(p)
        except FileNotFoundError:
            pass

    if path.exists():
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=onexc)
        else:
            shutil.rmtree(path, onerror=lambda f, p, e: onexc(f, p, e[1]))


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


class DiskFull(UserError):
    """The disk filled (ENOSPC / EDQUOT) while a stage wrote its cache entry."""


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file() and not f.is_symlink())


#: free bytes under which a failed build is taken as the disk's fault (a stage writes far more)
DISK_NEARLY_FULL = 1 << 20


def free_bytes(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 1 << 62


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it was raised from) is a full disk or quota: an OSError
    with ENOSPC / EDQUOT, or a native library's message with the C library's ENOSPC text."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if os.strerror(errno.ENOSPC) in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


@contextmanager
def temp_area(folder: Path):
    """Make ``folder`` (created) the temp folder of this process and of the processes it starts
    (``tempfile.tempdir`` and ``TMPDIR``/``TEMP``/``TMP``) while the block runs, then remove it
    and restore both. A stage's own temp files (``tempfile`` users: the fold-constants patch,
    QNN probes, optimum) then live in its cache temp folder, which a failed build removes and
    :meth:`Cache.clean_stale` removes after a SIGKILL, never in the system temp folder. One
    stage at a time per process (as ``tasks/store/stagelog.py``'s capture of fds 1 and 2)."""
    import tempfile

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = ("TMPDIR", "TEMP", "TMP")
    old_env, old_dir = {n: os.environ.get(n) for n in names}, tempfile.tempdir
    os.environ.update({n: str(folder) for n in names})
    tempfile.tempdir = str(folder)
    try:
        yield folder
    finally:
        tempfile.tempdir = old_dir
        for n, v in old_env.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v
        rmtree(folder)

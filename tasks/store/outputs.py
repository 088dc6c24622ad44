"""Writing outside the cache (``build/``, ``dist/``, ``catalog/``, the home's state
``.npubuild/``): a file is written under a temp name and renamed into place, a set of files is
renamed into place only once every one of them is written, and a full disk (ENOSPC / EDQUOT)
is one :class:`tasks.store.fileops.DiskFull` line naming the folder, what was being written and what
is free, with the temp files removed, so the previous contents stay whole.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from tasks.store.fileops import DiskFull, is_disk_full


def disk_full(folder: Path, what: str, setting: str, need: int | None = None) -> DiskFull:
    """The one-line error for a full disk under ``folder`` while writing ``what`` (``need``
    bytes, when known); ``setting`` names the variable that moves the folder
    (``NPUBUILD_BUILD``, ...), or the command-line option that names it (``--dest``)."""
    try:
        free = f"{shutil.disk_usage(folder).free / 1e6:.1f} MB free"
    except OSError:
        free = "free space unknown"
    size = f"{need / 1e6:.1f} MB, " if need is not None else ""
    move = f"give {setting} a folder on" if setting.startswith("--") else f"set {setting} to"
    return DiskFull(
        f"{folder}: no space left on its device while writing {what} ({size}{free}); its previous "
        f"contents are whole; free space or {move} a larger disk"
    )


@contextmanager
def full_disk_is(folder: Path, what: str, setting: str, cleanup=(), need: int | None = None):
    """Turn an ENOSPC / EDQUOT raised in the block into :func:`disk_full`'s DiskFull, after
    removing the paths of ``cleanup`` (a list the block may append to: its temp files and
    folders). Other errors also remove them, and propagate."""
    try:
        yield
    except BaseException as e:
        for p in reversed(list(cleanup)):
            p = Path(p)
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    p.unlink()
                except OSError:
                    pass
        if is_disk_full(e):
            raise disk_full(folder, what, setting, need) from None
        raise


def write_text(path: Path, text: str, setting: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temp file in its folder and one rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with full_disk_is(path.parent, path.name, setting, [tmp]):
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)


def _mount_point(path: Path) -> Path:
    """The mount point of the file system ``path`` is on."""
    path = Path(path).resolve()
    dev = path.stat().st_dev
    while path.parent != path and path.parent.stat().st_dev == dev:
        path = path.parent
    return path


def unwritable(name: str, folder: Path) -> str:
    """ "" when this user can create files in ``folder`` and in each folder directly under it
    (a cache's kinds), or, while it does not exist, in the nearest folder above it that does
    (where it will be made); else one line naming the folder and saying what is true: it is on
    a read-only file system (and where that is mounted), or its mode does not let its owner,
    this user, write, or it belongs to another user (owner and mode). ``name``: the variable
    that moves it (``NPUBUILD_CACHE``, ...)."""
    folder = Path(folder)
    if folder.is_dir():
        try:
            subs = [d for d in folder.iterdir() if d.is_dir() and not d.name.startswith(".")]
        except OSError:
            subs = []
        probes = [folder, *subs]
    else:
        probes = [next((p for p in folder.parents if p.is_dir()), folder)]
    uid = getattr(os, "getuid", lambda: None)()
    for d in probes:
        if os.access(d, os.W_OK | os.X_OK):
            continue
        where = d if d == folder else f"{d} (where it {'is' if folder.is_dir() else 'would be made'})"
        try:
            if hasattr(os, "statvfs") and os.statvfs(d).f_flag & os.ST_RDONLY:
                return (
                    f"{name} {folder}: {where} is on a read-only file system (mounted at {_mount_point(d)}): "
                    f"use a folder on a writable file system (set {name})"
                )
            st = d.stat()
        except OSError as e:
            return (
                f"{name} {folder}: {where} cannot be examined ({type(e).__name__}: {e}); set {name} to another folder"
            )
        mode = f"mode {st.st_mode & 0o777:04o}"
        if uid is not None and st.st_uid == uid:
            return (
                f"{name} {folder}: {where} belongs to this user (uid {uid}) but its {mode} does not let its "
                f"owner write: `chmod u+wx {d}`, or set {name} to another folder"
            )
        return (
            f"{name} {folder}: {where} is not writable by this user (uid {uid}; it belongs to uid {st.st_uid}, "
            f"{mode}): use a folder of your own (set {name}) or ask its owner to make it group-writable"
        )
    return ""

"""Writing outside the cache (``build/``, ``dist/``, ``catalog/``, the home's state
``.npubuild/``): a file is written under a temp name and renamed into place, a set of files is
renamed into place only once every one of them is written, and a full disk (ENOSPC / EDQUOT)
is one :class:`tasks.cache.DiskFull` line naming the folder, what was being written and what
is free, with the temp files removed, so the previous contents stay whole.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from .cache import DiskFull, _disk_full


def disk_full(folder: Path, what: str, setting: str) -> DiskFull:
    """The one-line error for a full disk under ``folder`` while writing ``what``; ``setting``
    names the variable that moves the folder (``NPUBUILD_BUILD``, ...)."""
    try:
        free = f"{shutil.disk_usage(folder).free / 1e6:.1f} MB free"
    except OSError:
        free = "free space unknown"
    return DiskFull(f"{folder}: no space left on its device while writing {what} ({free}); its previous contents "
                    f"are whole; free space or set {setting} to a larger disk")


@contextmanager
def full_disk_is(folder: Path, what: str, setting: str, cleanup=()):
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
        if _disk_full(e):
            raise disk_full(folder, what, setting) from None
        raise


def write_text(path: Path, text: str, setting: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temp file in its folder and one rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with full_disk_is(path.parent, path.name, setting, [tmp]):
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)

"""Writing a bundle: its folder (:func:`write_bundle`) and its deterministic archive
(:func:`write_archive`): entries sorted, all under ``<recipe>/``; every mtime the one given
(``SOURCE_DATE_EPOCH``, else the source commit's time, else 0:
:func:`.bundle.archive_mtime`); uid/gid 0, empty user/group names, mode 0644 (files) / 0755
(dirs); GNU tar format; gzip header with mtime 0 and no file name. The same files give a
byte-identical archive."""

from __future__ import annotations

import gzip
import shutil
import tarfile
from pathlib import Path


def write_bundle(plan: dict, into: Path) -> Path:
    """Write ``plan["files"]`` into the new folder ``into`` (what was there is removed first).
    Returns it. Files are copied (not linked), so the cache's read-only bits do not follow."""
    if into.exists():
        shutil.rmtree(into)
    for rel, src in plan["files"].items():
        dest = into / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(src, Path):
            shutil.copyfile(src, dest)
        else:
            dest.write_bytes(src)
    return into


def write_archive(folder: Path, dest: Path, prefix: str, mtime: int) -> Path:
    """Deterministic ``.tar.gz`` of every file under ``folder``, as ``<prefix>/<rel>``:
    directory and file entries sorted by name, mtime ``mtime`` (seconds), uid/gid 0, empty
    uname/gname, mode 0755/0644, GNU format, gzip level 9 with header mtime 0 and no name.
    Written to a temp file and renamed (the temp file is removed if writing fails). Returns
    ``dest``."""
    rels = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    dirs = sorted({"/".join(r.split("/")[:i]) for r in rels for i in range(1, r.count("/") + 1)})
    entries = sorted([(d, True) for d in ["", *dirs]] + [(r, False) for r in rels])
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        _write_tar(folder, tmp, prefix, mtime, entries)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(dest)
    return dest


def _write_tar(folder: Path, tmp: Path, prefix: str, mtime: int, entries: list) -> None:
    with (
        open(tmp, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar,
    ):
        for rel, is_dir in entries:
            ti = tarfile.TarInfo(f"{prefix}/{rel}".rstrip("/"))
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = mtime, 0, 0, "", ""
            if is_dir:
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(ti)
            else:
                p = folder / rel
                ti.type, ti.mode, ti.size = tarfile.REGTYPE, 0o644, p.stat().st_size
                with open(p, "rb") as f:
                    tar.addfile(ti, f)

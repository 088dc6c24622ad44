"""Model sources a recipe names (``source: {path | package}``), found without building anything:
shared by the download stage (``tasks/sources/download.py``, every family) and the LLM memory
estimate (which reads a source's config.json before any stage runs), so the LLM stages' keys
hold this file, not the Hub download code.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from tasks.store import paths
from tasks.sources.errors import SourceError  # noqa: F401  (the package's error, where callers import it)


#: what a source folder holds that is not the model: never copied, never in the key
SKIPPED_PARTS = ("__pycache__", ".git")


def source_files(folder: Path) -> list[Path]:
    """The files of a local source folder the download stage copies and its key hashes
    (:func:`tasks.store.digest.list_files`, without :data:`SKIPPED_PARTS`), sorted."""
    from tasks.store.digest import list_files

    return [f for f in list_files(folder) if not any(p in SKIPPED_PARTS for p in f.relative_to(folder).parts)]


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:  # undecodable bytes of the file system, kept as surrogates
        return False


def folder_problem(folder: Path, roots: list[Path], what: str) -> str:
    """ "" when every file of source folder ``folder`` resolves inside ``roots`` and this user
    can read it, else the message naming the first links out and where they point, or the first
    files it cannot read with their owner and mode (a link out would be copied into the cache
    and shipped; a 0600 file of another user would be a PermissionError traceback). ``what``:
    the source as the recipe names it. One walk of the folder for both checks."""
    import os

    from tasks.store.digest import links_out

    files = source_files(folder)
    if odd := [f for f in files if not _utf8(str(f.relative_to(folder)))]:  # keys, manifests and logs are UTF-8
        shown = "; ".join(repr(os.fsencode(f.relative_to(folder)))[1:] for f in odd[:3])
        return (
            f"expected file names in UTF-8 in {what} ({folder}), found {len(odd)} that are not: {shown} "
            "(rename or remove them)"
        )
    if out := links_out(folder, roots, files):
        shown = "; ".join(f"{rel} -> {real}" for rel, real in out[:3]) + (
            f" (and {len(out) - 3} more)" if len(out) > 3 else ""
        )
        return (
            f"expected every file of {what} to lie inside {', '.join(str(r) for r in roots)} once links are "
            f"followed, found {len(out)} link{'s' if len(out) > 1 else ''} out: {shown}"
        )
    if unread := [f for f in files if not os.access(f, os.R_OK)]:
        shown = "; ".join(
            f"{f.relative_to(folder).as_posix()} (uid {f.stat().st_uid}, mode {f.stat().st_mode & 0o777:04o})"
            for f in unread[:3]
        )
        return f"expected every file of {what} to be readable by this user, found {len(unread)} that are not: {shown}"
    return ""


def single_file(params: dict) -> Path | None:
    """The one model file a ``package`` + ``file`` source, or a ``path`` source naming a file,
    points at (not resolved: a link is followed when it is read); None for a folder source.
    Raises SourceError when the package is not installed or has no such file, or a path that
    is neither a folder nor a file. The package is found (``importlib.util.find_spec``), never
    imported."""
    if params.get("path") is not None:
        p = (paths.root() / params["path"]).absolute()
        return p if p.is_file() else None
    if params.get("file") is None:
        return None
    folder = _package_folder(params["package"])
    f = folder / params["file"]
    if not f.is_file():
        near = sorted(x.relative_to(folder).as_posix() for x in folder.rglob("*.onnx"))[:8]
        raise SourceError(
            f"source package {params['package']!r}: expected a file {params['file']!r} in {folder}, "
            f"found none" + (f" (its .onnx files: {', '.join(near)})" if near else " (it holds no .onnx file)")
        )
    return f


def local_files(params: dict) -> tuple[Path, list[Path]]:
    """(the folder, the files under it) that a ``path`` or ``package`` source copies: a model
    folder's files (:func:`local_folder`), or the one file of a file source (:func:`single_file`:
    its folder and ``[it]``; a link in it must resolve inside the project and
    ``NPUBUILD_ALLOW_PATHS`` for a path source, inside the package's folder for a package one).
    Raises SourceError as those do."""
    f = single_file(params)
    if f is None:
        folder = local_folder(params)
        return folder, source_files(folder)
    if params.get("path") is not None:
        bad = inside_problem(f.parent, f"source.path {params['path']!r}") or _file_problem(
            f, paths.allowed_dirs(), f"source.path {params['path']!r}"
        )
    else:
        bad = _file_problem(f, [_package_folder(params["package"]).resolve()], f"source package {params['package']!r}")
    if bad:
        raise SourceError(bad)
    return f.parent, [f]


def _file_problem(f: Path, roots: list[Path], what: str) -> str:
    import os

    real = f.resolve()
    if not any(r == real or r in real.parents for r in roots):
        return (
            f"expected {what}'s file to lie inside {', '.join(str(r) for r in roots)} once links are followed, "
            f"found {f} -> {real}"
        )
    if not os.access(real, os.R_OK):
        return f"expected {what}'s file to be readable by this user, found {f} (mode {real.stat().st_mode & 0o777:04o})"
    return ""


def _package_folder(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(f"source package {package!r} is not installed (pip install it)")
    return Path(list(spec.submodule_search_locations)[0])


def local_folder(params: dict) -> Path:
    """The folder a ``path`` or ``package`` source names. Raises SourceError if absent, if a
    file in it is a link that resolves outside the project (and ``NPUBUILD_ALLOW_PATHS``) for a
    path source, outside the package's folder for a package source, or if this user cannot read
    a file of it (:func:`folder_problem`)."""
    p = _folder(params)
    if params.get("path") is not None:
        bad = inside_problem(p, f"source.path {params['path']!r}") or folder_problem(
            p, paths.allowed_dirs(), f"source.path {params['path']!r}"
        )
    else:
        bad = folder_problem(p, [p.resolve()], f"source package {params['package']!r}")
    if bad:
        raise SourceError(bad)
    return p


#: the folders npubuild writes, by the setting that moves each
WRITTEN = {
    "NPUBUILD_CACHE": paths.cache_dir,
    "NPUBUILD_BUILD": paths.build_dir,
    "NPUBUILD_HOME": paths.state_dir,
    "NPUBUILD_DIST": paths.dist_dir,
    "NPUBUILD_CATALOG": paths.catalog_dir,
}


def inside_problem(folder: Path, what: str) -> str:
    """ "" unless a folder npubuild writes (:data:`WRITTEN`) lies inside source ``folder``: then
    the message naming it (the download would copy the cache or the build into itself: a key
    that never settles, or a source that changes while it is read, for ever)."""
    src = Path(folder).resolve()
    for name, where in WRITTEN.items():
        w = Path(where()).resolve()
        if w == src or src in w.parents:
            return (
                f"expected {what} ({src}) to hold no folder npubuild writes, found {name} ({w}) inside it: "
                f"set {name} to a folder outside the source"
            )
    return ""


def _folder(params: dict) -> Path:
    if params.get("path") is not None:
        p = (paths.root() / params["path"]).absolute()
        if not p.is_dir():
            m = re.fullmatch(r"\.fixtures/tiny-(\w+)/?", params["path"])
            how = (
                f"train it with `.venv/bin/python scripts/tiny_llm.py {m.group(1)}` (about 2 minutes)"
                if m
                else "the recipe's comments say how to make it"
            )
            if not p.exists() and not p.is_symlink():
                what = "a model folder or an .onnx file" if not p.suffix else f"a {p.suffix} file"
                raise SourceError(f"source path {params['path']!r}: expected {what}, found nothing at {p}; {how}")
            raise SourceError(f"source path {params['path']!r} is not a folder or a file (looked at {p}); {how}")
        return p
    p = _package_folder(params["package"]) / params.get("subdir", "")
    if not p.is_dir():
        raise SourceError(f"package {params['package']!r} has no folder {params.get('subdir')!r}")
    return p

"""``build/<recipe>/``: links to a recipe's artifacts in the cache (:func:`materialize`), what
``build:<recipe>`` fills and a cluster build fills after pulling; and whether it is current
(:func:`is_current`). The listing itself is :func:`tasks.core.state.artifacts`."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from tasks.store import paths
from tasks.core.record import read_state
from tasks.core.resolve import Resolver, checking_resolver
from tasks.core.run import task_width
from tasks.core.session import Session


def _temp_name(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.{os.getpid()}.tmp")


def _stage_link(src: Path, dest: Path) -> Path:
    """Hard-link ``src`` beside ``dest`` under a temp name (no copy, no symlink: works on NTFS
    too), else copy it there with its mtime; returns the temp path, which the caller renames
    onto ``dest`` (one atomic rename: safe against a concurrent materialize). The cache files
    are read-only, so the link cannot be edited by mistake. A process killed before the
    rename leaves the temp link: see :func:`_remove_dead_links`."""
    tmp = _temp_name(dest)
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    return tmp


def _same(a: Path, b: Path) -> bool:
    """``a`` is ``b`` (a hard link) or a copy with the same size and mtime."""
    try:
        sa, sb = a.stat(), b.stat()
    except OSError:
        return False
    return (sa.st_ino, sa.st_dev) == (sb.st_ino, sb.st_dev) or (sa.st_size, sa.st_mtime_ns) == (
        sb.st_size,
        sb.st_mtime_ns,
    )


_TEMP_LINK = re.compile(r"^\..+\.(\d+)\.tmp$")  # _stage_link's ".<name>.<pid>.tmp"


def _remove_dead_links(root: Path) -> list[str]:
    """Remove the temp links (``.<name>.<pid>.tmp``) under ``root`` whose process is gone (a
    build killed between :func:`_stage_link`'s link and its rename: found by the fault campaign,
    benchmarks/fault_campaign.py), and say so on stderr. A live process's are left alone
    (a concurrent materialize renames its own). Returns the removed names, relative to root."""
    from tasks.proc.processes import process_state as _process_state

    gone = []
    for p in sorted(root.rglob(".*.tmp")):
        m = _TEMP_LINK.match(p.name)
        if m and int(m.group(1)) != os.getpid() and _process_state(int(m.group(1))) == "gone":
            p.unlink(missing_ok=True)
            gone.append(p.relative_to(root).as_posix())
    if gone:
        print(f"npubuild: removed {len(gone)} temp link(s) of dead builds: {', '.join(gone)}", file=sys.stderr)
    return gone


def _remove_old_artifacts(root: Path, rels) -> None:
    """Remove the files ``rels`` (paths relative to ``root``, an earlier build's artifacts) and
    the folders they leave empty, up to ``root``."""
    root_r = root.resolve()
    for rel in sorted(rels):
        p = root / rel
        if root_r not in p.resolve().parents:  # an artifacts.json edited by hand: never outside
            continue
        p.unlink(missing_ok=True)
        d = p.parent
        while d != root and d.is_dir() and not any(d.iterdir()):
            d.rmdir()
            d = d.parent


def materialize(session: Session, recipe: str, res: Resolver | None = None) -> dict:
    """Fill ``build/<recipe>/`` with links to the recipe's artifacts in the cache: context
    binaries and EPContext models, tokenizer/config files and ``verify.json`` (one
    sub-folder per target when there are several). Writes ``artifacts.json``:
    {file: "<kind>/<key>/out/<path>"}, the cache file each one is. ``res``: the Resolver to
    use (a cluster build passes one that pulls only the artifacts' stage kinds). Files an
    earlier build linked (its ``artifacts.json``) that this one does not are removed, so the
    folder holds exactly what ``artifacts.json`` lists (no ``part2/`` of a 3-part build left
    beside a 2-part rebuild); files npubuild did not put there are left."""
    from tasks.store import outputs
    from tasks.core.state import artifacts, build_state  # (not imported by a no-op build)

    res = res or Resolver(session, recipe)
    arts = artifacts(build_state(res, read_state(session, recipe)))
    root = paths.build_dir() / recipe
    made = [d for d in (root, *root.parents) if not d.exists()][::-1]  # removed again if nothing lands
    with outputs.full_disk_is(paths.build_dir(), f"build/{recipe}/", "NPUBUILD_BUILD", made):
        root.mkdir(parents=True, exist_ok=True)
    _remove_dead_links(root)
    try:
        before = set(json.loads((root / "artifacts.json").read_text(encoding="utf-8")))
    except (OSError, ValueError):
        before = set()
    listing, staged, cleanup = {}, [], list(made)
    # every file is written under a temp name first, and renamed into place only once all are:
    # a full disk (files are copied where hard links cannot be made) leaves the folder as it was
    need = sum(a.path.stat().st_size for a in arts.values())  # where they are copies, not links
    with outputs.full_disk_is(root, f"the artifacts of {recipe} as copies", "NPUBUILD_BUILD", cleanup, need):
        for rel, a in arts.items():
            dest = root / rel
            cleanup += [d for d in (dest.parent, *dest.parent.parents) if not d.exists() and root in d.parents][::-1]
            dest.parent.mkdir(parents=True, exist_ok=True)
            cleanup.append(_temp_name(dest))
            staged.append((_stage_link(a.path, dest), dest))
            listing[rel] = f"{a.kind}/{a.key}/out/{a.rel}"
        tmp = root / f".artifacts.json.{os.getpid()}.tmp"  # a dead one is removed (_remove_dead_links)
        cleanup.append(tmp)
        tmp.write_text(json.dumps(listing, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for staged_tmp, dest in staged:
        os.replace(staged_tmp, dest)
        staged_tmp.unlink(missing_ok=True)  # rename() between two links of one file leaves the source
    # the old files go while the old listing still names them, then the new listing in one
    # rename: a build killed in between leaves a listing that names every file it left (the
    # other order, killed after the write, would keep a removed part's binaries for good)
    _remove_old_artifacts(root, before - set(listing))
    os.replace(tmp, root / "artifacts.json")
    try:
        shown = root.relative_to(Path.cwd())  # doit runs in the project folder: build/<recipe>
    except ValueError:
        shown = root
    print(f"{'build:' + recipe:<{task_width(session, recipe)}}  {len(listing)} artifacts in {shown}")
    return {"artifacts": len(listing)}


def is_current(session: Session, recipe: str) -> bool:
    """Whether ``build/<recipe>/`` holds what :func:`materialize` would put there now: its
    ``artifacts.json`` names the entries of the stages' current keys, every compile entry among
    them, and each file is still the cache file it names (a link, or a copy of the same size
    and mtime). Computes keys only (a checking Resolver): nothing is built or pulled."""
    p = paths.build_dir() / recipe / "artifacts.json"
    try:
        want = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    res = checking_resolver(session, recipe)
    try:
        keys = {n: f"{s.kind}/{res.key(n)}" for n, s in res.specs.items()}
    except Exception:
        return False
    linked = {"/".join(v.split("/")[:2]) for v in want.values()}
    # every compile entry links its binaries: one missing means the layout changed (a
    # target added: the old target's stages keep their keys, the folder gets sub-folders)
    compiled = {k for n, k in keys.items() if res.specs[n].kind == "compile"}
    cache = paths.cache_dir()
    return compiled <= linked <= set(keys.values()) and all(_same(p.parent / f, cache / src) for f, src in want.items())

"""``doit reproduce:<recipe>`` (:func:`reproduce`): rebuild from an empty temporary cache and
compare every published file with the rebuild; the published side is re-read first
(:func:`recheck_published`), and a difference is shown (:func:`differing_ranges`), never
excused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tasks.store import paths
from tasks.core.resolve import cache as cache_of
from tasks.core.session import Session
from tasks.core.state import diff
from tasks.core.status import catalog_recipes
from tasks.store.digest import sha256_file
from tasks.contract import artifact_patterns
from tasks.commands.publish.bundle import resolved_recipe
from tasks.commands.publish.check import check_bundle, file_count, read_manifest
from tasks.commands.publish.errors import PublishError


def differing_ranges(a: Path, b: Path, limit: int = 8, chunk: int = 1 << 20) -> list[tuple[int, int]] | str:
    """Byte ranges ``[start, end)`` where files ``a`` and ``b`` differ (the first ``limit``
    ranges, adjacent differing bytes merged), read ``chunk`` bytes at a time; or a sentence
    when their sizes differ. Used by :func:`reproduce` to show, not excuse, a difference."""
    import numpy as np

    sa, sb = Path(a).stat().st_size, Path(b).stat().st_size
    if sa != sb:
        return f"sizes differ: {sa} vs {sb} bytes"
    out: list[tuple[int, int]] = []
    with open(a, "rb") as fa, open(b, "rb") as fb:
        off = 0
        while len(out) < limit:
            x, y = fa.read(chunk), fb.read(chunk)
            if not x:
                break
            if x != y:
                idx = np.flatnonzero(np.frombuffer(x, np.uint8) != np.frombuffer(y, np.uint8)) + off
                for i in idx.tolist():
                    if out and out[-1][1] == i:
                        out[-1] = (out[-1][0], i + 1)
                    elif len(out) < limit:
                        out.append((i, i + 1))
            off += len(x)
    return out


def recheck_published(session: Session, folder: Path, manifest: dict) -> None:
    """Before a published bundle is compared with a rebuild: re-read every file of it against
    its manifest (:func:`check_bundle`, full sha256), and fully rehash the local cache entries
    its artifacts came from (the manifest's ``stages`` of the kinds with artifacts; entries
    no longer in the cache are skipped), so that a difference is never blamed on the rebuild
    when the published side is damaged. A damaged entry is quarantined
    (``Cache.confirm_damage``). Raises PublishError naming the file, or the entry and file."""
    res = check_bundle(folder)
    bad = [f"{w} {item}" for w in ("mismatch", "missing", "extra") for item in res[w]]
    if bad:
        raise PublishError(
            f"{folder}: the published bundle does not match its manifest.json ({'; '.join(bad[:5])}); "
            f"publish it again before comparing"
        )
    cache = cache_of(session)
    for stage, st in sorted(manifest.get("stages", {}).items()):
        if not (isinstance(st, dict) and artifact_patterns(str(st.get("kind"))) and isinstance(st.get("key"), str)):
            continue
        probs = cache.problems(st["kind"], st["key"], full=True)
        if probs:
            moved = cache.confirm_damage(st["kind"], st["key"], probs)
            raise PublishError(
                f"{folder} was published from cache entry {st['kind']}/{st['key']} (stage {stage}), "
                f"which is damaged: {'; '.join(probs[:3])}"
                + (f"; moved to {moved}" if moved else "")
                + "; rebuild and publish again before comparing"
            )


def _run_shown(recipe: str, cmd: list[str], env: dict) -> tuple[int, str]:
    """Run ``cmd`` (a doit command of the rebuild), its lines (one per stage as it ends: the
    console reporter's) shown as they come, each after ``[reproduce:<recipe>]`` and the minutes
    since the rebuild started: a rebuild of minutes is never silent. Returns (exit code, what it
    printed, stdout and stderr together)."""
    import time

    t0, said = time.monotonic(), []
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as p:
        for line in p.stdout:
            said.append(line)
            print(f"[reproduce:{recipe}] {(time.monotonic() - t0) / 60:5.1f} min  {line.rstrip()}", flush=True)
    return p.returncode, "".join(said)


def reproduce(recipe: str, keep: bool = False, session: Session | None = None) -> bool:
    """Rebuild ``recipe`` from an empty temporary cache (``doit build:<recipe>`` then
    ``doit publish:<recipe>`` in subprocesses with NPUBUILD_CACHE/BUILD/HOME/DIST in a temp
    folder) and compare every published file (manifest.json and the archive included) with
    the existing ``dist/<recipe>/``, printing ``identical`` or ``DIFFERS`` per file.

    Returns True when everything is identical. The temp folder is removed unless something
    differs or ``keep``. Raises PublishError when there is no published bundle to compare
    with, when the recipe now resolves to something else than the published one (naming
    what changed: a rebuild would be another bundle), or when the rebuild fails. ``session``:
    the command's (default: a new one)."""
    session = session or Session()
    old = paths.dist_dir() / recipe
    if not (old / "manifest.json").exists():
        raise PublishError(f"no published bundle at {old} to compare with: run `doit publish:{recipe}` first")
    old_manifest = read_manifest(old)
    recheck_published(session, old, old_manifest)
    changed = diff(old_manifest.get("resolved_recipe"), resolved_recipe(catalog_recipes(session)[recipe]))
    if changed:  # a rebuild would be another bundle: say so, not "DIFFERS" per file
        raise PublishError(
            f"{old / 'manifest.json'}: published (build {old_manifest.get('build_key')}) from another "
            f"recipe than {recipe} resolves to now: {'; '.join(changed[:5])}"
            f"{f' (and {len(changed) - 5} more)' if len(changed) > 5 else ''}; a rebuild would not "
            f"be that bundle: restore the recipe to reproduce it, or `doit publish:{recipe}` to "
            f"publish what it gives now"
        )
    old_archive = paths.dist_dir() / f"{recipe}-{old_manifest['build_key']}.tar.gz"
    tmp = Path(tempfile.mkdtemp(prefix=f"npubuild-reproduce-{recipe}-"))
    env = dict(
        os.environ,
        NPUBUILD_ROOT=str(paths.root()),
        NPUBUILD_RECIPES=str(paths.recipes_dir()),
        NPUBUILD_CACHE=str(tmp / "cache"),
        NPUBUILD_BUILD=str(tmp / "build"),
        NPUBUILD_HOME=str(tmp / "home"),
        NPUBUILD_DIST=str(tmp / "dist"),
    )
    env.pop("NPUBUILD_REMOTE", None)  # a rebuild from scratch, not a download
    env["PYTHONUNBUFFERED"] = "1"  # its stage lines as each stage ends (_run_shown), not when it exits
    dodo = Path(__file__).resolve().parents[3] / "dodo.py"  # tasks/commands/publish/ -> the project
    for task in (f"build:{recipe}", f"publish:{recipe}"):
        print(f"[reproduce:{recipe}] doit {task} in {tmp}", flush=True)
        code, said = _run_shown(
            recipe, [sys.executable, "-m", "doit", "-f", str(dodo), "-d", str(paths.root()), task], env
        )
        if code != 0:
            raise PublishError(f"rebuild failed: doit {task} exited {code} (kept {tmp}):\n" + said[-4000:])
    new = tmp / "dist" / recipe
    new_manifest = read_manifest(new)
    new_archive = tmp / "dist" / f"{recipe}-{new_manifest['build_key']}.tar.gz"
    pairs = [(rel, old_manifest["files"][rel]["sha256"], new / rel) for rel in sorted(old_manifest["files"])]
    pairs.append(("manifest.json", sha256_file(old / "manifest.json"), new / "manifest.json"))
    pairs.append(
        (f"archive {old_archive.name}", sha256_file(old_archive) if old_archive.exists() else None, new_archive)
    )
    same = True
    for rel, want, path in pairs:
        got = sha256_file(path) if path.exists() else None
        if got is not None and got == want:
            print(f"identical  {rel}  {got[:16]}")
        else:
            same = False
            print(f"DIFFERS    {rel}  published {str(want)[:16]}  rebuilt {str(got)[:16]}")
            mine = old / rel if (old / rel).is_file() else (old_archive if rel.startswith("archive ") else None)
            if got is not None and mine is not None and mine.exists():
                r = differing_ranges(mine, path)
                print(
                    "           "
                    + (
                        r
                        if isinstance(r, str)
                        else "differing bytes: " + ", ".join(f"{s0}..{e0 - 1} ({e0 - s0} B)" for s0, e0 in r)
                    )
                )
    old_v = {t: v["metrics"] for t, v in old_manifest.get("verify", {}).items()}
    new_v = {t: v["metrics"] for t, v in new_manifest.get("verify", {}).items()}
    print(f"verify metrics {'identical' if old_v == new_v else 'DIFFER'} (published vs rebuilt)")
    rekeyed = sorted(
        st
        for st, v in old_manifest.get("stages", {}).items()
        if v.get("key") != new_manifest.get("stages", {}).get(st, {}).get("key")
    )
    if not same and rekeyed:
        print(
            f"stage keys that differ (their code, tools or data files changed since publishing): {', '.join(rekeyed)}"
        )
    for rel in sorted(set(new_manifest["files"]) - set(old_manifest["files"])):
        same = False
        print(f"DIFFERS    {rel}  only in the rebuild")
    if same and not keep:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"[reproduce:{recipe}] byte-identical: {file_count(old_manifest)} files and the archive")
    else:
        print(f"[reproduce:{recipe}] {'differences found; ' if not same else ''}rebuild kept in {tmp}")
    return same

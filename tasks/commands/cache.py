"""The cache commands' doit tasks (:func:`creators`): ``gc`` (``--apply`` to delete) and
``cache_verify`` (full rehash) maintain ``cache/``; ``push:<recipe>`` (``push`` for all)
publishes a recipe's local entries to the remote cache (``NPUBUILD_REMOTE``; a build pushes
what it builds by itself)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tasks.store import paths
from tasks.core import recipeset, record, resolve
from tasks.core.session import Session


def referenced_entries(session: Session) -> set[tuple[str, str]]:
    """(kind, key) of every stage of every recipe whose key can be computed now, plus the key
    each stage had at its recipe's last recorded build (``build/<recipe>/stages.json``), so a
    source that is unavailable for a moment does not make its chain garbage.

    Only this checkout's recipes count: with a cache shared between checkouts, run gc where
    all recipes are, or not at all (docs/environment.md)."""
    refs = set()
    for name in recipeset.buildable(session):
        res = resolve.Resolver(session, name, pull=False)
        for stage, spec in res.specs.items():
            try:
                refs.add((spec.kind, res.key(stage)))
            except Exception:  # upstream not built or source unavailable
                pass
        for rec in record.read_state(session, name).values():
            refs.add((rec.get("kind"), rec.get("key")))
    return refs


def orphan_build_dirs(session: Session) -> list[Path]:
    """``build/<name>/`` folders with no recipe file ``<name>.yaml`` (valid or not): left by a
    recipe that was deleted or renamed. They hold links to cache entries and the two listings,
    nothing else (:func:`tasks.core.links.materialize`)."""
    bd = paths.build_dir()
    if not bd.is_dir():
        return []
    known = recipeset.stems(session)
    return sorted(p for p in bd.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in known)


def gc(session: Session, apply: bool) -> None:
    victims = resolve.cache(session).gc(referenced_entries(session), apply=apply)
    total = sum(s for _, s in victims)
    for rel, size in victims:
        print(f"{'removed' if apply else 'would remove'} {rel} ({size / 1e6:.1f} MB)")
    orphans = orphan_build_dirs(session)
    for d in orphans:
        if apply:
            shutil.rmtree(d)
        print(f"{'removed' if apply else 'would remove'} {d}/ (no recipe {d.name}.yaml)")
    print(
        f"{len(victims)} unreferenced entries, {total / 1e6:.1f} MB; {len(orphans)} build "
        f"folder{'' if len(orphans) == 1 else 's'} without a recipe"
        + ("" if apply else " (dry run; doit gc --apply deletes)")
    )


def cache_verify(session: Session) -> bool:
    bad = resolve.cache(session).verify()
    for entry, probs in bad.items():
        print(f"DAMAGED {entry}: {'; '.join(probs)} (moved to cache/.damaged/; the next build rebuilds it)")
    n = sum(1 for _ in resolve.cache(session).entries())
    print(f"{n} entries checked, {len(bad)} damaged")
    return not bad


def push(session: Session, recipe: str):
    """Push every stage entry of ``recipe`` that is in the local cache to the remote cache;
    print one line per stage (pushed / already on the remote / not in the local cache).
    Returns a TaskFailed without a remote or when a push failed."""
    from doit.exceptions import TaskFailed

    from tasks.store.remote import Rejected, RemoteError

    res = resolve.Resolver(session, recipe, pull=False)
    if res.cache.remote is None:
        return TaskFailed("no remote cache: set NPUBUILD_REMOTE to an fsspec URL (docs/environment.md: Remote cache)")
    errors = 0
    for stage, spec in res.specs.items():
        try:
            key = res.key(stage)
        except Exception as e:  # an upstream not built anywhere, or an offline source
            print(f"{spec.task:<40} -  not pushed: {e}")
            continue
        try:
            done = res.cache.push(spec.kind, key, material=res.material(stage))
            what = "pushed" if done else "already on the remote"
        except KeyError:
            what = "not in the local cache"
        except (Rejected, RemoteError) as e:
            errors += 1
            what = f"FAILED: {e}"
        print(f"{spec.task:<40} {spec.kind}/{key}  {what}")
    print(f"remote cache: {res.cache.remote.display}")
    return TaskFailed(f"{errors} push(es) of {recipe} failed") if errors else None


def creators(session: Session) -> dict:
    """{name: doit task creator} of the cache commands, all working in ``session``."""

    def task_gc():
        """Remove cache entries that no recipe references, and build/ folders of recipes that are
        gone (dry run unless --apply)."""
        return {
            "actions": [(gc, [session])],
            "uptodate": [False],
            "verbosity": 2,
            "params": [
                {
                    "name": "apply",
                    "long": "apply",
                    "type": bool,
                    "default": False,
                    "help": "delete (default: only list)",
                }
            ],
        }

    def task_cache_verify():
        """Rehash every cache entry and report those that no longer match their manifest."""
        return {"actions": [(cache_verify, [session])], "uptodate": [False], "verbosity": 2}

    def task_push():
        """push:<recipe> uploads the recipe's local cache entries to NPUBUILD_REMOTE (never
        replacing an entry already there)."""
        for name in recipeset.buildable(session):
            yield {
                "name": name,
                "actions": [(push, [session, name])],
                "uptodate": [False],
                "verbosity": 2,
                "doc": f"push {name}'s cache entries to the remote cache (NPUBUILD_REMOTE)",
            }

    return {"task_gc": task_gc, "task_cache_verify": task_cache_verify, "task_push": task_push}

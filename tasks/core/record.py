"""What a recipe's last build recorded: ``build/<recipe>/stages.json``, each stage's last key,
kind, entry folder and key material ({stage: {"key", "kind", "entry", "material"}}). Written
when a stage is built or found up to date (:func:`record`); read by explain (what changed), gc
(the entries the last build used) and the catalog ("stale" vs "not built")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tasks.store import paths
from tasks.store.entry import Entry
from tasks.core.session import Session


def state_path(recipe_name: str) -> Path:
    """``build/<recipe>/stages.json``."""
    return paths.build_dir() / recipe_name / "stages.json"


def read_state(session: Session, recipe_name: str, fresh: bool = False) -> dict:
    """``build/<recipe>/stages.json`` ({stage: {"key", "kind", "entry", "material"}}; {} when
    absent). One that cannot be read is reported in one line and counts as empty; the next
    stage of the recipe that runs rewrites it. While the recipe set is pinned, read once per
    session (``fresh``: from the file; the result may then be changed), else the caller must
    not change it."""
    pinned = session.pinned is not None
    if pinned and recipe_name in session.states and not fresh:
        return session.states[recipe_name]
    p = state_path(recipe_name)
    try:
        st = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(st, dict):
            if pinned and not fresh:
                session.states[recipe_name] = st
            return st
        err = f"expected a JSON object, found {type(st).__name__}"
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        err = f"{type(e).__name__}: {e}"
    print(f"npubuild: {p}: unreadable ({err}); ignored, rewritten by the next build of {recipe_name}", file=sys.stderr)
    return {}


def record(session: Session, recipe_name: str, stage: str, key: str, material: dict, entry: Entry, names) -> None:
    """Remember the last key and key material of a stage of this recipe (for explain).
    ``names``: the recipe's stage names now (its Resolver's ``specs``): rows of other stages go.
    Writes nothing when ``stages.json`` already says so (a no-op build writes no state).
    Raises DiskFull (``tasks.store.entries``) when the file cannot be written for want of space."""
    from filelock import FileLock

    from tasks.store import outputs

    row = json.loads(json.dumps({"key": key, "kind": entry.kind, "entry": str(entry.path), "material": material}))
    if read_state(session, recipe_name).get(stage) == row:
        return
    p = state_path(recipe_name)
    p.parent.mkdir(parents=True, exist_ok=True)
    locks = paths.state_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with FileLock(str(locks / f"state-{recipe_name}.lock")):
        # rows of stages the recipe no longer has (a part removed) go: explain has nothing to
        # say of them, and gc would keep their entries as the last build's
        st = {k: v for k, v in read_state(session, recipe_name, fresh=True).items() if k in names}
        st[stage] = row
        # a temp file and one rename (a dead build's temp file is removed with its temp links); a
        # full disk is one DiskFull line and leaves the file as it was
        outputs.write_text(p, json.dumps(st, indent=2, sort_keys=True) + "\n", "NPUBUILD_BUILD")
        session.states.pop(recipe_name, None)

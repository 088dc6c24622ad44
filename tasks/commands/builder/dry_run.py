"""``doit build:<recipe> -n`` (or ``--dry-run``): what ``build:<recipe>`` would run, and nothing
run (:func:`print_plan`), from the stages' states as :func:`tasks.core.explain.explain` finds them
(keys computed, entries looked up locally and, with ``NPUBUILD_REMOTE``, peeked at remotely:
nothing is built, downloaded or moved)."""

from __future__ import annotations

import sys

from tasks.core import recipeset
from tasks.core.session import Session

#: what a stage's status means for a build: (verb, would it run)
DOES = {
    "local hit": ("cache hit", False),
    "remote hit": ("pull from the remote cache", True),
    "failed": ("cache hit that fails its check, so the build fails", False),
    "stale": ("build: its key changed", True),
    "not built": ("build: no cache entry for its key", True),
    "blocked": ("build", True),
    "unknown": ("cannot tell", True),
}


def plan_lines(session: Session, recipe: str, rows: list[dict]) -> list[str]:
    """The dry run's lines for ``recipe`` from its stages' ``rows``
    (:func:`tasks.core.explain.explain`'s): a head line (how many stages would run), one line
    per stage (task, key prefix, what a build does with it and, where it helps, why), then the
    family's plan figures (an LLM's memory and disk estimates). Raises KeyError for a recipe not
    in the session's set."""
    from tasks.contract import family

    width = max(len(r["task"]) for r in rows)
    runs = sum(DOES[r["status"]][1] for r in rows)
    out = [
        f"build:{recipe} --dry-run (nothing is run): "
        + (f"{runs} of {len(rows)} stages would build or pull" if runs else "every stage is a cache hit")
    ]
    for r in rows:
        verb, _ = DOES[r["status"]]
        why = ""
        if r["status"] == "blocked":
            why = (
                f" once {r['changes'][0].split('waits for ', 1)[-1].split(',', 1)[0]} is built"
                if r.get("changes") and "waits for " in r["changes"][0]
                else ""
            )
        elif r["status"] in ("unknown", "stale") and r.get("changes"):
            why = f": {r['changes'][0]}" if r["status"] == "unknown" else f" ({r['changes'][0]})"
        elif r["status"] == "failed" and r.get("fails"):
            why = f": {r['fails'][0]}"
        key = (r["key"] or "-")[:12]
        out.append(f"  {r['task']:<{width}}  {key:<12}  {verb}{why}")
    out.append(f"  then link its artifacts into build/{recipe}/")
    recipe_obj = recipeset.recipes(session)[recipe]
    out += [f"  {line}" for line in (family(recipe_obj.export.family).plan_lines or (lambda _: []))(recipe_obj)]
    return out


def print_plan(session: Session, recipe: str, rows: list[dict]) -> None:
    """Print :func:`plan_lines` (``build:<recipe>``'s action under ``-n`` / ``--dry-run``)."""
    print("\n".join(plan_lines(session, recipe, rows)))
    sys.stdout.flush()

"""A recipe's state as the local cache alone says it (:func:`recipe_status`): what the catalog
lists and what publish refuses or ships. Reads recipes, ``build/<recipe>/stages.json`` and cache
manifests only: it never builds, never fetches (a Hub source that is offline shows as
``not-built``) and never moves a damaged cache entry (:class:`ReadOnlyResolver` reads entries
with :meth:`Cache.problems`, not :meth:`Cache.lookup`).

States:

=================  ==========================================================================
``verified``       every stage has an intact cache entry and every verify passes its thresholds
``verify-failed``  every stage has an entry, and some verify is below (or above) a threshold
``built-no-bars``  every stage has an entry, and the recipe's verify has no threshold to judge
                   its figures by (``verify.thresholds`` empty once the family's defaults are
                   merged: :func:`tasks.recipe.load.with_default_bars`): measured, never "verified";
                   shown as "built (no bars)" (:func:`tasks.core.row.label`)
``stale``          some stage has no entry for its current key, but ``build/<recipe>/stages.json``
                   records a complete earlier build (every verify stage recorded)
``not-built``      some stage has no entry and no complete build was ever recorded here
``shape-built``    a shape build (random weights of the model's exact config) whose every stage
                   has an entry: its verify figures are measured, never judged as quality
``unsupported``    a valid recipe of a model the LLM export does not implement
                   (:class:`tasks.recipe.load.UnsupportedModel`); ``reason`` says what
=================  ==========================================================================

Abstract recipes (templates, ``abstract: true``) are left out (:func:`catalog_recipes`), as from
the doit tasks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tasks.store.entry import Entry
from tasks.core import recipeset
from tasks.core.keys import NotReady
from tasks.core.record import read_state
from tasks.core.resolve import Resolver
from tasks.core.session import Session
from tasks.core.state import BuildState, build_state


class ReadOnlyResolver(Resolver):
    """A Resolver that never quarantines: a damaged entry counts as missing and stays put."""

    def entry(self, stage: str) -> Entry:
        spec = self.specs[stage]
        key = self.key(stage)
        probs = self.cache.problems(spec.kind, key)
        if probs is None:
            raise NotReady(f"{spec.task} has no cache entry for key {key[:12]}")
        if probs:
            raise NotReady(f"{spec.task}: cache entry {spec.kind}/{key} is damaged ({probs[0]})")
        path = self.cache.entry_path(spec.kind, key)
        return Entry(spec.kind, key, path, json.loads((path / "manifest.json").read_text(encoding="utf-8")))


def catalog_recipes(session: Session | None = None) -> dict:
    """{name: Recipe} of every non-abstract recipe, sorted by name. ``session``: the command's
    (default: a new one). Raises RecipeError."""
    return {n: r for n, r in sorted(recipeset.recipes(session or Session()).items()) if not r.abstract}


@dataclass(frozen=True)
class RecipeStatus:
    """One recipe as the catalog and publish see it: ``state`` (one of the states above),
    ``reason`` (the first stage without an entry, and why; for ``built-no-bars``, that no bar
    judged it), ``failures`` (verify's, as "<task>: ..."), and the typed build state it was
    judged from (tasks/core/state.py)."""

    state: str
    reason: str | None
    failures: list[str]
    build: BuildState

    @property
    def stage_keys(self) -> dict[str, str | None]:
        """{stage: key of its entry, None without one}"""
        return {n: s.entry.key if s.entry else None for n, s in self.build.stages.items()}

    @property
    def entries(self) -> dict[str, Entry]:
        return self.build.entries


def recipe_status(name: str, session: Session | None = None) -> RecipeStatus:
    """State of one recipe from the local cache alone (no building, no fetching, no
    quarantining). ``reason`` names the first stage without an entry and why (no entry for its
    key, an upstream missing, a Hub source unavailable offline...); "stale" when the last
    build recorded every verify stage, else "not-built". ``session``: the command's (default: a
    new one). Raises KeyError for an unknown recipe."""
    from tasks.proc.scrubbing import scrub

    session = session or Session()
    last = read_state(session, name)
    b = build_state(ReadOnlyResolver(session, name), last)
    reasons = [
        s.problem if s.status != "unknown" else f"{s.task}: {scrub(s.problem)}"
        for s in b.stages.values()
        if s.entry is None
    ]
    failures = []
    if not reasons:
        failures = [f"{s.task}: {f}" for s in b.of_kind("verify") for f in s.failures]
        barred = any(s.spec.params.get("thresholds") for s in b.of_kind("verify"))
        state = "verify-failed" if failures else "verified" if barred else "built-no-bars"
        if state == "built-no-bars":
            reasons = [
                "verify measured it, but the recipe sets no bar to judge it (verify.thresholds is empty "
                "and no runtime brings one): set verify.thresholds, or leave the key out for the "
                "family's default bars"
            ]
    else:
        verifies = [s.name for s in b.of_kind("verify")]
        state = "stale" if verifies and all(v in last for v in verifies) else "not-built"
    return RecipeStatus(state, reasons[0] if reasons else None, failures, b)

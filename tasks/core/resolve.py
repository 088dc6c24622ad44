"""Resolving one recipe's stages to cache entries: the cache (local, with the remote level),
and a :class:`Resolver` that computes keys and finds entries, memoising within a run."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from tasks.store import paths
from tasks.store import remote
from tasks.store.entries import Cache
from tasks.store.entry import Entry
from tasks.core import keys, recipeset
from tasks.core.session import Session


def cache(session: Session) -> Cache:
    """The local cache, with the remote level when ``NPUBUILD_REMOTE`` is set; a quarantined
    entry is unlinked from ``build/`` (:func:`unlink_build_copies`). Raises ValueError for a
    relative NPUBUILD_CACHE or a remote URL fsspec cannot open."""
    return Cache(
        paths.cache_dir(),
        remote=remote.from_env(),
        key_of=keys.remote_key,
        on_quarantine=partial(unlink_build_copies, session),
        cleaned=session.cleaned,
    )


def unlink_build_copies(session: Session, kind: str, key: str) -> list[Path]:
    """Remove, from every ``build/<recipe>/`` folder, the files that are links (or copies) of
    cache entry ``kind/key`` (as its ``artifacts.json`` lists them), and that
    ``artifacts.json``, so the next ``doit build:<recipe>`` links them anew (its up-to-date
    check needs ``artifacts.json``); and forget the entry in ``session.intact``. Called when
    the entry is quarantined: those hard links share the damaged bytes. Returns the folders
    changed; raises only what the file system raises."""
    session.intact.pop((kind, key), None)
    changed = []
    prefix = f"{kind}/{key}/"
    for art in sorted(paths.build_dir().glob("*/artifacts.json")):
        try:
            listing = json.loads(art.read_text(encoding="utf-8"))
            mine = [f for f, src in listing.items() if str(src).startswith(prefix)]
        except (OSError, ValueError, AttributeError):
            mine = []  # unreadable: the next build rewrites it anyway
        if mine:
            for f in mine:
                (art.parent / f).unlink(missing_ok=True)
            art.unlink(missing_ok=True)
            changed.append(art.parent)
    return changed


class Resolver:
    """Computes keys and finds entries for the stages of one recipe, memoising within a run.

    With a remote cache, ``pull=True`` downloads a stage's remote entry when the local cache
    misses it (what a build does); ``pull`` as a set of stage kinds downloads only those kinds
    (what ``build/<recipe>/`` and the checks read, after a cluster build), the others as with
    ``pull=False``; ``pull=False`` only reads remote manifests (``explain``,
    ``gc``, ``push``): an entry seen there has ``origin="remote"`` and no local files.
    Raises KeyError for a recipe that is not in the session's recipe set, ValueError as
    :func:`cache` does."""

    def __init__(self, session: Session, recipe_name: str, pull: bool | frozenset = True):
        self.session = session
        self.recipe = recipe_name
        self.specs = recipeset.plan(session, recipe_name)
        self.cache = cache(session)
        self.pull = pull
        self._materials: dict[str, dict] = {}
        self._entries: dict[str, Entry] = {}

    def material(self, stage: str) -> dict:
        """Key material of ``stage`` (:func:`tasks.core.keys.key_material`). Raises NotReady if
        an upstream has no entry. While the recipe set is pinned (a doit command), stages of
        different recipes that are the same stage (implementation, params, upstream outputs,
        data files) share one computation."""
        if stage not in self._materials:
            spec = self.specs[stage]
            upstream = {r: self.entry(up) for r, up in spec.inputs.items()}
            same, shared = None, self.session.materials
            if self.session.pinned is not None:
                same = json.dumps(
                    [
                        spec.kind,
                        spec.family,
                        spec.params,
                        spec.files,
                        {r: e.output_digest for r, e in upstream.items()},
                    ],
                    sort_keys=True,
                )
                if same in shared:
                    self._materials[stage] = shared[same]
                    return shared[same]
            self._materials[stage] = keys.key_material(self.session, spec, upstream)
            if same is not None:
                shared[same] = self._materials[stage]
        return self._materials[stage]

    def remember(self, stage: str, material: dict, entry: Entry) -> None:
        """Take ``entry`` (with its key ``material``) as the stage's, e.g. once it is built."""
        self._materials[stage], self._entries[stage] = material, entry

    def key(self, stage: str) -> str:
        """The stage's key (32 hex). Raises NotReady as :meth:`material` does."""
        return keys.stage_key(self.material(stage))

    def entry(self, stage: str) -> Entry:
        """The committed entry of ``stage`` (checked once per Resolver). Raises NotReady."""
        if stage not in self._entries:
            spec = self.specs[stage]
            key = self.key(stage)
            intact = self.session.intact
            e = intact.get((spec.kind, key))
            if e is None and (self.pull is True or (self.pull and spec.kind in self.pull)):
                e = self.cache.fetch(spec.kind, key)
            elif e is None:
                e = self.cache.lookup(spec.kind, key) or self.cache.peek_remote(spec.kind, key)
            if (
                e is not None and self.session.pinned is not None and e.origin == "local"
            ):  # "pulled" is this lookup's news
                intact[(spec.kind, key)] = e
            if e is None:
                raise keys.NotReady(f"waits for {spec.task}, which has no cache entry yet")
            self._entries[stage] = e
        return self._entries[stage]

    def failures(self, stage: str, entry: Entry) -> list[str]:
        """What the stage's ``check`` finds wrong with ``entry`` ([] when it passes or the
        implementation has no check)."""
        spec = self.specs[stage]
        check = spec.impl.check
        return check(entry.out, entry.manifest, spec.params) if check else []


def checking_resolver(session: Session, recipe_name: str) -> Resolver:
    """The session's Resolver for up-to-date checks of ``recipe_name``: keys, entries and
    entry checks are worked out once per session, not once per task (a no-op build over 50
    recipes computed key material 1,350 times for 300 stages). Only found entries are
    memoised, so a stage built later in the process is seen (``run.run_stage`` also tells
    it). Tied to the loaded recipe set: a recipe edited during a run gets a new one."""
    k = (id(recipeset.current(session)), recipe_name)
    if k not in session.checking:
        session.checking[k] = Resolver(session, recipe_name)
        session.checking[k].cache.defer_rejections = True  # the stage that then runs says it (tasks/store/entries.py)
    return session.checking[k]

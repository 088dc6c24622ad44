"""The recipes folder as a command sees it: :class:`RecipeSet` (names, stage specs, errors),
loaded once per state of the folder, and pinned for the rest of a doit command."""

from __future__ import annotations

import os
from pathlib import Path

from tasks.store import paths
from tasks.store import plancache
from tasks.recipe.plan import StageSpec, expand
from tasks.core.session import Session


class RecipeSet:
    """One state of the recipes folder, as a command sees it: the valid recipes' names and
    stage specs, from the plan cache (:mod:`tasks.store.plancache`: no YAML parsing, no pydantic)
    when it matches, else from loading every recipe file (which then refreshes the plan
    cache when every file was valid). :meth:`full` loads the recipes themselves on demand.

    ``recipes_dir``: the folder (str); ``stamp``: a tuple of (file name, mtime_ns, size) of
    its recipe files, the plan cache's signature."""

    def __init__(self, recipes_dir: str, stamp: tuple):
        self.dir = recipes_dir
        self._full: tuple[dict, dict] | None = None
        self._plans: dict[str, dict[str, StageSpec]] = {}
        sig = plancache.signature(recipes_dir, stamp)
        stored = plancache.load(paths.state_dir(), sig)
        try:
            for n, row in (stored or {}).items():
                if row["specs"] is not None:
                    self._plans[n] = {d["name"]: StageSpec(**d) for d in row["specs"]}
        except (TypeError, KeyError):  # rows of another shape: load the recipes
            stored, self._plans = None, {}
        self.from_plan_cache = stored is not None
        if stored is None:
            from tasks.errors import UnsupportedModel

            with plancache.recording() as noted:
                recipes, errors = self.full()
            stored = {n: {"abstract": r.abstract, "specs": None} for n, r in recipes.items()}
            # a valid recipe of a model not implemented yet is stored with its one reason, so a
            # folder holding one still gets the plan cache (the others are still loaded every time)
            stored.update(
                {
                    n: {"abstract": False, "specs": None, "unsupported": [e.file, [list(p) for p in e.problems]]}
                    for n, e in errors.items()
                    if isinstance(e, UnsupportedModel)
                }
            )
            if all(isinstance(e, UnsupportedModel) for e in errors.values()):
                try:
                    for n, r in recipes.items():
                        if not r.abstract:
                            self._plans[n] = {s.name: s for s in expand(r)}
                            stored[n]["specs"] = [vars(s) for s in self._plans[n].values()]
                except Exception:  # a recipe that cannot be expanded: its build task reports it
                    pass
                else:
                    plancache.save(paths.state_dir(), sig, noted, stored)
        self.abstract = {n: row["abstract"] for n, row in stored.items() if "unsupported" not in row}  # valid ones
        self._unsupported = {n: row["unsupported"] for n, row in stored.items() if "unsupported" in row}

    def full(self) -> tuple[dict, dict]:
        """(recipes by name, {file stem: RecipeError}): every recipe file loaded and checked."""
        if self._full is None:
            from tasks.recipe.checks import load_all

            self._full = load_all(Path(self.dir), collect_errors=True)
        return self._full

    def errors(self) -> dict:
        """{file stem: RecipeError}; from the plan cache, its unsupported recipes' errors."""
        if self.from_plan_cache:
            from tasks.errors import UnsupportedModel

            return {
                n: UnsupportedModel(f, [tuple(p) for p in problems]) for n, (f, problems) in self._unsupported.items()
            }
        return self.full()[1]

    def plan(self, recipe_name: str) -> dict[str, StageSpec]:
        """{stage name: spec} of one recipe (expanded once). Raises KeyError for a recipe that
        is not in the set, RecipeError (or what ``expand`` raises) for one that cannot be
        expanded."""
        if recipe_name not in self._plans:
            self._plans[recipe_name] = {s.name: s for s in expand(self.full()[0][recipe_name])}
        return self._plans[recipe_name]


def pin(session: Session) -> None:
    """Freeze the recipe set (and the entries found intact) for the rest of ``session``: a doit
    command makes its task list once, then asks every stage task whether it is up to date, and
    re-reading the recipes folder (a stat per file) and re-checking an entry shared by many
    recipes for each of those questions was most of a no-op build's time. Empties the memos
    kept only while pinned (``intact``, ``materials``, ``states``). Called by
    :func:`buildable`, so by every command that makes its tasks; a long-lived session that never pins (a
    cluster worker's) sees edits and re-checks entries on every use."""
    session.pinned = None
    for memo in (session.intact, session.materials, session.states):
        memo.clear()
    session.pinned = current(session)


def current(session: Session) -> RecipeSet:
    """The pinned set, else the set for the recipes folder's present stats (one ``stat`` per
    file; each state of the folder is loaded once per session)."""
    if session.pinned is not None:
        return session.pinned
    d = str(paths.recipes_dir())
    try:
        with os.scandir(d) as it:  # one stat per file, no Path objects: this runs per task
            stamp = tuple(sorted(_scan_stat(e) for e in it if e.name.endswith(".yaml") and not e.name.startswith(".")))
    except OSError:
        stamp = ()
    k = (d, stamp)
    if k not in session.recipe_sets:
        session.recipe_sets[k] = RecipeSet(d, stamp)
    return session.recipe_sets[k]


def _scan_stat(e) -> tuple:
    try:
        st = e.stat()  # follows symlinks, like Path.stat
    except OSError:  # a dangling symlink: load_all reports it
        return (e.name, None, None)
    return (e.name, st.st_mtime_ns, st.st_size)


def recipes(session: Session) -> dict:
    """The valid recipes by name ({name: Recipe}), loaded from the files (YAML and pydantic)."""
    return current(session).full()[0]


def recipe_names(session: Session) -> dict[str, bool]:
    """{name: abstract} of the valid recipes; from the plan cache when it matches (a no-op
    command never parses a recipe)."""
    return dict(current(session).abstract)


def recipe_errors(session: Session) -> dict:
    """{file stem: RecipeError} for every invalid recipe file."""
    return current(session).errors()


def plan(session: Session, recipe_name: str) -> dict[str, StageSpec]:
    """{stage name: spec} of one recipe, in build order (expanded once per recipe set); a new
    dict each call. Raises KeyError for a recipe that is not in the set."""
    return dict(current(session).plan(recipe_name))


def buildable(session: Session) -> list[str]:
    """Names of the valid, non-abstract recipes, the ones a command makes tasks for. Pins the
    recipe set for the rest of the command (:func:`pin`). Invalid recipes are not among them
    (:func:`recipe_errors`), so they never block the others."""
    pin(session)
    return [n for n, abstract in recipe_names(session).items() if not abstract]


def stems(session: Session) -> set[str]:
    """The stem of every recipe file, valid or not (abstract ones included)."""
    return set(recipe_names(session)) | set(recipe_errors(session))

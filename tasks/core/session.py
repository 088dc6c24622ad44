"""What one command remembers between calls into :mod:`tasks.core`: a :class:`Session`.

A command creates one and passes it to every core function: the doit task creators
(``dodo.py`` makes one per doit process and gives it to every command's ``creators``), a cluster worker (one per stage
it builds), the catalog and publish (one per call unless given one). The core modules keep no state of
their own, so two sessions never see each other's memos.
"""

from __future__ import annotations


class Session:
    """The memos of one command; every attribute starts empty.

    Recipes (:mod:`tasks.core.recipeset`):

    - ``pinned``: the RecipeSet frozen for the rest of the command (``recipeset.pin``), or
      None: then the recipes folder is stat-ed on every use and edits are seen;
    - ``recipe_sets``: {(recipes folder, stamp of its files): RecipeSet}, each state of the
      folder loaded once.

    Only while pinned (``recipeset.pin`` empties them):

    - ``intact``: {(kind, key): Entry} entries found intact in the local cache;
    - ``materials``: {canonical JSON of a stage (kind, family, params, files, upstream output
      digests): its key material}, shared by the same stage of several recipes;
    - ``states``: {recipe: its ``stages.json`` as read or written}.

    Always:

    - ``checking``: {(id of the RecipeSet, recipe): Resolver} for up-to-date checks
      (``resolve.checking_resolver``);
    - ``checked``: {stage task: (key, seconds, "cache hit" | "pulled")} of the stages found up
      to date (the console line of a skipped task);
    - ``module_files``: {dotted module name: its source file or None};
    - ``imports``: {dotted module name: frozenset of the package modules it imports};
    - ``code_modules``: {dotted module name: sorted tuple of the modules its code covers};
    - ``code_files``: {(implementation module, patch step names): (stats of its files,
      {module: xxh3 of its source})}, reused while the stats are unchanged;
    - ``warned``: recipe file stems whose problem the command has printed;
    - ``cleaned``: the cache roots whose dead builds' leftovers the command removed (once each:
      ``tasks.store.entries.Cache.clean_stale``);
    - ``stage_tasks``: {stage task name: its recipe} of the stage tasks the command made (the
      doit console reporter and its "Did you mean" read them);
    - ``admitted``: recipes whose stages to build were checked against the memory budget
      together before the first of them ran (:func:`tasks.core.admit.admit`);
    - ``request``: what the doit command line asks for (a
      ``tasks.commands.builder.command_line.CommandLine``), None outside doit;
    - ``skipped``: {task group: [(recipe, why)]} of the recipes a bare group command passed over
      (``doit publish``: the recipes that are not verified), said once when the run ends.
    """

    def __init__(self) -> None:
        self.pinned = None
        self.recipe_sets: dict[tuple, object] = {}
        self.intact: dict[tuple[str, str], object] = {}
        self.materials: dict[str, dict] = {}
        self.states: dict[str, dict] = {}
        self.checking: dict[tuple[int, str], object] = {}
        self.checked: dict[str, tuple[str, float, str]] = {}
        self.module_files: dict[str, object] = {}
        self.imports: dict[str, frozenset[str]] = {}
        self.code_modules: dict[str, tuple[str, ...]] = {}
        self.code_files: dict[tuple, tuple[tuple, dict[str, str]]] = {}
        self.warned: set[str] = set()
        self.cleaned: set[str] = set()
        self.stage_tasks: dict[str, str] = {}
        self.admitted: set[str] = set()
        self.request = None
        self.skipped: dict[str, list[tuple[str, str]]] = {}

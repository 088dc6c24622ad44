"""The build command's doit tasks (:func:`creators`):

- ``<stage>:<recipe>`` for every stage (``download:minilm-l6-w8a16``, ``export:...``); its
  ``uptodate`` callable says "my stage key names an intact cache entry", so a stage runs only
  when it is stale, and a stage built by another recipe is reused without running.
- ``build:<recipe>`` runs a recipe's chain, fills ``build/<recipe>/`` and ends with verify's
  figures (:mod:`.verify_lines`); ``doit build`` builds every recipe; with ``-n`` /
  ``--dry-run`` either only says what it would run (:mod:`.dry_run`).
- ``explain:<recipe>`` prints each stage's key, status and what changed since its last build.
- ``recipes``, what a plain ``doit`` runs: the recipes with their state and the commands
  (:mod:`.overview`); it never builds.

A stage's own output goes to its cache entry's ``log.txt`` (``tasks/store/stagelog.py``); the console
gets one line per stage (:mod:`.reporter`).
"""

from __future__ import annotations

import sys

from tasks.core import links, recipeset, run
from tasks.core.session import Session
from tasks.errors import UnsupportedModel, UserError, shown
from tasks.commands.builder.threads import THREAD_MODE


def named(session: Session) -> set[str]:
    """The recipes named on the doit command line (``<group>:<recipe>``) whose task's failure
    the console shows (none with another doit reporter: ``-r json``)."""
    req = session.request
    if req is None or req.reporter:
        return set()
    return {n.split(":", 1)[1] for n in req.names() if ":" in n}


def _invalid(session: Session) -> dict:
    """{stem: error} of the invalid recipe files, each said once on stderr, unless the command
    line names it: then its task's failure says it (once)."""
    errs = recipeset.recipe_errors(session)
    for stem, e in errs.items():
        if stem not in session.warned:
            session.warned.add(stem)
            if stem in named(session):
                continue
            # a valid recipe of a model not implemented yet is said where it is asked for: its
            # build task fails with the reason, `doit list` (_list_fails_on_invalid_recipes) and
            # the catalog name it unsupported; every other command stays quiet about it
            if not isinstance(e, UnsupportedModel):
                print(f"npubuild: invalid recipe, skipped\n{e}", file=sys.stderr)
    return errs


def _fail(message: str):
    from doit.exceptions import TaskFailed

    return TaskFailed(message)


def _stage_action(session: Session, recipe: str, stage: str):
    import threading

    from doit.exceptions import TaskFailed

    if threading.current_thread() is not threading.main_thread():
        return TaskFailed(THREAD_MODE)
    try:
        return run.run_stage(session, recipe, stage)
    except UserError as e:  # its notes name the stage's log (run.run_stage)
        return TaskFailed(shown(e))


def _materialize_action(session: Session, recipe: str, dry_run: bool = False):
    """:func:`tasks.core.links.materialize` as ``build:<recipe>``'s action, then verify's figures
    (:func:`.verify_lines.verify_lines`): an error that explains itself (a full build disk:
    DiskFull) is its one line, as a stage's is. ``dry_run`` (the task's ``-n`` param): never
    true here, a dry run's task has :func:`_dry_run_action` instead."""
    from tasks.commands.builder.verify_lines import verify_lines

    try:
        done = links.materialize(session, recipe)
    except UserError as e:
        return _fail(shown(e))
    for line in verify_lines(session, recipe, run.task_width(session, recipe)):
        print(line)
    return done


def _dry_run_action(session: Session, recipe: str, dry_run: bool = True):
    """``build:<recipe> -n``: :func:`.dry_run.print_plan`, nothing run."""
    from tasks.commands.builder.dry_run import print_plan
    from tasks.core.explain import explain

    try:
        print_plan(session, recipe, explain(session, recipe))
    except UserError as e:
        return _fail(shown(e))


#: the build tasks' dry-run option (doit passes it as the ``dry_run`` param)
DRY_RUN = {
    "name": "dry_run",
    "short": "n",
    "long": "dry-run",
    "type": bool,
    "default": False,
    "help": "say what build:<recipe> would run (stage by stage: cache hit, pull or build) and run nothing",
}


def _admit_action(session: Session, recipe: str):
    """``admit:<recipe>``, the first dependency of each of the recipe's stage tasks: the build is
    refused before any stage runs when a stage of the recipe still to build cannot fit the
    memory budget alone (:func:`tasks.core.admit.admit`), in its one line."""
    from tasks.core.admit import admit
    from tasks.core.resolve import Resolver

    try:
        admit(session, recipe, Resolver(session, recipe, pull=False), run.memory_estimate)
    except UserError as e:
        return _fail(shown(e))


def _admit_uptodate(session: Session, recipe: str):
    """``admit:<recipe>`` is up to date when every stage of the recipe has an intact cache entry
    (nothing to build needs memory), so a second build of an unchanged recipe runs no task."""

    def check(task, values):
        from tasks.core.resolve import Resolver

        try:
            res = Resolver(session, recipe, pull=False)
            return all(res.entry(stage) is not None for stage in res.specs)
        except Exception:  # a stage not built, or its key not computable yet: check the budget
            return False

    return check


def _print_explain(session: Session, recipe: str) -> None:
    from tasks.core.explain import print_explain

    print_explain(session, recipe)


def _build_uptodate(session: Session, recipe: str):
    def check(task, values):
        return links.is_current(session, recipe)

    return check


def _uptodate(session: Session, recipe: str, stage: str):
    def check(task, values):
        return run.is_up_to_date(session, recipe, stage)

    check.__name__ = f"cached_{stage}"
    return check


def creators(session: Session) -> dict:
    """{name: doit task creator} of the build command, all working in ``session``."""

    def task_stages():
        """One task per stage of every recipe; doit groups them by stage name."""
        for name in recipeset.buildable(session):
            for spec in recipeset.plan(session, name).values():
                session.stage_tasks[spec.task] = name
                yield {
                    "basename": spec.name,
                    "name": name,
                    "doc": f"{spec.kind} stage of {name}",
                    "actions": [(_stage_action, [session, name, spec.name])],
                    # admit first: a stage to build that cannot fit at all stops them all before work
                    "task_dep": [f"admit:{name}"] + [f"{up}:{name}" for up in sorted(set(spec.inputs.values()))],
                    "uptodate": [_uptodate(session, name, spec.name)],
                    "verbosity": 2,
                }

    def task_build():
        """build:<recipe> runs the recipe's whole chain (download, export, quantize, compile,
        verify), links its artifacts into build/<recipe>/ and prints verify's figures; with -n
        (--dry-run) it says what it would run and runs nothing.

        ``doit build`` builds every recipe (one line per failing one)."""
        yield {"name": None, "params": [DRY_RUN], "doc": "build every recipe (-n: say what each would run)"}
        for stem, err in sorted(_invalid(session).items()):
            yield {
                "name": stem,
                "doc": f"INVALID recipe {stem}.yaml (run it to see why)",
                "params": [DRY_RUN],
                "actions": [(_fail, [str(err)])],
                "uptodate": [False],
                "verbosity": 2,
            }
        for name in recipeset.buildable(session):
            if session.request and session.request.dry_run(f"build:{name}"):
                yield {
                    "name": name,
                    "doc": f"what build:{name} would run",
                    "params": [DRY_RUN],
                    "actions": [(_dry_run_action, [session, name])],
                    "uptodate": [False],
                    "verbosity": 2,
                }
                continue
            specs = recipeset.plan(session, name)
            yield {
                "name": name,
                "doc": f"build {name} (all stages) into build/{name}/",
                "params": [DRY_RUN],
                "actions": [(_materialize_action, [session, name])],
                "task_dep": [s.task for s in specs.values()],
                "uptodate": [_build_uptodate(session, name)],
                "verbosity": 2,
            }

    def task_admit():
        """admit:<recipe> refuses the build before any stage runs when one cannot fit the budget."""
        for name in recipeset.buildable(session):
            yield {
                "name": name,
                "actions": [(_admit_action, [session, name])],
                "uptodate": [_admit_uptodate(session, name)],
                "verbosity": 2,
                "doc": f"check {name}'s stages to build against NPUBUILD_MEMORY_GB",
            }

    def task_explain():
        """explain:<recipe> prints each stage's key, params, status and what changed; of an
        invalid or unsupported recipe it fails with the reason, as build:<recipe> does."""
        for stem, err in sorted(_invalid(session).items()):
            yield {
                "name": stem,
                "doc": f"INVALID recipe {stem}.yaml (run it to see why)",
                "actions": [(_fail, [str(err)])],
                "uptodate": [False],
                "verbosity": 2,
            }
        for name in recipeset.buildable(session):
            yield {
                "name": name,
                "actions": [(_print_explain, [session, name])],
                "uptodate": [False],
                "verbosity": 2,
                "doc": f"show {name}'s plan, stage keys and why a stage is stale",
            }

    return {
        "task_stages": task_stages,
        "task_build": task_build,
        "task_admit": task_admit,
        "task_explain": task_explain,
    }

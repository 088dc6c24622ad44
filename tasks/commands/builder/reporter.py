"""The console reporter of the doit commands (:func:`console_reporter`): one line per stage."""

from __future__ import annotations

from tasks.core import run
from tasks.core.session import Session


def console_reporter(session: Session):
    """doit's console reporter, made to print one line per stage: a stage task that
    runs prints its own line when done (``tasks.core.run.run_stage``: key, built / FAILED, seconds), so
    doit's ".  <task>" line is dropped for it and for ``build:<recipe>`` (which prints its own);
    an up-to-date stage gets the same line as a cache hit instead of "-- <task>". A task that
    fails with a message of ours (TaskFailed: a stage's error, a full disk under build/, dist/
    or catalog/, publish's refusals) is one ``<task>  <message>`` line, without doit's
    "TaskFailed - taskid:" line; an exception doit caught keeps its traceback."""
    from doit.reporter import ConsoleReporter

    class Reporter(ConsoleReporter):
        desc = "console, one line per stage (npubuild)"

        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self._causes: dict[str, tuple[str, ...]] = {}  # task -> the tasks that failed under it

        @staticmethod
        def _ours(task) -> bool:
            """A task that prints its own lines: a stage, ``build:``, the overview, a bare
            ``doit publish``'s (each publishes with its line or is named at the end), and any
            task of an invalid recipe (its failure is its one message)."""
            from tasks.core import recipeset

            base, _, recipe = task.name.partition(":")
            bare_publish = base == "publish" and session.request is not None and "publish" in session.request.names()
            return (
                bool(recipe)
                and (
                    base in ("build", "admit")
                    or task.name in session.stage_tasks
                    or bare_publish
                    or recipe in recipeset.recipe_errors(session)
                )
            ) or task.name == "recipes"

        def execute_task(self, task):
            if not self._ours(task):
                super().execute_task(task)

        def _write_failure(self, result, write_exception=True):
            from doit.exceptions import TaskFailed, UnmetDependency

            fail, name = result["exception"], result["task"].name
            causes = self._causes
            if isinstance(fail, UnmetDependency):  # one line, not doit's three
                # doit names the upstream tasks that did not succeed, also those that were only
                # not run themselves: name the ones that failed instead
                msg = f" {fail.get_msg().strip()} "  # names joined by spaces; a name may hold one
                ups = [t for t in causes if f" {t} " in msg] or msg.split()
                roots = sorted({c for up in ups for c in causes.get(up, (up,))})
                causes[name] = tuple(roots)
                recipe = self._recipe_of(name)
                if recipe and all(self._recipe_of(r) == recipe for r in roots):
                    return  # the recipe's own failure was its one line (not ~15 lines a recipe)
                self.write(f"{name}  not run: {' '.join(roots)} failed\n")
            elif name in session.stage_tasks and hasattr(fail, "get_msg") or type(fail) is TaskFailed:
                causes[name] = (name,)
                self.write(f"{name}  {fail.get_msg().strip()}\n")  # without doit's "TaskFailed - taskid" line
            else:
                causes[name] = (name,)
                super()._write_failure(result, write_exception)

        @staticmethod
        def _recipe_of(task: str) -> str | None:
            """The recipe of a stage task or of ``build:<recipe>`` / ``admit:<recipe>``, else None."""
            return session.stage_tasks.get(task) or (
                task.split(":", 1)[1] if task.startswith(("build:", "admit:")) else None
            )

        def skip_uptodate(self, task):
            checked = session.checked.get(task.name)
            if task.name in session.stage_tasks and checked:
                recipe = session.stage_tasks[task.name]
                self.write(
                    run.line(task.name, checked[0], checked[2], checked[1], run.task_width(session, recipe)) + "\n"
                )
            elif task.name.startswith("admit:"):  # every stage is built: the memory check had nothing to say
                pass
            else:
                super().skip_uptodate(task)
            if task.name.startswith("build:") and task.subtask_of is not None:  # up to date: its figures still
                from tasks.commands.builder.verify_lines import verify_lines

                recipe = task.name.split(":", 1)[1]
                for line in verify_lines(session, recipe, run.task_width(session, recipe)):
                    self.write(line + "\n")

        def complete_run(self):
            """doit's end of run, after one line per recipe a bare group command passed over
            (``session.skipped``: ``doit publish`` and the recipes that are not verified)."""
            for group, passed in sorted(session.skipped.items()):
                self.write(
                    f"{group}: {len(passed)} recipe(s) not {group}ed, not verified: "
                    + ", ".join(f"{r} ({why})" for r, why in passed)
                    + "\n"
                )
            super().complete_run()

    return Reporter

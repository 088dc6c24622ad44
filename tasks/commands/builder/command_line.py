"""What a doit command line asks for (:func:`parse`), read from ``sys.argv`` when ``dodo.py`` is
imported, before doit parses it itself: the doit command and the tasks named, each with the
options written after it. The task creators use it to make a task list that fits the request:
``build:<recipe> -n`` plans instead of building, a bare ``publish`` publishes the verified
recipes, and an invalid recipe named on the line is said once, by its task."""

from __future__ import annotations

from dataclasses import dataclass, field

#: doit's commands (doit 0.37, ``DoitMain.DOIT_CMDS``); without one, the command is ``run``
COMMANDS = (
    "auto",
    "clean",
    "dumpdb",
    "forget",
    "help",
    "ignore",
    "info",
    "list",
    "reset-dep",
    "run",
    "strace",
    "tabcompletion",
)

#: the options of the dry run a ``build`` task takes (doit gives them to the task as its params)
DRY_RUN = ("-n", "--dry-run")

#: the tasks' options that take no value (``publish --dry-run``, ``gc --apply``, the dry run):
#: any other option written after a task takes the next word unless written ``--opt=value``
TASK_FLAGS = (*DRY_RUN, "--apply")


def _options_with_values() -> set[str]:
    """The spellings (``-n``, ``--process``) of doit's options that take a value: the run
    command's, its base options' and the dodo loader's (``-f``, ``-d``)."""
    from doit.cmd_base import DodoTaskLoader, DoitCmdBase
    from doit.cmd_run import Run

    out = set()
    for o in (*DoitCmdBase.base_options, *Run.cmd_options, *DodoTaskLoader.cmd_options):
        if o.get("type") is not bool:
            out |= {f"-{o['short']}"} if o.get("short") else set()
            out |= {f"--{o['long']}"} if o.get("long") else set()
    return out


@dataclass(frozen=True)
class CommandLine:
    """``command``: doit's command (``run`` when none is given); ``tasks``: the task names in
    the order written, each with the options written after it ([(name, [option, ...])]);
    ``reporter``: whether doit's ``-r`` / ``--reporter`` chose another reporter than the console
    one (a task's failure then goes to that reporter's output, not to the console)."""

    command: str = "run"
    tasks: tuple[tuple[str, tuple[str, ...]], ...] = field(default_factory=tuple)
    reporter: bool = False

    def names(self) -> list[str]:
        return [n for n, _ in self.tasks]

    def options(self, name: str) -> tuple[str, ...]:
        """The options written after task ``name`` (its first mention), () when not named."""
        return next((o for n, o in self.tasks if n == name), ())

    def dry_run(self, task: str) -> bool:
        """Whether ``task`` (``build:<recipe>``) is to be planned, not run: ``-n`` or
        ``--dry-run`` after it, or after the bare ``build``."""
        group = task.split(":", 1)[0]
        return any(o in DRY_RUN for o in self.options(task) + self.options(group))


def parse(argv: list[str]) -> CommandLine:
    """The :class:`CommandLine` of ``argv`` (``sys.argv[1:]``): a first word that is one of
    doit's :data:`COMMANDS` is the command; then words starting with ``-`` are options (a
    value option takes the next word unless written ``--opt=value`` or ``-nVALUE``: doit's own
    before the first task, a task's unless it is one of :data:`TASK_FLAGS`) and the others are
    task names. Options after a task name are that task's (doit's own rule)."""
    args = list(argv)
    command = args.pop(0) if args and args[0] in COMMANDS else "run"
    valued = _options_with_values()
    tasks: list[tuple[str, list[str]]] = []
    reporter = False
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-") and len(a) > 1:
            if not tasks and (a in ("-r", "--reporter") or a.startswith(("-r", "--reporter="))):
                reporter = True
            if tasks:
                tasks[-1][1].append(a)
                if a not in TASK_FLAGS and "=" not in a and i + 1 < len(args):
                    tasks[-1][1].append(args[i + 1])  # its value
                    i += 1
            elif a in valued:  # doit's own, before any task: skip its value
                i += 1
        elif a.startswith("-"):
            pass
        else:
            tasks.append((a, []))
        i += 1
    return CommandLine(command, tuple((n, tuple(o)) for n, o in tasks), reporter)

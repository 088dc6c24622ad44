"""The doit process npubuild runs in: what ``dodo.py`` sets up before any task is made
(:func:`start`). Settings of the environment npubuild cannot use are one line each and exit 2
(:func:`environment_problems`, :func:`thread_mode`); Ctrl-C is one line; a task name doit does
not know gets "Did you mean" (:func:`suggestion`); doit's database is moved aside when SQLite
cannot read it (doit opens it through :mod:`.doitdb`: written once per run, a full disk one
line); ``doit list`` exits 1 on an invalid recipe; :func:`start` returns doit's configuration
with the console reporter (:mod:`.reporter`)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tasks.store import paths
from tasks.core import recipeset
from tasks.core.session import Session
from tasks.proc import interrupt
from tasks.commands.builder import doitdb
from tasks.commands.builder.reporter import console_reporter
from tasks.commands.builder.threads import THREAD_MODE, thread_mode


def environment_problems() -> list[str]:
    """One line per setting of the environment npubuild cannot use, found before any task is
    made (each would be a 40-line traceback): a relative ``NPUBUILD_*`` folder, a relative
    ``NPUBUILD_ALLOW_PATHS`` entry, an ``NPUBUILD_REMOTE`` URL fsspec cannot open (unknown
    scheme, backend not installed), a cache, build or home folder this user cannot write
    (:func:`tasks.store.outputs.unwritable`: read-only file system, mode, owner; dist/ and catalog/
    are checked by the tasks that write them), an ``NPUBUILD_HOME`` disk
    with less than :data:`HOME_MIN_FREE` free, an ``NPUBUILD_LOCK_TIMEOUT`` or
    ``NPUBUILD_MEMORY_GB`` that is not a number in range. Reads nothing from the network."""
    from tasks.store import outputs

    problems = []
    for where in (
        paths.root,
        paths.recipes_dir,
        paths.cache_dir,
        paths.build_dir,
        paths.state_dir,
        paths.dist_dir,
        paths.catalog_dir,
        paths.allowed_dirs,
    ):
        try:
            where()
        except ValueError as e:  # every folder under a relative NPUBUILD_ROOT says the same: once
            if str(e) not in problems:
                problems.append(str(e))
    for name, where in (
        ("NPUBUILD_CACHE", paths.cache_dir),
        ("NPUBUILD_BUILD", paths.build_dir),
        ("NPUBUILD_HOME", paths.state_dir),
    ):
        try:
            if bad := outputs.unwritable(name, where()):
                problems.append(bad)
        except ValueError:
            pass  # said above
    from tasks.store.keylock import lock_timeout
    from tasks.proc.budget import budget_gib

    for check in (lock_timeout, budget_gib):  # numbers: NPUBUILD_LOCK_TIMEOUT, NPUBUILD_MEMORY_GB
        try:
            check()
        except ValueError as e:
            problems.append(str(e))
    if os.environ.get("NPUBUILD_REMOTE"):
        from tasks.store import remote

        try:
            remote.from_env()
        except ValueError as e:
            problems.append(str(e))
    if not problems and (bad := _home_problem()):
        problems.append(bad)
    return problems


#: the room NPUBUILD_HOME needs to start a run: doit's database and the stat cache write there,
#: and doit stops with a traceback when its database cannot be written
HOME_MIN_FREE = 4 << 20


def _home_problem() -> str:
    home = paths.state_dir()
    probe = home if home.exists() else next((p for p in home.parents if p.exists()), home)
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return ""
    if free >= HOME_MIN_FREE:
        return ""
    return (
        f"NPUBUILD_HOME {home}: {free / 2**20:.1f} MiB free on its disk, expected at least "
        f"{HOME_MIN_FREE >> 20} MiB (doit's database and the stat cache write there): free space or point "
        f"NPUBUILD_HOME to another disk; nothing was changed"
    )


def _interrupted(exc_type, exc, tb, _default=sys.excepthook):
    """``sys.excepthook`` of the doit process: Ctrl-C is one line, not doit's traceback. What a
    stage was building stays out of the cache (``tasks/store/entries.py``: only a finished build is
    renamed into place); the process still ends by SIGINT, so shells see an interrupt."""
    if not issubclass(exc_type, KeyboardInterrupt):
        return _default(exc_type, exc, tb)
    logs = [n for n in getattr(exc, "__notes__", ()) if n.startswith("log: ")]
    sys.stderr.write(
        "npubuild: interrupted; cache entries are whole or absent (a stage stopped midway left none)"
        + (f"; the stopped stage's {logs[0]}" if logs else "")
        + "\n"
    )


def suggestion(session: Session, groups, param: str | None) -> str:
    """For a task name doit does not know (``build:minilm``), the close ones: the part after
    the last ``:`` against the recipe files' names (valid or not: those it begins, else
    difflib's ratio >= 0.6), the part before it against the task groups (ratio >= 0.6).
    "" when nothing is close. ``groups``: the names of the task creators' groups, without the
    stage tasks (their groups are the stage names ``session.stage_tasks`` holds)."""
    import difflib

    if not param:
        return ""
    group, sep, name = param.rpartition(":")
    if not sep:
        group, name = name, ""
    recipes = sorted(recipeset.stems(session))
    groups = sorted({t.split(":", 1)[0] for t in session.stage_tasks} | set(groups()))
    gs = [group] if group in groups or not group else difflib.get_close_matches(group, groups, n=2, cutoff=0.6)
    ns = (
        [name]
        if not name or name in recipes
        else (
            [r for r in recipes if r.startswith(name)][:3] or difflib.get_close_matches(name, recipes, n=3, cutoff=0.6)
        )
    )
    close = [f"{g}:{n}" if n else g for g in gs for n in ns if f"{g}:{n}" != param and g != param]
    return f"Did you mean: {', '.join(close)}?\n" if close else ""


def _did_you_mean(session: Session, groups) -> None:
    """doit's "Invalid parameter" error (``doit.exceptions.InvalidCommand``, raised before any
    task of ours runs) followed by :func:`suggestion`."""
    from doit.exceptions import InvalidCommand

    plain = InvalidCommand.__str__

    def __str__(self):
        return plain(self) + suggestion(session, groups, self.not_found)

    InvalidCommand.__str__ = __str__


def _backend_option(argv: list[str]) -> list[str]:
    """The problem with a ``--backend`` other than ``sqlite3`` on the command line: npubuild keeps
    doit's database in SQLite (:mod:`.doitdb`); doit's json and dbm backends cannot read that
    file, and doit's plain sqlite3 one held it locked beside a failed task (issue 51)."""
    for a, nxt in zip(argv, argv[1:] + [None]):
        v = a.split("=", 1)[1] if a.startswith("--backend=") else nxt if a == "--backend" else None
        if v is not None and v != "sqlite3":
            return [
                f"--backend {v}: expected sqlite3 or no --backend (npubuild keeps doit's database in "
                "SQLite, NPUBUILD_HOME/doit.sqlite3, which doit's other backends cannot read)"
            ]
    return []


def _check_doit_db(path: Path) -> None:
    """Move doit's database aside (one warning) when SQLite cannot read it, before doit opens
    it: it holds only doit's own records (our up-to-date checks read the cache), so doit
    starting with an empty one costs nothing but a re-check."""
    import sqlite3

    from tasks.store.digest import reset_database

    if not path.exists():
        return
    try:
        with sqlite3.connect(path, timeout=60) as conn:
            conn.execute("SELECT name FROM sqlite_master").fetchall()
            bad = conn.execute("PRAGMA quick_check").fetchone()[0]
            cols = [r[1] for r in conn.execute("PRAGMA table_info(doit)")]
            if bad == "ok" and cols and cols != ["task_id", "task_data"]:  # another program's table
                bad = f"table doit has columns {cols}, doit's are ['task_id', 'task_data']"
        conn.close()
    except sqlite3.DatabaseError as e:
        from tasks.store.digest import damaged

        if damaged(e):
            reset_database(path, e, "doit's database")
        return  # full, read-only, locked: doit says so when it writes; the file is valid
    if bad != "ok":
        reset_database(
            path,
            sqlite3.DatabaseError(bad if bad.startswith("table doit") else f"quick_check: {bad}"),
            "doit's database",
        )


def commands(namespace: dict) -> dict[str, str]:
    """{command as typed: what it does} from ``namespace``'s ``task_*`` creators (the stage
    tasks', ``admit``'s (every build runs it first) and the overview's left out): the first
    paragraph of each creator's docstring; a docstring that starts with ``<group>:<recipe>``
    names the command so."""
    from tasks.commands.builder.overview import first_paragraph

    out = {}
    for name, fn in namespace.items():
        if not name.startswith("task_") or name in ("task_stages", "task_admit", "task_recipes"):
            continue
        group, doc = name[len("task_") :], first_paragraph(getattr(fn, "__doc__", ""))
        if doc.startswith(f"{group}:<recipe> "):
            rest = doc[len(group) + 10 :]
            out[f"{group}:<recipe>"] = rest[:1].upper() + rest[1:]
        else:
            out[group] = doc
    return out


def stage_groups(session: Session) -> list[str]:
    """The stage task groups (``download``, ``export.part0``, ...) of the valid recipes, in
    build order of their first appearance."""
    out: list[str] = []
    for name in recipeset.buildable(session):
        out += [s.name for s in recipeset.plan(session, name).values() if s.name not in out]
    return out


def _overview(session: Session, namespace: dict, header: str = "") -> None:
    from tasks.commands.builder.overview import print_overview

    print_overview(session, commands(namespace), stage_groups(session), header)


def creators(session: Session, namespace: dict) -> dict:
    """{name: doit task creator} of the doit process itself: ``recipes``, what a plain ``doit``
    runs (``DOIT_CONFIG["default_tasks"]``): the recipes with their state and the commands; it
    builds nothing."""

    def task_recipes():
        """The recipes with their state in the local cache, and the commands: what a plain
        `doit` prints (it never builds; `doit build:<recipe>` builds one)."""
        header = (
            "npubuild: nothing was built (a plain `doit` lists; `doit build:<recipe>` builds one, "
            "`doit build:<recipe> -n` first says what it would run)"
        )
        return {"actions": [(_overview, [session, namespace, header])], "uptodate": [False], "verbosity": 2}

    return {"task_recipes": task_recipes}


def with_invalid_recipes(session: Session, made: dict) -> dict:
    """``made`` ({name: task creator}, a command's) with each per-recipe creator (one whose
    subtasks are named after recipes) also making, for an invalid or unsupported recipe file
    the command line names as ``<group>:<stem>``, a task that fails with the file's error: its
    one message, where doit would add "Invalid parameter" after the one printed as the
    recipes load. The stage tasks' creator is left as it is."""
    import functools

    def _failing(message: str):
        from doit.exceptions import TaskFailed

        return TaskFailed(message)

    def wrap(group: str, creator):
        @functools.wraps(creator)
        def wrapped():
            made_now = creator()
            if isinstance(made_now, dict) or made_now is None:
                return made_now
            return _with(made_now)

        def _with(tasks):
            names, recipes = set(), set(recipeset.buildable(session))
            for t in tasks:
                names.add(t.get("name"))
                yield t
            wanted = set(session.request.names()) if session.request else set()
            if names & recipes:
                for stem, err in sorted(recipeset.recipe_errors(session).items()):
                    if stem not in names and f"{group}:{stem}" in wanted:
                        yield {
                            "name": stem,
                            "doc": f"INVALID recipe {stem}.yaml",
                            "actions": [(_failing, [str(err)])],
                            "uptodate": [False],
                            "verbosity": 2,
                        }

        return wrapped

    return {n: c if n == "task_stages" else wrap(n[len("task_") :], c) for n, c in made.items()}


def _plain_list(
    pos_args=None, subtasks=False, quiet=False, status=False, private=False, list_deps=False, template=None, **_
) -> bool:
    """Whether ``doit list`` was asked with nothing but (possibly) its sort: then it prints the
    overview instead of doit's one line per task group."""
    return not (pos_args or subtasks or quiet or status or private or list_deps or template)


def _list_fails_on_invalid_recipes(session: Session, namespace: dict) -> None:
    """Make ``doit list`` list the recipes with their state and the commands (:func:`_overview`;
    doit's own listing with ``--all``, ``-q``, task names or a template), exit 1 when a recipe
    file is invalid (after listing the valid ones), and end quietly (exit 1, Python's advice
    for EPIPE) when its reader closes the pipe. doit's List command always returns 0 and has no
    hook; dodo.py is imported before it runs."""
    import functools

    from doit.cmd_list import List

    plain = List._execute
    if getattr(plain, "npubuild", False):
        return

    @functools.wraps(plain)
    def _execute(self, *args, **kw):
        try:
            if not args and _plain_list(**kw):
                _overview(session, namespace)
                sys.stdout.flush()
                code = 0
            else:
                code = plain(self, *args, **kw)
        except BrokenPipeError:  # `doit list --all | head`: the reader left, so do we, without a traceback
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (and no second error at exit)
            return 1
        errs = recipeset.recipe_errors(session)
        if errs:  # (the recipe module, and pydantic with it, only when a stored plan did not serve)
            from tasks.errors import UnsupportedModel

            for e in errs.values():  # listed as unsupported, not invalid: one line each
                if isinstance(e, UnsupportedModel):
                    print(f"npubuild: {e.file}: unsupported model, skipped: {e.problems[0][1]}", file=sys.stderr)
            errs = {k: e for k, e in errs.items() if not isinstance(e, UnsupportedModel)}
        if errs:
            print(
                f"npubuild: {len(errs)} invalid recipe file(s), each with a failing build:<stem> task: "
                f"{', '.join(f'{s}.yaml' for s in sorted(errs))}",
                file=sys.stderr,
            )
        return code or (1 if errs else 0)

    _execute.npubuild = True
    List._execute = _execute


def start(session: Session, namespace: dict) -> dict:
    """Set up this doit process for ``session`` (the command's): refuse, exit 2, the settings
    :func:`environment_problems` and :func:`thread_mode` find; make ``NPUBUILD_HOME``; install
    the Ctrl-C line, "Did you mean" (the groups: ``namespace``'s ``task_*`` creators, read when
    doit asks), the doit database checks and ``doit list``'s listing and exit status; read the
    command line into ``session.request`` (:mod:`.command_line`). Returns DOIT_CONFIG: a plain
    ``doit`` runs ``recipes`` (:func:`creators`), never a build."""
    if (
        problems := environment_problems()
        + ([THREAD_MODE] if thread_mode(sys.argv[1:]) else [])
        + _backend_option(sys.argv[1:])
    ):
        sys.stderr.write("".join(f"npubuild: {p}\n" for p in problems))
        sys.exit(2)
    paths.state_dir().mkdir(parents=True, exist_ok=True)
    sys.excepthook = _interrupted
    interrupt.install()
    _did_you_mean(
        session, lambda: [n[len("task_") :] for n in namespace if n.startswith("task_") and n != "task_stages"]
    )
    _check_doit_db(paths.state_dir() / "doit.sqlite3")
    doitdb.install()
    _list_fails_on_invalid_recipes(session, namespace)
    from tasks.commands.builder.command_line import parse

    session.request = parse(sys.argv[1:])
    return {
        "backend": "sqlite3",  # the only doit backend that supports concurrent access (as doitdb.py installs it)
        "dep_file": str(paths.state_dir() / "doit.sqlite3"),
        "verbosity": 2,
        "default_tasks": ["recipes"],  # a plain `doit` lists (tasks named `doit build` build them all)
        "continue": True,  # like make -k: build every recipe that can be built, report the others
        "reporter": console_reporter(session),  # one console line per stage
    }

"""Turn recipes' plans into doit tasks. ``dodo.py`` only imports the ``task_*`` creators here.

Tasks (``doit list``):

- ``<stage>:<recipe>`` for every stage (``download:minilm-l6-w8a16``, ``export:...``); its
  ``uptodate`` callable says "my stage key names an intact cache entry", so a stage runs only
  when it is stale, and a stage built by another recipe is reused without running.
- ``build:<recipe>`` runs a recipe's chain and fills ``build/<recipe>/``; ``doit build`` builds
  every recipe.
- ``explain:<recipe>`` prints each stage's key, status and what changed since its last build.
- ``gc`` (``--apply`` to delete) and ``cache_verify`` (full rehash) maintain ``cache/``.
- ``push:<recipe>`` (``push`` for all) publishes a recipe's local entries to the remote cache
  (``NPUBUILD_REMOTE``); a build pushes what it builds by itself.
- ``cluster --scheduler tcp://host:8786 [recipe ...]`` builds the stale stages on a Dask
  cluster and pulls them (``tasks/cluster.py``).

The console reporter (:func:`_console_reporter`) prints one line per stage; a stage's own
output goes to its cache entry's ``log.txt`` (``tasks/stagelog.py``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from . import paths
from .core import recipeset, record, resolve, run
from .core.session import Session
from .proc import interrupt


def environment_problems() -> list[str]:
    """One line per setting of the environment npubuild cannot use, found before any task is
    made (issue 23: each was a 40-line traceback): a relative ``NPUBUILD_*`` folder, a relative
    ``NPUBUILD_ALLOW_PATHS`` entry, an ``NPUBUILD_REMOTE`` URL fsspec cannot open (unknown
    scheme, backend not installed), a cache, build or home folder this user cannot write
    (:func:`tasks.outputs.unwritable`: read-only file system, mode, owner; dist/ and catalog/
    are checked by the tasks that write them), an ``NPUBUILD_HOME`` disk
    with less than :data:`HOME_MIN_FREE` free, an ``NPUBUILD_LOCK_TIMEOUT`` or
    ``NPUBUILD_MEMORY_GB`` that is not a number in range. Reads nothing from the network."""
    from . import outputs

    problems = []
    for where in (paths.root, paths.recipes_dir, paths.cache_dir, paths.build_dir, paths.state_dir,
                  paths.dist_dir, paths.catalog_dir, paths.allowed_dirs):
        try:
            where()
        except ValueError as e:  # every folder under a relative NPUBUILD_ROOT says the same: once
            if str(e) not in problems:
                problems.append(str(e))
    for name, where in (("NPUBUILD_CACHE", paths.cache_dir), ("NPUBUILD_BUILD", paths.build_dir),
                        ("NPUBUILD_HOME", paths.state_dir)):
        try:
            if bad := outputs.unwritable(name, where()):
                problems.append(bad)
        except ValueError:
            pass  # said above
    from .cache import lock_timeout
    from .budget import budget_gib

    for check in (lock_timeout, budget_gib):  # numbers: NPUBUILD_LOCK_TIMEOUT, NPUBUILD_MEMORY_GB
        try:
            check()
        except ValueError as e:
            problems.append(str(e))
    if os.environ.get("NPUBUILD_REMOTE"):
        from . import remote

        try:
            remote.from_env()
        except ValueError as e:
            problems.append(str(e))
    if not problems and (bad := _home_problem()):
        problems.append(bad)
    return problems


#: the room NPUBUILD_HOME needs to start a run: doit's database and the stat cache write there,
#: and doit stops with a traceback when its database cannot be written (issue 23)
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
    return (f"NPUBUILD_HOME {home}: {free / 2**20:.1f} MiB free on its disk, expected at least "
            f"{HOME_MIN_FREE >> 20} MiB (doit's database and the stat cache write there): free space or point "
            f"NPUBUILD_HOME to another disk; nothing was changed")


THREAD_MODE = ("-P thread: npubuild runs stages in processes: use `doit -n N` without `-P thread` (a stage "
               "redirects its process's stdout/stderr into its log, and the exporters are not "
               "thread-safe: concurrent exports failed in thread mode)")


def thread_mode(argv: list[str]) -> bool:
    """Whether a doit command line asks for thread-parallel tasks (``-P thread``, ``-Pthread``,
    ``--parallel-type thread``, ``--parallel-type=thread``): refused when doit starts, as a
    no-op too (a tester's no-op passed and a stale build failed at its first stage)."""
    for i, a in enumerate(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if a in ("-P", "--parallel-type") and nxt == "thread" or a in ("-Pthread", "--parallel-type=thread"):
            return True
    return False


if _problems := environment_problems() + ([THREAD_MODE] if thread_mode(sys.argv[1:]) else []):
    sys.stderr.write("".join(f"npubuild: {p}\n" for p in _problems))
    sys.exit(2)
paths.state_dir().mkdir(parents=True, exist_ok=True)


def _interrupted(exc_type, exc, tb, _default=sys.excepthook):
    """``sys.excepthook`` of the doit process: Ctrl-C is one line, not doit's traceback. What a
    stage was building stays out of the cache (``tasks/cache.py``: only a finished build is
    renamed into place); the process still ends by SIGINT, so shells see an interrupt."""
    if not issubclass(exc_type, KeyboardInterrupt):
        return _default(exc_type, exc, tb)
    logs = [n for n in getattr(exc, "__notes__", ()) if n.startswith("log: ")]
    sys.stderr.write("npubuild: interrupted; cache entries are whole or absent (a stage stopped midway left none)"
                     + (f"; the stopped stage's {logs[0]}" if logs else "") + "\n")


sys.excepthook = _interrupted
interrupt.install()


def suggestion(param: str | None) -> str:
    """For a task name doit does not know (``build:minilm``), the close ones: the part after
    the last ``:`` against the recipe files' names (valid or not: those it begins, else
    difflib's ratio >= 0.6), the part before it against the task groups (ratio >= 0.6).
    "" when nothing is close."""
    import difflib

    if not param:
        return ""
    group, sep, name = param.rpartition(":")
    if not sep:
        group, name = name, ""
    recipes = sorted(_recipe_stems())
    groups = sorted({t.split(":", 1)[0] for t in _STAGE_TASKS} | {n[len("task_"):] for n in globals()
                                                                  if n.startswith("task_") and n != "task_stages"})
    gs = [group] if group in groups or not group else difflib.get_close_matches(group, groups, n=2, cutoff=0.6)
    ns = [name] if not name or name in recipes else (
        [r for r in recipes if r.startswith(name)][:3] or difflib.get_close_matches(name, recipes, n=3, cutoff=0.6))
    close = [f"{g}:{n}" if n else g for g in gs for n in ns if f"{g}:{n}" != param and g != param]
    return f"Did you mean: {', '.join(close)}?\n" if close else ""


def _did_you_mean() -> None:
    """doit's "Invalid parameter" error (``doit.exceptions.InvalidCommand``, raised before any
    task of ours runs) followed by :func:`suggestion`."""
    from doit.exceptions import InvalidCommand

    plain = InvalidCommand.__str__

    def __str__(self):
        return plain(self) + suggestion(self.not_found)

    InvalidCommand.__str__ = __str__


_did_you_mean()


def _check_doit_db(path: Path) -> None:
    """Move doit's database aside (one warning) when SQLite cannot read it, before doit opens
    it: it holds only doit's own records (our up-to-date checks read the cache), so doit
    starting with an empty one costs nothing but a re-check."""
    import sqlite3

    from .digest import reset_database

    if not path.exists():
        return
    try:
        with sqlite3.connect(path, timeout=60) as conn:
            conn.execute("SELECT name FROM sqlite_master").fetchall()
            bad = conn.execute("PRAGMA quick_check").fetchone()[0]
        conn.close()
    except sqlite3.DatabaseError as e:
        from .digest import damaged

        if damaged(e):
            reset_database(path, e, "doit's database")
        return  # full, read-only, locked: doit says so when it writes; the file is valid
    if bad != "ok":
        reset_database(path, sqlite3.DatabaseError(f"quick_check: {bad}"), "doit's database")


_check_doit_db(paths.state_dir() / "doit.sqlite3")


def _doit_db_full_is_one_line() -> None:
    """doit writes its database once, when the run ends (``SqliteDB.dump``, one transaction): on
    a home whose disk filled meanwhile that was a traceback after the run's own lines. It is one
    DiskFull line instead; the transaction is rolled back, so the database stays as it was
    (doit re-checks this run's tasks next time: their results are in the cache)."""
    import sqlite3

    from doit.dependency import SqliteDB

    from . import outputs

    plain = SqliteDB.dump
    if getattr(plain, "npubuild", False):
        return

    def dump(self):
        try:
            plain(self)
        except sqlite3.OperationalError as e:
            if (getattr(e, "sqlite_errorcode", 0) or 0) & 0xFF != 13 and "disk is full" not in str(e):  # SQLITE_FULL
                raise
            try:
                self._conn.rollback()
                self._conn.close()
            except sqlite3.Error:
                pass
            self._dirty = set()
            err = outputs.disk_full(paths.state_dir(), "doit's database doit.sqlite3", "NPUBUILD_HOME")
            sys.stderr.write(f"npubuild: DiskFull: {err}\n")

    dump.npubuild = True
    SqliteDB.dump = dump


_doit_db_full_is_one_line()
DOIT_CONFIG = {
    "backend": "sqlite3",  # the only doit backend that supports concurrent access
    "dep_file": str(paths.state_dir() / "doit.sqlite3"),
    "verbosity": 2,
    "default_tasks": ["build"],
    "continue": True,  # like make -k: build every recipe that can be built, report the others
    "reporter": None,  # set below: Reporter, one console line per stage
}


#: this doit command's Session (doit imports dodo.py once per command): the recipe set it pins,
#: the entries, key material and up-to-date checks it works out once (tasks/core/session.py)
SESSION = Session()


def _recipe_stems() -> set[str]:
    """The stem of every recipe file, valid or not (abstract ones included)."""
    return set(recipeset.recipe_names(SESSION)) | set(recipeset.recipe_errors(SESSION))


def _recipes() -> list[str]:
    """Names of the valid, non-abstract recipes. Invalid ones are reported on stderr and get a failing
    ``build:<stem>`` task (see :func:`task_build`), so they never block the others. The set
    is pinned for the rest of the command (:func:`tasks.core.recipeset.pin`)."""
    recipeset.pin(SESSION)
    return [n for n, abstract in recipeset.recipe_names(SESSION).items() if not abstract]


def _invalid() -> dict:
    errs = recipeset.recipe_errors(SESSION)
    for stem, e in errs.items():
        if stem not in SESSION.warned:
            SESSION.warned.add(stem)
            from .errors import UnsupportedModel

            # a valid recipe of a model not implemented yet is said where it is asked for: its
            # build task fails with the reason, `doit list` (_list_fails_on_invalid_recipes) and
            # the catalog name it unsupported; every other command stays quiet about it
            if not isinstance(e, UnsupportedModel):
                print(f"npubuild: invalid recipe, skipped\n{e}", file=sys.stderr)
    return errs


def _list_fails_on_invalid_recipes() -> None:
    """Make ``doit list`` exit 1 when a recipe file is invalid, after listing every task of
    the valid ones (and the failing ``build:<stem>`` of each invalid one), and end quietly
    (exit 1, Python's advice for EPIPE) when its reader closes the pipe. doit's List command
    always returns 0 and has no hook; dodo.py is imported before it runs."""
    import functools

    from doit.cmd_list import List

    plain = List._execute
    if getattr(plain, "npubuild", False):
        return

    @functools.wraps(plain)
    def _execute(self, *args, **kw):
        try:
            code = plain(self, *args, **kw)
        except BrokenPipeError:  # `doit list --all | head`: the reader left, so do we, without a traceback
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (and no second error at exit)
            return 1
        errs = recipeset.recipe_errors(SESSION)
        if errs:  # (the recipe module, and pydantic with it, only when a stored plan did not serve)
            from .errors import UnsupportedModel

            for e in errs.values():  # listed as unsupported, not invalid: one line each
                if isinstance(e, UnsupportedModel):
                    print(f"npubuild: {e.file}: unsupported model, skipped: {e.problems[0][1]}", file=sys.stderr)
            errs = {k: e for k, e in errs.items() if not isinstance(e, UnsupportedModel)}
        if errs:
            print(f"npubuild: {len(errs)} invalid recipe file(s), each with a failing build:<stem> task: "
                  f"{', '.join(f'{s}.yaml' for s in sorted(errs))}", file=sys.stderr)
        return code or (1 if errs else 0)

    _execute.npubuild = True
    List._execute = _execute


_list_fails_on_invalid_recipes()


def _fail(message: str):
    from doit.exceptions import TaskFailed

    return TaskFailed(message)


def _expected_errors() -> tuple:
    """Errors that explain themselves: shown as one message, without a traceback."""
    from .graphs import GraphError
    from .qnn import NotOnNPU
    from .sources import SourceError

    from .cache import DiskFull, EntryUnreadable, LockTimeout
    from .context_binary import Mismatch, ReadError
    from .digest import InputChanged, StoreUnwritable
    from .budget import NotEnoughMemory
    from .recipe import RecipeError

    return (run.StageFailed, run.UpstreamUnusable, SourceError, NotOnNPU, GraphError, RecipeError,
            FileNotFoundError, ValueError, DiskFull, LockTimeout, InputChanged, StoreUnwritable, NotEnoughMemory,
            Mismatch, ReadError, EntryUnreadable)


def _stage_action(recipe: str, stage: str):
    import threading

    from doit.exceptions import TaskFailed

    if threading.current_thread() is not threading.main_thread():
        return TaskFailed(THREAD_MODE)
    try:
        return run.run_stage(SESSION, recipe, stage)
    except _expected_errors() as e:  # the notes name the stage's log (run.run_stage)
        return TaskFailed("\n".join([f"{type(e).__name__}: {e}", *getattr(e, "__notes__", ())]))


def _console_reporter():
    """doit's console reporter, made to print one line per stage (issue 13): a stage task that
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
            base = task.name.split(":", 1)[0]
            return ":" in task.name and (base == "build" or task.name in _STAGE_TASKS)

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
                    return  # the recipe's own failure was its one line (issue 23: ~15 lines a recipe)
                self.write(f"{name}  not run: {' '.join(roots)} failed\n")
            elif name in _STAGE_TASKS and hasattr(fail, "get_msg") or type(fail) is TaskFailed:
                causes[name] = (name,)
                self.write(f"{name}  {fail.get_msg().strip()}\n")  # without doit's "TaskFailed - taskid" line
            else:
                causes[name] = (name,)
                super()._write_failure(result, write_exception)

        @staticmethod
        def _recipe_of(task: str) -> str | None:
            """The recipe of a stage task or of ``build:<recipe>``, else None."""
            return _STAGE_TASKS.get(task) or (task.split(":", 1)[1] if task.startswith("build:") else None)

        def skip_uptodate(self, task):
            checked = SESSION.checked.get(task.name)
            if task.name in _STAGE_TASKS and checked:
                recipe = _STAGE_TASKS[task.name]
                self.write(run.line(task.name, checked[0], checked[2], checked[1], run.task_width(SESSION, recipe))
                           + "\n")
            else:
                super().skip_uptodate(task)

    return Reporter


_STAGE_TASKS: dict[str, str] = {}  # stage task name -> recipe (filled by task_stages)
DOIT_CONFIG["reporter"] = _console_reporter()


def _uptodate(recipe: str, stage: str):
    def check(task, values):
        return run.is_up_to_date(SESSION, recipe, stage)

    check.__name__ = f"cached_{stage}"
    return check


def task_stages():
    """One task per stage of every recipe; doit groups them by stage name."""
    for name in _recipes():
        for spec in recipeset.plan(SESSION, name).values():
            _STAGE_TASKS[spec.task] = name
            yield {
                "basename": spec.name,
                "name": name,
                "doc": f"{spec.kind} stage of {name}",
                "actions": [(_stage_action, [name, spec.name])],
                "task_dep": [f"{up}:{name}" for up in sorted(set(spec.inputs.values()))],
                "uptodate": [_uptodate(name, spec.name)],
                "verbosity": 2,
            }


# ------------------------------------------------------------ build/<recipe>/


def _temp_name(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.{os.getpid()}.tmp")


def _stage_link(src: Path, dest: Path) -> Path:
    """Hard-link ``src`` beside ``dest`` under a temp name (no copy, no symlink: works on NTFS
    too), else copy it there with its mtime; returns the temp path, which the caller renames
    onto ``dest`` (one atomic rename: safe against a concurrent materialize). The cache files
    are read-only, so the link cannot be edited by mistake. A process killed before the
    rename leaves the temp link: see :func:`_remove_dead_links`."""
    tmp = _temp_name(dest)
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    return tmp


def _same(a: Path, b: Path) -> bool:
    """``a`` is ``b`` (a hard link) or a copy with the same size and mtime."""
    try:
        sa, sb = a.stat(), b.stat()
    except OSError:
        return False
    return (sa.st_ino, sa.st_dev) == (sb.st_ino, sb.st_dev) or \
        (sa.st_size, sa.st_mtime_ns) == (sb.st_size, sb.st_mtime_ns)




_TEMP_LINK = re.compile(r"^\..+\.(\d+)\.tmp$")  # _link's ".<name>.<pid>.tmp"


def _remove_dead_links(root: Path) -> list[str]:
    """Remove the temp links (``.<name>.<pid>.tmp``) under ``root`` whose process is gone (a
    build killed between :func:`_link`'s link and its rename: found by the fault campaign,
    benchmarks/fault_campaign.py), and say so on stderr. A live process's are left alone
    (a concurrent materialize renames its own). Returns the removed names, relative to root."""
    from .proc.processes import process_state as _process_state

    gone = []
    for p in sorted(root.rglob(".*.tmp")):
        m = _TEMP_LINK.match(p.name)
        if m and int(m.group(1)) != os.getpid() and _process_state(int(m.group(1))) == "gone":
            p.unlink(missing_ok=True)
            gone.append(p.relative_to(root).as_posix())
    if gone:
        print(f"npubuild: removed {len(gone)} temp link(s) of dead builds: {', '.join(gone)}", file=sys.stderr)
    return gone


def _remove_old_artifacts(root: Path, rels) -> None:
    """Remove the files ``rels`` (paths relative to ``root``, an earlier build's artifacts) and
    the folders they leave empty, up to ``root``."""
    root_r = root.resolve()
    for rel in sorted(rels):
        p = root / rel
        if root_r not in p.resolve().parents:  # an artifacts.json edited by hand: never outside
            continue
        p.unlink(missing_ok=True)
        d = p.parent
        while d != root and d.is_dir() and not any(d.iterdir()):
            d.rmdir()
            d = d.parent


def materialize(recipe: str, res: resolve.Resolver | None = None) -> dict:
    """Fill ``build/<recipe>/`` with links to the recipe's artifacts in the cache: context
    binaries and EPContext models, tokenizer/config files and ``verify.json`` (one
    sub-folder per target when there are several). Writes ``artifacts.json``:
    {file: "<kind>/<key>/out/<path>"}, the cache file each one is. ``res``: the Resolver to
    use (a cluster build passes one that pulls only the artifacts' stage kinds). Files an
    earlier build linked (its ``artifacts.json``) that this one does not are removed, so the
    folder holds exactly what ``artifacts.json`` lists (a tester found a 3-part build's
    ``part2/`` left beside a 2-part rebuild); files npubuild did not put there are left."""
    from . import outputs
    from .core.state import artifacts, build_state  # (not imported by a no-op build)

    res = res or resolve.Resolver(SESSION, recipe)
    arts = artifacts(build_state(res, record.read_state(SESSION, recipe)))
    root = paths.build_dir() / recipe
    made = [d for d in (root, *root.parents) if not d.exists()][::-1]  # removed again if nothing lands
    with outputs.full_disk_is(paths.build_dir(), f"build/{recipe}/", "NPUBUILD_BUILD", made):
        root.mkdir(parents=True, exist_ok=True)
    _remove_dead_links(root)
    try:
        before = set(json.loads((root / "artifacts.json").read_text(encoding="utf-8")))
    except (OSError, ValueError):
        before = set()
    listing, staged, cleanup = {}, [], list(made)
    # every file is written under a temp name first, and renamed into place only once all are:
    # a full disk (files are copied where hard links cannot be made) leaves the folder as it was
    need = sum(a.path.stat().st_size for a in arts.values())  # where they are copies, not links
    with outputs.full_disk_is(root, f"the artifacts of {recipe} as copies", "NPUBUILD_BUILD", cleanup, need):
        for rel, a in arts.items():
            dest = root / rel
            cleanup += [d for d in (dest.parent, *dest.parent.parents) if not d.exists() and root in d.parents][::-1]
            dest.parent.mkdir(parents=True, exist_ok=True)
            cleanup.append(_temp_name(dest))
            staged.append((_stage_link(a.path, dest), dest))
            listing[rel] = f"{a.kind}/{a.key}/out/{a.rel}"
        tmp = root / f".artifacts.json.{os.getpid()}.tmp"  # a dead one is removed (_remove_dead_links)
        cleanup.append(tmp)
        tmp.write_text(json.dumps(listing, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for staged_tmp, dest in staged:
        os.replace(staged_tmp, dest)
        staged_tmp.unlink(missing_ok=True)  # rename() between two links of one file leaves the source
    # the old files go while the old listing still names them, then the new listing in one
    # rename: a build killed in between leaves a listing that names every file it left (a
    # tester killed it after the write: a removed part's binaries stayed for good)
    _remove_old_artifacts(root, before - set(listing))
    os.replace(tmp, root / "artifacts.json")
    try:
        shown = root.relative_to(Path.cwd())  # doit runs in the project folder: build/<recipe>
    except ValueError:
        shown = root
    print(f"{'build:' + recipe:<{run.task_width(SESSION, recipe)}}  {len(listing)} artifacts in {shown}")
    return {"artifacts": len(listing)}


def _materialize_action(recipe: str):
    """:func:`materialize` as ``build:<recipe>``'s action: an error that explains itself (a full
    build disk: DiskFull) is its one line, as a stage's is."""
    try:
        return materialize(recipe)
    except _expected_errors() as e:
        return _fail(f"{type(e).__name__}: {e}")


def _print_explain(recipe: str) -> None:
    from .core.explain import print_explain

    print_explain(SESSION, recipe)


def _build_uptodate(recipe: str):
    def check(task, values):
        p = paths.build_dir() / recipe / "artifacts.json"
        try:
            want = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        res = resolve.checking_resolver(SESSION, recipe)
        try:
            keys = {n: f"{s.kind}/{res.key(n)}" for n, s in res.specs.items()}
        except Exception:
            return False
        linked = {"/".join(v.split("/")[:2]) for v in want.values()}
        # every compile entry links its binaries: one missing means the layout changed (a
        # target added: the old target's stages keep their keys, the folder gets sub-folders)
        compiled = {k for n, k in keys.items() if res.specs[n].kind == "compile"}
        cache = paths.cache_dir()
        return compiled <= linked <= set(keys.values()) and \
            all(_same(p.parent / f, cache / src) for f, src in want.items())

    return check


def task_build():
    """build:<recipe> runs the recipe's whole chain and links its artifacts into build/."""
    for stem, err in sorted(_invalid().items()):
        yield {"name": stem, "doc": f"INVALID recipe {stem}.yaml (run it to see why)",
               "actions": [(_fail, [str(err)])], "uptodate": [False], "verbosity": 2}
    for name in _recipes():
        specs = recipeset.plan(SESSION, name)
        yield {
            "name": name,
            "doc": f"build {name} (all stages) into build/{name}/",
            "actions": [(_materialize_action, [name])],
            "task_dep": [s.task for s in specs.values()],
            "uptodate": [_build_uptodate(name)],
            "verbosity": 2,
        }


def task_explain():
    """explain:<recipe> prints each stage's key, params, status and what changed."""
    for name in _recipes():
        yield {"name": name, "actions": [(_print_explain, [name])], "uptodate": [False],
               "verbosity": 2, "doc": f"show {name}'s plan, stage keys and why a stage is stale"}


# ------------------------------------------------------------ cache maintenance


def referenced_entries() -> set[tuple[str, str]]:
    """(kind, key) of every stage of every recipe whose key can be computed now, plus the key
    each stage had at its recipe's last recorded build (``build/<recipe>/stages.json``), so a
    source that is unavailable for a moment does not make its chain garbage.

    Only this checkout's recipes count: with a cache shared between checkouts, run gc where
    all recipes are, or not at all (README)."""
    refs = set()
    for name in _recipes():
        res = resolve.Resolver(SESSION, name, pull=False)
        for stage, spec in res.specs.items():
            try:
                refs.add((spec.kind, res.key(stage)))
            except Exception:  # upstream not built or source unavailable
                pass
        for rec in record.read_state(SESSION, name).values():
            refs.add((rec.get("kind"), rec.get("key")))
    return refs


def orphan_build_dirs() -> list[Path]:
    """``build/<name>/`` folders with no recipe file ``<name>.yaml`` (valid or not): left by a
    recipe that was deleted or renamed. They hold links to cache entries and the two listings,
    nothing else (:func:`materialize`)."""
    bd = paths.build_dir()
    if not bd.is_dir():
        return []
    known = _recipe_stems()
    return sorted(p for p in bd.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in known)


def gc(apply: bool) -> None:
    victims = resolve.cache(SESSION).gc(referenced_entries(), apply=apply)
    total = sum(s for _, s in victims)
    for rel, size in victims:
        print(f"{'removed' if apply else 'would remove'} {rel} ({size / 1e6:.1f} MB)")
    orphans = orphan_build_dirs()
    for d in orphans:
        if apply:
            shutil.rmtree(d)
        print(f"{'removed' if apply else 'would remove'} {d}/ (no recipe {d.name}.yaml)")
    print(f"{len(victims)} unreferenced entries, {total / 1e6:.1f} MB; {len(orphans)} build "
          f"folder{'' if len(orphans) == 1 else 's'} without a recipe"
          + ("" if apply else " (dry run; doit gc --apply deletes)"))


def task_gc():
    """Remove cache entries that no recipe references, and build/ folders of recipes that are
    gone (dry run unless --apply)."""
    return {"actions": [gc], "params": [{"name": "apply", "long": "apply", "type": bool, "default": False,
                                         "help": "delete (default: only list)"}],
            "uptodate": [False], "verbosity": 2}


def cache_verify() -> bool:
    bad = resolve.cache(SESSION).verify()
    for entry, probs in bad.items():
        print(f"DAMAGED {entry}: {'; '.join(probs)} (moved to cache/.damaged/; the next build rebuilds it)")
    n = sum(1 for _ in resolve.cache(SESSION).entries())
    print(f"{n} entries checked, {len(bad)} damaged")
    return not bad


def task_cache_verify():
    """Rehash every cache entry and report those that no longer match their manifest."""
    return {"actions": [cache_verify], "uptodate": [False], "verbosity": 2}


def push(recipe: str):
    """Push every stage entry of ``recipe`` that is in the local cache to the remote cache;
    print one line per stage (pushed / already on the remote / not in the local cache).
    Returns a TaskFailed without a remote or when a push failed."""
    from doit.exceptions import TaskFailed

    from .remote import Rejected, RemoteError

    res = resolve.Resolver(SESSION, recipe, pull=False)
    if res.cache.remote is None:
        return TaskFailed("no remote cache: set NPUBUILD_REMOTE to an fsspec URL (README, Remote cache)")
    errors = 0
    for stage, spec in res.specs.items():
        try:
            key = res.key(stage)
        except Exception as e:  # an upstream not built anywhere, or an offline source
            print(f"{spec.task:<40} -  not pushed: {e}")
            continue
        try:
            done = res.cache.push(spec.kind, key, material=res.material(stage))
            what = "pushed" if done else "already on the remote"
        except KeyError:
            what = "not in the local cache"
        except (Rejected, RemoteError) as e:
            errors += 1
            what = f"FAILED: {e}"
        print(f"{spec.task:<40} {spec.kind}/{key}  {what}")
    print(f"remote cache: {res.cache.remote.display}")
    return TaskFailed(f"{errors} push(es) of {recipe} failed") if errors else None


def task_push():
    """push:<recipe> uploads the recipe's local cache entries to NPUBUILD_REMOTE (never
    replacing an entry already there)."""
    for name in _recipes():
        yield {"name": name, "actions": [(push, [name])], "uptodate": [False], "verbosity": 2,
               "doc": f"push {name}'s cache entries to the remote cache (NPUBUILD_REMOTE)"}


def _cluster_action(scheduler: str, recipes: list):
    from doit.exceptions import TaskFailed

    from . import cluster

    try:
        cluster.build(recipes, scheduler, link=materialize, session=SESSION)
    except (cluster.ClusterError, *_expected_errors()) as e:
        return TaskFailed(f"{type(e).__name__}: {e}")


def task_cluster():
    """Build the stale stages of the given recipes (default: all) on a Dask cluster, then pull
    them: doit cluster --scheduler tcp://host:8786 [recipe ...] (needs NPUBUILD_REMOTE)."""
    return {"actions": [_cluster_action], "pos_arg": "recipes", "uptodate": [False], "verbosity": 2,
            "params": [{"name": "scheduler", "long": "scheduler", "type": str, "default": "",
                        "help": "Dask scheduler address, tcp://host:8786 (default: $NPUBUILD_SCHEDULER)"}]}


# ------------------------------------------------------------ catalog, publish, reproduce (issue 5)


def _catalog_action():
    from . import catalog, outputs
    from .cache import DiskFull

    if bad := outputs.unwritable("NPUBUILD_CATALOG", paths.catalog_dir()):
        return _fail(bad)
    try:
        catalog.write_catalog(session=SESSION)
    except DiskFull as e:
        return _fail(f"DiskFull: {e}")


def task_catalog():
    """Write catalog/catalog.json, README.md and index.html: every recipe and its state."""
    return {"actions": [_catalog_action], "uptodate": [False], "verbosity": 2}


def _publish_action(recipe: str, dest: str, hub_repo: str, dry_run: bool, sign: str, signing_cert: str,
                    cert_chain: str):
    from doit.exceptions import TaskFailed

    from . import outputs, publish
    from .cache import DiskFull

    if not dry_run and (bad := outputs.unwritable("NPUBUILD_DIST", paths.dist_dir())):
        return TaskFailed(bad)
    try:
        publish.publish(recipe, dest=dest or None, hub_repo=hub_repo or None, dry_run=dry_run, sign=sign or None,
                        signing_cert=signing_cert or None, cert_chain=_paths_list(cert_chain), session=SESSION)
    except publish.PublishError as e:
        return TaskFailed(str(e))
    except DiskFull as e:
        return TaskFailed(f"DiskFull: {e}")


def task_publish():
    """publish:<recipe> writes dist/<recipe>/ and its archive from a verified build (never
    builds; refuses a failed, stale or unbuilt recipe); --dest, --hub-repo, --dry-run."""
    params = [
        {"name": "dest", "long": "dest", "type": str, "default": "", "help": "also copy bundle + archive to this folder"},
        {"name": "hub_repo", "long": "hub-repo", "type": str, "default": "", "help": "also push to this Hub repo"},
        {"name": "dry_run", "long": "dry-run", "type": bool, "default": False, "help": "only print the operations"},
        {"name": "sign", "long": "sign", "type": str, "default": "",
         "help": "sign the bundle with this PEM elliptic-curve private key (OpenSSF model-signing)"},
        {"name": "signing_cert", "long": "signing-cert", "type": str, "default": "",
         "help": "with --sign: the key's PEM certificate (certificate signing instead of a bare key)"},
        _CERT_CHAIN,
    ]
    for name in _recipes():
        yield {"name": name, "doc": f"publish {name} to dist/ (and --dest / --hub-repo)",
               "actions": [(_publish_action, [name])], "params": params, "uptodate": [False], "verbosity": 2}


def _reproduce_action(recipe: str):
    from doit.exceptions import TaskFailed

    from . import publish

    try:
        same = publish.reproduce(recipe, session=SESSION)
    except publish.PublishError as e:
        return TaskFailed(str(e))
    return True if same else TaskFailed(f"{recipe}: the rebuild is not byte-identical to dist/{recipe}/")


def task_reproduce():
    """reproduce:<recipe> rebuilds into an empty temp cache and compares with dist/<recipe>/."""
    for name in _recipes():
        yield {"name": name, "doc": f"rebuild {name} from scratch and compare with its published bundle",
               "actions": [(_reproduce_action, [name])], "uptodate": [False], "verbosity": 2}


def _check_bundle_action(path: str, public_key: str, cert_chain: str):
    from doit.exceptions import TaskFailed

    from . import publish

    if not path:
        return TaskFailed("give the bundle folder: doit check_bundle --path dist/<recipe>")
    try:
        ok = publish.print_check(path, public_key or None, _paths_list(cert_chain))
    except publish.PublishError as e:
        return TaskFailed(str(e))
    return True if ok else TaskFailed(f"{path}: bundle does not match its manifest (or its signature)")


def task_check_bundle():
    """Recompute sha256 of every file of a bundle (--path) against its manifest.json; verify its
    signature against --public-key or --cert-chain."""
    return {"actions": [_check_bundle_action], "uptodate": [False], "verbosity": 2,
            "params": [{"name": "path", "long": "path", "type": str, "default": "", "help": "bundle folder"},
                       {"name": "public_key", "long": "public-key", "type": str, "default": "",
                        "help": "PEM public key the bundle's signature must verify against"},
                       _CERT_CHAIN]}


_CERT_CHAIN = {"name": "cert_chain", "long": "cert-chain", "type": str, "default": "",
               "help": "PEM CA certificate(s) of the signing certificate, separated by os.pathsep"}


def _paths_list(value: str) -> list[str] | None:
    return [v for v in value.split(os.pathsep) if v] or None

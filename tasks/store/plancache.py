"""The plan cache: a no-op command's recipe set without parsing or validating recipes.

Loading the recipes (PyYAML, the pydantic schema, the load-time checks) and expanding them
into stage specs would be about a third of a no-op ``doit build`` over 50 recipes (the bar
is 0.1 x ``dvc repro``: benchmarks/README.md). After a load in which every recipe file was valid, the
expanded plan is written to ``<NPUBUILD_HOME>/plans-<context>.json``, as DVC keeps
``dvc.lock``: plain JSON, one row per stage (:class:`tasks.recipe.plan.StageSpec` fields). A later
command uses it, without importing pydantic, only when all of these are unchanged (else it
loads the recipes and rewrites it):

- the recipes folder's ``*.yaml`` files (name, mtime, size: the stamp ``tasks.core.recipeset`` takes);
- every file the load looked at, present or not (:func:`note`): recipe files and ``extends``
  parents, data files, a source folder, its ``config.json`` and ``tokenizer_config.json``, and
  for a ``package`` source the folders of ``sys.path`` and the package's own folder. Each as
  stat'ed when the load looked at it, before reading it (device, inode, mode, owner, group,
  size, mtime, ctime: a file replaced with its old mtime, or made unreadable, still differs)
  and as its symlinks resolve (a retargeted link on the way differs);
- this package's code (every ``tasks/**/*.py``: path, mtime, size), so a changed schema,
  default, target table or patch version never meets an old plan;
- the environment the load reads (``NPUBUILD_*``, ``HF_*``, ``HUGGINGFACE_*``, ``XDG_*``,
  ``HOME``) with the project root and the allowed folders resolved, ``sys.path`` (``''`` as
  the working folder), the Python version.

Nothing is stored after a load with an invalid recipe file (its errors come from a real load
every time), nor after one that met something it cannot describe by files (a ``package``
source that is not installed: :func:`uncacheable`), nor after one that read a file changed
less than ``RACY_NS`` before (a second edit within the file system's timestamp granularity
could keep every stat field: git's "racily clean" entries); the next command stores it.
Each context (recipes folder, environment, ``sys.path``: ``doit`` and ``python -m doit``
differ) has its own file; the ``KEEP`` most recent are kept. Stage keys are never stored
here: they are computed from these specs as always.
"""

from __future__ import annotations

import contextvars
import json
import os
import sys
from pathlib import Path

from tasks.store.digest import RACY_NS  # a load that read a file changed within it is not stored

VERSION = 2
PREFIX = "plans-"
KEEP = 8
ENV_PREFIXES = ("NPUBUILD_", "HF_", "HUGGINGFACE_", "XDG_")
#: the [path, realpath, stat] rows of the load under way (:class:`recording`), None outside one
#: (a context variable: what one thread loads is never noted into another's recording)
_NOTED: contextvars.ContextVar[list | None] = contextvars.ContextVar("npubuild_plan_rows", default=None)
_CODE = Path(__file__).resolve().parents[1]  # the package: every module of tasks/


def _stat(path: str) -> list | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _row(path) -> list:
    p = os.fspath(path) or os.getcwd()
    return [p, os.path.realpath(p), _stat(p)]


def note(path) -> None:
    """Record that the recipe load under way is about to read (or look for) ``path``, as it
    is now; a no-op outside :func:`recording`. Called by ``tasks/recipe/load.py`` wherever a
    load-time check reads a file."""
    if (noted := _NOTED.get()) is not None:
        noted.append(_row(path))


def note_sys_path() -> None:
    """Record every ``sys.path`` folder: what a ``package`` source is found through."""
    for p in sys.path:
        note(p)


def uncacheable(why: str) -> None:
    """The load under way met something files do not describe (``why``): store no plan after
    it (a None row marks the rows unusable for :func:`save`)."""
    if (noted := _NOTED.get()) is not None:
        noted.append(None)


class recording:
    """``with recording() as noted:`` collects the rows :func:`note` made; ``noted`` holds a
    None row when :func:`uncacheable` was called."""

    def __enter__(self) -> list:
        self._token = _NOTED.set([])
        return _NOTED.get()

    def __exit__(self, *exc) -> None:
        _NOTED.reset(self._token)


def _code() -> list:
    out = []
    for dirpath, dirnames, filenames in os.walk(_CODE):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py"):
                p = os.path.join(dirpath, f)
                st = os.stat(p)
                out.append([os.path.relpath(p, _CODE), st.st_mtime_ns, st.st_size])
    return out


def signature(recipes_dir: str, stamp: tuple) -> dict:
    """What a stored plan must have been made under (module docstring), as JSON values."""
    from tasks.store.paths import allowed_dirs, root

    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) or k == "HOME"}
    try:
        places = [str(root().resolve()), *(str(d) for d in allowed_dirs())]
    except ValueError as e:  # a relative NPUBUILD_ALLOW_PATHS entry: the load reports it
        places = [str(e)]
    return {
        "version": VERSION,
        "recipes_dir": recipes_dir,
        "stamp": [list(s) for s in stamp],
        "code": _code(),
        "env": dict(sorted(env.items())),
        "places": places,
        "python": sys.version,
        "sys_path": [p or os.getcwd() for p in sys.path],
    }


def _context(sig: dict) -> str:
    from tasks.store.digest import digest_bytes

    ctx = {k: sig[k] for k in ("recipes_dir", "env", "sys_path", "python")}
    return digest_bytes(json.dumps(ctx, sort_keys=True).encode())[:16]


def _path(state_dir: Path, sig: dict) -> Path:
    return Path(state_dir) / f"{PREFIX}{_context(sig)}.json"


def load(state_dir: Path, sig: dict) -> dict | None:
    """The stored plan ``{recipe: {"abstract": bool, "specs": [StageSpec fields] | None}}``
    when it was made under ``sig`` and every file it noted is as it was; else None. A file
    that cannot be read or has another shape counts as absent (the caller then loads the
    recipes and rewrites it)."""
    try:
        stored = json.loads(_path(state_dir, sig).read_text(encoding="utf-8"))
        if stored["signature"] != sig:
            return None
        if any(_row(p) != [p, real, st] for p, real, st in stored["inputs"]):
            return None
        recipes = stored["recipes"]
        ok = isinstance(recipes, dict) and all(
            isinstance(row, dict)
            and isinstance(row.get("abstract"), bool)
            and (
                row.get("specs") is None
                or isinstance(row["specs"], list)
                and all(isinstance(d, dict) for d in row["specs"])
            )
            for row in recipes.values()
        )
        return recipes if ok else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(state_dir: Path, sig: dict, noted: list, recipes: dict) -> bool:
    """Store ``recipes`` (as :func:`load` returns it) made under ``sig`` after a load that
    noted ``noted``. Writes nothing after an uncacheable load, when ``recipes`` does not
    survive a JSON round trip unchanged (e.g. a tuple or a non-text key in some params: the
    stages would then see other values than a real load gives them), when a file read was
    changed within ``RACY_NS`` (module docstring) or when the file already says the same.
    Returns True when it wrote."""
    import time

    if None in noted:
        return False
    rows = sorted({r[0]: r for r in noted}.values())
    doc = {"signature": sig, "inputs": rows, "recipes": recipes}
    mtimes = [st[6] for _, _, st in rows if st] + [s[1] for s in sig["stamp"] if s[1]] + [c[1] for c in sig["code"]]
    if max(mtimes, default=0) > time.time_ns() - RACY_NS:
        return False
    text = json.dumps(doc, sort_keys=True)
    if json.loads(text)["recipes"] != recipes:
        return False
    p = _path(state_dir, sig)
    try:
        if p.read_text(encoding="utf-8") == text:
            return False
    except OSError:
        pass
    from tasks.proc.processes import process_state as _process_state

    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        for old in p.parent.glob(f".{PREFIX}*.tmp"):  # of a process killed between write and rename
            pid = old.name.split(".")[-2]
            if pid.isdigit() and _process_state(int(pid)) == "gone":
                old.unlink(missing_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
        for old in sorted(p.parent.glob(f"{PREFIX}*.json"), key=lambda f: f.stat().st_mtime_ns)[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError:  # a read-only state folder, a folder in the way: the next command loads again
        try:
            tmp.unlink()
        except OSError:
            pass
        return False
    return True

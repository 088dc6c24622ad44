"""The plan cache: a no-op command's recipe set without parsing or validating recipes.

Loading the recipes (PyYAML, the pydantic schema, the load-time checks) and expanding them
into stage specs was about a third of a no-op ``doit build`` over 50 recipes (issue 11: the
bar is 0.1 x ``dvc repro``). After a load in which every recipe file was valid, the
expanded plan is written to ``<NPUBUILD_HOME>/plans.json``, as DVC keeps ``dvc.lock``: plain
JSON, one row per stage (:class:`tasks.plan.StageSpec` fields). A later command uses it,
without importing pydantic, only when all of these are unchanged (else it loads the recipes
and rewrites it):

- the recipes folder's ``*.yaml`` files (name, mtime, size: the stamp ``tasks.engine`` takes);
- every other file the load looked at, present or not (:func:`note`): ``extends`` parents,
  data files, a source's ``config.json`` and ``tokenizer_config.json`` (device, inode, mtime,
  size);
- this package's code (every ``tasks/**/*.py``: path, mtime, size), so a changed schema,
  default, target table or patch version never meets an old plan;
- the environment the load reads (``NPUBUILD_*``, ``HF_*``, ``HUGGINGFACE_*``), ``sys.path``
  and the mtimes of its folders (a package source installed or removed), the Python version.

A load with any invalid recipe file writes nothing (its errors are reported from a real load
every time). Nor does a load that read a file changed less than ``RACY_NS`` before it: a
second edit within the file system's timestamp granularity could keep size and mtime (git's
"racily clean" index entries); the next command then stores the plan. Stage keys are never stored here: they are computed from these specs as always.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

VERSION = 1
FILE = "plans.json"
RACY_NS = 2_000_000_000  # FAT's mtime granularity (2 s) is the coarsest a project may sit on
_NOTED: list[str] | None = None  # paths looked at by the load under way (see :func:`recording`)
_CODE = Path(__file__).resolve().parent


def note(path) -> None:
    """Record that the recipe load under way read (or looked for) ``path``; a no-op outside
    :func:`recording`. Called by ``tasks/recipe.py`` wherever a load-time check reads a file."""
    if _NOTED is not None:
        _NOTED.append(os.fspath(path))


class recording:
    """``with recording() as noted:`` collects the paths :func:`note` was given."""

    def __enter__(self) -> list[str]:
        global _NOTED
        _NOTED = []
        return _NOTED

    def __exit__(self, *exc) -> None:
        global _NOTED
        _NOTED = None


def _stat(path: str) -> list | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size]


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
    env = {k: v for k, v in os.environ.items() if k.startswith(("NPUBUILD_", "HF_", "HUGGINGFACE_"))}
    return {"version": VERSION, "recipes_dir": recipes_dir, "stamp": [list(s) for s in stamp],
            "code": _code(), "env": dict(sorted(env.items())), "python": sys.version,
            "sys_path": [[p, _stat(p)] for p in sys.path]}


def _path(state_dir: Path) -> Path:
    return Path(state_dir) / FILE


def load(state_dir: Path, sig: dict) -> dict | None:
    """The stored plan ``{recipe: {"abstract": bool, "specs": [StageSpec fields] | None}}``
    when it was made under ``sig`` and every file it noted is as it was; else None. An
    unreadable file counts as absent."""
    try:
        stored = json.loads(_path(state_dir).read_text(encoding="utf-8"))
        if stored["signature"] != sig:
            return None
        if any(_stat(p) != st for p, st in stored["inputs"]):
            return None
        return stored["recipes"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(state_dir: Path, sig: dict, noted: list[str], recipes: dict) -> bool:
    """Store ``recipes`` (as :func:`load` returns it) made under ``sig`` after a load that
    looked at ``noted``. Writes nothing when ``recipes`` does not survive a JSON round trip
    unchanged (e.g. a tuple or a non-text key in some params: the stages would then see
    other values than a real load gives them) or when the file already says the same.
    Nor when a file read was changed within ``RACY_NS`` (module docstring). Returns True when
    it wrote."""
    import time

    doc = {"signature": sig, "inputs": [[p, _stat(p)] for p in sorted(set(noted))], "recipes": recipes}
    mtimes = [st[2] for _, st in doc["inputs"] if st] + [s[1] for s in sig["stamp"] if s[1]] + [c[1] for c in sig["code"]]
    if max(mtimes, default=0) > time.time_ns() - RACY_NS:
        return False
    text = json.dumps(doc, sort_keys=True)
    if json.loads(text)["recipes"] != recipes:
        return False
    p = _path(state_dir)
    try:
        if p.read_text(encoding="utf-8") == text:
            return False
    except OSError:
        pass
    from .cache import _process_state

    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        for old in p.parent.glob(f".{p.name}.*.tmp"):  # of a process killed between write and rename
            pid = old.name.split(".")[-2]
            if pid.isdigit() and _process_state(int(pid)) == "gone":
                old.unlink(missing_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
    except OSError:  # a read-only state folder: the next command loads the recipes again
        return False
    return True

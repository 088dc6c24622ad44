"""doit's database as npubuild opens it (tasks/commands/builder/doitdb.py): a second doit beside
a run whose task failed is not refused with "database is locked" (issue 51), and what doit's
plain backend made a traceback is one line or a re-check."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from conftest import REPO

#: the two processes below open the database with doit's SqliteDB, as doit does, after npubuild's
#: ``install()`` or not (argv[2]: "npubuild" / "doit")
OPEN = """
import sys
sys.path.insert(0, {repo!r})
from doit.dependency import JSONCodec, SqliteDB
if sys.argv[2] == "npubuild":
    from tasks.commands.builder.doitdb import install
    install()
db = SqliteDB(sys.argv[1], JSONCodec())
"""
#: process A: removes a record as doit does for a failed task (``remove_success``), says so,
#: and keeps its connection open until told to end its run (its end-of-run write)
HOLDER = (
    OPEN
    + """
db.remove("failed")
db.set("built-by-a", "result:", "a")
print("removed", flush=True)
sys.stdin.readline()
db.dump()
print("dumped", flush=True)
"""
)
#: process B: a second run's end-of-run write
WRITER = (
    OPEN
    + """
db.set("built-by-b", "result:", "b")
try:
    db.dump()
    print("written")
except Exception as e:
    print(type(e).__name__, e)
"""
)


def _py(script: str, *args, **kw):
    return subprocess.Popen(
        [sys.executable, "-c", script.format(repo=str(REPO)), *map(str, args)], text=True, stdout=subprocess.PIPE, **kw
    )


def _seed(path):
    db = sqlite3.connect(path)
    db.execute("create table doit (task_id text not null primary key, task_data json)")
    db.execute("insert into doit values ('failed', ?)", (json.dumps({"result:": "old"}),))
    db.commit()
    db.close()


def _rows(path) -> dict:
    db = sqlite3.connect(path)
    rows = {k: json.loads(v) for k, v in db.execute("select task_id, task_data from doit")}
    db.close()
    return rows


def _beside(path, backend: str) -> tuple[str, str]:
    """The holder and then the writer with ``backend``; the holder ends its run once the writer
    is done. Returns (the writer's line, the holder's output)."""
    holder = _py(HOLDER, path, backend, stdin=subprocess.PIPE)
    assert holder.stdout.readline().strip() == "removed"
    said, _ = _py(WRITER, path, backend).communicate(timeout=120)
    out, _ = holder.communicate("end\n", timeout=60)
    return said.strip(), out


def test_doits_plain_backend_locks_the_database_from_a_removal_to_the_runs_end(tmp_path):
    """Why doitdb exists: with doit's SqliteDB as it comes, a removal (a failed task) locks the
    database until that run ends, and a second run's write gives up."""
    path = tmp_path / "doit.sqlite3"
    _seed(path)
    said, out = _beside(path, "doit")
    assert said == "OperationalError database is locked", said
    assert out.split() == ["dumped"]


def test_a_second_run_writes_beside_a_run_whose_task_failed(tmp_path):
    """As npubuild opens it the second run writes at once; the first run's end writes its
    removal and its record; both runs' records are there."""
    path = tmp_path / "doit.sqlite3"
    _seed(path)
    said, out = _beside(path, "npubuild")
    assert said == "written" and out.split() == ["dumped"]
    assert _rows(path) == {"built-by-a": {"result:": "a"}, "built-by-b": {"result:": "b"}}


def test_a_removed_record_reads_as_absent_and_a_new_one_starts_empty(tmp_path):
    from doit.dependency import JSONCodec, SqliteDB

    from tasks.commands.builder.doitdb import install

    install()
    path = str(tmp_path / "doit.sqlite3")
    db = SqliteDB(path, JSONCodec())
    db.set("t", "result:", "x")
    db.set("t", "deps:", ["a"])
    db.dump()
    db = SqliteDB(path, JSONCodec())
    assert db.in_("t") and db.get("t", "deps:") == ["a"]
    db.remove("t")
    assert not db.in_("t") and db.get("t", "result:") is None
    db.set("t", "result:", "y")
    assert db.in_("t") and db.get("t", "deps:") is None
    db.dump()
    assert _rows(path) == {"t": {"result:": "y"}}


def test_dodo_installs_it(project):
    """Loading the repo's dodo.py, as doit does, gives doit's SqliteDB npubuild's behaviour
    (and imports nothing before dodo.py: no entry point)."""
    import importlib.metadata

    assert not list(importlib.metadata.entry_points(group="doit.BACKEND"))
    code = (
        "import runpy, sys; sys.argv = ['doit', 'list']; runpy.run_path({dodo!r}); "
        "from doit.dependency import SqliteDB; print(getattr(SqliteDB, 'npubuild', False))"
    ).format(dodo=str(REPO / "dodo.py"))
    r = subprocess.run([sys.executable, "-c", code], env=project.env, cwd=project.root, capture_output=True, text=True)
    assert r.stdout.strip() == "True", r.stdout + r.stderr


@pytest.mark.parametrize(
    "damage, want",
    [
        ("table", "; moved to "),  # another program's table: moved aside when doit starts
        ("row", None),  # a record that is not JSON: that task is checked again
        ("readonly", "could not be written"),  # a read-only database at the run's write: one line
    ],
)
def test_an_odd_database_is_one_line_or_a_recheck_not_a_traceback(project, damage, want):
    """Cases a stranger found giving tracebacks (issue 51): a doit table of other columns, a
    record that is not JSON, a database that cannot be written."""
    project.recipe("t8")
    project.doit("run", "build:t8")
    db = project.root / ".npubuild" / "doit.sqlite3"
    if damage == "table":
        db.unlink()
        conn = sqlite3.connect(db)
        conn.execute("create table doit (x int)")
        conn.commit()
        conn.close()
    elif damage == "row":
        conn = sqlite3.connect(db)
        conn.execute("update doit set task_data = '{not json'")
        conn.commit()
        conn.close()
    else:  # immutable (chattr +i), so that root (as CI runs) cannot write it either
        subprocess.run(["chattr", "+i", str(db)], check=True)
    try:
        run = project.doit("run", "build:t8", check=False)
        forget = project.popen("forget", "build:t8")  # writes doit's database
        out, _ = forget.communicate(timeout=300)
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=False)
    log = run.log() + out
    assert "Traceback" not in log, log
    assert run.code == 0 and run.ran() == [], run.log()  # every stage a cache hit
    assert forget.returncode == 0, out
    if want:
        assert want in log, log


@pytest.mark.parametrize("args", [["run", "--backend", "json", "build:t8"], ["list", "--backend=dbm"]])
def test_another_backend_on_the_command_line_is_one_line(project, args):
    """doit's json and dbm backends cannot read the SQLite database (a stranger's traceback),
    and its plain sqlite3 backend is what doitdb changes: a --backend other than sqlite3 is
    refused before anything runs."""
    project.recipe("t8")
    p = subprocess.run(
        [sys.executable, "-m", "doit", args[0], "-f", str(REPO / "dodo.py"), "-d", str(project.root), *args[1:]],
        env=project.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = p.stdout + p.stderr
    v = "json" if "json" in args else "dbm"
    assert p.returncode == 2 and out == (
        f"npubuild: --backend {v}: expected sqlite3 or no --backend (npubuild keeps doit's database in SQLite, "
        "NPUBUILD_HOME/doit.sqlite3, which doit's other backends cannot read)\n"
    ), out

"""doit's database as npubuild opens it (tasks/commands/builder/doitdb.py): a second doit beside
a run whose task failed is not refused with "database is locked" (issue 51)."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: process A: opens the database with the backend named, removes a record as doit does for a
#: failed task (``remove_success``), says so, and keeps its connection open until told to end
#: its run (its end-of-run write)
HOLDER = """
import sys
from doit.dependency import JSONCodec, SqliteDB
from tasks.commands.builder.doitdb import Database
cls = Database if sys.argv[2] == "npubuild" else SqliteDB
db = cls(sys.argv[1], JSONCodec())
db.remove("failed")
db.set("built-by-a", "result:", "a")
print("removed", flush=True)
sys.stdin.readline()
db.dump()
print("dumped", flush=True)
"""


def _seed(path):
    from doit.dependency import JSONCodec

    from tasks.commands.builder.doitdb import Database

    db = Database(str(path), JSONCodec())
    db.set("failed", "result:", "old")
    db.dump()


def _beside(path, backend):
    """Start the holder with ``backend``, then write from this process as a second doit would
    (doit's own wait: 5 s), then let the holder end its run; returns (this write's error or
    None, the holder's output)."""
    from doit.dependency import JSONCodec, SqliteDB

    from tasks.commands.builder.doitdb import Database

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), backend], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "removed"
    err = None
    try:
        db = (Database if backend == "npubuild" else SqliteDB)(str(path), JSONCodec())
        db.set("built-by-b", "result:", "b")
        db.dump()
    except Exception as e:  # noqa: BLE001  (the failure under doit's own backend is the point)
        err = e
    out, _ = holder.communicate("end\n", timeout=60)
    return err, out


def test_doits_own_backend_holds_the_write_lock_from_a_removal_to_the_runs_end(tmp_path):
    """Why the backend exists: with doit's SqliteDB, a removal (a failed task) locks the
    database until that run ends, and a second run's write gives up after 5 s."""
    path = tmp_path / "doit.sqlite3"
    _seed(path)
    err, out = _beside(path, "doit")
    assert err is not None and "database is locked" in str(err), err
    assert out.split() == ["dumped"]


def test_a_second_run_writes_beside_a_run_whose_task_failed(tmp_path):
    """With npubuild's backend the second run writes at once; the first run's end writes its
    removal and its record; both runs' records are there."""
    from doit.dependency import JSONCodec

    from tasks.commands.builder.doitdb import Database

    path = tmp_path / "doit.sqlite3"
    _seed(path)
    err, out = _beside(path, "npubuild")
    assert err is None, err
    assert out.split() == ["dumped"]
    db = Database(str(path), JSONCodec())
    assert not db.in_("failed") and db.get("failed", "result:") is None
    assert db.get("built-by-a", "result:") == "a" and db.get("built-by-b", "result:") == "b"


def test_a_removed_record_reads_as_absent_and_a_new_one_starts_empty(tmp_path):
    from doit.dependency import JSONCodec

    from tasks.commands.builder.doitdb import Database

    path = tmp_path / "doit.sqlite3"
    db = Database(str(path), JSONCodec())
    db.set("t", "result:", "x")
    db.set("t", "deps:", ["a"])
    db.dump()
    db = Database(str(path), JSONCodec())
    assert db.in_("t") and db.get("t", "deps:") == ["a"]
    db.remove("t")
    assert not db.in_("t") and db.get("t", "result:") is None
    db.set("t", "result:", "y")
    assert db.in_("t") and db.get("t", "deps:") is None
    db.dump()
    db = Database(str(path), JSONCodec())
    assert db.get("t", "result:") == "y" and db.get("t", "deps:") is None


def test_doit_runs_with_this_backend(project):
    """The entry point is installed and doit opens the database through it."""
    from doit.plugin import PluginDict

    from tasks.commands.builder.doitdb import Database

    backends = PluginDict()
    backends.add_plugins({}, "BACKEND")  # as doit's DoitCmdBase.get_backends: the entry points
    assert backends.get_plugin("npubuild-sqlite") is Database
    p = project.popen("list", "--status")  # the status column reads the database
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out
    assert (project.root / ".npubuild" / "doit.sqlite3").is_file()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))

"""doit's database (``$NPUBUILD_HOME/doit.sqlite3``) as npubuild opens it: doit's own SQLite
backend (:class:`doit.dependency.SqliteDB`, one table of task records, written once when the run
ends) with these changes, made to that class by :func:`install` when ``dodo.py`` loads (doit
builds its table of backends before it loads ``dodo.py`` and opens the database after; a
``doit.BACKEND`` entry point would be imported from wherever the virtualenv's editable install
points, before the project's own code: a second checkout sharing the venv ran the first one's
command code, issue 51):

- **a removal waits for the run's one write.** doit deletes a failed task's record at once
  (``remove_success``: a ``DELETE`` in Python's implicit transaction), which held SQLite's write
  lock until the run ended, so a second ``doit`` beside a long build whose task had failed died
  at its own end with ``sqlite3.OperationalError: database is locked`` (issue 51, a stranger's
  case beside a Genie build). Removals are kept and written with the rest, in the one short
  transaction of the run's end (``dump``).
- **a writer waits up to :data:`BUSY_TIMEOUT_S` for another's write** (doit's connection waits
  Python's default 5 s).
- **a record that is not a JSON object reads as no record** (doit checks that task again)
  instead of an AttributeError (a table of another shape is moved aside when doit starts:
  :func:`tasks.commands.builder.startup._check_doit_db`).
- **a full disk or a read-only database at the run's write is one line**, not a traceback
  after the run's own lines; the transaction is rolled back, so the database stays as it was
  (doit re-checks this run's tasks next time: their results are in the cache).
"""

from __future__ import annotations

import sqlite3
import sys

from doit.dependency import SqliteDB

#: seconds a connection waits for another process's write before "database is locked"; every
#: write is the end-of-run transaction, milliseconds long
BUSY_TIMEOUT_S = 60

SQLITE_FULL, SQLITE_READONLY = 13, 8  # https://www.sqlite.org/rescode.html


def _removed(db) -> set:
    return db.__dict__.setdefault("_npubuild_removed", set())


def install() -> None:
    """Give doit's :class:`SqliteDB` the behaviour the module docstring lists; idempotent."""
    if getattr(SqliteDB, "npubuild", False):
        return
    plain_connect, plain_get, plain_in, plain_set = (
        SqliteDB._sqlite3,
        SqliteDB._get_task_data,
        SqliteDB.in_,
        SqliteDB.set,
    )

    def _sqlite3(self, name):
        conn = plain_connect(self, name)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
        return conn

    def _get_task_data(self, task_id):
        try:
            data = {} if task_id in _removed(self) else plain_get(self, task_id)
        except ValueError:  # not JSON
            return {}
        return data if isinstance(data, dict) else {}

    def in_(self, task_id):
        return task_id not in _removed(self) and plain_in(self, task_id)

    def set_(self, task_id, dependency, value):
        if task_id in _removed(self):  # a record written after its removal starts empty
            _removed(self).discard(task_id)
            self._cache[task_id] = {}
        plain_set(self, task_id, dependency, value)

    def remove(self, task_id):
        """Forget ``task_id``'s record now; the row is deleted when the run ends (``dump``)."""
        self._cache.pop(task_id, None)
        self._dirty.discard(task_id)
        _removed(self).add(task_id)

    def dump(self):
        """Write the run's removals and records in one transaction and close; a full disk or a
        read-only database rolls it back and prints one line."""
        try:
            for task_id in _removed(self) - self._dirty:
                self._conn.execute("delete from doit where task_id=?", (task_id,))
            for task_id in self._dirty:
                self._conn.execute(
                    "insert or replace into doit values (?,?)", (task_id, self.codec.encode(self._cache[task_id]))
                )
            self._conn.commit()
            self._conn.close()
        except sqlite3.OperationalError as e:
            code = (getattr(e, "sqlite_errorcode", 0) or 0) & 0xFF
            if code not in (SQLITE_FULL, SQLITE_READONLY) and "disk is full" not in str(e):
                raise
            try:
                self._conn.rollback()
                self._conn.close()
            except sqlite3.Error:
                pass
            from tasks.store import outputs, paths

            if code == SQLITE_READONLY:
                sys.stderr.write(
                    f"npubuild: doit's database {self.name} could not be written ({e}): this run's results are "
                    "in the cache; the next run checks its tasks again\n"
                )
            else:
                err = outputs.disk_full(paths.state_dir(), "doit's database doit.sqlite3", "NPUBUILD_HOME")
                sys.stderr.write(f"npubuild: DiskFull: {err}\n")
        self._dirty = set()
        _removed(self).clear()

    for name, fn in {
        "_sqlite3": _sqlite3,
        "_get_task_data": _get_task_data,
        "in_": in_,
        "set": set_,
        "remove": remove,
        "dump": dump,
    }.items():
        setattr(SqliteDB, name, fn)
    SqliteDB.npubuild = True

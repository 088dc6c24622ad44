"""doit's database (``$NPUBUILD_HOME/doit.sqlite3``) as npubuild opens it: doit's own SQLite
backend (:class:`doit.dependency.SqliteDB`, one table of task records, written once when the run
ends) with three changes, registered as the doit backend ``npubuild-sqlite`` (the ``doit.BACKEND``
entry point in ``pyproject.toml``) and named by :func:`tasks.commands.builder.startup.start`:

- **a removal waits for the run's one write.** doit deletes a failed task's record at once
  (``remove_success``: a ``DELETE`` in Python's implicit transaction), which held SQLite's write
  lock until the run ended, so a second ``doit`` beside a long build whose task had failed died
  at its own end with ``sqlite3.OperationalError: database is locked`` (issue 51, a stranger's
  case beside a Genie build). Removals are kept and written with the rest, in the one short
  transaction of :meth:`Database.dump`.
- **a writer waits up to :data:`BUSY_TIMEOUT_S` for another's write** (doit's connection waits
  Python's default 5 s).
- **a full disk at the run's write is one line**, not a traceback after the run's own lines; the
  transaction is rolled back, so the database stays as it was (doit re-checks this run's tasks
  next time: their results are in the cache).
"""

from __future__ import annotations

import sqlite3
import sys

from doit.dependency import SqliteDB

#: seconds a connection waits for another process's write before "database is locked"; every
#: write is the end-of-run transaction (:meth:`Database.dump`), milliseconds long
BUSY_TIMEOUT_S = 60

SQLITE_FULL = 13  # https://www.sqlite.org/rescode.html#full


class Database(SqliteDB):
    """doit's SQLite backend with removals deferred to the run's one write (module docstring)."""

    desc = "doit's sqlite3 backend; writes only when the run ends (npubuild)"

    def __init__(self, name, codec, *, module_name=None):
        self._removed: set[str] = set()
        super().__init__(name, codec, module_name=module_name)

    def _sqlite3(self, name):
        conn = super()._sqlite3(name)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
        return conn

    def _get_task_data(self, task_id):
        return {} if task_id in self._removed else super()._get_task_data(task_id)

    def in_(self, task_id):
        return task_id not in self._removed and super().in_(task_id)

    def set(self, task_id, dependency, value):
        if task_id in self._removed:  # a record written after its removal starts empty
            self._removed.discard(task_id)
            self._cache[task_id] = {}
        super().set(task_id, dependency, value)

    def remove(self, task_id):
        """Forget ``task_id``'s record now; the row is deleted by :meth:`dump`."""
        self._cache.pop(task_id, None)
        self._dirty.discard(task_id)
        self._removed.add(task_id)

    def dump(self):
        """Write the run's removals and records in one transaction and close. A full disk rolls
        it back and prints one ``DiskFull`` line (module docstring)."""
        try:
            for task_id in self._removed - self._dirty:
                self._conn.execute("delete from doit where task_id=?", (task_id,))
            for task_id in self._dirty:
                self._conn.execute(
                    "insert or replace into doit values (?,?)", (task_id, self.codec.encode(self._cache[task_id]))
                )
            self._conn.commit()
            self._conn.close()
        except sqlite3.OperationalError as e:
            if (getattr(e, "sqlite_errorcode", 0) or 0) & 0xFF != SQLITE_FULL and "disk is full" not in str(e):
                raise
            try:
                self._conn.rollback()
                self._conn.close()
            except sqlite3.Error:
                pass
            from tasks.store import outputs, paths

            err = outputs.disk_full(paths.state_dir(), "doit's database doit.sqlite3", "NPUBUILD_HOME")
            sys.stderr.write(f"npubuild: DiskFull: {err}\n")
        self._dirty = set()
        self._removed = set()

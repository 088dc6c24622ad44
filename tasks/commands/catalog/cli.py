"""The catalog command's doit task (:func:`creators`): ``doit catalog`` writes
``catalog/catalog.json``, ``README.md`` and ``index.html`` (:mod:`.write`)."""

from __future__ import annotations

from tasks.core.session import Session
from tasks.errors import UserError, shown


def _catalog_action(session: Session):
    from doit.exceptions import TaskFailed

    from tasks.store import outputs
    from tasks.store import paths
    from tasks.commands.catalog.write import write_catalog

    if bad := outputs.unwritable("NPUBUILD_CATALOG", paths.catalog_dir()):
        return TaskFailed(bad)
    try:
        write_catalog(session=session)
    except UserError as e:  # DiskFull, ...
        return TaskFailed(shown(e))


def creators(session: Session) -> dict:
    """{name: doit task creator} of the catalog command, working in ``session``."""

    def task_catalog():
        """Write catalog/catalog.json, README.md and index.html: every recipe and its state."""
        return {"actions": [(_catalog_action, [session])], "uptodate": [False], "verbosity": 2}

    return {"task_catalog": task_catalog}

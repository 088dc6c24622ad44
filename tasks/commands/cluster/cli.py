"""The cluster command's doit task (:func:`creators`): ``doit cluster --scheduler
tcp://host:8786 [recipe ...]`` builds the stale stages on a Dask cluster and pulls them
(:mod:`.build`)."""

from __future__ import annotations

from tasks.core.session import Session


def _cluster_action(session: Session, scheduler: str, recipes: list):
    from doit.exceptions import TaskFailed

    from tasks.core import links
    from tasks.commands.cluster import build
    from tasks.errors import UserError, shown

    try:
        build.build(
            recipes, scheduler, link=lambda recipe, res: links.materialize(session, recipe, res), session=session
        )
    except UserError as e:
        return TaskFailed(shown(e))


def creators(session: Session) -> dict:
    """{name: doit task creator} of the cluster command, working in ``session``."""

    def task_cluster():
        """Build the stale stages of the given recipes (default: all) on a Dask cluster, then pull
        them: doit cluster --scheduler tcp://host:8786 [recipe ...] (needs NPUBUILD_REMOTE)."""
        return {
            "actions": [(_cluster_action, [session])],
            "pos_arg": "recipes",
            "uptodate": [False],
            "verbosity": 2,
            "params": [
                {
                    "name": "scheduler",
                    "long": "scheduler",
                    "type": str,
                    "default": "",
                    "help": "Dask scheduler address, tcp://host:8786 (default: $NPUBUILD_SCHEDULER)",
                }
            ],
        }

    return {"task_cluster": task_cluster}

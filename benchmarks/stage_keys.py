"""Every stage key of every recipe, as JSON on stdout (run by hand; asserts nothing): to show
that a change of the build code leaves the keys alone, run it before and after and compare.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/stage_keys.py > before.json

For each stage of each valid, non-abstract recipe: ``explain_key`` and ``status`` (as
``doit explain`` gives them: a key only where the cache holds its upstream entries) and
``pending_key`` (the key with each upstream output digest replaced by ``pending:<stage>``, as
a cluster build plans: computed for every stage whatever the cache holds, so it covers the
code digest, params, data files, tools and ``key_extra`` of every stage), ``code`` (the code
digest). ``_errors``: the first line of each invalid recipe file's error. The recipes, cache
and home are the usual ones (``NPUBUILD_*``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tasks.core import explain, keys, recipeset  # noqa: E402
from tasks.core.session import Session  # noqa: E402


def stage_keys(session: Session) -> dict:
    out = {"_errors": {k: str(v).splitlines()[0] for k, v in sorted(recipeset.recipe_errors(session).items())}}
    for name, abstract in sorted(recipeset.recipe_names(session).items()):
        if abstract:
            continue
        rows = {}
        for stage, spec in recipeset.plan(session, name).items():
            pending = {role: SimpleNamespace(output_digest=f"pending:{up}") for role, up in spec.inputs.items()}
            try:
                material = keys.key_material(session, spec, pending)
                rows[stage] = {"pending_key": keys.stage_key(material), "code": material["code"]}
            except Exception as e:  # e.g. a source folder that is not there
                rows[stage] = {
                    "pending_key": f"ERR {type(e).__name__}: {(str(e).splitlines() or [''])[0]}",
                    "code": None,
                }
        for row in explain.explain(session, name):
            rows[row["stage"]].update(explain_key=row["key"], status=row["status"])
        out[name] = rows
    return out


if __name__ == "__main__":
    json.dump(stage_keys(Session()), sys.stdout, indent=1, sort_keys=True)
    print()

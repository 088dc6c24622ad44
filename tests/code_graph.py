"""The package's import graph as the layout and key tests read it: its modules, the cycles of a
graph, and the modules a traced stage loaded that its code digest does not cover."""

from __future__ import annotations

import json
import sys

from conftest import REPO


def package_modules() -> list[str]:
    """Dotted names of every module of ``tasks/`` (packages by their ``__init__``)."""
    mods = []
    for f in (REPO / "tasks").rglob("*.py"):
        parts = f.relative_to(REPO).with_suffix("").parts
        mods.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return mods


def import_cycles(graph: dict) -> list[list[str]]:
    """The cycles a depth-first walk of ``graph`` ({node: nodes it imports}) finds."""
    state, cycles = {}, []

    def visit(u, stack):
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                cycles.append(stack[stack.index(v) :] + [v])
            elif v not in state:
                visit(v, stack)
        stack.pop()
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            visit(u, [])
    return cycles


TRACED = r"""
import json, sys
from tasks.core import keys, recipeset
from tasks.core.session import Session
session = Session()
out = {}
for recipe in sys.argv[1:]:
    for spec in recipeset.plan(session, recipe).values():
        out[spec.task] = sorted(keys.code_files(session, spec))
print(json.dumps(out))
"""


def traced_modules_outside_keys(project, recipes, trace) -> dict:
    """{file of ``trace`` (a NPUBUILD_TRACE_MODULES folder): the ``tasks`` modules that process
    had loaded (a stage process: those the stage imported; a child: all) and that the stage's
    code digest does not cover}; also asserts that traces were written for stage processes and
    their children."""
    import subprocess

    p = subprocess.run(
        [sys.executable, "-c", TRACED, *recipes], env=project.env, capture_output=True, text=True, cwd=project.root
    )
    assert p.returncode == 0, p.stderr[-2000:]
    covered = json.loads(p.stdout.splitlines()[-1])
    traces = [json.loads(f.read_text()) for f in sorted(trace.glob("*.json"))]
    assert {t["who"] for t in traces} == {"stage", "child"}, traces
    missing = {}
    for t in traces:
        # the namespace package itself holds no code (the child runner's entry runs as __main__)
        extra = set(t["modules"]) - set(covered[t["task"]]) - {"tasks"}
        if extra:
            missing[f"{t['task']} ({t['who']})"] = sorted(extra)
    return missing

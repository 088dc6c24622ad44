"""Issue 11: stage keys that cannot go stale. Each stage's code digest comes from the modules it
imports (found from the source, not a hand-kept list); the target enters compile/verify keys as
the provider options it resolves to; the package has no import cycles."""
import json
import shutil
import subprocess
import sys

from conftest import REPO

PROBE = r"""
import json, sys
from tasks import engine
from tasks.plan import StageSpec
from tasks.stages import module_for

stage = sys.argv[1]
spec = StageSpec("r", stage, stage, {"target": "x-elite"})
def key():
    mod = module_for(stage)
    extra = mod.key_extra(spec.params) if stage in ("compile", "verify") else None
    return engine.code_digest(spec), extra
base = key()
changed, unchanged = [], []
for name in engine.code_modules(module_for(stage).__name__):
    f = engine._module_file(name)
    text = f.read_text()
    f.write_text(text + "\n# an edit\n")
    (changed if key()[0] != base[0] else unchanged).append(name)
    f.write_text(text)
t = engine._module_file("tasks.targets")
text = t.read_text()
t.write_text(text.replace('Target("x-elite", 60, 73,', 'Target("x-elite", 61, 73,'))
import importlib, tasks.targets, tasks.qnn
importlib.reload(tasks.targets); importlib.reload(tasks.qnn)
from tasks.stages import module_for as mf
mod = importlib.reload(mf(stage))
after = (engine.code_digest(spec), mod.key_extra(spec.params) if stage in ("compile", "verify") else None)
t.write_text(text)
print(json.dumps({"modules": list(engine.code_modules(module_for(stage).__name__)), "changed": changed,
                  "unchanged": unchanged, "extra_before": base[1], "extra_after": after[1],
                  "code_after_target_edit_differs": after[0] != base[0]}))
"""


def _probe(tmp_path, stage):
    """Run the probe against a copy of the package (edits never touch the checkout)."""
    shutil.copytree(REPO / "tasks", tmp_path / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    p = subprocess.run([sys.executable, "-c", PROBE, stage], cwd=tmp_path, capture_output=True, text=True,
                       env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "NPUBUILD_HOME": str(tmp_path / "h")})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


def test_editing_any_module_quantize_imports_changes_its_key(tmp_path):
    r = _probe(tmp_path, "quantize")
    # the LLM path's helpers are found without being listed anywhere
    for m in ("tasks.stages.quantize", "tasks.llm.quant", "tasks.llm.calib", "tasks.llm.sessions",
              "tasks.llm.runner", "tasks.graphs"):
        assert m in r["modules"], (m, r["modules"])
    assert r["unchanged"] == [] and len(r["changed"]) == len(r["modules"]) >= 8


def test_editing_a_targets_soc_model_changes_compile_and_verify_keys(tmp_path):
    for stage in ("compile", "verify"):
        r = _probe(tmp_path / stage, stage)
        assert "tasks.targets" in r["modules"]
        assert r["extra_before"]["provider_options"]["soc_model"] == "60"
        assert r["extra_after"]["provider_options"]["soc_model"] == "61"
        assert r["code_after_target_edit_differs"]


def test_modules_with_the_same_file_name_both_count():
    """tasks/llm/export.py and tasks/stages/export.py are two files: both enter export's digest."""
    from tasks.engine import code_modules

    mods = code_modules("tasks.stages.export")
    assert "tasks.llm.export" in mods and "tasks.stages.export" in mods


def test_no_import_cycles():
    from tasks.engine import direct_imports

    mods = []
    for f in (REPO / "tasks").rglob("*.py"):
        parts = f.relative_to(REPO).with_suffix("").parts
        mods.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    graph = {m: direct_imports(m) for m in mods}
    state, cycles = {}, []

    def visit(u, stack):
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                cycles.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v, stack)
        stack.pop()
        state[u] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert len(graph) > 40 and sum(map(len, graph.values())) > 60  # the graph was really read
    assert cycles == [], cycles

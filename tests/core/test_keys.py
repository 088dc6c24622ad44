"""Issue 11: stage keys that cannot go stale. Each stage's code digest comes from the modules it
imports (found from the source, not a hand-kept list); the target enters compile/verify keys as
the provider options it resolves to; the package has no import cycles."""

import json
import shutil
import subprocess
import sys

from code_graph import import_cycles, package_modules, traced_modules_outside_keys
from conftest import REPO

PROBE = r"""
import json, sys
from tasks.core import keys
from tasks.core.session import Session
from tasks.recipe.plan import StageSpec
from tasks.contract import implementation

stage, family = sys.argv[1], sys.argv[2]
spec = StageSpec("r", stage, stage, {"target": "x-elite"}, family=family)
def key():
    st = implementation(stage, family)
    extra = st.key_extra(spec.params) if stage in ("compile", "verify") else None
    return keys.code_digest(Session(), spec), extra
base = key()
changed, unchanged = [], []
for name in keys.code_modules(Session(), implementation(stage, family).module):
    f = keys.module_file(Session(), name)
    text = f.read_text()
    f.write_text(text + "\n# an edit\n")
    (changed if key()[0] != base[0] else unchanged).append(name)
    f.write_text(text)
t = keys.module_file(Session(), "tasks.qnn.targets")
text = t.read_text()
import re
edited = re.sub(r'("x-elite",\s*)60(,\s*73,)', r"\g<1>61\2", text)  # the row however it is formatted
assert edited != text, "no x-elite row with soc_model 60 in targets.py"
t.write_text(edited)
import importlib, tasks.qnn.targets, tasks.qnn.ep
importlib.reload(tasks.qnn.targets); importlib.reload(tasks.qnn.ep)
importlib.reload(tasks.contract.common)
st = importlib.reload(importlib.import_module(implementation(stage, family).module)).STAGE
after = (keys.code_digest(Session(), spec), st.key_extra(spec.params) if stage in ("compile", "verify") else None)
t.write_text(text)
print(json.dumps({"modules": list(keys.code_modules(Session(), implementation(stage, family).module)), "changed":
changed,
                  "unchanged": unchanged, "extra_before": base[1], "extra_after": after[1],
                  "code_after_target_edit_differs": after[0] != base[0]}))
"""


def _probe(tmp_path, stage, family="encoder"):
    """Run the probe against a copy of the package (edits never touch the checkout)."""
    shutil.copytree(REPO / "tasks", tmp_path / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    p = subprocess.run(
        [sys.executable, "-c", PROBE, stage, family],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "NPUBUILD_HOME": str(tmp_path / "h")},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


def test_editing_any_module_quantize_imports_changes_its_key(tmp_path):
    r = _probe(tmp_path, "quantize", "llm")
    # the LLM path's helpers are found without being listed anywhere
    for m in (
        "tasks.llm.quantize",
        "tasks.llm.qdq",
        "tasks.llm.calibration_feeds",
        "tasks.llm.sessions",
        "tasks.llm.runner",
        "tasks.contract.common",
    ):
        assert m in r["modules"], (m, r["modules"])
    assert r["unchanged"] == [] and len(r["changed"]) == len(r["modules"]) >= 8
    enc = _probe(tmp_path / "encoder", "quantize")
    assert (
        "tasks.qnn.graphs" in enc["modules"] and enc["unchanged"] == [] and len(enc["changed"]) == len(enc["modules"])
    )


def test_editing_a_targets_soc_model_changes_compile_and_verify_keys(tmp_path):
    for stage, family in (("compile", "encoder"), ("verify", "encoder"), ("compile", "llm"), ("verify", "llm")):
        r = _probe(tmp_path / stage / family, stage, family)
        assert "tasks.qnn.targets" in r["modules"]
        assert r["extra_before"]["provider_options"]["soc_model"] == "60"
        assert r["extra_after"]["provider_options"]["soc_model"] == "61"
        assert r["code_after_target_edit_differs"]


def test_each_family_hashes_its_own_implementation_only():
    """A stage kind has one module per family (its stage table: tasks.contract.family), chosen in plan:
    an encoder stage's key holds no LLM code and the reverse, so editing the LLM export leaves
    every encoder key alone; ``tasks/llm/export.py`` counts under its own dotted name."""
    from tasks.core import keys
    from tasks.core.session import Session
    from tasks.contract import implementation, implementation_modules

    def code_modules(name):
        return keys.code_modules(Session(), name)

    for kind in ("export", "quantize", "compile", "verify"):
        enc = code_modules(implementation(kind, "encoder").module)
        llm = code_modules(implementation(kind, "llm").module)
        assert not any(m.startswith("tasks.llm.") for m in enc), (kind, enc)
        assert f"tasks.encoder.{kind}" in enc and not any(m.startswith("tasks.encoder.") for m in llm), (kind, llm)
    assert "tasks.llm.export" in code_modules("tasks.llm.export")
    assert implementation_modules("download") == ["tasks.sources.download"]  # one module every family names


def test_no_stage_module_branches_on_the_family():
    """No implementation module (every family's stage table: tasks.contract.implementation_modules)
    reads ``family``: the plan picks the implementation, so a stage never asks which family it builds."""
    import ast

    from tasks.contract import implementation_modules

    files = [REPO.joinpath(*m.split(".")).with_suffix(".py") for m in implementation_modules()]
    assert len(files) >= 14 and all(f.is_file() for f in files), files
    for f in sorted(files):
        tree = ast.parse(f.read_text())
        reads = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value == "family"]
        assert reads == [], f"{f.name} reads params['family'] (line {reads[0].lineno})"


def test_no_import_cycles():
    from tasks.core.keys import direct_imports
    from tasks.core.session import Session

    session = Session()
    graph = {m: direct_imports(session, m) for m in package_modules()}
    cycles = import_cycles(graph)
    assert len(graph) > 40 and sum(map(len, graph.values())) > 60  # the graph was really read
    assert cycles == [], cycles


def test_editing_the_llm_compiler_changes_the_llm_compile_key(tmp_path):
    """Issue 24: the LLM compile ran its compile helpers (now ``tasks.llm.htp``) in a child given as source text, so the
    code digest (which follows imports) never saw it: an edit left ``compile:<llm>`` up to date
    with the old binaries. The child now runs a named function the stage imports."""
    r = _probe(tmp_path, "compile", "llm")
    assert "tasks.llm.htp" in r["modules"] and "tasks.llm.htp" in r["changed"], r
    assert "tasks.proc.child" in r["modules"]


def test_every_module_an_encoder_stage_runs_is_in_its_key(project, tmp_path):
    """Through the doit CLI: every ``tasks`` module a stage loads, in its own process or in its
    children (the compile child, verify's HTP children), is in that stage's code digest."""
    project.recipe("t", backend="htp")
    trace = tmp_path / "trace"
    trace.mkdir()
    project.env["NPUBUILD_TRACE_MODULES"] = str(trace)
    run = project.doit("run", "build:t")
    assert run.ran() == ["compile:t", "download:t", "export:t", "prepatch:t", "quantize:t", "verify:t"]
    children = [json.loads(f.read_text())["task"] for f in trace.glob("child-*.json")]
    assert "compile:t" in children and "verify:t" in children, children
    assert traced_modules_outside_keys(project, ["t"], trace) == {}


def test_children_run_the_package_copy_their_parent_runs(tmp_path):
    """A child's PYTHONPATH is the folder holding its parent's ``tasks/`` (tasks/proc/child.py
    ``PACKAGE_ROOT``): from a copy of the package (a worktree, a CI clone) the child imports the
    copy, not an installed checkout, so it runs the code the stage key hashed."""
    shutil.copytree(REPO / "tasks", tmp_path / "copy" / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        "from tasks.proc.child import run_function, run_python\n"
        "import tasks.qnn.targets\n"
        "print(run_python('import tasks.qnn.targets as t; print(t.__file__)', cwd='/').stdout.strip())\n"
        "r = run_function(tasks.qnn.targets.get, 'x-elite', cwd='/')\n"
        "print(r.returncode)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "copy", capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    first, rc = p.stdout.split()
    assert first == str(tmp_path / "copy" / "tasks" / "qnn" / "targets.py") and rc == "0", p.stdout

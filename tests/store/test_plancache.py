"""The plan cache (tasks/store/plancache.py): a no-op command plans without parsing recipes or
importing pydantic, and every input the recipe load reads makes it load the recipes again."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from tasks.store import plancache

PROBE = """
import json, sys
from tasks.core import recipeset
from tasks.core.session import Session
session = Session()
recipeset.pin(session)
s = recipeset.current(session)
plans = {n: {k: v.params for k, v in recipeset.plan(session, n).items()}
         for n, a in recipeset.recipe_names(session).items() if not a}
out = {"cached": s.from_plan_cache, "pydantic": "pydantic" in sys.modules, "plans": plans}
out["errors"] = sorted(recipeset.recipe_errors(session))
print(json.dumps(out))
"""


def _age(root: Path) -> None:
    """Date every file of the project a minute back, out of the plan cache's racy window."""
    old = time.time() - 60
    for p in [root, *root.rglob("*")]:
        os.utime(p, (old, old))


def probe(project, **env) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=dict(project.env, PYTHONPATH=str(REPO), **env),
        capture_output=True,
        text=True,
        cwd=project.root,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


@pytest.fixture
def cached(project):
    """A project with one valid recipe whose plan is stored."""
    project.recipe("a")
    _age(project.root)
    first = probe(project)
    assert not first["cached"] and first["errors"] == []
    assert _stored(project)
    return project, first


def _stored(project) -> list[Path]:
    return sorted((project.root / ".npubuild").glob(f"{plancache.PREFIX}*.json"))


def test_stored_plan_used_without_pydantic(cached):
    project, first = cached
    again = probe(project)
    assert again["cached"] and not again["pydantic"]
    assert again["plans"] == first["plans"]
    assert again["plans"]["a"]["quantize"]["calibration"]["samples"] == 4

    def doit_list():
        r = subprocess.run(
            [sys.executable, "-m", "doit", "list", "-f", str(REPO / "dodo.py"), "-d", str(project.root)],
            env=dict(project.env, NPUBUILD_STATS="1"),
            capture_output=True,
            text=True,
            cwd=project.root,
        )
        assert r.returncode == 0, r.stderr
        return r

    doit_list()  # doit's sys.path differs from the probe's (its dodo.py folder): stores its own
    listed = doit_list()
    assert re.search(r"npubuild-stats .* pydantic=0", listed.stderr), listed.stderr
    assert "quantize" in listed.stdout


def _edit_recipe(p):
    f = p.root / "recipes" / "a.yaml"
    f.write_text(f.read_text().replace("samples: 4", "samples: 5"))


def _short_data(p):
    (p.root / "data" / "calib.txt").write_text("one line\n")


def _config_limit(p):
    f = p.root / "models" / "tiny-bert" / "config.json"
    f.write_text(json.dumps(dict(json.loads(f.read_text()), max_position_embeddings=8)))


def _tokenizer_inputs(p):
    f = p.root / "models" / "tiny-bert" / "tokenizer_config.json"
    cfg = json.loads(f.read_text()) if f.is_file() else {}
    f.write_text(json.dumps(dict(cfg, model_input_names=["input_ids"])))


def _new_recipe(p):
    p.recipe("b", precision="w4a16")


def _replaced_keeping_mtime(p):  # as rsync -a / cp -p / tar x replace a file: old mtime, new bytes
    f = p.root / "data" / "calib.txt"
    st = f.stat()
    f.unlink()
    f.write_text("one line\n")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


def _unreadable(p):
    (p.root / "data" / "calib.txt").chmod(0)


@pytest.mark.parametrize(
    "change, check",
    [
        (_edit_recipe, lambda r: r["plans"]["a"]["quantize"]["calibration"]["samples"] == 5),
        (_short_data, lambda r: r["errors"] == ["a"]),
        (_config_limit, lambda r: r["errors"] == ["a"]),
        (_tokenizer_inputs, lambda r: r["errors"] == ["a"]),
        (
            _new_recipe,
            lambda r: sorted(r["plans"]) == ["a", "b"] and r["plans"]["b"]["quantize"]["precision"] == "w4a16",
        ),
        (_replaced_keeping_mtime, lambda r: r["errors"] == ["a"]),
        (_unreadable, lambda r: True),  # the mode is part of the stat (as root the file stays readable)
    ],
    ids=["recipe-edit", "data-file", "source-config", "tokenizer-config", "new-recipe", "replaced-old-mtime", "mode"],
)
def test_each_input_invalidates(cached, change, check):
    project, _ = cached
    change(project)
    got = probe(project)
    assert not got["cached"] and check(got), got


def test_environment_invalidates(cached, tmp_path):
    project, first = cached
    got = probe(project, NPUBUILD_ALLOW_PATHS=str(tmp_path))
    assert not got["cached"] and got["plans"] == first["plans"]


def test_code_change_invalidates(tmp_path, monkeypatch):
    code = tmp_path / "tasks"
    shutil.copytree(REPO / "tasks", code, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(plancache, "_CODE", code)
    before = plancache.signature("/x", ())
    f = code / "qnn" / "targets.py"
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1_000_000))
    assert plancache.signature("/x", ()) != before


def test_nothing_stored_when_racy_or_invalid(project):
    project.recipe("a")
    got = probe(project)  # the files were written just now: within the racy window
    assert not got["cached"] and not _stored(project)
    (project.root / "recipes" / "bad.yaml").write_text("quantize: {precision: w3a3}\n")
    _age(project.root)
    got = probe(project)
    assert got["errors"] == ["bad"] and not _stored(project)
    assert probe(project)["errors"] == ["bad"]  # reported by a real load every time


def test_retargeted_symlink_invalidates(project):
    """A data file reached through a symlinked folder: retargeting the link changes what
    the load checks (and reads) though the file's own stat may not change."""
    for d in ("one", "two"):
        (project.root / d).mkdir()
        shutil.copy(project.root / "data" / "calib.txt", project.root / d / "calib.txt")
    (project.root / "two" / "calib.txt").write_text("one line\n")
    (project.root / "link").symlink_to("one")
    project.recipe("a", text=_tiny("data/calib.txt", "link/calib.txt"))
    _age(project.root)
    assert probe(project)["errors"] == [] and probe(project)["cached"]
    (project.root / "link").unlink()
    (project.root / "link").symlink_to("two")
    got = probe(project)
    assert not got["cached"] and got["errors"] == ["a"]


def _tiny(old: str, new: str) -> str:
    from conftest import TINY_RECIPE

    return TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
        f"file: {old}, samples: 4", f"file: {new}, samples: 4"
    )


def test_home_and_xdg_are_part_of_the_environment(cached):
    project, _ = cached
    assert not probe(project, HOME=str(project.root))["cached"]
    assert not probe(project, XDG_CACHE_HOME=str(project.root))["cached"]


def test_file_changed_while_loading_is_not_taken_as_read(tmp_path):
    """A file is stat'ed when the load looks at it, not when the plan is saved: a change in
    between makes the stored row differ from the file."""
    f = tmp_path / "calib.txt"
    f.write_text("a\nb\n")
    old = time.time() - 60
    os.utime(f, (old, old))
    with plancache.recording() as noted:
        plancache.note(f)
    st = f.stat()
    f.write_text("c\n")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert noted[0][2] != plancache._row(f)[2]


def test_package_source_not_installed_stores_nothing(project):
    text = _tiny("data/calib.txt", "data/calib.txt").replace(
        "source: {path: models/tiny-bert}", "source: {package: no_such_package_xyz, subdir: model}"
    )
    project.recipe("a", text=text)
    _age(project.root)
    got = probe(project)
    assert got["errors"] == [] and not _stored(project)


@pytest.mark.parametrize(
    "damage",
    [
        lambda rows: rows["a"].pop("specs"),
        lambda rows: rows["a"].update(specs=5),
        lambda rows: rows["a"]["specs"][0].update(colour="red"),
    ],
    ids=["row-without-specs", "specs-not-a-list", "unknown-field"],
)
def test_damaged_rows_count_as_absent(cached, damage):
    project, first = cached
    (f,) = _stored(project)
    doc = json.loads(f.read_text())
    damage(doc["recipes"])
    f.write_text(json.dumps(doc))
    got = probe(project)
    assert not got["cached"] and got["plans"] == first["plans"]
    assert probe(project)["cached"]  # rewritten by that load


def test_a_folder_with_an_unsupported_model_still_gets_the_plan_cache(project):
    """A valid recipe of a model not implemented yet (the repo's gemma-2) is stored with its
    reason: a later `doit list` uses the stored plan (no pydantic) and still says, in one line,
    that the recipe is unsupported."""
    project.recipe("a")
    model = project.root / "models" / "g"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "gemma3", "num_hidden_layers": 2}))
    (project.root / "recipes" / "g.yaml").write_text(
        "source: {path: models/g}\nexport: {family: llm, sequence_length: 8, context_length: 32}\n"
        "quantize: {calibration: {file: data/calib.txt, samples: 2}}\n"
        "verify: {data: {file: data/verify.txt, samples: 2}}\n"
    )
    _age(project.root)

    def doit_list():
        r = subprocess.run(
            [sys.executable, "-m", "doit", "list", "-f", str(REPO / "dodo.py"), "-d", str(project.root)],
            env=dict(project.env, NPUBUILD_STATS="1"),
            capture_output=True,
            text=True,
            cwd=project.root,
        )
        assert r.returncode == 0, r.stderr
        return r

    first = doit_list()
    assert re.search(r"npubuild-stats .* pydantic=1", first.stderr), first.stderr
    again = doit_list()
    assert re.search(r"npubuild-stats .* pydantic=0", again.stderr), again.stderr
    line = [ln for ln in again.stderr.splitlines() if "g.yaml" in ln]
    assert len(line) == 1 and "unsupported model" in line[0] and "'gemma3'" in line[0], again.stderr

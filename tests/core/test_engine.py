"""The build engine end to end through the real doit CLI, on a tiny real BERT: incremental
rebuilds, sharing across recipes, early cut-off, killed builds, concurrent builds."""

from __future__ import annotations

import json
import os
import re
import signal
import time

from conftest import TINY_RECIPE

CHAIN = ["compile:{r}", "download:{r}", "export:{r}", "prepatch:{r}", "quantize:{r}", "verify:{r}"]


def chain(r: str, *names: str) -> list[str]:
    return sorted(n.format(r=r) for n in (names or CHAIN))


def test_second_build_runs_nothing(project):
    project.recipe("t8")
    first = project.doit("run", "build:t8")
    assert first.ran() == chain("t8")
    assert first.tasks["build:t8"]["result"] == "success"
    again = project.doit("run", "build:t8")
    assert again.ran() == []
    assert all(t["result"] == "up-to-date" for t in again.tasks.values())
    art = json.loads((project.root / "build" / "t8" / "artifacts.json").read_text())
    assert {"model_ctx.onnx", "model_ctx_qnn.bin", "verify.json", "tokenizer.json"} <= set(art)
    report = json.loads((project.root / "build" / "t8" / "verify.json").read_text())
    assert report["backend"] == "cpu-qdq" and len(report["samples"]) == 3
    assert 0.9 <= report["metrics"]["pooled_cosine_mean"] <= 1.0


def test_quantize_param_change_reruns_only_downstream(project):
    project.recipe("t8")
    project.doit("run", "build:t8")
    p = project.recipe(
        "t8",
        TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
            "samples: 4", "samples: 5"
        ),
    )
    assert "samples: 5" in p.read_text()
    before = project.doit("run", "explain:t8").tasks["explain:t8"]["out"]
    assert "changed: params.calibration.samples: 4 -> 5" in before
    status = {ln.split(None, 3)[0]: ln.split(None, 3)[3] for ln in before.splitlines() if not ln.startswith(" ")}
    assert status == {
        "download:t8": "local hit",
        "export:t8": "local hit",
        "prepatch:t8": "local hit",
        "quantize:t8": "stale",
        "compile:t8": "blocked",
        "verify:t8": "blocked",
    }
    run = project.doit("run", "build:t8")
    assert run.ran() == chain("t8", "quantize:{r}", "compile:{r}", "verify:{r}")
    assert len(project.entries("export")) == 1 and len(project.entries("quantize")) == 2
    # explain names the changed param for nothing now, and every stage is up to date
    ex = project.doit("run", "explain:t8")
    assert "stale" not in ex.tasks["explain:t8"]["out"]
    # a data file's change is named by its path
    with open(project.root / "data" / "calib.txt", "a") as f:
        f.write("one more calibration sentence\n")
    out = project.doit("run", "explain:t8").tasks["explain:t8"]["out"]
    assert re.search(r'changed: files.calibration \(data/calib.txt\): content "[0-9a-f]{32}" -> "[0-9a-f]{32}"', out), (
        out
    )
    # the old quantize, compile and verify entries are now unreferenced: gc lists, keeps them
    dry = project.doit("run", "gc").tasks["gc"]["out"]
    assert dry.count("would remove ") == 3 and "MB" in dry and "(dry run" in dry
    assert len(project.entries("quantize")) == 2
    # the recipe renamed: build/t8/ has no recipe now, gc lists it and --apply removes it (and
    # the entries no recipe references), keeping the entries t9 references
    calib = project.root / "data" / "calib.txt"
    calib.write_text(calib.read_text().replace("one more calibration sentence\n", ""))  # back: t9 = t8's last build
    (project.root / "recipes" / "t8.yaml").rename(project.root / "recipes" / "t9.yaml")
    (project.root / "recipes" / "bad.yaml").write_text("export: [\n")  # an invalid recipe keeps its folder
    (project.root / "build" / "bad").mkdir()
    dry = project.doit("run", "gc").tasks["gc"]["out"]
    assert f"would remove {project.root / 'build' / 't8'}/ (no recipe t8.yaml)" in dry, dry
    assert "build/bad" not in dry and "; 1 build folder without a recipe (dry run" in dry
    applied = project.doit("run", "gc", "--apply").tasks["gc"]["out"]
    assert f"removed {project.root / 'build' / 't8'}/" in applied and not (project.root / "build" / "t8").exists()
    assert (project.root / "build" / "bad").is_dir()
    assert len(project.entries("quantize")) == 1 and len(project.entries("export")) == 1
    assert project.doit("run", "build:t9").ran() == []  # every stage of t9 still a cache hit


def test_precision_variants_share_download_and_export(project):
    project.recipe("t8")
    project.recipe("t4", precision="w4a16")
    project.doit("run", "build:t8")
    second = project.doit("run", "build:t4")
    assert second.ran() == chain("t4", "quantize:{r}", "compile:{r}", "verify:{r}")
    for kind, n in {"download": 1, "export": 1, "patch": 1, "quantize": 2, "compile": 2}.items():
        assert len(project.entries(kind)) == n, kind
    m4 = json.loads(next((project.cache / "quantize").glob("*/manifest.json")).read_text())
    assert m4["inputs"]["model"]["kind"] == "patch"


def test_patch_that_does_not_apply_cuts_off_downstream(project):
    project.recipe("t8")
    project.doit("run", "build:t8")
    # add a patch that finds nothing in this graph (no RMSNorm in BERT): prepatch reruns,
    # its output is byte-identical, so quantize/compile/verify stay up to date
    text = (
        (project.root / "recipes" / "t8.yaml")
        .read_text()
        .replace(
            "  - {name: mask-range, when: pre-quantize}",
            "  - {name: mask-range, when: pre-quantize}\n  - {name: rmsnorm-decompose, when: pre-quantize}",
        )
    )
    project.recipe("t8", text)
    ex = project.doit("run", "explain:t8").tasks["explain:t8"]["out"]
    assert "prepatch" in ex and "steps" in ex and "rmsnorm-decompose" in ex
    run = project.doit("run", "build:t8")
    assert run.ran() == ["prepatch:t8"]
    assert len(project.entries("patch")) == 2 and len(project.entries("quantize")) == 1
    outs = {
        json.loads((project.cache / "patch" / k / "manifest.json").read_text())["output_digest"]
        for k in project.entries("patch")
    }
    assert len(outs) == 1


def test_killed_build_leaves_no_entry_and_rebuilds(project):
    project.recipe("t8")
    proc = project.popen("run", "build:t8", start_new_session=True)
    tmp = project.cache / ".tmp"
    deadline = time.time() + 120
    while time.time() < deadline and not (tmp.is_dir() and any(p.name.startswith("export-") for p in tmp.iterdir())):
        time.sleep(0.05)
    assert tmp.is_dir(), "export never started"
    time.sleep(1.0)  # in the middle of the export
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert project.entries("export") == []  # nothing half-written counts as built
    assert any(p.name.startswith("export-") for p in tmp.iterdir())
    run = project.doit("run", "build:t8")
    assert "export:t8" in run.ran() and "download:t8" not in run.ran()
    assert len(project.entries("export")) == 1
    assert list(tmp.iterdir()) == []  # the next build removed the dead build's temp folder (issue 14)
    gc = project.doit("run", "gc", "--apply")
    assert ".tmp/" not in gc.tasks["gc"]["out"]


def test_two_concurrent_builds_share_one_entry_per_key(project):
    project.recipe("t8")
    a = project.popen("run", "build:t8")
    b = project.popen("run", "build:t8")
    out_a, out_b = a.communicate(timeout=600)[0], b.communicate(timeout=600)[0]
    assert a.returncode == 0, out_a
    assert b.returncode == 0, out_b
    for kind in ("download", "export", "patch", "quantize", "compile", "verify"):
        assert len(project.entries(kind)) == 1, kind
    built = re.findall(r"^\S+:t8\s+[0-9a-f]{12}\s+built\s", out_a + out_b, re.M)
    assert len(built) == 6, out_a + out_b  # each key built once, by one of the two


def test_parallel_targets_and_damaged_entry(project):
    project.recipe("t2", targets="[x-elite, 8gen3]")
    run = project.doit("run", "-n", "2", "build:t2")
    assert "compile@x-elite:t2" in run.ran() and "compile@8gen3:t2" in run.ran()
    assert len(project.entries("compile")) == 2
    assert (project.root / "build" / "t2" / "8gen3" / "model_ctx_qnn.bin").exists()
    # damage one entry's output keeping its size and mtime: invisible to the per-build check,
    # caught by cache_verify, which quarantines it; the next build rebuilds it and refreshes
    # build/ (whose file was a hard link to the damaged one)
    entry = project.cache / "compile" / project.entries("compile")[0]
    binf = next((entry / "out").glob("*.bin"))
    st = binf.stat()
    os.chmod(binf, 0o644)
    with open(binf, "r+b") as f:
        f.seek(100)
        f.write(bytes(b ^ 0xFF for b in f.read(3)))
    os.utime(binf, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert project.doit("run", "build:t2").ran() == []
    check = project.doit("run", "cache_verify", check=False)
    assert check.code != 0 and "DAMAGED compile/" in check.tasks["cache_verify"]["out"]
    assert not entry.exists() and any((project.cache / ".damaged").iterdir())
    again = project.doit("run", "build:t2")
    assert len([n for n in again.ran() if n.startswith("compile")]) == 1
    assert again.tasks["build:t2"]["result"] == "success"
    for sub in ("x-elite", "8gen3"):
        built = project.root / "build" / "t2" / sub / "model_ctx_qnn.bin"
        art = json.loads((project.root / "build" / "t2" / "artifacts.json").read_text())
        assert os.path.samefile(built, project.cache / art[f"{sub}/model_ctx_qnn.bin"])
    assert project.doit("run", "cache_verify").code == 0


def test_build_all_builds_what_it_can_and_reports_the_rest(project):
    project.recipe("t8")
    project.recipe(
        "hub",
        TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
            "source: {path: models/tiny-bert}", "source: {hf: acme/absent, revision: main}"
        ),
    )
    run = project.doit("run", "build", check=False)
    assert run.code != 0
    assert run.tasks["verify:t8"]["result"] == "success" and run.tasks["build:t8"]["result"] == "success"
    err = run.tasks["download:hub"]["error"]
    assert "SourceError: cannot get Hub model 'acme/absent' at revision 'main'" in err
    assert "Traceback" not in err
    assert project.entries("download") and len(project.entries("download")) == 1

"""LLM parts as stages of their own (issue 22), through the real doit CLI on the tiny trained
Qwen2 (4 layers) split into 3 parts: each part's export, calibrate, quantize and compile has
its own key and entry; a killed build resumes by part; a change to one part rebuilds only
what reads it; another target shares every part stage up to compile."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, Project, needs
from llm_projects import parts_project_at


@pytest.fixture
def parts_project(tmp_path, tiny_bert) -> Project:
    return parts_project_at(tmp_path / "proj", tiny_bert)


def _stages(proj: Project, recipe: str) -> dict:
    return json.loads((proj.root / "build" / recipe / "stages.json").read_text())


def test_parts_are_stages_resume_by_part_and_are_shared(parts_project):
    """Through the doit CLI: ``doit list`` shows every part's stages; a build SIGKILLed (the
    whole process group) while quantize.part2 runs resumes with part 2: parts 0 and 1 are
    cache hits, and exactly part 2's quantize and compile, the bundle and verify are built. Then
    the entries, the joined bundle and verify; a lost entry rebuilds one stage; another target
    shares every part stage before compile."""
    proj = parts_project
    listed = subprocess.run(
        [sys.executable, "-m", "doit", "list", "--all", "-f", str(REPO / "dodo.py"), "-d", str(proj.root)],
        env=proj.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for k in range(3):
        for s in ("export", "calibrate", "quantize", "compile"):
            assert f"{s}.part{k}:tiny3" in listed, listed

    first = proj.doit("run", "calibrate.part2:tiny3")  # every export and calibration first (fast)
    assert first.ran() == sorted(
        ["download:tiny3"] + [f"{s}.part{k}:tiny3" for k in range(3) for s in ("export", "calibrate")]
    ), first.log()
    p = proj.popen("run", "build:tiny3", start_new_session=True)
    seen, t0 = [], time.time()
    for line in p.stdout:
        seen.append(line)
        if line.startswith("quantize.part2:tiny3") or time.time() - t0 > 600:
            break
        if line.startswith("compile.part1:tiny3"):
            # killed once quantize.part2 runs: its temp folder exists (parts 0 and 1 are committed
            # by now, so a quantize temp folder is part 2's), measured rather than timed, as a
            # loaded machine may take any time to start it
            tmp = proj.cache / ".tmp"
            while not any(tmp.glob("quantize-*")) and p.poll() is None and time.time() - t0 < 600:
                time.sleep(0.05)
            running = any(tmp.glob("quantize-*"))
            os.killpg(p.pid, signal.SIGKILL)
            assert running, "quantize.part2 never started"
            break
    p.wait()
    assert p.returncode == -signal.SIGKILL, "".join(seen)
    assert not any(ln.startswith("quantize.part2:tiny3") for ln in seen), "".join(seen)
    assert len(proj.entries("quantize")) == 2 and len(proj.entries("compile")) == 2
    run = proj.doit("run", "build:tiny3")
    assert run.ran() == ["bundle:tiny3", "compile.part2:tiny3", "quantize.part2:tiny3", "verify:tiny3"], run.log()

    # one entry per part and kind; the bundle joins the parts' binaries into one layout
    assert [len(proj.entries(k)) for k in ("export", "calibrate", "quantize", "compile", "bundle")] == [3, 3, 3, 3, 1]
    b = proj.root / "build" / "tiny3"
    desc = json.loads((b / "export.json").read_text())
    assert [p["layers"] for p in desc["parts"]] == [[0, 1], [1, 3], [3, 4]]  # the embedding weighs in part 0
    assert all(p["weight_bytes"] > 0 for p in desc["parts"])  # each from its own part's export
    assert desc["parts"][0]["prefill"]["inputs"][0]["name"] == "input_ids"
    assert desc["parts"][1]["prefill"]["inputs"][0]["name"] == "hidden_states_0"
    assert desc["parts"][2]["prefill"]["outputs"][0]["name"] == "logits"
    for k in range(3):
        assert (b / "shared" / f"part{k}" / "prefill_ctx.onnx").is_file() and (
            b / f"part{k}" / "decode_ctx.onnx"
        ).is_file()
    # calibrate.part1 read part 0's hidden states; the last part writes none
    st = _stages(proj, "tiny3")
    cal = [proj.cache / "calibrate" / st[f"calibrate.part{k}"]["key"] / "out" for k in range(3)]
    assert len(list((cal[0] / "hidden").glob("*.npy"))) > 0 and not (cal[2] / "hidden").exists()
    m1 = json.loads((cal[1].parent / "manifest.json").read_text())
    assert m1["inputs"]["previous"]["key"] == st["calibrate.part0"]["key"]
    for k in range(3):  # each part's weight-shared binary is < 0.7 x its two single-graph binaries
        (row,) = json.loads((proj.cache / "compile" / st[f"compile.part{k}"]["key"] / "manifest.json").read_text())[
            "info"
        ]["parts"]
        assert row["part"] == k and row["shared_ratio"] < 0.7, row
    r = json.loads((b / "verify.json").read_text())
    # the HTP simulator, through onnxruntime-genai's pipeline of the 3 parts' 6 graphs
    assert r["metrics"]["token_agreement"] >= 0.9 and r["metrics"]["logits_cosine_mean"] >= 0.999, r["metrics"]
    assert r["metrics"]["genai_runner_agreement"] == 1.0, r["metrics"]
    assert r["all_on_htp"] is True
    # every binary read back: per part the weight-shared one (both graphs, weights shared) and
    # the two per-graph ones, all for x-elite's SoC (60)
    assert sorted(r["binaries"]) == sorted(
        f"{d}part{k}/{g}_ctx_qnn.bin"
        for k in range(3)
        for d, g in (("", "prefill"), ("", "decode"), ("shared/", "prefill"))
    ), r["binaries"]
    for k in range(3):
        shared = r["binaries"][f"shared/part{k}/prefill_ctx_qnn.bin"]
        assert shared["soc_model"] == 60 and len(shared["graphs"]) == 2, shared
        assert all(g["shared_weight_bytes"] > 0 for g in shared["graphs"].values()), shared

    # a part's lost quantize entry: only that stage runs again, and its output is the same
    # bytes, so compile.part1 and everything after it are up to date (early cut-off)
    q1 = proj.cache / "quantize" / st["quantize.part1"]["key"]
    subprocess.run(["chmod", "-R", "u+w", str(q1)], check=True)
    subprocess.run(["rm", "-rf", str(q1)], check=True)
    said = proj.doit("run", "explain:tiny3").tasks["explain:tiny3"]["out"]
    assert (
        f"changed: nothing in its key: the entry quantize/{st['quantize.part1']['key'][:12]} the last build" in said
    ), said
    again = proj.doit("run", "build:tiny3")
    assert again.ran() == ["quantize.part1:tiny3"], again.log()

    # the same model for another target shares every part stage before compile
    proj.recipe("tiny3-8gen3", "extends: tiny3\ncompile: {targets: [8gen3]}\n")
    other = proj.doit("run", "build:tiny3-8gen3")
    assert other.ran() == sorted(
        [f"compile.part{k}:tiny3-8gen3" for k in range(3)] + ["bundle:tiny3-8gen3", "verify:tiny3-8gen3"]
    ), other.log()
    # both targets in one recipe: every stage is one of the two builds' (cache hits), and each
    # target's folder holds what onnxruntime-genai loads from one folder, the tokenizer included
    proj.recipe("tiny3-both", "extends: tiny3\ncompile: {targets: [x-elite, 8gen3]}\n")
    both = proj.doit("run", "build:tiny3-both")
    assert both.ran() == [], both.log()
    from transformers import AutoTokenizer

    want = AutoTokenizer.from_pretrained(str(proj.root / ".fixtures" / "tiny-qwen2"))("a cat sat")["input_ids"]
    for t in ("x-elite", "8gen3"):
        folder = proj.root / "build" / "tiny3-both" / t
        assert (folder / "genai_config.json").is_file() and (folder / "shared" / "part2" / "prefill_ctx.onnx").is_file()
        assert AutoTokenizer.from_pretrained(str(folder))("a cat sat")["input_ids"] == want
    assert not (proj.root / "build" / "tiny3-both" / "genai_config.json").exists()
    # verified on cpu-qdq (the 7B's way), a weight-shared part compiles only the binary it ships
    proj.recipe("tiny3-cpu", "extends: tiny3\nverify: {backend: cpu-qdq}\n")
    cpu = proj.doit("run", "build:tiny3-cpu")
    assert cpu.ran() == sorted(
        [f"compile.part{k}:tiny3-cpu" for k in range(3)] + ["bundle:tiny3-cpu", "verify:tiny3-cpu"]
    ), cpu.log()
    st = _stages(proj, "tiny3-cpu")
    for k in range(3):
        out = proj.cache / "compile" / st[f"compile.part{k}"]["key"] / "out"
        assert sorted(p.name for p in out.iterdir()) == ["shared"], list(out.iterdir())
        assert sorted(p.name for p in (out / "shared" / f"part{k}").glob("*.onnx")) == [
            "decode_ctx.onnx",
            "prefill_ctx.onnx",
        ]
    cb = proj.root / "build" / "tiny3-cpu"
    assert not any((cb / f"part{k}").exists() for k in range(3)) and (cb / "genai_config.json").is_file()
    rc = json.loads((cb / "verify.json").read_text())
    assert rc["backend"] == "cpu-qdq" and rc["all_on_htp"] is True, rc
    assert sorted(rc["binaries"]) == [f"shared/part{k}/prefill_ctx_qnn.bin" for k in range(3)], rc["binaries"]
    assert rc["metrics"]["token_agreement"] >= 0.9, rc["metrics"]
    # the catalog row: 3 parts, verified; an LLM's export runs no optimum ("not used", was "unknown")
    proj.doit("run", "catalog")
    row = {r["name"]: r for r in json.loads((proj.root / "catalog" / "catalog.json").read_text())["recipes"]}["tiny3"]
    assert row["parts"] == 3 and row["state"] == "verified" and row["tools"]["optimum"] == "not used", row
    # the model's parameters as transformers counts them (tied head once), not the graphs'
    # initializers (rotary and mask tables, the tied head's copy: 2.57 M, a tester)
    from transformers import AutoModelForCausalLM

    assert (
        row["parameters"]
        == AutoModelForCausalLM.from_pretrained(str(proj.root / ".fixtures" / "tiny-qwen2")).num_parameters()
    )
    # explain shows each part's stage with its key
    out = proj.doit("run", "explain:tiny3").tasks["explain:tiny3"]["out"]
    assert all(f"quantize.part{k}" in out for k in range(3)), out


def test_calibration_parts_after_the_first_take_its_schedule_not_the_file(parts_project, tmp_path, tiny_bert):
    """The calibration file is rewritten after calibrate.part0 committed its entry, while the
    build goes on to part 1 (through the doit CLI). Part 1 takes part 0's schedule with its
    hidden states, not the file: its key and entry are those of a build of the old content in
    an empty cache (before, part 1 hashed the new file under an old chain), the two parts' schedules
    are one, and the next build, with the new content, rebuilds the chain from part 0."""
    proj = parts_project
    calib = proj.root / "tasks" / "llm" / "data" / "tiny-corpus.txt"
    old = calib.read_text()
    new = "\n".join(reversed(old.splitlines())) + "\n"  # other windows, the same length
    p = proj.popen("run", "calibrate.part0:tiny3", "quantize.part0:tiny3", "calibrate.part1:tiny3")
    deadline = time.time() + 300
    while not proj.entries("calibrate"):
        assert p.poll() is None and time.time() < deadline, p.communicate()[0]
        time.sleep(0.01)
    calib.write_text(new)  # quantize.part0 and export.part1 are still to run
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0, out
    keys = proj.entries("calibrate")
    assert len(keys) == 2, out
    cal = {k: proj.cache / "calibrate" / k for k in keys}
    m = {k: json.loads((d / "manifest.json").read_text()) for k, d in cal.items()}
    (k0,) = [k for k in keys if "previous" not in m[k]["inputs"]]
    (k1,) = [k for k in keys if k != k0]
    assert set(m[k1]["inputs"]) == {"model", "previous"} and not m[k1].get("files"), m[k1]
    assert m[k1]["inputs"]["previous"]["key"] == k0 and set(m[k0]["inputs"]) == {"model", "source"}
    assert (cal[k1] / "out" / "schedule.json").read_bytes() == (cal[k0] / "out" / "schedule.json").read_bytes()

    calib.write_text(old)  # the old content in an empty cache: the same keys, the same bytes
    fresh = parts_project_at(tmp_path / "fresh", tiny_bert)
    fresh.doit("run", "calibrate.part1:tiny3")
    assert fresh.entries("calibrate") == keys
    for k in keys:
        got = json.loads((fresh.cache / "calibrate" / k / "manifest.json").read_text())["output_digest"]
        assert got == m[k]["output_digest"]

    calib.write_text(new)  # the new content: the whole chain again, under new keys
    run = proj.doit("run", "calibrate.part1:tiny3")
    assert run.ran() == ["calibrate.part0:tiny3", "calibrate.part1:tiny3"], run.log()
    assert len(set(proj.entries("calibrate")) - set(keys)) == 2


def test_calibration_disk_estimate_and_a_calibration_that_cannot_fit(parts_project):
    """The calibrate stage's disk estimate (``tasks.llm.calibration_feeds.disk_bytes``, from the schedule
    alone) against what the 3 parts' entries hold, built through the doit CLI: never below,
    and within 2x (the estimate also counts the removed scratch KV caches). Then a recipe
    asking for 100,000 calibration prompts with the cache on a 64 MiB tmpfs: calibrate.part0
    stops before work with one DiskFull line naming the key and the figures, and leaves no
    calibrate entry (it used to fill the disk minutes in)."""
    from tasks.llm.calibration_feeds import disk_bytes

    proj = parts_project
    proj.doit("run", "calibrate.part2:tiny3")
    st = _stages(proj, "tiny3")
    desc = json.loads((proj.cache / "export" / st["export.part0"]["key"] / "out" / "export.json").read_text())
    for k in range(3):
        out = proj.cache / "calibrate" / st[f"calibrate.part{k}"]["key"] / "out"
        sched = json.loads((out / "schedule.json").read_text())["calls"]
        held = sum(f.stat().st_size for f in out.rglob("*") if f.is_file() and f.name != "schedule.json")
        est = disk_bytes(desc, sched, k)
        assert held <= est <= 2 * held, (k, held, est)

    needs(os.geteuid() == 0, "root (to mount a small tmpfs for the cache)")
    huge = proj.root / "huge"
    huge.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(huge)], capture_output=True)
    needs(mounted.returncode == 0, f"a tmpfs mount ({mounted.stderr.decode().strip()})")
    try:
        proj.recipe("many", "extends: tiny3\nquantize: {calibration: {samples: 100000}}\n")
        env = dict(proj.env, NPUBUILD_CACHE=str(huge))
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "doit",
                "-f",
                str(REPO / "dodo.py"),
                "-d",
                str(proj.root),
                "run",
                "calibrate.part0:many",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert p.returncode != 0, p.stdout + p.stderr
        line = [ln for ln in (p.stdout + p.stderr).splitlines() if "DiskFull" in ln]
        assert (
            len(line) == 1
            and "quantize.calibration.samples" in line[0]
            and "of part 0 writes about" in line[0]
            and f"({huge})" in line[0]
        ), p.stdout + p.stderr
        assert "Traceback" not in p.stdout + p.stderr
        assert not (huge / "calibrate").is_dir() or not any((huge / "calibrate").iterdir())
        # before work, not a failed write minutes in: the estimate's line (check_disk), not the
        # "no space left on its device" of an ENOSPC while writing feeds
        assert "no space left" not in line[0], line[0]
    finally:
        subprocess.run(["umount", str(huge)], check=False)


def test_calibration_text_too_short_names_the_key_the_file_and_the_counts(parts_project):
    """A calibration file too short for one prompt and its decode steps: one line naming
    quantize.calibration.file, the file and the tokens expected and found (a tester saw only
    "text too short or context too small for calibration")."""
    proj = parts_project
    (proj.root / "data" / "short.txt").write_text("hello\n")
    proj.recipe("short", "extends: tiny3\nquantize: {calibration: {file: data/short.txt}}\n")
    run = proj.doit("run", "calibrate.part0:short", check=False)
    log = run.log()
    assert run.code != 0 and "Traceback" not in log, log
    (line,) = [ln for ln in log.splitlines() if "quantize.calibration.file" in ln]
    assert "data/short.txt" in line and "expected at least" in line and "tokens of text" in line, line
    assert proj.entries("calibrate") == []

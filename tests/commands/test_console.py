"""What a user sees while it builds (issue 13), through the real doit CLI on the tiny BERT: one
console line per stage, every stage's full output in its cache entry's log.txt, known harmless
third-party lines kept off the console, and tqdm progress bars on a terminal only."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import textwrap

from conftest import REPO, TINY_RECIPE
from console_cli import doit

from tasks.store import stagelog
from tasks.store.entries import Cache

STAGES = ["download", "export", "prepatch", "quantize", "compile", "verify"]
KIND = {"prepatch": "patch"}
LINE = re.compile(r"^(?P<task>\S+)\s+(?P<key>[0-9a-f]{12})\s+(?P<status>built|cache hit|FAILED)\s+(?P<s>\d+\.\d)s$")

# third-party lines the tiny htp build really prints, and the stage whose log holds them
THIRD_PARTY = {
    "export": [
        "`torch_dtype` is deprecated! Use `dtype` instead!",
        "TracerWarning: ",
        "Weight deduplication check in the ONNX export requires accelerate",
    ],
    "quantize": ["pre-processing before quantization", "Axis 1 is out-of-range for weight"],
    "compile": ["# LIBNATIVE: No alternate configuration present in libnative_tls.conf"],
    "verify": ["# LIBNATIVE: No alternate configuration present in libnative_tls.conf"],
}


def stage_lines(out: str) -> dict[str, re.Match]:
    return {m["task"]: m for m in map(LINE.match, out.splitlines()) if m}


def test_one_line_per_stage_full_logs_in_entries(project):
    project.recipe("t8", backend="htp")
    run = doit(project, "run", "build:t8")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stderr == ""  # no warning that is not on the harmless list, no bar (not a terminal)
    lines = run.stdout.splitlines()
    assert len(lines) == 8, run.stdout  # six stages + build + verify's figures
    got = stage_lines(run.stdout)
    assert list(got) == [f"{s}:t8" for s in STAGES]
    assert {m["status"] for m in got.values()} == {"built"}
    assert re.fullmatch(r"build:t8\s+8 artifacts in .*build/t8", lines[-2])
    figures = r"verify:t8\s+verified: pooled_cosine_mean (0\.9\d+|1\.00000) \(>= 0\.9\); runs on npu"
    assert re.fullmatch(figures, lines[-1]), lines[-1]
    for pattern, _ in stagelog.HARMLESS:
        assert not re.search(pattern, run.stdout), pattern
    cache = Cache(project.cache)
    for stage, m in got.items():
        name = stage.split(":")[0]
        kind = KIND.get(name, name)
        entry = next(p for p in (project.cache / kind).iterdir() if p.name.startswith(m["key"]))
        log = (entry / "log.txt").read_text()
        assert log.startswith(f"{stage}: {kind} {entry.name} (recipe t8), "), log[:200]
        for text in THIRD_PARTY.get(name, []):
            assert text in log, (stage, text, log)
        # the log is no output: not listed, not in the output digest, not linked into build/
        manifest = json.loads((entry / "manifest.json").read_text())
        assert not any("log" in rel for rel in manifest["outputs"])
        assert cache.problems(kind, entry.name, full=True) == []
    assert "TracerWarning" in (next((project.cache / "export").iterdir()) / "log.txt").read_text()
    assert not list((project.root / "build").rglob("log.txt"))
    assert "log.txt" not in json.loads((project.root / "build" / "t8" / "artifacts.json").read_text())

    again = doit(project, "run", "build:t8")
    hits = stage_lines(again.stdout)
    assert again.returncode == 0 and again.stderr == ""
    assert {t: (m["key"], m["status"]) for t, m in hits.items()} == {t: (m["key"], "cache hit") for t, m in got.items()}
    assert again.stdout.splitlines()[-2:] == ["-- build:t8", lines[-1]] and len(again.stdout.splitlines()) == 8

    explain = doit(project, "run", "explain:t8").stdout
    logs = re.findall(r"^    log: (\S+)$", explain, re.M)
    assert len(logs) == 6 and all(os.path.isfile(p) and p.endswith("/log.txt") for p in logs), explain

    # verify below a threshold (the entry is a cache hit: thresholds are not in the key): the
    # line says FAILED, the error names the entry's log
    project.recipe(
        "strict",
        TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="htp").replace(
            "thresholds: {pooled_cosine_mean: 0.9}", "thresholds: {max_abs_error: 1.0e-9}"
        ),
    )
    strict = doit(project, "run", "build:strict")
    assert strict.returncode != 0
    assert [m["status"] for m in stage_lines(strict.stdout).values()] == ["cache hit"] * 5 + ["FAILED"]
    assert f"log: {project.cache}/verify/{got['verify:t8']['key']}" in strict.stdout
    assert "max_abs_error = " in strict.stdout and "not run" not in strict.stdout  # the failure is the recipe's line
    assert "verify:strict  StageFailed: verify:strict failed:" in strict.stdout and "TaskFailed" not in strict.stdout
    # explain says why the cached verify entry does not pass the recipe's bar
    ex = doit(project, "run", "explain:strict").stdout
    assert re.search(r"^verify:strict +verify +[0-9a-f]{16}  failed$", ex, re.M), ex
    assert re.search(r"^    fails: max_abs_error = ", ex, re.M), ex

    # a stage whose run raises (weights that do not load): FAILED, then the error with the
    # path of the kept log, which holds the stage's output and the traceback
    broken = project.root / "models" / "broken"
    broken.mkdir()
    for f in (project.root / "models" / "tiny-bert").iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"\xff" * 1000)
    project.recipe(
        "broken",
        TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="htp").replace(
            "models/tiny-bert", "models/broken"
        ),
    )
    bad = doit(project, "run", "build:broken")
    assert bad.returncode != 0
    assert [m["status"] for m in stage_lines(bad.stdout).values()] == ["built", "FAILED"], bad.stdout
    kept = project.root / ".npubuild" / "logs" / "broken" / "export.failed.txt"
    assert f"log: {kept}" in bad.stdout and "SafetensorError" in bad.stdout
    # the failure is the recipe's one message: its later tasks say nothing (issue 23)
    assert [ln for ln in bad.stdout.splitlines() if "not run:" in ln] == []
    assert any(ln.startswith("export:broken  ") and "Error" in ln for ln in bad.stdout.splitlines()), bad.stdout
    text = kept.read_text()
    assert text.startswith("export:broken: export ") and "Traceback (most recent call last)" in text
    assert "SafetensorError" in text
    assert f"    log: {kept} (last failed or stopped build)" in doit(project, "run", "explain:broken").stdout
    assert not (project.cache / ".tmp").exists() or not any((project.cache / ".tmp").iterdir())


def test_ctrl_c_is_one_line_and_leaves_nothing_built(project):
    """Ctrl-C (SIGINT) while export runs: its line says ``stopped``, stderr holds one line (no
    traceback) naming the log kept so far, the process ends by SIGINT, and no export entry and
    no temp folder are left."""
    import signal

    project.recipe("cc", TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="htp"))
    p = subprocess.Popen(
        [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "-d", str(project.root), "build:cc"],
        env=project.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = p.stdout.readline()  # download's line: export (importing torch: seconds) runs next
    assert first.startswith("download:cc "), first
    import time

    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == -signal.SIGINT, (p.returncode, out, err)
    assert re.match(r"^export:cc\s+[0-9a-f]{12}\s+stopped\s+\d+\.\ds$", out.splitlines()[0]), out
    kept = project.root / ".npubuild" / "logs" / "cc" / "export.failed.txt"
    assert err == (
        "npubuild: interrupted; cache entries are whole or absent (a stage stopped midway left none); "
        f"the stopped stage's log: {kept}\n"
    ), err
    assert "Traceback" not in out + err and kept.is_file()
    assert project.entries("export") == []
    assert not (project.cache / ".tmp").exists() or not any((project.cache / ".tmp").iterdir())


def test_unknown_task_names_the_close_ones(project):
    """doit's "Invalid parameter" error for a mistyped task is followed by the close task
    names: recipes the typed name begins or resembles, groups that resemble the typed one."""
    project.recipe("minilm-a")
    project.recipe("minilm-b")
    project.recipe("other")
    said = {
        arg: (r := doit(project, arg)).stdout + r.stderr
        for arg in ("build:minilm", "explain:minilm-aa", "biuld:other", "publsh", "zzz:qqq")
    }
    assert all('Invalid parameter: "' in text for text in said.values()), said
    assert "Did you mean: build:minilm-a, build:minilm-b?" in said["build:minilm"]
    assert "Did you mean: explain:minilm-a, explain:minilm-b?" in said["explain:minilm-aa"]
    assert "Did you mean: build:other?" in said["biuld:other"]
    assert "Did you mean: publish, push?" in said["publsh"]
    assert "Did you mean" not in said["zzz:qqq"]


def test_a_closed_pipe_ends_quietly(project):
    """``doit list --all | head``: the reader is gone before doit writes; no traceback."""
    project.recipe("bp")
    p = subprocess.Popen(
        [sys.executable, "-m", "doit", "list", "-f", str(REPO / "dodo.py"), "-d", str(project.root), "--all"],
        env=project.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    p.stdout.close()
    err = p.stderr.read()
    p.wait(60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_thread_mode_is_refused_with_a_clear_error(project):
    """``doit -n 2 -P thread``: stages refuse to run in threads (fd capture and the exporters
    need a process each), with a message naming the way that works; nothing is built."""
    project.recipe("th", TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="htp"))
    r = doit(project, "run", "-n", "2", "-P", "thread", "build:th")
    assert r.returncode != 0
    assert "npubuild runs stages in processes: use `doit -n N` without `-P thread`" in r.stdout + r.stderr
    assert "download:th  not run" not in r.stdout and not any((project.cache).glob("*/*/manifest.json"))
    # refused when doit starts, in every spelling, before any task (a no-op passed before: a tester)
    for args in (["-Pthread"], ["--parallel-type", "thread"], ["--parallel-type=thread"]):
        r = doit(project, "run", "-n", "2", *args, "build:th")
        said = r.stderr.strip()
        assert r.returncode == 2 and r.stdout == "" and "\n" not in said, r.stdout + r.stderr
        assert said.startswith(
            "npubuild: -P thread: npubuild runs stages in processes: use `doit -n N` without `-P thread`"
        ), said


def test_interrupt_is_remembered_and_kills_children_at_once():
    """tasks/proc/interrupt.py in a fresh process: a SIGINT that library code swallows (an ``except
    BaseException``, as numpy's C import does) is still seen, and a run_python child another
    thread waits on (verify's HTP children) is killed at once, not waited for."""
    code = textwrap.dedent(f"""
        import os, signal, sys, threading, time
        sys.path.insert(0, {str(REPO)!r})
        from tasks.proc import child, interrupt
        assert interrupt.install() and not interrupt.seen()
        got = {{}}
        def wait_on_child():
            t0 = time.time()
            r = child.run_python("import time; time.sleep(60)")
            got["rc"], got["s"] = r.returncode, time.time() - t0
        t = threading.Thread(target=wait_on_child)
        t.start()
        while not child._RUNNING:
            time.sleep(0.01)
        time.sleep(0.3)
        try:  # a library that swallows the interrupt
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except BaseException as e:
            swallowed = type(e).__name__
        t.join(10)
        print(swallowed, interrupt.seen(), got["rc"], round(got["s"]) < 5, child._RUNNING == set())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["KeyboardInterrupt", "True", "-9", "True", "True"], r.stdout


def test_capture_takes_fds_and_shows_only_what_matters(tmp_path):
    """stagelog.capture in a fresh process: C-level writes to fds 1 and 2, libc's buffered
    stdio, Python warnings and logging all land in the log; on the console (the process's
    stderr) only the stderr lines that are not on the harmless list, with their continuations."""
    code = textwrap.dedent(f"""
        import ctypes, logging, os, sys, warnings
        sys.path.insert(0, {str(REPO)!r})
        from tasks.store import stagelog
        with stagelog.capture({str(tmp_path / "log.txt")!r}, "export:x"):
            print("ours on stdout")
            os.write(1, b"native stdout\\n")
            ctypes.CDLL(None).puts(b"libc buffered stdout")
            os.write(2, b"Weight deduplication check in the ONNX export requires accelerate. Please install\\n")
            os.write(2, b"native stderr: something new\\n  its detail line\\n")
            warnings.warn_explicit("torch.tensor results are registered as constants", UserWarning, "m.py", 196)
            os.write(2, b"/x/m.py:196: TracerWarning: constants in the trace\\n  inverted_mask = torch.tensor(1.0)\\n")
            logging.getLogger("t").warning("logged warning")
        print("after the stage", file=sys.stderr)
        """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout == ""
    assert p.stderr.splitlines() == [
        "[export:x] native stderr: something new",
        "[export:x]   its detail line",
        "[export:x] m.py:196: UserWarning: torch.tensor results are registered as constants",
        "[export:x] logged warning",
        "after the stage",
    ]
    log = (tmp_path / "log.txt").read_text()
    for text in (
        "ours on stdout",
        "native stdout",
        "libc buffered stdout",
        "Weight deduplication check",
        "native stderr: something new",
        "  its detail line",
        "TracerWarning: constants in the trace",
        "  inverted_mask = torch.tensor(1.0)",
        "logged warning",
        "UserWarning: torch.tensor results",
    ):
        assert text in log, text
    assert "after the stage" not in log


def _pty_doit(project, *args, env: dict) -> tuple[str, str, int]:
    """Run doit with stderr on a pseudo-terminal (120 columns) and stdout on a pipe; returns
    (what the terminal got, stdout, exit code)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a fresh pty has 0 columns
    p = subprocess.Popen(
        [sys.executable, "-m", "doit", args[0], "-f", str(REPO / "dodo.py"), "-d", str(project.root), *args[1:]],
        env=env,
        stdout=subprocess.PIPE,
        stderr=slave,
        stdin=subprocess.DEVNULL,
    )
    os.close(slave)
    tty = b""
    while True:
        if select.select([master], [], [], 1.0)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            tty += data
        elif p.poll() is not None:
            break
    os.close(master)
    out = p.stdout.read().decode()
    return tty.decode("utf-8", "replace"), out, p.wait()


def test_progress_bars_on_a_terminal_only(project):
    project.recipe("t8")
    env = {k: v for k, v in project.env.items() if k != "NPUBUILD_PROGRESS"}
    tty, out, code = _pty_doit(project, "run", "build:t8", env=env)
    assert code == 0, out + tty
    assert re.search(r"verify:t8 samples:\s+\d+%\|[^|]*\| [0-3]/3 \[", tty), tty
    assert re.search(r"quantize:t8 model calibration samples:\s+\d+%\|[^|]*\| [0-4]/4 \[", tty), tty
    assert re.search(r"compile:t8 graphs:\s+\d+%\|", tty), tty
    assert [m["status"] for m in stage_lines(out).values()] == ["built"] * 6  # stdout: the same lines
    for pattern, _ in stagelog.HARMLESS:  # the terminal got bars, not the harmless lines
        assert not re.search(pattern, tty), pattern
    # NPUBUILD_PROGRESS=0 turns them off on a terminal too (only verify reruns: fewer samples)
    project.recipe(
        "t8",
        TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
            "samples: 3", "samples: 2"
        ),
    )
    tty, out, code = _pty_doit(project, "run", "build:t8", env=dict(env, NPUBUILD_PROGRESS="0"))
    assert code == 0, out + tty
    assert tty == "" and [m["status"] for m in stage_lines(out).values()] == ["cache hit"] * 5 + ["built"]


def test_doit_build_prints_one_line_per_failing_recipe(project):
    """Issue 23: ``doit build`` with three recipes whose sources are missing printed ~15 lines a
    recipe (doit's header, every later stage "not run"); now one line each and one for ``build``."""
    for name in ("a", "b", "c"):
        project.recipe(
            name,
            TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
                "models/tiny-bert", f"models/missing-{name}"
            ),
        )
    r = doit(project, "run", "build")
    assert r.returncode != 0 and "Traceback" not in r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == ["download:a", "download:b", "download:c", "build"], r.stdout
    assert lines[0].startswith(
        "download:a  SourceError: source path 'models/missing-a': "
        "expected a model folder or an .onnx file, found nothing at "
    )
    assert lines[3] == "build  not run: download:a download:b download:c failed"

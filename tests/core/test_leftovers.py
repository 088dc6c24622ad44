"""Issue 14 faults 8 and 11: what killed, stopped or starved builds leave behind, and the
messages instead of tracebacks (stale temp folders and lock files, lock holders that are
stopped or gone, damaged state databases, a full disk, temp files outside the cache)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import REPO, TINY_RECIPE, can_unshare, needs

from tasks.store import keylock
from tasks.store.entries import Cache
from tasks.store.keylock import LockTimeout

KEY = "k" * 32


def _write(out: Path) -> dict:
    (out / "f.bin").write_bytes(b"x" * 100)
    return {}


# ------------------------------------------------------------ SIGKILL leftovers (fault 8)


def test_sigkilled_build_leaves_nothing_after_the_next_build(project):
    """A real doit build killed with SIGKILL in the middle of a stage (its temp folder and key
    lock exist), then the next build: no temp folder and no lock file remain, and the build
    is complete."""
    project.recipe(
        "t8",
        TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
            "name: mask-range", "name: fold-constants"
        ),
    )
    tmp = project.cache / ".tmp"
    p = project.popen("run", "build:t8", start_new_session=True)
    victim, deadline = None, time.monotonic() + 120
    while victim is None and time.monotonic() < deadline and p.poll() is None:
        live = [d for d in tmp.iterdir()] if tmp.is_dir() else []
        victim = next((d for d in live if d.name.startswith(("export-", "patch-", "quantize-"))), None)
        time.sleep(0.02)
    assert victim is not None, f"no stage temp folder seen: {p.communicate()[0]}"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert victim.exists() and any((project.cache / ".locks").iterdir())  # what the kill left
    run = project.doit("run", "build:t8")
    assert run.tasks["build:t8"]["result"] == "success"
    assert "temp folder(s) of dead builds" in run.log() and victim.name in run.log()
    assert list(tmp.iterdir()) == []
    assert list((project.cache / ".locks").iterdir()) == []  # released locks are removed too


KILL_IN_LINK = """\
import os, signal, sys
sys.path.insert(0, {repo!r})
replace = os.replace


def killing_replace(src, dst, *a, **kw):  # SIGKILL between _stage_link's link and its rename (in build/)
    if os.path.basename(str(src)).startswith(".") and str(src).endswith(".tmp") and "/build/" in str(dst):
        os.kill(os.getpid(), signal.SIGKILL)
    return replace(src, dst, *a, **kw)


os.replace = killing_replace
from tasks.core.links import materialize
from tasks.core.session import Session
materialize(Session(), {recipe!r})
"""


def test_sigkill_while_linking_build_folder_leaves_no_temp_link(project):
    """A SIGKILL inside ``build/<recipe>/``'s linking, after the files' temp links
    (``.<name>.<pid>.tmp``) exist and before the first rename (the campaign's window; found by
    injecting SIGKILL on that rename with strace): the next build removes the temp link."""
    project.recipe("t8")
    project.doit("run", "build:t8")
    out = project.root / "build" / "t8"
    shutil.rmtree(out)
    p = subprocess.Popen(
        [sys.executable, "-c", KILL_IN_LINK.format(repo=str(REPO), recipe="t8")],
        env=project.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=project.root,
    )
    said = p.communicate(timeout=300)[0]
    assert p.returncode == -signal.SIGKILL, said
    # what the kill left: every file's temp link and the new listing (all made before the first rename)
    left = sorted(f.name for f in out.iterdir() if f.name.startswith("."))
    assert len(left) == 9 and all(f.endswith(f".{p.pid}.tmp") for f in left), left  # 8 artifacts + the listing
    run = project.doit("run", "build:t8")
    assert run.tasks["build:t8"]["result"] == "success"
    assert f"removed 9 temp link(s) of dead builds: {', '.join(left)}" in run.log()
    assert [f.name for f in out.iterdir() if f.name.startswith(".")] == []
    listed = json.loads((out / "artifacts.json").read_text())
    assert sorted(f.name for f in out.iterdir()) == sorted([*listed, "artifacts.json", "stages.json"])


def test_build_folder_holds_only_this_builds_artifacts(project):
    """A rebuild that links fewer files (2 targets -> 1: one sub-folder per target before, none
    after) removes what the earlier build linked and this one does not, and only that: a file
    the user put there stays (a tester found a 3-part LLM's part2/ left beside a 2-part rebuild)."""
    project.recipe("t8", targets="[x-elite, 8gen3]")
    project.doit("run", "build:t8")
    out = project.root / "build" / "t8"
    assert (out / "8gen3" / "model_ctx.onnx").is_file()
    (out / "notes.txt").write_text("mine")
    project.recipe("t8")
    project.doit("run", "build:t8")
    listed = json.loads((out / "artifacts.json").read_text())
    assert not any(r.startswith(("8gen3/", "x-elite/")) for r in listed)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted([*listed, "artifacts.json", "stages.json", "notes.txt"]), files
    assert not (out / "8gen3").exists() and not (out / "x-elite").exists()
    # and back (1 -> 2 targets): the one-target stages are all in the new plan, under the same
    # keys, yet the folder's layout changes, so build:t8 is not up to date (a tester found it was)
    project.recipe("t8", targets="[x-elite, 8gen3]")
    run = project.doit("run", "build:t8")
    assert run.tasks["build:t8"]["result"] == "success", run.log()
    listed = json.loads((out / "artifacts.json").read_text())
    assert {r.split("/")[0] for r in listed if "/" in r} == {"8gen3", "x-elite"}, listed
    assert (out / "8gen3" / "model_ctx.onnx").is_file() and not (out / "model_ctx.onnx").exists()
    assert project.doit("run", "build:t8").tasks["build:t8"]["result"] == "up-to-date"


KILL_IN_REMOVAL = """\
import os, signal, sys
sys.path.insert(0, {repo!r})
unlink = os.unlink


def killing_unlink(path, *a, **kw):  # SIGKILL at the first removal of an earlier build's file
    if "/build/" in str(path) and "/8gen3/" in str(path):
        os.kill(os.getpid(), signal.SIGKILL)
    return unlink(path, *a, **kw)


os.unlink = killing_unlink
from tasks.core.links import materialize
from tasks.core.session import Session
materialize(Session(), {recipe!r})
"""


def test_sigkill_while_removing_an_earlier_builds_files_leaves_none_for_good(project):
    """2 targets -> 1, killed at the first removal of the 2-target build's files: the next
    build still removes them all (a tester killed it after artifacts.json named only the new
    files: the old part's binaries stayed, and every later build was up to date)."""
    project.recipe("t8", targets="[x-elite, 8gen3]")
    project.doit("run", "build:t8")
    project.recipe("t8")
    project.doit("run", "verify:t8")  # every stage of the 1-target plan, not build/
    p = subprocess.Popen(
        [sys.executable, "-c", KILL_IN_REMOVAL.format(repo=str(REPO), recipe="t8")],
        env=project.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=project.root,
    )
    said = p.communicate(timeout=300)[0]
    assert p.returncode == -signal.SIGKILL, said
    out = project.root / "build" / "t8"
    assert (out / "8gen3").is_dir()
    run = project.doit("run", "build:t8")
    assert run.tasks["build:t8"]["result"] == "success", run.log()
    listed = json.loads((out / "artifacts.json").read_text())
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted([*listed, "artifacts.json", "stages.json"]), files
    assert not (out / "8gen3").exists()
    # stages.json keeps rows of this plan's stages only (the 2-target plan's per-target stages
    # stayed, and gc kept their entries as the last build's: a tester)
    rows = sorted(json.loads((out / "stages.json").read_text()))
    assert rows == ["compile", "download", "export", "prepatch", "quantize", "verify"], rows


def test_temp_files_of_a_stage_live_in_its_cache_temp_folder(tmp_path):
    """What a stage makes with ``tempfile`` (the fold-constants patch's ``fold-constants-*``,
    QNN probes) lands in its cache temp folder, removed with it, not in the system temp dir."""
    seen = {}

    def build(out: Path) -> dict:
        with tempfile.TemporaryDirectory(prefix="fold-constants-") as t:
            seen["dir"] = Path(t)
        seen["env"] = subprocess.run(
            [sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"], capture_output=True, text=True
        ).stdout.strip()
        return _write(out)

    before = tempfile.gettempdir()
    Cache(tmp_path / "c").get_or_build("patch", KEY, {}, build)
    assert seen["dir"].parent.parent.parent == tmp_path / "c" / ".tmp"
    assert seen["dir"].parent.name == "work" and seen["dir"].parent.parent.name.startswith(f"patch-{KEY}-")
    assert Path(seen["env"]).parent == seen["dir"].parent.parent  # child processes too
    assert tempfile.gettempdir() == before and list((tmp_path / "c" / ".tmp").iterdir()) == []
    assert not (tmp_path / "c" / "patch" / KEY / "work").exists()  # not committed into the entry


# ------------------------------------------------------------ lock holders (fault 11)

HOLDER = """\
import os, subprocess, sys, time
sys.path.insert(0, {repo!r})
from tasks.store.entries import Cache
lock = Cache({root!r})._lock("export", {key!r})
lock.acquire()
if {leave_child}:  # a program it started kept the lock's descriptor; the pid the lock file names exits
    fd = lock._lock._context.lock_file_fd
    os.set_inheritable(fd, True)
    subprocess.Popen(["sleep", "60"], pass_fds=[fd])
    print("held", flush=True)
    os._exit(0)
print("held", flush=True)
time.sleep({hold})
lock.release()
print("released", flush=True)
"""


def _holder(root: Path, hold: float, leave_child: bool = False) -> subprocess.Popen:
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLDER.format(repo=str(REPO), root=str(root), key=KEY, hold=hold, leave_child=leave_child),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert p.stdout.readline().strip() == "held"
    return p


def test_stopped_lock_holder_is_named_and_given_up_on(tmp_path, monkeypatch, capsys):
    holder = _holder(tmp_path / "c", hold=60)
    try:
        os.kill(holder.pid, signal.SIGSTOP)
        monkeypatch.setenv("NPUBUILD_LOCK_TIMEOUT", "1.5")
        t0 = time.monotonic()
        with pytest.raises(LockTimeout) as e:
            Cache(tmp_path / "c").get_or_build("export", KEY, {}, _write)
        waited = time.monotonic() - t0
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    host = socket.gethostname()
    assert 1.5 <= waited < 10
    err = capsys.readouterr().err
    assert (
        f"npubuild: waiting for the lock of export/{KEY}" in err
        and f"held by pid {holder.pid} on host {host} since {time.strftime('%Y-%m-%d')}" in err
        and "(stopped)" in err
    )
    assert f"gave up waiting for the lock of export/{KEY} after 1.5 s: held by pid {holder.pid}" in str(e.value)
    assert f"which is stopped; resume it (kill -CONT {holder.pid})" in str(e.value)
    assert not (tmp_path / "c" / "export" / KEY).exists()


def test_gone_lock_holder_whose_child_keeps_the_lock_is_given_up_on(tmp_path, monkeypatch):
    holder = _holder(tmp_path / "c", hold=60, leave_child=True)
    holder.wait()  # the recorded pid has exited; its child holds the lock
    try:
        monkeypatch.setenv("NPUBUILD_LOCK_TIMEOUT", "1")
        with pytest.raises(LockTimeout, match=f"held by pid {holder.pid} on host .* \\(gone\\), which is gone"):
            Cache(tmp_path / "c").get_or_build("export", KEY, {}, _write)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)


def test_running_lock_holder_is_waited_for(tmp_path, monkeypatch, capsys):
    holder = _holder(tmp_path / "c", hold=2)
    monkeypatch.setenv("NPUBUILD_LOCK_TIMEOUT", "0.5")  # applies to stopped/gone holders only
    entry, built = Cache(tmp_path / "c").get_or_build("export", KEY, {}, _write)
    assert built and holder.wait(timeout=30) == 0
    assert f"held by pid {holder.pid}" in capsys.readouterr().err
    assert list((tmp_path / "c" / ".locks").iterdir()) == []


def test_lock_timeout_must_be_a_number(monkeypatch):
    monkeypatch.setenv("NPUBUILD_LOCK_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="NPUBUILD_LOCK_TIMEOUT: expected a number of seconds >= 0, found 'soon'"):
        keylock.lock_timeout()


# ------------------------------------------------------------ damaged state databases (fault 11)


def test_damaged_state_databases_are_rebuilt_with_one_warning(project):
    """Two kinds of damage: a file that is not SQLite at all (the stat cache) and a database
    whose header is valid but whose pages are cut off (doit's)."""
    project.recipe("t8")
    project.doit("run", "build:t8")
    home = project.root / ".npubuild"
    for name, damage in (("statcache.sqlite", "garbage"), ("doit.sqlite3", "truncated")):
        f = home / name
        for extra in ("-wal", "-shm"):
            Path(str(f) + extra).unlink(missing_ok=True)
        if damage == "garbage":
            f.write_bytes(b"this is not a database\n" * 200)
        else:  # a valid header, the rest cut off
            f.write_bytes(f.read_bytes()[:200])
    (project.root / "build" / "t8" / "stages.json").write_text("{not json")
    p = project.popen("run", "build:t8")  # the console reporter: what a user sees
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 0 and "Traceback" not in out, out
    for name in ("statcache.sqlite", "doit.sqlite3"):
        assert sum(f"{home / name}: " in line and "could not be read" in line for line in out.splitlines()) == 1, out
        assert list(home.glob(f"{name}.damaged-*"))
    assert "stages.json: unreadable" in out
    explain = project.doit("run", "explain:t8")
    assert "Traceback" not in explain.output and json.loads((project.root / "build" / "t8" / "stages.json").read_text())


# ------------------------------------------------------------ a full disk (fault 11)


@pytest.mark.parametrize("size, stage", [("3m", "download"), ("8m", "export")])
def test_full_disk_is_one_line_naming_the_folder(project, size, stage):
    """The cache on a real small file system (a tmpfs of ``size`` mounted in a user namespace:
    no root needed), so the stage gets a real ENOSPC from the kernel: in download (copying
    the 4.8 MB model) or, with room for that, deep in export (optimum / onnx writing)."""
    needs(can_unshare(), "unshare -Urm with tmpfs mounts (user namespaces)")
    project.recipe("t8")
    project.cache.mkdir()
    doit = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "-d", str(project.root), "run", "build:t8"]
    p = subprocess.run(
        [
            "unshare",
            "-Urm",
            "sh",
            "-c",
            f'mount -t tmpfs -o size={size} tmpfs "$0" && exec "$@"',
            str(project.cache),
            *doit,
        ],
        env=project.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "Traceback" not in out, out
    (line,) = [ln for ln in out.splitlines() if "DiskFull: " in ln]
    assert line.startswith(
        f"{stage}:t8  DiskFull: {project.cache / '.tmp'}: no space left on its device while building {stage}/"
    ), line
    assert "MB free there (it had written" in line and "set NPUBUILD_CACHE to a larger disk" in line


PARENT_OF_A_SLEEPER = """
import sys
sys.path.insert(0, {repo!r})
from tasks.proc.child import run_python
run_python("import os, time, pathlib; pathlib.Path({pidfile!r}).write_text(str(os.getpid())); time.sleep(300)")
"""


def test_a_child_dies_with_its_parent(tmp_path):
    """A stage process killed alone (SIGKILL to its pid, not its group) takes its child with it:
    a tester's plain ``kill -9`` of doit left a quantize child writing on beside the next build."""
    needs(sys.platform.startswith("linux"), "Linux (PR_SET_PDEATHSIG)")
    from tasks.proc.processes import process_state

    pidfile = tmp_path / "child.pid"
    p = subprocess.Popen([sys.executable, "-c", PARENT_OF_A_SLEEPER.format(repo=str(REPO), pidfile=str(pidfile))])
    t0 = time.time()
    while not pidfile.exists() and time.time() - t0 < 60:
        time.sleep(0.1)
    child = int(pidfile.read_text())
    assert process_state(child) == "running"
    p.kill()
    p.wait()
    t0 = time.time()
    while process_state(child) != "gone" and time.time() - t0 < 10:
        time.sleep(0.1)
    assert process_state(child) == "gone"


def test_two_processes_removing_one_dead_temp_folder_both_succeed(tmp_path):
    """Every doit process removes the temp folders of dead builds when it starts; two that
    start together remove the same folder, and the one that finds a file already gone must
    go on (a tester's concurrent resumes failed a stage with FileNotFoundError). Two real
    processes, 20,000 files, three rounds."""
    code = (
        "import sys, time; from pathlib import Path; from tasks.store.fileops import rmtree\n"
        "t = float(sys.argv[2])\nwhile time.time() < t: pass\nrmtree(Path(sys.argv[1]))\n"
    )
    for round_ in range(3):
        d = tmp_path / f"dead{round_}" / "out"
        d.mkdir(parents=True)
        for i in range(20000):
            (d / f"f{i}").touch()
        start = f"{time.time() + 1.5}"
        ps = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(d.parent), start], cwd=REPO, stderr=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        errs = [p.communicate(timeout=120)[1] for p in ps]
        assert [p.returncode for p in ps] == [0, 0], errs
        assert not d.parent.exists()


def test_a_child_that_meets_a_full_disk_says_one_line_and_the_parent_raises_enospc(tmp_path):
    """A stage's child process (the LLM quantize and compile, the encoder compile) that meets a
    full disk: no traceback on its stderr (the console shows a stage's stderr; a tester saw 18
    lines before the DiskFull line), and the parent gets an OSError with ENOSPC, which the
    cache reports as its one DiskFull line. The kernel's ENOSPC, from /dev/full; any other
    error keeps its traceback."""
    needs(os.path.exists("/dev/full"), "/dev/full (writes to it fail with ENOSPC)")
    import errno

    from tasks.proc.child import run_function

    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 100_000)
    with pytest.raises(OSError) as e:
        run_function(shutil.copyfile, str(src), "/dev/full")
    assert e.value.errno == errno.ENOSPC and "No space left on device" in str(e.value), e.value
    r = run_function(shutil.copyfile, str(tmp_path / "missing"), str(tmp_path / "x"))
    assert r.returncode == 1 and "Traceback" in r.stderr and "FileNotFoundError" in r.stderr

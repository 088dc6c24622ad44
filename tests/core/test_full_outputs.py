"""The folders npubuild writes outside the cache (build/, dist/, catalog/) on a real small file
system (a tmpfs: the kernel's ENOSPC): a full disk is one DiskFull line naming the folder, and
the previous contents stay whole, with no temp file left. Through the real doit CLI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest
from conftest import TINY_RECIPE, needs
from console_cli import doit as console

TRACEBACK = "Traceback (most recent call last)"


@pytest.fixture
def small_fs():
    """mount(path, size): a tmpfs of ``size`` at ``path`` (needs root), unmounted afterwards."""
    mounted = []

    def mount(path, size: str):
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
        needs(done.returncode == 0, f"a tmpfs mount, root ({done.stderr.decode().strip()})")
        mounted.append(path)

    yield mount
    for p in reversed(mounted):
        subprocess.run(["umount", "-l", str(p)], capture_output=True)


def _fill(folder, leave: int = 0):
    """Fill the file system of ``folder`` up to ``leave`` bytes free; returns the filler."""
    filler = folder / "filler"
    free = shutil.disk_usage(folder).free - leave
    with open(filler, "wb") as f:
        try:
            f.write(b"\0" * max(free, 0))
            f.flush()
        except OSError:
            pass
    return filler


def _contents(folder) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line(run, prefix: str) -> str:
    out = run.stdout + run.stderr
    assert run.returncode != 0 and TRACEBACK not in out, out
    lines = [ln for ln in out.splitlines() if "DiskFull" in ln]
    assert len(lines) == 1 and lines[0].startswith(prefix), out
    return lines[0]


def test_a_full_build_folder_is_one_line_and_leaves_the_previous_build_whole(project, small_fs):
    build = project.root / "build"
    small_fs(build, "6m")  # another file system than the cache: files are copied, not linked
    project.recipe("r")
    project.doit("run", "build:r")
    before = _contents(build / "r")
    assert "model_ctx.onnx" in before and "artifacts.json" in before

    # a changed verify: build:r links its artifacts anew, and the disk has room for stages.json only
    project.recipe(
        "r",
        TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
            "samples: 3", "samples: 2"
        ),
    )
    filler = _fill(build, leave=256 << 10)
    line = _one_line(console(project, "run", "build:r"), "build:r  DiskFull: ")
    need = sum((project.cache / src).stat().st_size for src in json.loads(before["artifacts.json"]).values())
    assert line.startswith(
        f"build:r  DiskFull: {build / 'r'}: no space left on its device while writing the "
        f"artifacts of r as copies ({need / 1e6:.1f} MB, 0."
    ), line
    assert line.endswith(
        " MB free); its previous contents are whole; free space or set NPUBUILD_BUILD to a larger disk"
    ), line
    after = _contents(build / "r")
    assert {k: v for k, v in after.items() if k != "stages.json"} == {
        k: v for k, v in before.items() if k != "stages.json"
    }
    assert not [p for p in build.rglob("*.tmp")]

    # the stage's record (build/r/stages.json) on a disk with no room at all
    filler.unlink()
    _fill(build)
    project.recipe(
        "r",
        TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
            "samples: 3", "samples: 1"
        ),
    )
    state = (build / "r" / "stages.json").read_bytes()
    line = _one_line(console(project, "run", "build:r"), "verify:r  DiskFull: ")
    assert line.startswith(
        f"verify:r  DiskFull: {build / 'r'}: no space left on its device while writing stages.json ("
    ), line
    assert (build / "r" / "stages.json").read_bytes() == state and not [p for p in build.rglob("*.tmp")]

    (build / "filler").unlink()
    project.doit("run", "build:r")
    assert _contents(build / "r")["verify.json"] != before["verify.json"]


def test_a_full_catalog_folder_is_one_line_and_leaves_the_previous_catalog_whole(project, small_fs):
    catalog = project.root / "catalog"
    small_fs(catalog, "1m")
    project.recipe("r")
    project.doit("run", "catalog")
    before = _contents(catalog)
    assert sorted(before) == ["README.md", "catalog.json", "index.html"]
    project.recipe("r2")
    _fill(catalog)
    line = _one_line(console(project, "run", "catalog"), "catalog  DiskFull: ")
    assert line.startswith(
        f"catalog  DiskFull: {catalog}: no space left on its device while writing the "
        f"catalog (0.0 MB free); its previous contents are whole"
    ), line
    assert {k: v for k, v in _contents(catalog).items() if k != "filler"} == before


@pytest.mark.parametrize(
    "name, sub", [("NPUBUILD_CACHE", "cache"), ("NPUBUILD_HOME", "home"), ("NPUBUILD_BUILD", "not-yet/build")]
)
def test_a_read_only_file_system_is_named_as_such(project, small_fs, name, sub):
    """A folder npubuild writes on a read-only mount (as root: os.access fails there too): the
    line says read-only file system and where it is mounted, not permissions or owner; a
    folder not made yet is judged by the folder it would be made in."""
    ro = project.root / "ro"
    small_fs(ro, "1m")
    (ro / "cache" / "download").mkdir(parents=True)
    (ro / "home").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
    project.recipe("r")
    env = dict(project.env, **{name: str(ro / sub)})
    run = console(project, "run", "build:r", env=env)
    where = str(ro / sub) if sub != "not-yet/build" else f"{ro} (where it would be made)"
    assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
    assert run.stderr == (
        f"npubuild: {name} {ro / sub}: {where} is on a read-only file system (mounted at {ro}): "
        f"use a folder on a writable file system (set {name})\n"
    )


def test_dist_and_catalog_on_a_read_only_file_system_are_named_as_such(project, small_fs):
    ro = project.root / "ro"
    small_fs(ro, "1m")
    subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
    project.recipe("r")
    env = dict(project.env, NPUBUILD_CATALOG=str(ro / "catalog"))
    run = console(project, "run", "catalog", env=env)
    assert run.returncode != 0 and TRACEBACK not in run.stdout + run.stderr
    assert (
        f"catalog  NPUBUILD_CATALOG {ro / 'catalog'}: {ro} (where it would be made) is on a read-only file "
        f"system (mounted at {ro})" in run.stdout + run.stderr
    )


def test_a_full_dist_folder_is_one_line_and_leaves_the_previous_bundle_whole(project, small_fs):
    dist = project.root / "dist"
    small_fs(dist, "6m")
    project.recipe("r")
    project.doit("run", "build:r", "publish:r")
    before = _contents(dist)
    assert "r/manifest.json" in before and [k for k in before if k.endswith(".tar.gz")]
    project.recipe(
        "r",
        TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
            "samples: 3", "samples: 2"
        ),
    )
    project.doit("run", "build:r")
    _fill(dist)
    line = _one_line(console(project, "run", "publish:r"), "publish:r  DiskFull: ")
    assert line.startswith(
        f"publish:r  DiskFull: {dist}: no space left on its device while writing the bundle "
        f"of r (0.0 MB free); its previous contents are whole"
    ), line
    assert {k: v for k, v in _contents(dist).items() if k != "filler"} == before
    assert sorted(p.name for p in dist.iterdir()) == sorted({k.split("/")[0] for k in before} | {"filler"})


def test_a_home_that_fills_during_a_run_is_one_line_and_keeps_doits_database(project, small_fs):
    """The home's disk fills once the stages ran (after the start's free-space check): doit's
    database, written when the run ends, is one DiskFull line and stays as it was."""
    home = project.root / ".npubuild"
    small_fs(home, "8m")
    project.recipe("r")
    project.doit("run", "download:r")
    db = (home / "doit.sqlite3").read_bytes()
    p = project.popen("run", "build:r")
    out = []
    for ln in p.stdout:
        out.append(ln)
        if ln.startswith("verify:r"):  # the last stage's line: doit writes its database after build:r
            os.kill(p.pid, signal.SIGSTOP)  # paused while the disk fills
            _fill(home)
            os.kill(p.pid, signal.SIGCONT)
            break
    out.append(p.communicate(timeout=300)[0])
    out = "".join(out)
    assert TRACEBACK not in out, out
    assert [ln for ln in out.splitlines() if "doit.sqlite3" in ln] == [
        f"npubuild: DiskFull: {home}: no space left on its device while writing doit's database doit.sqlite3 "
        f"(0.0 MB free); its previous contents are whole; free space or set NPUBUILD_HOME to a larger disk"
    ], out
    assert (home / "doit.sqlite3").read_bytes() == db


def test_a_full_dest_is_one_line_and_leaves_the_previous_copy_whole(project, small_fs, tmp_path):
    """``publish --dest`` on a disk that fills: one DiskFull line naming the folder and the
    option, the previous copy whole and nothing under the bundle's final name (before: a
    19-line traceback and a partial bundle of empty files under ``<dest>/<recipe>/``)."""
    shelf = tmp_path / "shelf"
    small_fs(shelf, "6m")
    project.recipe("r")
    project.doit("run", "build:r", "publish:r", "--dest", str(shelf))
    before = _contents(shelf)
    assert "r/manifest.json" in before and [k for k in before if k.endswith(".tar.gz")]
    project.recipe(
        "r",
        TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
            "samples: 3", "samples: 2"
        ),
    )
    project.doit("run", "build:r")
    _fill(shelf, leave=64 << 10)
    line = _one_line(console(project, "run", "publish:r", "--dest", str(shelf)), "publish:r  DiskFull: ")
    assert line.startswith(
        f"publish:r  DiskFull: {shelf}: no space left on its device while writing the bundle of r ("
    ), line
    assert line.endswith(
        " MB free); its previous contents are whole; free space or give --dest a folder on a larger disk"
    ), line
    assert {k: v for k, v in _contents(shelf).items() if k != "filler"} == before
    assert sorted(p.name for p in shelf.iterdir()) == sorted({k.split("/")[0] for k in before} | {"filler"})

    # a first copy that does not fit leaves no folder under the bundle's name
    (shelf / "filler").unlink()
    shutil.rmtree(shelf / "r")
    for p in shelf.glob("r-*"):
        p.unlink()
    _fill(shelf, leave=64 << 10)
    _one_line(console(project, "run", "publish:r", "--dest", str(shelf)), "publish:r  DiskFull: ")
    assert sorted(p.name for p in shelf.iterdir()) == ["filler"]

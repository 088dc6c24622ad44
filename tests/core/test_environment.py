"""Issue 23, kind 5: the environment and the disks, one line each and nothing lost: relative
``NPUBUILD_*`` folders, a remote scheme fsspec does not know, a full ``NPUBUILD_HOME``, a stat
cache that cannot be written (never moved aside as damaged)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO, can_unshare, needs

TRACEBACK = "Traceback (most recent call last)"


@pytest.mark.parametrize(
    "name, value, want",
    [
        ("NPUBUILD_CACHE", "rel/cache", "npubuild: NPUBUILD_CACHE='rel/cache': expected an absolute path"),
        ("NPUBUILD_BUILD", "build2", "npubuild: NPUBUILD_BUILD='build2': expected an absolute path"),
        ("NPUBUILD_HOME", "home", "npubuild: NPUBUILD_HOME='home': expected an absolute path"),
        ("NPUBUILD_RECIPES", "r", "npubuild: NPUBUILD_RECIPES='r': expected an absolute path"),
        ("NPUBUILD_ROOT", ".", "npubuild: NPUBUILD_ROOT='.': expected an absolute path"),
        ("NPUBUILD_ALLOW_PATHS", "data", "npubuild: NPUBUILD_ALLOW_PATHS entry 'data' is not an absolute path"),
        (
            "NPUBUILD_REMOTE",
            "foo://x",
            "npubuild: NPUBUILD_REMOTE=foo://x: cannot open it with fsspec (ValueError: Protocol not known: foo",
        ),
        (
            "NPUBUILD_REMOTE",
            "relpath2",
            "npubuild: NPUBUILD_REMOTE='relpath2': expected an absolute path or "
            "file:///absolute/path (doit changes into the dodo.py folder), found the relative "
            "path 'relpath2'",
        ),
        (
            "NPUBUILD_REMOTE",
            "file://relative/path",
            "npubuild: NPUBUILD_REMOTE='file://relative/path': expected an "
            "absolute path or file:///absolute/path (doit changes into the dodo.py "
            "folder), found the relative path 'relative/path'",
        ),
    ],
)
def test_an_unusable_setting_is_one_line_before_anything_runs(project, name, value, want):
    project.recipe("r")
    env = dict(project.env, **{name: value})
    p = subprocess.run(
        [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "-d", str(project.root), "run", "build:r"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 2 and TRACEBACK not in out, out
    assert out.splitlines() == [out.splitlines()[0]] and out.startswith(want), out
    assert not project.cache.exists() and not (project.root / "build").exists()
    assert sorted(p.name for p in project.root.iterdir()) == ["data", "models", "recipes"]


def test_a_full_home_is_one_line_and_its_databases_stay(project, tmp_path):
    """NPUBUILD_HOME on a real full file system (a tmpfs in a user namespace holding a copy of
    a valid home, then filled): one line, exit 2, and the databases are neither moved aside as
    damaged nor changed."""
    needs(can_unshare(), "unshare -Urm with tmpfs mounts (user namespaces)")
    project.recipe("r")
    project.doit("run", "download:r")
    home = project.root / ".npubuild"
    saved = tmp_path / "saved"
    shutil.copytree(home, saved)
    doit = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "-d", str(project.root), "run", "build:r"]
    script = (
        f'mount -t tmpfs -o size=1m tmpfs "$0" && cp -a {saved}/. "$0"/ && '
        f'(dd if=/dev/zero of="$0/fill" bs=4k 2>/dev/null; true) && "$@"; rc=$?; rm "$0/fill"; ls "$0"; exit $rc'
    )
    p = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script, str(home), *doit],
        env=project.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and TRACEBACK not in p.stdout + p.stderr, p.stdout + p.stderr
    assert p.stderr.startswith(f"npubuild: NPUBUILD_HOME {home}: 0.0 MiB free on its disk, expected at least 4 MiB")
    assert len(p.stderr.splitlines()) == 1, p.stderr
    assert "damaged" not in p.stdout and "statcache.sqlite\n" in p.stdout and "doit.sqlite3\n" in p.stdout


def test_a_stat_cache_that_cannot_grow_is_one_line_and_is_not_moved(tmp_path):
    """SQLite's own "database or disk is full" (SQLITE_FULL, from a page limit): the stat cache
    says which file and what to do, and the database stays where it is, valid."""
    from tasks.store import digest

    db = tmp_path / "home" / "statcache.sqlite"
    sc = digest.StatCache(db)
    files = []
    for i in range(400):
        f = tmp_path / f"f{i}.txt"
        f.write_text(f"file {i}\n" * 20)
        files.append(f)
    time.sleep(digest.RACY_NS / 1e9 + 0.1)  # out of the racy window: their digests are kept
    sc.file_digest(files[0])
    pages = sc._conn().execute("PRAGMA page_count").fetchone()[0]
    sc._conn().execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(digest.StoreUnwritable) as e:
        for f in files[1:]:
            sc.file_digest(f)
    assert str(e.value).startswith(
        f"{db}: the stat cache cannot be written (SQLITE_FULL: database or disk is full); free space on that disk"
    )
    assert not list(db.parent.glob("*.damaged-*"))
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*) FROM stat2").fetchone()[0] >= 1


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _as_nobody_ok() -> bool:
    """Root with setpriv, and this interpreter and checkout reachable by ``nobody`` (a checkout
    under a 0700 folder is not)."""
    if not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("setpriv")):
        return False
    return (
        subprocess.run([*NOBODY, sys.executable, "-c", "import doit, tasks"], cwd=REPO, capture_output=True).returncode
        == 0
    )


def test_another_users_cache_and_an_unreadable_source_file_are_one_line(tiny_bert):
    """As ``nobody``: a cache another user made under umask 022, then a source file of mode 0600
    of another owner; each is one line naming the folder or file, its owner and mode."""
    needs(_as_nobody_ok(), "root, setpriv, and this checkout readable by nobody (to be another user)")
    from conftest import Project

    top = Path(tempfile.mkdtemp(prefix="npubuild-owner-", dir="/tmp"))
    try:
        project = Project(top / "proj", tiny_bert)
        project.recipe("r")
        project.doit("run", "download:r")  # as root: cache/ and cache/download/ are root's, 0755
        home = top / "home"
        home.mkdir(mode=0o777)
        home.chmod(0o777)
        for d, _, files in os.walk(top):
            os.chmod(d, os.stat(d).st_mode | 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), os.stat(os.path.join(d, f)).st_mode | 0o644)
        env = dict(project.env, NPUBUILD_HOME=str(home))
        nobody = [*NOBODY, sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "-d", str(project.root)]
        p = subprocess.run([*nobody, "run", "build:r"], env=env, capture_output=True, text=True, timeout=120)
        out = p.stdout + p.stderr
        assert p.returncode == 2 and TRACEBACK not in out, out
        assert out.startswith(
            f"npubuild: NPUBUILD_CACHE {project.cache}: {project.cache} is not writable by this "
            f"user (uid 65534; it belongs to uid 0, mode 0755)"
        ), out

        secret = project.root / "models" / "tiny-bert" / "vocab.txt"
        secret.chmod(0o600)
        env.update(NPUBUILD_CACHE=str(home / "cache"), NPUBUILD_BUILD=str(home / "build"))
        p = subprocess.run([*nobody, "list"], env=env, capture_output=True, text=True, timeout=120)
        out = p.stdout + p.stderr
        assert TRACEBACK not in out, out
        assert (
            "source.path: expected every file of source.path 'models/tiny-bert' to be readable by this user, "
            "found 1 that are not: vocab.txt (uid 0, mode 0600)"
        ) in out, out
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_stat_cache_another_process_holds_is_waited_for_not_refused(tmp_path):
    """SQLITE_BUSY (another build writing) is neither damage nor a full disk: the access waits
    and succeeds, nothing is moved aside (a concurrent build failed on it when BUSY was taken
    for an unwritable store)."""
    import threading
    import time

    from tasks.store import digest

    db = tmp_path / "home" / "statcache.sqlite"
    digest.StatCache(db).file_digest(Path(__file__))
    f = tmp_path / "x.txt"
    f.write_text("x\n")
    time.sleep(digest.RACY_NS / 1e9 + 0.1)  # out of the racy window: its digest is written, so it waits
    holder = sqlite3.connect(db, timeout=0, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    threading.Thread(target=lambda: (time.sleep(1.0), holder.execute("COMMIT")), daemon=True).start()
    sc = digest.StatCache(db)
    t0 = time.monotonic()
    assert sc.file_digest(f) == digest.hash_file_uncached(f)
    assert time.monotonic() - t0 >= 0.5 and not list(db.parent.glob("*.damaged-*"))


def test_setup_drops_pip_warnings_about_the_machines_locations_and_keeps_the_rest(tmp_path):
    """scripts/setup.sh's pip: a "Location ... is ignored" warning for a location the machine's
    pip configuration names (here a --find-links of pip's own: the same warning) is dropped;
    one inside the project, pip's errors and its exit status are kept. Real pip, offline."""
    text = (REPO / "scripts" / "setup.sh").read_text()
    func = text[text.index("pip() {") : text.index("\n}\n", text.index("pip() {")) + 3]
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(sys.executable)
    script = (
        f"set -euo pipefail\n{func}pip download -q --no-index --find-links file:///nonexistent-x "
        f'--find-links "file://$PWD/nonexistent-ours" -d dl no-such-package-npubuild'
    )
    p = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stdout == "", p
    assert p.stderr.splitlines() == [
        f"WARNING: Location 'file://{tmp_path}/nonexistent-ours' is ignored: it is neither a file nor a directory.",
        "ERROR: Could not find a version that satisfies the requirement no-such-package-npubuild (from versions: none)",
        "ERROR: No matching distribution found for no-such-package-npubuild",
    ], p.stderr

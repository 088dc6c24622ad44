"""Files a stranger's machine holds that are not what npubuild reads, through the doit CLI:
editor and OS side files in recipes/ (Emacs' `.#r.yaml` lock link, macOS' `._r.yaml`), a recipe
name too long for the file names made from it, and a source folder holding a file name that is
not UTF-8. Each is ignored or is one line naming it; nothing is left half-made."""

from __future__ import annotations

import os


def test_hidden_files_in_recipes_are_not_recipes(project):
    project.recipe("r")
    os.symlink("root@host.12345:1700000000", project.root / "recipes" / ".#r.yaml")  # Emacs' lock: dangling
    (project.root / "recipes" / "._r.yaml").write_bytes(b"\x00\x05\x16\x07AppleDouble")
    p = project.popen("list", "--all")
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0 and ".#r" not in out and "._r" not in out and "download:r" in out, out
    assert project.doit("run", "download:r").code == 0


def test_a_recipe_name_too_long_for_its_file_names_is_one_line(project):
    name = "b" * 129
    project.recipe(name)
    run = project.doit("run", f"build:{name}", check=False)
    lines = [ln for ln in run.log().splitlines() if "expected at most 128 characters" in ln]
    assert run.code != 0 and lines and all("found 129" in ln for ln in lines), run.log()
    assert "Traceback" not in run.log() and project.entries("download") == []
    project.recipe("b" * 128)
    assert project.doit("run", f"download:{'b' * 128}").code == 0


def test_a_source_file_name_that_is_not_utf8_is_one_line_naming_it(project):
    project.recipe("r")
    with open(os.fsencode(project.root / "models" / "tiny-bert") + b"/notes\xff.txt", "wb") as f:
        f.write(b"hi")
    run = project.doit("run", "build:r", check=False)
    lines = [ln for ln in run.log().splitlines() if "expected file names in UTF-8" in ln]
    assert run.code != 0 and lines and all("notes\\xff.txt" in ln for ln in lines), run.log()
    assert "UnicodeEncodeError" not in run.log() and project.entries("download") == []


def test_a_cache_or_build_folder_inside_the_source_folder_is_one_line(project):
    """NPUBUILD_CACHE or NPUBUILD_BUILD inside the source folder: the download would copy them
    into themselves (a build that never converged, or InputChanged on every build). One line
    naming the setting, no entry."""
    import subprocess
    import sys

    from conftest import REPO

    project.recipe("r")
    src = project.root / "models" / "tiny-bert"
    for name, sub in (("NPUBUILD_CACHE", "cache"), ("NPUBUILD_BUILD", "out")):
        env = dict(project.env, **{name: str(src / sub)})
        p = subprocess.run(
            [sys.executable, "-m", "doit", "run", "-f", str(REPO / "dodo.py"), "-d", str(project.root), "build:r"],
            env=env,
            capture_output=True,
            text=True,
        )
        said = [ln for ln in (p.stdout + p.stderr).splitlines() if f"found {name} (" in ln]
        assert p.returncode != 0 and said and "inside it" in said[0], p.stdout + p.stderr
        assert not (src / sub / "download").exists()


def test_another_users_unreadable_entry_is_one_line_and_not_moved(project):
    """A shared cache holding another user's entry made under umask 077: the build that cannot
    read it says so in one line and moves nothing to .damaged/ (it was a PermissionError
    traceback and the entry moved aside). The other user is this one without the capabilities
    that let root read anything (setpriv drops CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER)."""
    import stat
    import subprocess
    import sys

    from conftest import REPO

    project.recipe("r")
    project.doit("run", "download:r")
    (entry,) = (project.cache / "download").iterdir()
    os.chown(entry, 12345, 12345)
    os.chmod(entry, stat.S_IRWXU)
    p = subprocess.run(
        [
            "setpriv",
            "--inh-caps=-all",
            "--bounding-set=-dac_override,-dac_read_search,-fowner",
            sys.executable,
            "-m",
            "doit",
            "run",
            "-f",
            str(REPO / "dodo.py"),
            "-d",
            str(project.root),
            "build:r",
        ],
        env=project.env,
        capture_output=True,
        text=True,
    )
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "cannot read this cache entry" in out and "uid 12345" in out, out
    assert "Traceback" not in out and not (project.cache / ".damaged").exists() and entry.is_dir(), out

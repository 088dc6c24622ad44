"""The doit CLI with its default (console) reporter, as a user runs it."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def doit(project, *args, env=None) -> subprocess.CompletedProcess:
    """The doit CLI with its default (console) reporter; stdout and stderr are pipes."""
    return subprocess.run(
        [sys.executable, "-m", "doit", *args[:1], "-f", str(REPO / "dodo.py"), "-d", str(project.root), *args[1:]],
        env=env or project.env,
        capture_output=True,
        text=True,
    )

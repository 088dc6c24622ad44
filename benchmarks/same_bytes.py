"""Benchmark: do two checkouts build the same bytes? (run by hand; prints, asserts nothing).

    .venv/bin/python benchmarks/same_bytes.py --a OLD_CHECKOUT --b NEW_CHECKOUT --work DIR [recipe ...]

For a change that should not change what is built (a redesign, a refactor): each checkout builds
the given recipes (default: every repo recipe that builds offline: the MiniLM ones and the tiny
LLMs) with ``doit build:<recipe>`` in a project of its own under ``--work`` (its own recipes
folder copied from that checkout, empty caches, the same sources: the package's MiniLM and the
tiny trained LLMs of ``.fixtures/``, hard-linked from this checkout's test fixtures), run with
that checkout's code (``PYTHONPATH``) and this venv. Then every file of ``build/<recipe>/`` is
compared byte for byte. Printed per recipe: files, how many are identical, the ones that
differ, and each side's wall time. Resumable: a project's cache survives a stop (``--work`` is
kept), so a second run rebuilds only what is missing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OFFLINE = (
    "minilm-l6-w8a16",
    "minilm-l6-w4a16",
    "tiny-qwen2-w8a16",
    "tiny-qwen2-w4a16",
    "tiny-llama-w8a16",
    "tiny-qwen3-w8a16",
    "tiny-phi3-w8a16",
    "tiny-gemma-w8a16",
)


def fixture_dirs() -> dict[str, Path]:
    """{"tiny-<arch>": trained fixture folder} from this checkout's ``.fixtures`` (the tests make
    them: ``scripts/tiny_llm.py``). The folder ``.fixtures/tiny-<arch>`` wins over
    ``.fixtures/llm/<arch>-<key>``."""
    out = {}
    for d in sorted((REPO / ".fixtures" / "llm").glob("*-*")):
        arch = d.name.split("-")[0]
        if arch != "export" and (d / "model.safetensors").is_file():
            out.setdefault(f"tiny-{arch}", d)
    for d in sorted((REPO / ".fixtures").glob("tiny-*")):
        out[d.name] = d
    return out


def project(root: Path, checkout: Path) -> None:
    """A project at ``root`` with ``checkout``'s recipes and data and the tiny LLM fixtures."""
    if (root / "recipes").is_dir():
        return
    shutil.copytree(checkout / "recipes", root / "recipes")
    (root / "tasks" / "llm").mkdir(parents=True)
    shutil.copytree(checkout / "tasks" / "llm" / "data", root / "tasks" / "llm" / "data")
    for name, src in fixture_dirs().items():
        dest = root / ".fixtures" / name
        dest.mkdir(parents=True)
        for f in src.iterdir():
            os.link(f, dest / f.name)


def build(root: Path, checkout: Path, recipe: str) -> tuple[int, float, str]:
    env = dict(
        os.environ,
        NPUBUILD_ROOT=str(root),
        NPUBUILD_CACHE=str(root / "cache"),
        NPUBUILD_BUILD=str(root / "build"),
        NPUBUILD_HOME=str(root / ".npubuild"),
        NPUBUILD_DIST=str(root / "dist"),
        NPUBUILD_CATALOG=str(root / "catalog"),
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(checkout),
    )
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "doit", "-f", str(checkout / "dodo.py"), "-d", str(root), f"build:{recipe}"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    return p.returncode, time.perf_counter() - t0, (p.stdout + p.stderr)[-1500:]


def files(folder: Path) -> dict[str, bytes]:
    return {f.relative_to(folder).as_posix(): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def json_differences(a, b, path: str = "") -> list[str]:
    """Leaf paths where the JSON values ``a`` and ``b`` differ once stage keys, code digests and
    the two projects' folders are set aside (hex runs of 12+ characters and ``/a/`` vs ``/b/``
    project paths read the same): what a changed code digest alone does not explain."""
    import re

    def norm(v):
        return (
            re.sub(r"[0-9a-f]{12,}", "H", re.sub(r"/(a|b)/(cache|build)/", r"/X/\2/", v)) if isinstance(v, str) else v
        )

    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in json_differences(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in json_differences(x, y, f"{path}[{i}]")]
    return [] if norm(a) == norm(b) else [path or "/"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, required=True, help="the checkout before (e.g. a clone at the old commit)")
    ap.add_argument("--b", type=Path, default=REPO, help="the checkout after (default: this one)")
    ap.add_argument("--work", type=Path, required=True, help="folder for the two projects (kept: resumable)")
    ap.add_argument("recipes", nargs="*", default=list(OFFLINE))
    a = ap.parse_args()
    sides = {"a": a.a.resolve(), "b": a.b.resolve()}
    for s, checkout in sides.items():
        project(a.work / s, checkout)
    for s, checkout in sides.items():
        head = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        print(f"side {s}: {checkout} at {head.stdout.strip() or '?'}")
    print(f"{'recipe':22} {'files':>5} {'same':>5}  {'a s':>6} {'b s':>6}  differ")
    for r in a.recipes:
        times = {}
        for s, checkout in sides.items():
            rc, secs, tail = build(a.work / s, checkout, r)
            times[s] = secs
            if rc:
                print(f"{r:22} side {s} failed (exit {rc}):\n{tail}", flush=True)
                break
        else:
            fa, fb = files(a.work / "a" / "build" / r), files(a.work / "b" / "build" / r)
            names = sorted(set(fa) | set(fb))
            differ = [n for n in names if fa.get(n) != fb.get(n)]
            notes = []
            for n in differ:  # build/'s records name entries by key: what differs beyond the keys?
                if n.endswith(".json") and n in fa and n in fb:
                    import json

                    rest = json_differences(json.loads(fa[n]), json.loads(fb[n]))
                    notes.append(f"{n} ({'keys only' if not rest else 'also ' + ', '.join(rest[:6])})")
                else:
                    notes.append(n)
            print(
                f"{r:22} {len(names):5d} {len(names) - len(differ):5d}  {times['a']:6.0f} {times['b']:6.0f}  "
                f"{'; '.join(notes) or '-'}",
                flush=True,
            )


if __name__ == "__main__":
    main()

"""Benchmarks of the build engine (run by hand; prints figures, asserts nothing).

    .venv/bin/python benchmarks/bench_engine.py [--recipes 50] [--runs 5] [--gb 1]

1. No-op ``doit build`` over N generated recipes (tiny BERT, all built once first): wall
   time (median of --runs) and the bytes the process hashed and read (``NPUBUILD_STATS``);
   paired, in turn, with a no-op ``dvc repro`` of a dvc.yaml of N chains of 6 stages (each a
   ``cp`` of a small file, built once first) in DVC's own venv (made with pip on first use,
   ``--dvc-venv``; skipped with a message when it cannot be installed): medians and the
   per-pair ratio npubuild / DVC (issue 11 asks for at most 0.1). Before timing, our package
   is byte-compiled (pip did that for DVC's) and one untimed no-op stores the plan cache
   (tasks/store/plancache.py); the stats line says ``pydantic=0`` when the no-op used it.
2. Hashing a file of --gb GiB: our hasher (xxh3-128, streamed) cold, our hasher through the
   stat cache, and ``hashlib.md5`` streamed, as medians of --runs, with ratios. "Cold" means
   no stat-cache row; the file is in the OS page cache either way (dropping it needs
   privileges a CI machine may not grant), so the comparison is hashing cost, not disk speed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def dvc_project(root: Path, n: int, dvc: Path) -> list[str]:
    """A DVC project at ``root``: ``n`` chains download -> export -> patch -> quantize ->
    compile -> verify, each stage ``cp <previous output> <its output>`` with deps and outs, all
    built once. Returns the ``dvc repro`` command (a no-op from then on)."""
    import yaml

    root.mkdir(parents=True)
    subprocess.run([str(dvc), "init", "--no-scm", "-q"], cwd=root, check=True)
    subprocess.run([str(dvc), "config", "core.analytics", "false"], cwd=root, check=True)
    (root / "src").mkdir()
    stages = {}
    kinds = ("download", "export", "patch", "quantize", "compile", "verify")
    for i in range(n):
        (root / "src" / f"m{i}.txt").write_text(f"model {i}\n" * 100)
        prev = f"src/m{i}.txt"
        for k in kinds:
            out = f"out/{k}-{i}.txt"
            stages[f"{k}-{i}"] = {"cmd": f"mkdir -p out && cp {prev} {out}", "deps": [prev], "outs": [out]}
            prev = out
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    t0 = time.time()
    subprocess.run([str(dvc), "repro", "-q"], cwd=root, check=True, capture_output=True)
    print(f"dvc: first repro of {n} x 6 stages: {time.time() - t0:.1f} s")
    return [str(dvc), "repro"]


def _dvc(venv: Path) -> Path | None:
    """``dvc`` from ``venv``, made with ``pip install dvc`` when missing; None (with a
    message) when that fails."""
    exe = venv / "bin" / "dvc"
    if not exe.exists():
        print(f"making DVC's venv in {venv} (pip install dvc) ...", flush=True)
        r = subprocess.run(
            f"python3 -m venv {venv} && {venv}/bin/pip install -q dvc", shell=True, capture_output=True, text=True
        )
        if r.returncode or not exe.exists():
            print(f"skipping the DVC comparison: could not install dvc ({(r.stderr or r.stdout)[-300:]})")
            return None
    return exe


def _timed(cmd: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return time.perf_counter() - t0, p


def noop_build(n: int, runs: int, dvc_venv: Path | None = None) -> None:
    from conftest import TINY_RECIPE, Project, make_tiny_bert

    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_bert(Path(tmp) / "tiny-bert")
        proj = Project(Path(tmp) / "proj", model)
        for i in range(n):
            proj.recipe(
                f"gen-{i:03d}",
                TINY_RECIPE.format(precision="w8a16" if i % 2 else "w4a16", targets="[x-elite]", backend="cpu-qdq"),
            )
        t0 = time.time()
        first = proj.doit("run", "build")
        print(
            f"first build of {n} recipes: {time.time() - t0:.1f} s, {len(first.ran())} stage tasks ran, "
            f"{sum(len(proj.entries(k)) for k in ('download', 'export', 'patch', 'quantize', 'compile', 'verify'))}"
            " cache entries"
        )
        env = dict(proj.env, NPUBUILD_STATS="1")
        # DVC's venv was byte-compiled by pip; our package is an editable install, and with
        # PYTHONDONTWRITEBYTECODE set (as on our CI machines) Python would compile it from source
        # on every run: byte-compile it once, as pip does for an installed package
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "tasks")], check=True, capture_output=True)
        # one untimed no-op: the first build's recipe load was too close to the recipes' writing
        # for the plan cache (tasks/store/plancache.py RACY_NS); this one stores the plan
        warm = subprocess.run(
            [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "-d", str(proj.root), "build"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert warm.returncode == 0, warm.stdout + warm.stderr
        dvc = _dvc(dvc_venv) if dvc_venv else None
        dvc_cmd = dvc_project(Path(tmp) / "dvcproj", n, dvc) if dvc else None
        times, dvc_times, stats = [], [], ""
        for _ in range(runs):  # in turn: npubuild, DVC, npubuild, DVC, ...
            secs, p = _timed(
                [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "-d", str(proj.root), "build"], env=env
            )
            times.append(secs)
            assert p.returncode == 0, p.stdout + p.stderr
            executed = [ln for ln in p.stdout.splitlines() if ln.startswith(".  ") or re.search(r"\sbuilt\s", ln)]
            assert not executed, executed
            stats = re.findall(r"npubuild-stats .*", p.stderr)[-1]
            if dvc_cmd:
                secs, p = _timed(dvc_cmd, cwd=Path(tmp) / "dvcproj")
                said = p.stdout + p.stderr
                assert p.returncode == 0 and ("is cached" in said or "up to date" in said), said[-2000:]
                dvc_times.append(secs)
        print(
            f"no-op `doit build` over {n} recipes ({n * 7} tasks): median {statistics.median(times):.2f} s "
            f"(min {min(times):.2f}, max {max(times):.2f}, {runs} runs); last run: {stats}"
        )
        if dvc_times:
            ratios = [a / b for a, b in zip(times, dvc_times)]
            print(
                f"no-op `dvc repro` over {n} x 6 stages:           median {statistics.median(dvc_times):.2f} s "
                f"(min {min(dvc_times):.2f}, max {max(dvc_times):.2f}); npubuild / DVC per pair: median "
                f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
            )


def hashing(gb: float, runs: int) -> None:
    from tasks.store.digest import StatCache, hash_file_uncached

    from tasks.store.paths import state_dir

    state_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=state_dir()) as tmp:  # on disk, not in a tmpfs
        f = Path(tmp) / "weights.bin"
        size = int(gb * (1 << 30))
        with open(f, "wb") as out:
            block = os.urandom(1 << 24)
            for _ in range(size // len(block)):
                out.write(block)

        def timed(fn):
            ts = []
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts)

        def md5():
            with open(f, "rb") as fh:
                hashlib.file_digest(fh, "md5")

        sc_dir = Path(tmp) / "sc"

        def cold():  # a fresh stat cache each time: the file is read and hashed
            StatCache(sc_dir / f"{time.perf_counter_ns()}.sqlite").file_digest(f)

        warm_cache = StatCache(sc_dir / "warm.sqlite")
        warm_cache.file_digest(f)
        t_xxh, t_md5 = timed(lambda: hash_file_uncached(f)), timed(md5)
        t_cold, t_warm = timed(cold), timed(lambda: warm_cache.file_digest(f))
        gbs = size / 1e9
        print(f"hashing a {size / (1 << 30):.2f} GiB file, median of {runs}:")
        print(f"  xxh3-128 streamed      {t_xxh:7.3f} s  {gbs / t_xxh:6.2f} GB/s")
        print(
            f"  md5 streamed           {t_md5:7.3f} s  {gbs / t_md5:6.2f} GB/s   (xxh3 is {t_md5 / t_xxh:.1f}x faster)"
        )
        print(f"  ours, cold stat cache  {t_cold:7.3f} s  {gbs / t_cold:6.2f} GB/s")
        print(
            f"  ours, stat-cache hit   {t_warm * 1e3:7.3f} ms ({t_cold / t_warm:,.0f}x faster than cold; no bytes read)"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", type=int, default=50)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument(
        "--dvc-venv",
        default=str(REPO / ".npubuild" / "bench-dvc-venv"),
        help="DVC's own venv (made with pip when missing); '' skips the DVC comparison",
    )
    ap.add_argument("--skip-hashing", action="store_true")
    a = ap.parse_args()
    if not a.skip_hashing:
        hashing(a.gb, a.runs)
    noop_build(a.recipes, a.runs, Path(a.dvc_venv) if a.dvc_venv else None)

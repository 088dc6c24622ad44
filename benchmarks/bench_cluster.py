"""Cluster build vs one local process (run by hand; prints figures, asserts nothing).

    .venv/bin/python benchmarks/bench_cluster.py [--recipes 4] [--workers 2]
    .venv/bin/python benchmarks/bench_cluster.py --llm 4 [--workers 2]

``--llm P``: instead, one LLM recipe, the tiny trained Qwen2 (``scripts/tiny_llm.py qwen2``)
in P parts, each part's export / calibrate / quantize / compile a stage of its own (issue 22);
the cold cluster run then prints its timeline: per worker, each stage it built with its start
and end (seconds from the first start, from the remote manifests' build times).

N tiny-BERT recipes (the tests' model) that share download, export and prepatch and differ in
precision and calibration sample count (and, past 10, verify sample count), so each has its
own quantize, compile and verify (up to 10; then its own verify): 3 + 3N distinct stages
for N <= 10. Prints the wall time of

1. ``doit build`` of the N recipes in one local process (empty cache, no remote);
2. ``doit cluster`` of the same recipes on a local Dask cluster (``dask scheduler`` and
   --workers ``dask worker`` processes on 127.0.0.1, one thread each, each with its own
   local cache, one shared ``file://`` remote), from an empty remote: what the workers built
   (remote misses) and what was pulled from the remote (hits: by workers for upstream
   entries, by the client for build/);
3. the same ``doit cluster`` again (everything on the remote: 0 submitted);

and checks that the build/ folders are byte-identical. The cluster is started before the
clock runs; a worker's first stage pays its imports (torch, onnxruntime), as on a real one.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def _pulled(cache: Path) -> int:
    return sum(
        1 for m in cache.glob("*/*/manifest.json") if "pulled_from" in (json.loads(m.read_text()).get("remote") or {})
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--llm", type=int, default=0, help="one tiny LLM recipe in this many parts")
    args = ap.parse_args()

    from conftest import TINY_RECIPE, Project, make_tiny_bert
    from dask_servers import DaskCluster

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = make_tiny_bert(tmp / "tiny-bert")
        url = (tmp / "remote").as_uri()
        if args.llm:
            from llm_projects import parts_project_at

            names = [f"tiny{args.llm}"]
            local, client = (parts_project_at(tmp / n, model, names[0], args.llm) for n in ("local", "client"))
        else:
            local, client = Project(tmp / "local", model), Project(tmp / "client", model)
            names = [f"bench-{i:02d}" for i in range(args.recipes)]
        for p in (local, client):
            for i, n in enumerate(names if not args.llm else []):  # 10 distinct quantize stages, then verify samples
                text = TINY_RECIPE.format(precision=("w8a16", "w4a16")[i % 2], targets="[x-elite]", backend="cpu-qdq")
                p.recipe(
                    n,
                    text.replace("samples: 4", f"samples: {2 + (i // 2) % 5}").replace(
                        "samples: 3", f"samples: {3 + (i // 10) % 4}"
                    ),
                )
        client.env["NPUBUILD_REMOTE"] = url

        t0 = time.time()
        alone = local.doit("run", *(f"build:{n}" for n in names))
        t_local = time.time() - t0
        print(f"{len(names)} recipe(s), 1 local process: {t_local:.1f} s, {len(alone.ran())} stages built")

        cluster = DaskCluster(tmp / "dask")
        try:
            workers = [
                cluster.add_worker(
                    chr(65 + i),
                    dict(
                        client.env,
                        NPUBUILD_CACHE=str(tmp / f"w{i}" / "cache"),
                        NPUBUILD_HOME=str(tmp / f"w{i}" / "home"),
                        NPUBUILD_BUILD=str(tmp / f"w{i}" / "build"),
                        NPUBUILD_REMOTE=url,
                        PYTHONPATH=str(REPO),
                    ),
                )
                for i in range(args.workers)
            ]
            before = {w.name: 0 for w in workers}
            for label in ("cold remote", "warm remote"):
                t0 = time.time()
                run = client.doit("run", "cluster", "--scheduler", cluster.address, *names)
                wall = time.time() - t0
                line = re.search(r"\[cluster\] stages .*", run.log())
                counts = dict(re.findall(r"(\w+) (\d+(?:\.\d+)?)", line.group(0))) if line else {}
                built = {w.name: len(w.built()) - before[w.name] for w in workers}
                before = {w.name: len(w.built()) for w in workers}
                worker_pulls = (
                    sum(_pulled(Path(w.env["NPUBUILD_CACHE"])) for w in workers) if label.startswith("cold") else 0
                )
                if label.startswith("cold"):
                    _timeline(url)
                print(
                    f"{len(names)} recipe(s), {args.workers}-worker cluster, {label}: {wall:.1f} s "
                    f"({counts.get('stages')} stages, {counts.get('submitted')} submitted); remote misses "
                    f"(built by workers) {counts.get('built')} {built}; remote hits: {counts.get('on_remote')} "
                    f"found before submitting, {worker_pulls} pulled by workers (upstream), "
                    f"{counts.get('pulled')} pulled by the client"
                )
        finally:
            cluster.stop()
        differ = [
            f"{n}/{rel}" for n in names for rel, data in _files(local, n).items() if _files(client, n).get(rel) != data
        ]
        print(
            f"build/ byte-identical to the local build: {not differ}"
            + (f" (differ: {', '.join(differ)})" if differ else "")
        )


def _timeline(url: str) -> None:
    """Per worker, the stages it built (from the remote manifests: builder, build time, end
    time), with start and end in seconds from the first start."""
    from tasks.contract import kinds
    from remote_contents import remote_fs

    fs, root = remote_fs(url)
    rows = []
    for kind in kinds():
        if fs.exists(f"{root}/{kind}"):
            for d in fs.ls(f"{root}/{kind}", detail=False):
                try:
                    m = json.loads(fs.cat_file(f"{d.rstrip('/')}/manifest.json"))
                except FileNotFoundError:
                    continue
                end, secs = m["timings"]["finished"], m["timings"]["build_seconds"]
                part = m["params"].get("part")
                rows.append(
                    (end - secs, end, m["builder"].get("name", "?"), kind + ("" if part is None else f".part{part}"))
                )
    if not rows:
        return
    t0 = min(r[0] for r in rows)
    print("timeline (s from the first start):")
    for start, end, worker, stage in sorted(rows):
        print(f"  {worker:<3} {start - t0:7.1f} -> {end - t0:7.1f}  {stage}")


def _files(p, recipe: str) -> dict:
    root = p.root / "build" / recipe
    listed = json.loads((root / "artifacts.json").read_text())
    return {rel: (root / rel).read_bytes() for rel in [*listed, "artifacts.json"]}


if __name__ == "__main__":
    main()

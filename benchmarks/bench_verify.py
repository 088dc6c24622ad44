"""Benchmark: the LLM verify stage's work again on the entries a build recorded (run by hand;
prints, asserts nothing).

    .venv/bin/python benchmarks/bench_verify.py PROJECT RECIPE [--memory-gb G]

Reads ``PROJECT/build/RECIPE/stages.json`` for the verify entry the last build made (it may be
a failed stage's record), and calls the stage's function (:func:`tasks.llm.verify.run`) with
this checkout's code on the same inputs and files, in this process: what a changed verify
would take on a big model whose upstream entries were built by an older checkout (the stage's
key includes its code, so ``doit`` would rebuild from calibrate on). Prints the wall seconds,
each side's seconds and sessions made, the metrics and this process's peak RSS (VmHWM)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("project")
    ap.add_argument("recipe")
    ap.add_argument("--memory-gb", type=float, help="NPUBUILD_MEMORY_GB while it runs")
    a = ap.parse_args()
    if a.memory_gb:
        os.environ["NPUBUILD_MEMORY_GB"] = str(a.memory_gb)
    root = Path(a.project)
    st = json.loads((root / "build" / a.recipe / "stages.json").read_text())
    entry = Path(st["verify"]["entry"])
    if not (entry / "manifest.json").is_file():  # a failed verify leaves no entry: its record names the key
        entry = root / "cache" / "verify" / st["verify"]["key"]
    man = json.loads((entry / "manifest.json").read_text())
    inputs = {n: root / "cache" / i["kind"] / i["key"] / "out" for n, i in man["inputs"].items()}
    files = {
        r: str(root / f["path"]) if not Path(f["path"]).is_absolute() else f["path"] for r, f in man["files"].items()
    }
    from tasks.llm import verify
    from tasks.proc.rss import peak_rss

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        info = verify.run(inputs, files, man["params"], Path(out))
        rep = json.loads((Path(out) / "verify.json").read_text())
    print(
        f"verify of {a.recipe} on {entry.name}'s inputs: {time.perf_counter() - t0:.0f} s wall; "
        f"sides {info.get('seconds')} s; sessions {info.get('part_loads')}; resident {info.get('parts_resident')}; "
        f"peak RSS {peak_rss() / 2**30:.2f} GiB"
    )
    print("metrics", json.dumps(rep["metrics"]))
    print(
        "before (the entry's):",
        json.dumps({k: man["info"].get(k) for k in ("part_loads", "parts_resident")}),
        f"{man.get('timings', {}).get('build_seconds', 0):.0f} s",
    )


if __name__ == "__main__":
    main()

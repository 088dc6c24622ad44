"""Benchmark helper (run by hand): per-part check of an LLM bench project (bench_llm.py --keep DIR): part k's QDQ graph vs its fp32 graph on the same input
(part k-1's fp32 output), prefill of one window of random in-vocabulary tokens (ids 3..999,
seed 0): the cosine of the part's outputs, whole and per position, so a quantization loss is
placed in a part without running the whole model twice.

    .venv/bin/python benchmarks/llm_part_check.py /work/bench7b
"""
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np
from tasks.llm.runner import PartGraph, KVCache, block_ids
from tasks.llm.sessions import cpu_session
root = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/bench7b")
st = json.load(open(root / "build" / "bench" / "stages.json"))
E = lambda n: Path(st[n]["entry"]) / "out"
desc = json.loads((E("bundle") / "export.json").read_text())
S, C = desc["seq_len"], desc["context_len"]
rng = np.random.default_rng(0)
ids = rng.integers(3, 1000, S).tolist()
x = block_ids(ids, S, desc["pad_token_id"])
def cos(a, b):
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
for k, p in enumerate(desc["parts"]):
    outs = {}
    for side, entry in (("fp32", E(f"export.part{k}")), ("qdq", E(f"quantize.part{k}"))):
        g = PartGraph(cpu_session(entry / p["prefill"]["path"]))
        c = KVCache(range(*p["layers"]), desc["num_kv_heads"], C, desc["head_dim"])
        outs[side] = g.call(x, c)[g.out][0]
        del g
    f, q = outs["fp32"], outs["qdq"]
    rows = [cos(f[t], q[t]) for t in range(S)]
    # what the part adds to the residual stream (its output minus its input hidden state): a
    # later part's output is mostly its input passed through, so its whole cosine flatters it
    inc = "" if k == 0 or f.shape != x[0].shape else f", added cosine {cos(f - x[0], q - x[0]):.5f}"
    print(f"part {k}: out {f.shape}, cosine whole {cos(f, q):.5f}{inc}, per row mean {np.mean(rows):.5f} min {np.min(rows):.5f}, "
          f"fp32 row std {f.std(axis=-1).mean():.4g} mean|.| {np.abs(f).mean():.4g}", flush=True)
    x = f[None]  # the next part reads the fp32 output

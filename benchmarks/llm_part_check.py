"""Benchmark helper (run by hand): where an LLM bench project's quantization loss is
(``bench_llm.py --keep DIR``), without running the whole model twice.

    .venv/bin/python benchmarks/llm_part_check.py DIR             # every part
    .venv/bin/python benchmarks/llm_part_check.py DIR --trace 0   # every tensor of part 0

Each part's QDQ prefill graph runs against its fp32 graph on the same input (part k-1's fp32
output; part 0: one window of random in-vocabulary token ids 3..999, seed 0). Printed per
part: the cosine of the outputs (whole and per position) and, for a middle part, of what it
adds to the residual stream (output minus input: a later part's output is mostly its input
passed through, so its whole cosine flatters it). ``--trace K``: every float tensor the fp32
and QDQ graphs of part K both compute (onnxruntime's QDQ graph keeps the fp32 graph's node
output names), in graph order, with its op type, cosine and fp32 range: where the loss starts
and how it grows. Memory: two sessions of one part, one at a time (``--trace``: plus every
intermediate tensor of a window).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np

from tasks.llm.kv_cache import KVCache
from tasks.llm.runner import PartGraph, block_ids
from tasks.llm.sessions import cpu_session


def cos(a, b) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(a @ b / na / nb) if na and nb else float("nan")


def run(path: Path, part: dict, desc: dict, x, extra=()) -> dict:
    """Outputs of the prefill graph at ``path`` on ``x`` with an empty KV cache; ``extra``:
    tensor names made graph outputs first (in a copy saved beside the graph, then removed)."""
    if extra:
        import onnx
        from onnx import helper

        m = onnx.load(str(path), load_external_data=False)
        m.graph.output.extend(helper.make_value_info(n, onnx.TypeProto()) for n in extra)
        path = path.parent / f"trace_{path.name}"
        onnx.save(m, str(path))
    try:
        g = PartGraph(cpu_session(path))
        g.output_names = [o.name for o in g.sess.get_outputs()]
        cache = KVCache(range(*part["layers"]), desc["num_kv_heads"], desc["context_len"], desc["head_dim"])
        res = g.call(x, cache)
        res["_out"] = res[g.out]
        return res
    finally:
        if extra:
            path.unlink()


def trace(k: int, E, desc: dict, x) -> None:
    import onnx

    p = desc["parts"][k]
    fp, qp = E(f"export.part{k}") / p["prefill"]["path"], E(f"quantize.part{k}") / p["prefill"]["path"]
    mf, mq = (onnx.load(str(f), load_external_data=False) for f in (fp, qp))
    in_q = {o for n in mq.graph.node for o in n.output}
    outs = {o.name for o in mf.graph.output}
    op = {o: n.op_type for n in mf.graph.node for o in n.output}
    names = [o for n in mf.graph.node if n.op_type != "Constant" for o in n.output if o in in_q and o not in outs]
    del mf, mq
    f, q = run(fp, p, desc, x, names), run(qp, p, desc, x, names)
    print(f"part {k}: {len(names)} tensors both graphs compute")
    for n in names:
        a, b = f.get(n), q.get(n)
        if a is None or b is None or a.dtype.kind != "f" or a.size < 2:
            continue
        print(f"{cos(a, b):.5f} {op[n]:<11} {n[:72]:<72} {tuple(a.shape)} [{a.min():.3g}, {a.max():.3g}]")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", nargs="?", default="/work/bench7b")
    ap.add_argument("--trace", type=int, help="part whose every tensor is compared")
    a = ap.parse_args()
    root = Path(a.root)
    st = json.loads((root / "build" / "bench" / "stages.json").read_text())
    E = lambda n: Path(st[n]["entry"]) / "out"  # noqa: E731
    desc = json.loads((E("bundle") / "export.json").read_text())
    S = desc["seq_len"]
    ids = np.random.default_rng(0).integers(3, 1000, S).tolist()
    x = block_ids(ids, S, desc["pad_token_id"])
    for k, p in enumerate(desc["parts"]):
        if a.trace == k:
            return trace(k, E, desc, x)
        f = run(E(f"export.part{k}") / p["prefill"]["path"], p, desc, x)["_out"][0]
        if a.trace is None:
            q = run(E(f"quantize.part{k}") / p["prefill"]["path"], p, desc, x)["_out"][0]
            rows = [cos(f[t], q[t]) for t in range(S)]
            added = f", added cosine {cos(f - x[0], q - x[0]):.5f}" if k and f.shape == x[0].shape else ""
            print(
                f"part {k}: out {f.shape}, cosine whole {cos(f, q):.5f}{added}, per row mean {np.mean(rows):.5f} "
                f"min {np.min(rows):.5f}, fp32 row std {f.std(axis=-1).mean():.4g} mean|.| {np.abs(f).mean():.4g}",
                flush=True,
            )
        x = f[None]  # the next part reads the fp32 output


if __name__ == "__main__":
    main()

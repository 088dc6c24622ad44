"""Time GPTQ on one Qwen2.5-7B-shaped decoder layer (hidden 3584, intermediate 18944, 28 query
heads / 4 KV heads of 128, LPBQ blocks of 128) with Hessians of random activations, as the
sequential GPTQ of ``tasks/qnn/seqgptq.py`` runs it: per layer input, the Hessian (float32 sums of
X^T X), one inverse-Hessian factor shared by the weights that read it, the LPBQ scale search and
the codes. Prints wall seconds per step and the CPU seconds, the layer total, x 28 layers, and the peak RSS
(on a shared machine the CPU seconds / cores bound what an idle one takes).

    python benchmarks/bench_gptq_layer.py [--rows 2064] [--dtype float32] [--span 4736]

``--span``: ``quantize.gptq_span`` (the Hessian of a wider input in diagonal blocks of at most
this many in-features, each factored on its own: :func:`tasks.qnn.gptq.spans`).
"""

import argparse
import resource
import time

import numpy as np


def main():
    from tasks.qnn import gptq
    from tasks.qnn import weights

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16 * 128 + 16)  # the recipe's 16 windows of 128 + decode rows
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--span", type=int, default=None, help="quantize.gptq_span")
    a = ap.parse_args()
    import torch

    D, I, H, Hkv, d = 3584, 18944, 28, 4, 128
    rng = np.random.default_rng(0)
    groups = {
        "attn_in": (D, [("q", H * d), ("k", Hkv * d), ("v", Hkv * d)]),
        "o_in": (H * d, [("o", D)]),
        "mlp_in": (D, [("gate", I), ("up", I)]),
        "down_in": (I, [("down", D)]),
    }
    times, total, cpu = {}, time.perf_counter(), time.process_time()
    for g, (K, ws) in groups.items():
        t0, c0 = time.perf_counter(), time.process_time()
        # activations with per-channel scales spread over two decades (outlier channels, as real ones)
        scale = torch.as_tensor(np.exp(rng.normal(0, 1, K)).astype(np.float32))
        cuts = gptq.spans(K, a.span)
        Hs = [(k0, torch.zeros((k1 - k0, k1 - k0), dtype=getattr(torch, a.dtype))) for k0, k1 in cuts]
        for r0 in range(0, a.rows, 512):
            x = (torch.randn(min(512, a.rows - r0), K) * scale).to(Hs[0][1].dtype)
            for k0, h in Hs:
                h.addmm_(x[:, k0 : k0 + h.shape[0]].T, x[:, k0 : k0 + h.shape[0]])
        t1 = time.perf_counter()
        U, dead = gptq.block_factors(Hs, dtype=a.dtype, rows=a.rows)  # as tasks.qnn.seqgptq.sequential
        t2 = time.perf_counter()
        s0 = time.perf_counter()
        Ws, Ss = [], []
        for _name, N in ws:  # the weights reading this input: one factor, codes of their concatenation
            W = rng.standard_normal((K, N), dtype=np.float32) * 0.02
            bint, pc = weights.lpbq_scales(W, a.block)
            Ws.append(W)
            Ss.append(np.repeat(bint.astype(np.float32) * pc, a.block, axis=0))
        s1 = time.perf_counter()
        q = gptq.codes(np.concatenate(Ws, 1), U, dead, np.concatenate(Ss, 1))
        tc, ts = time.perf_counter() - s1, s1 - s0
        del Ws, Ss, q
        del U
        times[g] = (t1 - t0, t2 - t1, ts, tc)
        print(
            f"{g:8s} K={K:5d} ({len(cuts)} block{'s' if len(cuts) > 1 else ''}): hessian {t1 - t0:6.1f} s, "
            f"factor {t2 - t1:6.1f} s, scales {ts:6.1f} s, "
            f"codes {tc:6.1f} s (wall); {time.process_time() - c0:6.1f} s CPU",
            flush=True,
        )
    tot, cpu = time.perf_counter() - total, time.process_time() - cpu
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"layer: {tot:.1f} s wall (x 28 layers: {tot * 28 / 60:.1f} min), {cpu:.1f} s CPU (/ 2 cores x 28: "
        f"{cpu / 2 * 28 / 60:.1f} min), peak RSS {rss:.2f} GiB, dtype {a.dtype}, span {a.span}, "
        f"threads {torch.get_num_threads()}"
    )


if __name__ == "__main__":
    main()

"""verify, the encoder implementation (LLMs: ``tasks/llm/verify.py``): run the compiled
model and the fp32 export on the verify set; compare; judge.

Backends: ``htp`` runs the EPContext model through the QNN EP (on x86_64 Linux: the HTP
simulator; on a Snapdragon machine: the NPU); ``cpu-qdq`` runs the QDQ model on the CPU EP
(checks quantization only; fast, for models too big for the simulator). The reference is
the fp32 export on the CPU EP.

Metrics, per sample and aggregated (``verify.json``):

- ``pooled_cosine`` (embedding models, task ``feature-extraction``/``sentence-similarity``):
  cosine between attention-mask-weighted mean-pooled embeddings, as sentence-transformers'
  ``Pooling(mean)`` computes them;
- ``cosine``: cosine of the flattened first output over the real (unpadded) tokens;
- ``max_abs_error``: max |compiled - fp32| over the real tokens;
- ``top1_agreement``: share of real tokens whose argmax over the last axis agrees.

Before measuring, every context binary that ships is read back (``binaries``: its graph's
inputs and outputs against the QDQ graph's, the SoC model against the target's, and its
figures: weight, spill-fill and I/O bytes, QNN SDK build id; ``tasks/qnn/context_binary.py``).

Thresholds are not part of the key (``key_exclude``): they judge a result, they don't change
it. :func:`check` (``tasks/contract/common.py``, shared with the LLM verify) fails the build with
the metric, the threshold and the worst sample.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from tasks import progress
from tasks.qnn import ep as qnn
from tasks.proc import lazy
from tasks.datafiles import read_lines
from tasks.metrics import cosine
from tasks.proc.scrubbing import sample_text
from tasks.contract import common
from tasks.contract.stage import Param, Stage, Threshold
from tasks.contract.params import BACKEND, DATA_FILE, DATA_SAMPLES, THRESHOLDS as THRESHOLDS_PARAM
from tasks.encoder.binaries import read_back
from tasks.encoder.inputs import encoder_feeds

np = lazy.module("numpy")
onnx = lazy.module("onnx")

DATA_MAX_LENGTH = Param(
    "verify", "data.max_length", int, 128, "tokens per sample (padded/truncated)", limits={"ge": 1, "le": 131_072}
)
#: the bars this verify measures (``verify.thresholds``)
THRESHOLDS = (
    Threshold(
        "pooled_cosine_mean",
        "min",
        "pooled_cosine",
        "mean over samples of the mean-pooled embedding cosine",
        "a cosine",
        0.0,
        False,
        1.0,
    ),
    Threshold(
        "pooled_cosine_min",
        "min",
        "pooled_cosine",
        "worst sample's mean-pooled embedding cosine",
        "a cosine",
        0.0,
        False,
        1.0,
    ),
    Threshold("cosine_mean", "min", "cosine", "mean over samples of the output cosine", "a cosine", 0.0, False, 1.0),
    Threshold("cosine_min", "min", "cosine", "worst sample's output cosine", "a cosine", 0.0, False, 1.0),
    Threshold(
        "max_abs_error",
        "max",
        "max_abs_error",
        "largest |compiled - fp32| over all samples",
        "an absolute error",
        0.0,
        True,
        math.inf,
    ),
    Threshold(
        "top1_agreement",
        "min",
        "top1_agreement",
        "share of tokens whose argmax agrees",
        "a share of tokens",
        0.0,
        True,
        1.0,
    ),
)


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[1, L, H] float, [1, L] {0,1} -> [H]: the mask-weighted mean over tokens."""
    m = mask.astype(np.float64)[..., None]
    return (hidden.astype(np.float64) * m).sum(axis=1)[0] / max(m.sum(), 1e-9)


def compare(ref: np.ndarray, got: np.ndarray, mask: np.ndarray) -> dict:
    """Per-sample metrics between fp32 output ``ref`` and ``got`` ([1, L, H]) over the real
    tokens of ``mask`` ([1, L])."""
    keep = mask[0].astype(bool)
    r, g = ref[0][keep], got[0][keep]
    return {
        "pooled_cosine": cosine(mean_pool(ref, mask), mean_pool(got, mask)),
        "cosine": cosine(r, g),
        "max_abs_error": float(np.abs(r - g).max()),
        "top1_agreement": float((r.argmax(-1) == g.argmax(-1)).mean()),
        "tokens": int(keep.sum()),
    }


def _aggregate(samples: list[dict]) -> dict:
    agg = {}
    for name in ("pooled_cosine", "cosine", "top1_agreement"):
        vals = [s[name] for s in samples]
        agg[f"{name}_mean"] = float(np.mean(vals))
        agg[f"{name}_min"] = float(np.min(vals))
    agg["max_abs_error"] = float(max(s["max_abs_error"] for s in samples))
    agg["top1_agreement"] = agg["top1_agreement_mean"]
    return agg


def run(inputs, files, params, out: Path) -> dict:
    """Measure; write ``out/verify.json``. Returns {"backend", "samples"}."""
    return common.write_report(out, _verify_encoder(inputs, files, params))


def workers(samples: int) -> int:
    """Processes that run verify samples on HTP at once: one per core, at most 4 and at most one
    per sample. The HTP simulator runs one inference at a time per process (two sessions in two
    threads took as long as one: 27.9 s vs 27.8 s for MiniLM's 16 samples), two processes on
    two cores took 16.5 s each for half the samples each (measured 2026-11-30)."""
    return max(1, min(os.cpu_count() or 1, 4, samples))


def htp_outputs(ctx: Path, target: str, feeds: list[dict], out_name: str, work: Path):
    """Yield, in sample order, the first output (``out_name``) of the compiled EPContext model
    ``ctx`` for each feed, computed on HTP by :func:`workers` child processes (each its own
    session over every n-th sample, ``tasks/proc/child.py``; their logs go to ours). Each sample's
    output is yielded as soon as its file is written, so a progress bar over it moves. Raises
    RuntimeError with a child's output when one fails."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from tasks.proc.child import run_function

    n = workers(len(feeds))
    for i, f in enumerate(feeds):
        np.savez(work / f"feed{i}.npz", **f)
    args = (str(ctx), target, str(work), len(feeds), n, out_name)
    with ThreadPoolExecutor(n) as pool:
        runs = [pool.submit(run_function, _htp_child, k, *args, forward=True) for k in range(n)]
        for i in range(len(feeds)):
            out = work / f"out{i}.npy"
            while not out.exists():
                r = runs[i % n]
                if r.done() and (r.result().returncode != 0 or not out.exists()):
                    raise RuntimeError(
                        f"verify on HTP: the child process for samples {i % n}::{n} failed "
                        f"(exit {r.result().returncode}):\n{r.result().tail(2000)}"
                    )
                time.sleep(0.02)
            yield np.load(out)


def _htp_child(first: int, ctx: str, target: str, work: str, count: int, step: int, out_name: str) -> None:
    """The child side of :func:`htp_outputs`: one HTP session over samples ``first``,
    ``first + step``, ... < ``count``, reading ``feed<i>.npz`` and writing ``out<i>.npy`` in
    ``work`` (each by rename, so the parent never reads half a file)."""
    work_dir = Path(work)
    s = qnn.htp_session(Path(ctx), target)
    for i in range(first, count, step):
        out = work_dir / f"out{i}.npy"
        np.save(work_dir / f"out{i}.tmp.npy", s.run([out_name], dict(np.load(work_dir / f"feed{i}.npz")))[0])
        os.replace(work_dir / f"out{i}.tmp.npy", out)


def _verify_encoder(inputs, files, params) -> dict:
    # the shipped binaries read back first: graphs, I/O, SoC, figures (tasks/qnn/context_binary.py)
    binaries = read_back(inputs["compiled"], params["target"], qdq=inputs["qdq"])
    d = params["data"]
    texts = read_lines(files["data"], d["samples"])
    ref_model = inputs["reference"] / "model.onnx"
    feeds = encoder_feeds(ref_model, inputs["source"], texts, d["max_length"])
    ref = qnn.cpu_session(ref_model)
    ctx = inputs["compiled"] / "model_ctx.onnx"
    # where the compiled model runs, whichever backend verifies it
    placement = {
        **qnn.placement(inputs["compiled"]),
        "nodes": [n.op_type for n in onnx.load(str(ctx), load_external_data=False).graph.node],
    }
    if params["backend"] != "htp":
        got = qnn.cpu_session(inputs["qdq"] / "model.onnx")
    out_name = ref.get_outputs()[0].name
    samples = []
    with tempfile.TemporaryDirectory(prefix="verify-") as tmp:
        outputs = (
            htp_outputs(ctx, params["target"], feeds, out_name, Path(tmp))
            if params["backend"] == "htp"
            else (got.run([out_name], f)[0] for f in feeds)
        )
        for text, feed, g in progress.bar(zip(texts, feeds, outputs), "samples", total=len(texts), unit="sample"):
            r = ref.run([out_name], feed)[0]
            s = compare(r, g, feed["attention_mask"])
            s["text"] = sample_text(text)
            samples.append(s)
    return {
        "backend": params["backend"],
        "target": params["target"],
        "output": out_name,
        "sequence_length": d["max_length"],
        "metrics": _aggregate(samples),
        "samples": samples,
        "binaries": binaries,
        **placement,
    }


STAGE = Stage(
    kind="verify",
    module=__name__,
    version=3,  # 3: every context binary read back
    tools=("onnxruntime", "onnxruntime-qnn", "qnn-sdk", "transformers", "tokenizers", "numpy"),
    run=run,
    params=(BACKEND, DATA_SAMPLES, DATA_MAX_LENGTH, THRESHOLDS_PARAM),
    files={DATA_FILE: "data"},
    line_samples=("data",),
    wired=("target", "task"),
    key_exclude=("thresholds",),  # bars judge a result, they do not change it
    key_extra=common.target_key_extra,
    check=common.checker(THRESHOLDS),
    thresholds=THRESHOLDS,
    artifacts=common.VERIFY_ARTIFACTS,
)

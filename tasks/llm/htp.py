"""Compile QDQ LLM graphs to QNN HTP context binaries (onnxruntime-qnn plugin EP) and load them.

Compile = create a session on the QDQ model with ``ep.context_enable=1`` (EPContext model
``<name>_ctx.onnx`` + context binary ``<name>_ctx_qnn.bin``, ``ep.context_embed_mode=0``),
``session.disable_cpu_ep_fallback=1`` and provider option ``offload_graph_io_quantization=0``, so a
successful compile proves every node is on HTP. Weight sharing (:func:`compile_shared`) compiles
prefill and decode one after the other with ``enable_htp_weight_sharing=1`` and
``ep.share_ep_contexts=1`` (+ ``ep.stop_share_ep_contexts=1`` on the last), giving one ``.bin``
holding both graphs.

On x86_64 a session on a ``_ctx.onnx`` runs the binary on the HTP *simulator* (slow; its speed says
nothing about a device). Tested with onnxruntime 1.32.0 + onnxruntime-qnn 2.7.0 (QNN SDK 2.51).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tasks.qnn import ep as _qnn
from tasks.qnn.targets import DEFAULT_TARGET


def make_qnn_session(
    path,
    *,
    target: str = DEFAULT_TARGET,
    config: dict | None = None,
    cpu_fallback: bool = False,
    **extra_provider_options,
):
    """``onnxruntime.InferenceSession`` on QNN HTP for ``path`` (QDQ or ``_ctx.onnx``; ``bytes``
    are passed through), built with :func:`tasks.qnn.ep.session_options` for the named ``target``
    (``tasks/qnn/targets.py``; a KeyError lists the known ones).

    ``config``: extra session config entries; ``cpu_fallback=False`` sets
    ``session.disable_cpu_ep_fallback=1`` (session creation fails if any node is not on HTP)."""
    import onnxruntime as ort

    so = _qnn.session_options(target, config, not cpu_fallback, extra_provider_options)
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), sess_options=so)


def qnn_session_factory(**kw):
    """``make_session(path)`` for :class:`tasks.llm.runner.LLMRunner` on QNN HTP."""
    return lambda path: make_qnn_session(path, **kw)


def _compile(qdq, ctx_path: Path, target: str, config=None, **extra):
    cfg = {"ep.context_enable": "1", "ep.context_embed_mode": "0", "ep.context_file_path": str(ctx_path)}
    cfg.update(config or {})
    t = time.perf_counter()
    # the path as given names the compiled graph (see tasks/qnn/ep.py compile_graph): callers run
    # in the graphs' folder (tasks/llm/compile.py) so it is "prefill.onnx" / "decode.onnx"
    src = os.path.relpath(qdq)
    sess = make_qnn_session(src, target=target, config=cfg, **extra)
    del sess
    return time.perf_counter() - t


def _bins(out_dir: Path, before: set) -> list[Path]:
    return sorted(p for p in out_dir.glob("*.bin") if p not in before)


def compile_single(qdq, out_dir, *, name: str | None = None, target: str = DEFAULT_TARGET) -> dict:
    """Compile one QDQ graph to ``out_dir/<name>_ctx.onnx`` + its own context binary.

    ``name`` defaults to the QDQ file's stem. Existing outputs are replaced (ORT refuses to
    overwrite a ``_ctx.onnx``). Returns ``{"ctx": str, "bin": str, "bin_bytes": int,
    "seconds": float}``. Raises onnxruntime's error if a node cannot go to HTP.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = name or Path(qdq).stem
    ctx = out_dir / f"{name}_ctx.onnx"
    for old in [ctx, *out_dir.glob(f"{name}_ctx*.bin")]:
        old.unlink(missing_ok=True)
    before = set(out_dir.glob("*.bin"))
    secs = _compile(qdq, ctx, target)
    bins = _bins(out_dir, before)
    return {
        "ctx": str(ctx),
        "bin": str(bins[0]) if bins else None,
        "bin_bytes": sum(b.stat().st_size for b in bins),
        "seconds": secs,
    }


def compile_shared(
    prefill_qdq, decode_qdq, out_dir, target: str = DEFAULT_TARGET, *, names=("prefill", "decode")
) -> dict:
    """Compile prefill + decode into ONE weight-shared context binary.

    Writes ``out_dir/{names[0]}_ctx.onnx``, ``out_dir/{names[1]}_ctx.onnx`` (both EPContext models
    reference the same ``.bin``) and the ``.bin`` (named after the first graph). Returns
    ``{"ctx": [prefill_ctx, decode_ctx], "bins": [...], "bin_bytes": int, "seconds": float}``.
    Note: on x86_64 loading such a multi-graph binary segfaulted the simulator;
    use per-graph binaries (:func:`compile_single`) to verify there, or see
    :func:`load_shared_probe`.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctxs = [out_dir / f"{n}_ctx.onnx" for n in names]
    for old in [*ctxs, *out_dir.glob("*.bin")]:
        old.unlink(missing_ok=True)
    t = 0.0
    for i, (qdq, ctx) in enumerate(zip((prefill_qdq, decode_qdq), ctxs)):
        cfg = {"ep.share_ep_contexts": "1"}
        if i == 1:
            cfg["ep.stop_share_ep_contexts"] = "1"
        t += _compile(qdq, ctx, target, config=cfg, enable_htp_weight_sharing="1")
    bins = sorted(out_dir.glob("*.bin"))
    return {
        "ctx": [str(c) for c in ctxs],
        "bins": [str(b) for b in bins],
        "bin_bytes": sum(b.stat().st_size for b in bins),
        "seconds": t,
    }


def load_shared_probe(ctx_paths, *, target: str = DEFAULT_TARGET, timeout: float = 300) -> dict:
    """Try, in a child process, to load the given ``_ctx.onnx`` models (sharing one context
    binary) in one process with ``ep.share_ep_contexts=1`` and run nothing. Returns
    ``{"returncode": int, "loaded": bool, "tail": str}``; returncode -11 = the simulator segfault
    seen for multi-graph binaries on x86_64 (onnxruntime-qnn 2.7.0 / QNN 2.51)."""
    from tasks.proc.child import run_function

    r = run_function(_load_shared, [str(p) for p in ctx_paths], target, timeout=timeout)
    return {"returncode": r.returncode, "loaded": r.returncode == 0 and "LOADED" in r.stdout, "tail": r.tail(600)}


def _load_shared(paths: list[str], target: str) -> None:
    """The child side of :func:`load_shared_probe`: open every graph, print ``LOADED``."""
    sessions = []
    for i, p in enumerate(paths):
        cfg = {"ep.share_ep_contexts": "1"}
        if i == len(paths) - 1:
            cfg["ep.stop_share_ep_contexts"] = "1"
        sessions.append(make_qnn_session(p, target=target, config=cfg))
    print("LOADED", flush=True)

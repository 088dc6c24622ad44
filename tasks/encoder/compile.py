"""compile, the encoder implementation (LLMs: ``tasks/llm/compile.py``): QDQ ONNX ->
EPContext model + QNN context binary for one target.

Each graph ``<g>.onnx`` of the input becomes ``<g>_ctx.onnx`` (one EPContext node) and
``<g>_ctx_qnn.bin`` (the context binary, ``ep.context_embed_mode=0``) through the
onnxruntime-qnn plugin EP (``tasks/qnn/ep.py``). With ``disable_cpu_ep_fallback`` (default) a
graph that does not go entirely to HTP fails with the op types left on the CPU. The QNN SDK version recorded in the
EPContext node goes into the manifest.
"""

from __future__ import annotations

from pathlib import Path

from tasks import progress
from tasks.qnn import ep as qnn
from tasks.qnn.graphs import list_graphs, load_model
from tasks.encoder.binaries import read_back
from tasks.contract.common import COMPILE_ARTIFACTS, target_key_extra
from tasks.contract.stage import Param, Stage

DISABLE_CPU_EP_FALLBACK = Param(
    "compile",
    "disable_cpu_ep_fallback",
    bool,
    True,
    "no node may fall back to the CPU EP (false: allowed, and the card says npu+cpu)",
)


def run(inputs, files, params, out: Path) -> dict:
    """Compile every graph of ``inputs["model"]`` for ``params["target"]``, each in a fresh
    process, once, or again while the binary shows the QNN SDK's racy padding variant (same
    bytes in every build: tasks/qnn/ep.py ``compile_in_subprocess`` and ``compile_settled``;
    checked by tests building in several folders).
    Returns {"graphs": {graph: EPContext info}, "compiles": {graph: n}, "qnn_sdk", "nodes":
    {graph: {"htp": count of the QDQ graph's nodes QNN took, "cpu": {op type: count} left on the
    CPU}}, "binaries": {binary: figures}} (the CPU is empty unless ``disable_cpu_ep_fallback`` is
    false). Every context binary is read back (:func:`tasks.qnn.context_binary_checks.check_models`): its
    graph holds the QDQ graph's inputs and outputs and the binary is for the target's SoC.
    Raises qnn.NotOnNPU or onnxruntime's error, context_binary_checks.Mismatch."""
    src = inputs["model"]
    info, compiles, placed = _compile_graphs(src, out, params)
    sdk = sorted({n.get("ep_sdk_version", "?") for nodes in info.values() for n in nodes})
    return {
        "graphs": info,
        "compiles": compiles,
        "qnn_sdk": sdk,
        "nodes": placed,
        "binaries": read_back(out, params["target"], qdq=src),
    }


def _compile_graphs(src: Path, out: Path, params: dict) -> tuple[dict, dict, dict]:
    info, compiles, placed = {}, {}, {}
    for g in progress.bar(list_graphs(src), "graphs", unit="graph"):
        total = len(load_model(g, load_external_data=False).graph.node)  # a clear error for a corrupt input
        rel = g.relative_to(src)
        ctx = out / rel.parent / f"{rel.stem}_ctx.onnx"
        ctx.parent.mkdir(parents=True, exist_ok=True)
        compiles[rel.as_posix()] = qnn.compile_settled(
            lambda d, g=g, name=ctx.name: qnn.compile_in_subprocess(
                g, d / name, params["target"], params["disable_cpu_ep_fallback"]
            ),
            ctx,
        )
        info[rel.as_posix()] = qnn.ep_context_info(ctx)
        cpu = qnn.cpu_nodes(ctx)
        placed[rel.as_posix()] = {"htp": total - sum(cpu.values()), "cpu": cpu}
    return info, compiles, placed


STAGE = Stage(
    kind="compile",
    module=__name__,
    version=8,  # 8: every binary read back
    tools=("onnxruntime", "onnxruntime-qnn", "qnn-sdk", "onnx"),
    run=run,
    params=(DISABLE_CPU_EP_FALLBACK,),
    wired=("target",),
    key_exclude=("target",),  # the name; the key holds what it resolves to (key_extra)
    key_extra=target_key_extra,
    artifacts=COMPILE_ARTIFACTS,
)

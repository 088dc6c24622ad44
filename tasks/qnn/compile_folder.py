"""Compile every graph of a stage folder for one target, every node on HTP, and read the
binaries back: the compile of a family whose graphs stand alone (one graph per model, no
weight sharing; the vision and audio families). Each graph ``<g>.onnx`` becomes ``<g>_ctx.onnx``
(one EPContext node) and ``<g>_ctx_qnn.bin``, compiled in a fresh process (same bytes every
build: :func:`tasks.qnn.ep.compile_in_subprocess`, :func:`tasks.qnn.ep.compile_settled`), with
CPU fallback disabled: a graph that does not go whole to HTP fails with the op types left."""

from __future__ import annotations

from pathlib import Path

from tasks import progress
from tasks.qnn import ep as qnn
from tasks.qnn.graphs import list_graphs, load_model


def compiled_models(qdq: Path) -> dict[str, Path]:
    """{EPContext model path relative to the compile output: the QDQ graph it is compiled from}."""
    out = {}
    for g in list_graphs(qdq):
        rel = g.relative_to(qdq)
        out[(rel.parent / f"{rel.stem}_ctx.onnx").as_posix()] = g
    return out


def read_back(compiled: Path, target: str, qdq: Path) -> dict:
    """Every context binary of compile output ``compiled`` read back and checked against the
    graphs of ``qdq`` and the SoC of ``target`` (:func:`tasks.qnn.context_binary_checks.check_models`):
    {binary: figures}. Raises context_binary_checks.Mismatch, one line per difference."""
    from tasks.qnn import context_binary_checks

    models = compiled_models(qdq)
    found = context_binary_checks.check_models(compiled, sorted(models), target, qdq=models)
    return {rel: b.figures() for rel, b in sorted(found.items())}


def compile_folder(src: Path, out: Path, target: str) -> dict:
    """Compile every graph of ``src`` into ``out`` for ``target``. Returns {"graphs": {graph:
    EPContext info}, "compiles": {graph: tries}, "qnn_sdk": [versions], "nodes": {graph: {"htp":
    count, "cpu": {}}}, "binaries": :func:`read_back`}. Raises qnn.NotOnNPU (op types left on the
    CPU), onnxruntime's error, context_binary_checks.Mismatch."""
    info, compiles, placed = {}, {}, {}
    for g in progress.bar(list_graphs(src), "graphs", unit="graph"):
        total = len(load_model(g, load_external_data=False).graph.node)
        rel = g.relative_to(src)
        ctx = out / rel.parent / f"{rel.stem}_ctx.onnx"
        ctx.parent.mkdir(parents=True, exist_ok=True)
        compiles[rel.as_posix()] = qnn.compile_settled(
            lambda d, g=g, name=ctx.name: qnn.compile_in_subprocess(g, d / name, target, True), ctx
        )
        info[rel.as_posix()] = qnn.ep_context_info(ctx)
        cpu = qnn.cpu_nodes(ctx)
        placed[rel.as_posix()] = {"htp": total - sum(cpu.values()), "cpu": cpu}
    sdk = sorted({n.get("ep_sdk_version", "?") for nodes in info.values() for n in nodes})
    return {
        "graphs": info,
        "compiles": compiles,
        "qnn_sdk": sdk,
        "nodes": placed,
        "binaries": read_back(out, target, src),
    }

"""The context binaries of an encoder's compile output, read back: which EPContext model comes
from which QDQ graph, and the check of every binary against them (the compile stage runs it on
what it wrote, the verify stage again on what it verifies)."""

from __future__ import annotations

from pathlib import Path

from tasks.qnn.graphs import list_graphs


def compiled_models(qdq: Path) -> dict[str, Path]:
    """{EPContext model path relative to the compile output: the QDQ graph it is compiled from}
    for every graph of the QDQ folder ``qdq`` (what the plan makes: ``<g>.onnx`` ->
    ``<g>_ctx.onnx``)."""
    out = {}
    for g in list_graphs(qdq):
        rel = g.relative_to(qdq)
        out[(rel.parent / f"{rel.stem}_ctx.onnx").as_posix()] = g
    return out


def read_back(compiled: Path, target: str, qdq: Path) -> dict:
    """Read back every context binary of an encoder's compile output ``compiled`` and check it
    against the graphs compiled from ``qdq`` and the SoC of ``target``
    (:func:`tasks.qnn.context_binary_checks.check_models`). Returns {binary: figures} (bytes, SDK build
    id, SoC model, per graph weight / shared weight / spill-fill / I/O bytes). Raises
    context_binary_checks.Mismatch, one line per difference."""
    from tasks.qnn import context_binary_checks  # ctypes and the reader: not on a no-op's path

    models = compiled_models(qdq)
    found = context_binary_checks.check_models(compiled, sorted(models), target, qdq=models)
    return {rel: b.figures() for rel, b in sorted(found.items())}

"""onnxruntime CPU sessions whose weights stay in the external data file (memory-mapped).

A part's fp32 weights are several GB for a 7 B model. By default onnxruntime's CPU EP
pre-packs every constant MatMul weight (MLAS), a second, anonymous copy of the weights.
With pre-packing off (``session.disable_prepacking``) and the session made from the model's
*path*, onnxruntime maps the external data file instead of reading it (the file's tensors are
64 KiB-aligned: ``tasks.llm.export``), so the weights are file-backed pages shared by every
session on the file. Measured here on a 1 GiB MatMul weight (onnxruntime 1.32): default session
peak 2.05 GiB (1.0 GiB anonymous); pre-packing off, 1.06 GiB, all of it file-backed; handing
``numpy.memmap`` arrays to ``SessionOptions.add_external_initializers`` copied them (2.07 GiB).
"""

from __future__ import annotations

import os
from pathlib import Path


def cpu_session(model, *, threads: int | None = None):
    """A CPU ``onnxruntime.InferenceSession`` on the ONNX file ``model`` (a path), weights
    mapped from its external data, MatMul pre-packing off. Raises onnxruntime's errors (e.g.
    a missing external data file)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_prepacking", "1")
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(str(model), sess_options=so, providers=["CPUExecutionProvider"])


def cpu_session_for(model_proto, folder, name: str):
    """A :func:`cpu_session` on ``model_proto`` (a graph whose external-data locations are
    relative to ``folder``): the graph (no weights) is written to ``folder/name`` for the
    session to resolve them (onnxruntime only reads external data inside the model's folder),
    and removed once the session exists. Raises OSError when ``folder`` is not writable."""
    path = Path(folder) / name
    path.write_bytes(model_proto.SerializeToString())
    try:
        return cpu_session(path)
    finally:
        os.unlink(path)

"""onnxruntime CPU sessions whose weights stay in the external data file (memory-mapped).

A part's fp32 weights are several GB for a 7 B model. ``InferenceSession(path)`` copies every
external initializer into its own buffers and MLAS then pre-packs MatMul weights (a second
copy). :func:`cpu_session` instead maps each external tensor with ``numpy.memmap`` and hands the
mapped arrays to the session (``SessionOptions.add_external_initializers``: onnxruntime uses
the caller's buffers, which must outlive the session, so the session keeps a reference), with
pre-packing off (``session.disable_prepacking``). The mapped pages are file-backed: the kernel
can drop and re-read them under pressure, and they are shared between sessions on the same
file (a part's prefill and decode graphs share ``weights.data``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _external(init) -> dict | None:
    import onnx

    if init.data_location != onnx.TensorProto.EXTERNAL:
        return None
    return {e.key: e.value for e in init.external_data}


def cpu_session(model, base_dir=None, *, threads: int | None = None):
    """A CPU ``onnxruntime.InferenceSession`` on ``model`` with memory-mapped external weights.

    Args:
        model: path of an ONNX file, or a ``ModelProto`` (then ``base_dir`` is required) whose
            external-data locations are relative to ``base_dir``.
        base_dir: folder the external-data locations are relative to (default: the file's).
        threads: intra-op threads (default: onnxruntime's).

    Raises FileNotFoundError when an external data file is missing, ValueError when a tensor
    lies outside its file.
    """
    import onnx
    import onnxruntime as ort

    if isinstance(model, (str, Path)):
        base_dir = Path(model).parent if base_dir is None else Path(base_dir)
        model = onnx.load(str(model), load_external_data=False)
    else:
        model = type(model).FromString(model.SerializeToString())
        base_dir = Path(base_dir)
    names, values, keep = [], [], []
    for init in model.graph.initializer:
        info = _external(init)
        if info is None:
            continue
        f = base_dir / info["location"]
        dt = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
        off, shape = int(info.get("offset", 0)), tuple(init.dims)
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        if off + n > f.stat().st_size:
            raise ValueError(f"{f}: tensor {init.name!r} [{off}, {off + n}) lies outside the file")
        arr = np.memmap(f, dtype=dt, mode="r", offset=off, shape=shape) if n else np.zeros(shape, dt)
        keep.append(arr)
        names.append(init.name)
        values.append(ort.OrtValue.ortvalue_from_numpy(arr))
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_prepacking", "1")
    if threads:
        so.intra_op_num_threads = threads
    if names:
        so.add_external_initializers(names, values)
    sess = ort.InferenceSession(model.SerializeToString(), sess_options=so,
                                providers=["CPUExecutionProvider"])
    sess._npubuild_buffers = (keep, values)  # the session reads these buffers: keep them alive
    return sess

"""onnxruntime CPU sessions whose weights stay in the external data file (memory-mapped).

A part's fp32 weights are several GB for a 7 B model. By default onnxruntime's CPU EP
pre-packs every constant MatMul weight (MLAS), a second, anonymous copy of the weights.
With pre-packing off (``session.disable_prepacking``) and the session made from the model's
*path*, onnxruntime maps the external data file instead of reading it (the file's tensors are
64 KiB-aligned: ``tasks.llm.export``), so the weights are file-backed pages shared by every
session on the file. Measured here on a 1 GiB MatMul weight (onnxruntime 1.32): default session
peak 2.05 GiB (1.0 GiB anonymous); pre-packing off, 1.06 GiB, all of it file-backed; handing
``numpy.memmap`` arrays to ``SessionOptions.add_external_initializers`` copied them (2.07 GiB).

The same entries (:data:`CPU_CONFIG`) also fix how a QDQ graph's weight MatMuls compute. At
``ORT_ENABLE_EXTENDED`` and above onnxruntime fuses ``DequantizeLinear`` (8- or 4-bit constant
weight) + ``MatMul`` into ``com.microsoft.MatMulNBits`` whose ``accuracy_level`` is the session
entry ``session.qdq_matmulnbits_accuracy_level``, "If not provided, default is 4"
(onnxruntime ``include/onnxruntime/core/session/onnxruntime_session_options_config_keys.h``),
and level 4 computes with the activations quantized to int8 (``MatMulNBits`` schema,
``docs/ContribOperators.md``) - not what a w8a16 QDQ graph says. Measured (onnxruntime 1.32,
a random 2-layer Phi-3's w8a16 QDQ graphs): with default session options the logits are 1e-2
from the unfused graph (``ORT_ENABLE_BASIC``: DequantizeLinear + fp32 MatMul) at the first
prefill and flip a near tie at decode step 3; at level 1 (fp32), or with pre-packing off
(unpacked, ``MatMulNBits`` "dequantize[s] B first and then compute[s] float gemm":
``contrib_ops/cpu/quantization/matmul_nbits.cc`` ``ComputeBUnpacked``), they are the unfused
graph's to 1e-4. onnxruntime-genai's sessions start from onnxruntime's defaults, so genai gets
these entries too, or it computes other numbers than LLMRunner on the same QDQ graphs.
"""

from __future__ import annotations

import os
from pathlib import Path

from tasks.qnn.precisions import QDQ_MATMUL_FP32

#: session config entries of every CPU session an LLM stage runs (:func:`cpu_session`), and of
#: onnxruntime-genai's CPU sessions on the same graphs (:func:`tasks.llm.genai.genai_config`),
#: so that both compute the same numbers (module docstring)
CPU_CONFIG = {"session.disable_prepacking": "1", **QDQ_MATMUL_FP32}


def cpu_session(model, *, threads: int | None = None):
    """A CPU ``onnxruntime.InferenceSession`` on the ONNX file ``model`` (a path), weights
    mapped from its external data, MatMul pre-packing off, fused QDQ weight MatMuls in fp32
    (:data:`CPU_CONFIG`). Raises onnxruntime's errors (e.g. a missing external data file)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    for k, v in CPU_CONFIG.items():
        so.add_session_config_entry(k, v)
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


def cpu_session_on(model_proto, folder, arena: bool = True, priority_order: bool = False):
    """A :func:`cpu_session` on ``model_proto`` (a graph whose external-data locations are
    relative to ``folder``) made from its bytes, the weights read from ``folder`` through
    onnxruntime's ``session.model_external_initializers_file_folder_path``: nothing is written,
    so ``folder`` may be a read-only cache entry, and the weights are memory-mapped as from a
    path (measured, onnxruntime 1.32: a 512 MiB weight, 31 MiB anonymous either way).
    ``arena`` False: onnxruntime's CPU memory arena off (each tensor from malloc, given back
    when freed), for a graph whose arena grows call after call (:class:`tasks.llm.calibration_feeds.RangeTaps`).
    ``priority_order``: onnxruntime's ``ExecutionOrder.PRIORITY_BASED`` instead of its default
    order, for a graph with many outputs read early (the range taps): the same values, bit for
    bit, in another order of its nodes (measured: a 0.86 B Qwen2 part of 11 layers at S=128,
    C=4096, tapped, every output and tap equal; a prefill call's peak 3.09 -> 1.22 GiB, 3.9 ->
    2.6 s; the untapped graph's unchanged, 1.10 vs 1.14 GiB).
    Raises onnxruntime's errors (e.g. a missing external data file)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.enable_cpu_mem_arena = arena
    if priority_order:
        so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    for k, v in {**CPU_CONFIG, "session.model_external_initializers_file_folder_path": str(folder)}.items():
        so.add_session_config_entry(k, v)
    return ort.InferenceSession(model_proto.SerializeToString(), sess_options=so, providers=["CPUExecutionProvider"])

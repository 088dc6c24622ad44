"""onnxruntime quantization settings shared by the encoder and LLM quantize implementations
(importing neither): quant type names, per-channel MatMul weight overrides, int4 packing."""

from __future__ import annotations

from contextlib import contextmanager

WEIGHT_TYPES = ("uint8", "int8", "int4", "uint4", "uint16")


def qtype(name: str):
    """onnxruntime's ``QuantType`` for a name of :data:`WEIGHT_TYPES` (or ``int16``). KeyError
    for any other."""
    from onnxruntime.quantization import QuantType

    return {
        "uint8": QuantType.QUInt8,
        "int8": QuantType.QInt8,
        "int4": QuantType.QInt4,
        "uint4": QuantType.QUInt4,
        "uint16": QuantType.QUInt16,
        "int16": QuantType.QInt16,
    }[name]


def matmul_weight_overrides(
    model, weight_type: str, axis: int = 1, symmetric: bool = True, keep_8bit: tuple = ()
) -> dict:
    """Tensor-quant overrides making every constant MatMul weight ([K, N]) per-channel on ``axis``
    (1 = output channel). ``get_qnn_qdq_config(per_channel=True)`` alone leaves MatMul weights
    per-tensor (its source says "QNN does not support per-channel MatMul"; that applies to
    older QNN, see ``tasks.llm.qdq.quantize_qdq``). MatMul nodes whose name or weight name a
    regular expression of ``keep_8bit`` finds (``re.search``: recipe ``overrides`` patterns)
    get uint8 instead of ``weight_type`` (:func:`matching_weights`)."""
    inits = {i.name: i for i in model.graph.initializer}
    kept = set().union(*(matching_weights(model, k) for k in keep_8bit))
    out = {}
    for n in model.graph.node:
        if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in inits and len(inits[n.input[1]].dims) == 2:
            wt = "uint8" if n.input[1] in kept else weight_type
            out[n.input[1]] = [{"quant_type": qtype(wt), "axis": axis, "symmetric": symmetric}]
    return out


def per_tensor_4bit(overrides: dict) -> dict:
    """``overrides`` (:func:`matmul_weight_overrides`' form) with every 4-bit weight's axis
    dropped: onnxruntime quantizes those weights per-tensor, one numpy pass each, instead of its
    per-channel path, a Python loop over the output channels (cProfile on a Qwen2.5-7B part's
    prefill graph: ~85 s of the quantizer's 102 s; benchmarks/README.md "Where the rest of the
    7B's time went"). Only for weights whose encoding is replaced whole afterwards
    (:func:`tasks.qnn.weights.reencode` with LPBQ blocks or GPTQ): the QDQ model it leaves is then
    the same bytes (tests/llm/test_llm_qnn.py compares both paths). Returns a new dict; 8-bit entries as they are."""
    out = {}
    for name, specs in overrides.items():
        out[name] = [
            {k: v for k, v in s.items() if k != "axis"}
            if getattr(s.get("quant_type"), "name", "") in ("QInt4", "QUInt4")
            else s
            for s in specs
        ]
    return out


def matching_weights(model, pattern: str) -> set[str]:
    """Constant weight names (2-D or more) whose own name or consuming node's name matches
    ``pattern`` (``re.search``): what a recipe ``quantize.overrides`` pattern selects, in
    encoder and LLM graphs alike."""
    import re

    inits = {i.name: i for i in model.graph.initializer}
    out = {n for n, i in inits.items() if len(i.dims) >= 2 and re.search(pattern, n)}
    for node in model.graph.node:
        if re.search(pattern, node.name):
            out |= {i for i in node.input if i in inits and len(inits[i].dims) >= 2}
    return out


def pack_int4(src) -> bytearray:
    """Codes (bytes, one code per byte, values -8..7 or 0..15) packed two per byte, the first
    in the low nibble (the ONNX INT4/UINT4 layout; an odd count leaves the last high nibble 0):
    what onnxruntime's ``quant_utils.pack_bytes_to_4bit`` returns, with numpy instead of a
    Python loop per byte."""
    import numpy as np

    a = np.frombuffer(src, np.uint8) & 0x0F
    if a.size % 2:
        a = np.concatenate([a, np.zeros(1, np.uint8)])
    return bytearray((a[0::2] | (a[1::2] << 4)).tobytes())


@contextmanager
def fast_int4_packing():
    """Within the block, onnxruntime's quantizer packs int4 weights with :func:`pack_int4`.
    Its own ``quant_utils.pack_bytes_to_4bit`` loops over the bytes in Python: 53 s of a 170 s
    quantize of a Qwen2.5-7B-shaped slab's prefill graph (2 layers, int4 LPBQ; cProfile,
    benchmarks/README "Where a 7B part's quantize time goes"). Same bytes (tests/test_int4.py
    compares the two on random codes); onnxruntime's function is restored on exit."""
    from onnxruntime.quantization import base_quantizer, quant_utils

    mods = (quant_utils, base_quantizer)  # base_quantizer imported the name from quant_utils
    slow = [m.pack_bytes_to_4bit for m in mods]
    for m in mods:
        m.pack_bytes_to_4bit = pack_int4
    try:
        yield
    finally:
        for m, f in zip(mods, slow):
            m.pack_bytes_to_4bit = f

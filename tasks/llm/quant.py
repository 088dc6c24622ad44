"""QDQ quantization of the exported LLM graphs for QNN HTP (onnxruntime.quantization, QNN config).

w8a16: uint16 activations, uint8 per-channel weights; w4a16: uint16 activations, int4 per-channel
weights (``QuantType.QInt4``). The RoPE tables (``rope_cos`` / ``rope_sin``, [C, d]) are forced to
uint16 so the rotary angles keep 16-bit precision. onnxruntime upgrades the opset to 21 for 16-bit
/ 4-bit types (it logs a warning).
"""

from __future__ import annotations

from pathlib import Path

from .calib import FeedsDataReader
from .export import ROPE_TABLES

WEIGHT_TYPES = ("uint8", "int8", "int4", "uint4", "uint16")


def _qtype(name: str):
    from onnxruntime.quantization import QuantType

    return {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8, "int4": QuantType.QInt4,
            "uint4": QuantType.QUInt4, "uint16": QuantType.QUInt16,
            "int16": QuantType.QInt16}[name]


def matmul_weight_overrides(model, weight_type: str, axis: int = 1,
                            symmetric: bool = True) -> dict:
    """Tensor-quant overrides making every constant MatMul weight ([K, N]) per-channel on ``axis``
    (1 = output channel). ``get_qnn_qdq_config(per_channel=True)`` alone leaves MatMul weights
    per-tensor (its source says "QNN does not support per-channel MatMul"; that applies to
    older QNN, see :func:`quantize_qdq`)."""
    inits = {i.name: i for i in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in inits \
                and len(inits[n.input[1]].dims) == 2:
            out[n.input[1]] = [{"quant_type": _qtype(weight_type), "axis": axis,
                                "symmetric": symmetric}]
    return out


def quantize_qdq(fp32_path, out_path, feeds: list[dict], *, weight_type: str = "uint8",
                 activation_type: str = "uint16", per_channel: bool = True,
                 matmul_per_channel: bool = True) -> Path:
    """Quantize ``fp32_path`` (one exported graph) to a QDQ model at ``out_path``.

    Args:
        feeds: calibration feed dicts for this graph (from :func:`tasks.llm.calib.collect_calibration_feeds`).
        weight_type: one of :data:`WEIGHT_TYPES` (``"uint8"`` for w8a16, ``"int4"`` for w4a16).
        activation_type: ``"uint16"`` (default) or ``"uint8"``.
        per_channel: ORT's QNN per-channel switch (Conv/ConvTranspose/Gemm weights).
        matmul_per_channel: also make MatMul weights per-channel (axis 1, symmetric) via
            :func:`matmul_weight_overrides`; our graphs have only MatMul weights.
    Calibration: MinMax. Returns ``Path(out_path)``. Raises KeyError on an unknown type name.
    """
    import onnx
    from onnxruntime.quantization import quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from onnxruntime.quantization import QuantType

    model = onnx.load(str(fp32_path))
    names = {i.name for i in model.graph.initializer}
    overrides = {n: [{"quant_type": QuantType.QUInt16}] for n in ROPE_TABLES if n in names}
    if matmul_per_channel:
        overrides.update(matmul_weight_overrides(model, weight_type))
    cfg = get_qnn_qdq_config(
        model, FeedsDataReader(feeds), activation_type=_qtype(activation_type),
        weight_type=_qtype(weight_type), per_channel=per_channel, init_overrides=overrides or None)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    quantize(model, str(out_path), cfg)
    return out_path

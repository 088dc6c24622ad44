"""QDQ quantization of the exported LLM graphs for QNN HTP (onnxruntime.quantization, QNN config).

w8a16: uint16 activations, uint8 per-channel weights; w4a16: uint16 activations, int4 per-channel
MatMul weights (``QuantType.QInt4``) except ``lm_head`` (uint8, see :func:`quantize_qdq`). The RoPE tables (``rope_cos`` / ``rope_sin``, [C, d]) are forced to
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


def matmul_weight_overrides(model, weight_type: str, axis: int = 1, symmetric: bool = True,
                            keep_8bit: tuple = ()) -> dict:
    """Tensor-quant overrides making every constant MatMul weight ([K, N]) per-channel on ``axis``
    (1 = output channel). ``get_qnn_qdq_config(per_channel=True)`` alone leaves MatMul weights
    per-tensor (its source says "QNN does not support per-channel MatMul"; that applies to
    older QNN, see :func:`quantize_qdq`). MatMul nodes whose name contains one of ``keep_8bit``
    get uint8 instead of ``weight_type``."""
    inits = {i.name: i for i in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in inits \
                and len(inits[n.input[1]].dims) == 2:
            wt = "uint8" if any(k in n.name for k in keep_8bit) else weight_type
            out[n.input[1]] = [{"quant_type": _qtype(wt), "axis": axis,
                                "symmetric": symmetric}]
    return out


def quantize_qdq(fp32_path, out_path, feeds: list[dict], *, weight_type: str = "uint8",
                 activation_type: str = "uint16", per_channel: bool = True,
                 matmul_per_channel: bool = True, keep_8bit: tuple | None = None) -> Path:
    """Quantize ``fp32_path`` (one exported graph) to a QDQ model at ``out_path``.

    Args:
        feeds: calibration feed dicts for this graph (from :func:`tasks.llm.calib.collect_calibration_feeds`).
        weight_type: one of :data:`WEIGHT_TYPES` (``"uint8"`` for w8a16, ``"int4"`` for w4a16).
        activation_type: ``"uint16"`` (default) or ``"uint8"``.
        per_channel: ORT's QNN per-channel switch (Conv/ConvTranspose/Gemm weights).
        matmul_per_channel: also make MatMul weights per-channel (axis 1, symmetric) via
            :func:`matmul_weight_overrides`; our graphs have only MatMul weights.
        keep_8bit: MatMul name fragments kept at uint8 when ``weight_type`` is 4-bit; default
            ``("lm_head",)``. Measured on the HTP simulator (tiny Llama prefill, logits cosine HTP vs
            the same QDQ model on CPU): any single group of int4 MatMuls 0.999+, all int4 except
            lm_head 0.99997, all int4 *including* lm_head 0.62 (and -0.03 with per-tensor int4):
            an HTP-side problem, not quantization loss (the QDQ model on CPU is fine).
            Non-MatMul weights (norm scales, biases) then use uint8 as the default type.
    Calibration: MinMax. Returns ``Path(out_path)``. Raises KeyError on an unknown type name.
    """
    import onnx
    from onnxruntime.quantization import quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from onnxruntime.quantization import QuantType

    model = onnx.load(str(fp32_path))
    names = {i.name for i in model.graph.initializer}
    overrides = {n: [{"quant_type": QuantType.QUInt16}] for n in ROPE_TABLES if n in names}
    four_bit = weight_type in ("int4", "uint4")
    if keep_8bit is None:
        keep_8bit = ("lm_head",) if four_bit else ()
    if matmul_per_channel or four_bit:
        overrides.update(matmul_weight_overrides(model, weight_type, keep_8bit=keep_8bit))
    default_wt = "uint8" if four_bit else weight_type
    cfg = get_qnn_qdq_config(
        model, FeedsDataReader(feeds), activation_type=_qtype(activation_type),
        weight_type=_qtype(default_wt), per_channel=per_channel, init_overrides=overrides or None)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    quantize(model, str(out_path), cfg)
    return out_path


def quantize_llm(src, model_dir, calib_text, params: dict, out) -> dict:
    """The quantize stage for ``family: llm``: calibrate every part's prefill and decode graph
    on real feeds (:func:`tasks.llm.calib.collect_calibration_feeds`: the fp32 model run over
    ``calib_text``, real KV caches and hidden states) and write QDQ graphs under ``out`` with
    the export's relative paths. ``params``: the quantize stage params (precision w8a16 |
    w4a16 | w8a8, per_channel, calibration.samples = prompts, overrides with weight_bits 8 =
    MatMul name fragments kept at uint8). Returns {graph path: {"qdq_nodes": n}}."""
    import json

    import onnx

    from .calib import collect_calibration_feeds

    src, out = Path(src), Path(out)
    desc = json.loads((src / "export.json").read_text())
    feeds = collect_calibration_feeds(model_dir, src, calib_text, n_prompts=params["calibration"]["samples"])
    weight = {"w8a16": "uint8", "w4a16": "int4", "w8a8": "uint8"}[params["precision"]]
    act = "uint8" if params["precision"] == "w8a8" else "uint16"
    keep = tuple(o["pattern"] for o in params.get("overrides", []) if o["weight_bits"] == 8) or None
    report = {}
    for p in desc["parts"]:
        for g in ("prefill", "decode"):
            rel = p[g]["path"]
            q = quantize_qdq(src / rel, out / rel, feeds[g][p["index"]], weight_type=weight, activation_type=act,
                             per_channel=params["per_channel"], keep_8bit=keep)
            ops = [n.op_type for n in onnx.load(str(q), load_external_data=False).graph.node]
            report[rel] = {"quantize_linear": ops.count("QuantizeLinear"),
                           "dequantize_linear": ops.count("DequantizeLinear"),
                           "calibration_feeds": len(feeds[g][p["index"]])}
    return report

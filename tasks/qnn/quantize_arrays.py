"""A prepared fp32 graph (``prepare.py``) -> a QDQ graph for QNN HTP, calibrated on feeds
given as arrays ({input name: array}), with onnxruntime's QNN quantization helpers:

``quant_pre_process`` (shape inference + onnxruntime's optimizations; its symbolic shape
inference fails on some graphs, PP-OCR cls's Concat and Silero VAD's among them, with an
AssertionError: then it runs with ``skip_symbolic_shape=True``, and the manifest says so) ->
the ``metadata_props`` it writes dropped (onnxruntime 1.32's ``qnn_preprocess_model`` raises
TypeError on any model that has some) -> ``qnn_preprocess_model`` -> ``get_qnn_qdq_config`` -> ``quantize``.

Weight overrides (``init_overrides``):

- ``per_channel``: MatMul weights per output channel (axis 1), as the encoder family does
  (:func:`tasks.quantconfig.matmul_weight_overrides`); Conv weights are per-channel through the
  config's own ``per_channel``.
- the recipe's ``overrides`` ({pattern, weight_bits}): a matched **Conv** weight gets
  ``axis: 0`` (one scale per output channel, symmetric), always: QNN HTP refuses a per-tensor
  16-bit Conv weight at session creation ("Conv ... inserted using the NHWC format ... not
  selected by that EP", measured on Silero VAD with onnxruntime-qnn 2.7.0), and an override
  without an axis is per-tensor in onnxruntime's config. A matched MatMul weight keeps axis 1
  when it is per-channel; any other weight is per-tensor.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from tasks.proc import lazy

onnx = lazy.module("onnx")


class FeedReader:
    """``onnxruntime.quantization.CalibrationDataReader`` over a list of feed dicts."""

    def __init__(self, feeds: list[dict]):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # pragma: no cover - MinMax reads once
        raise NotImplementedError


def pre_process(src: Path, dst: Path) -> dict:
    """``quant_pre_process`` of ``src`` into ``dst``: with symbolic shape inference, or without
    it where it fails (an AssertionError inside it). Returns {"symbolic_shape_inference": bool,
    "why_not": str?}."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(src), str(dst), skip_symbolic_shape=False)
        return {"symbolic_shape_inference": True}
    except AssertionError as e:
        quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)
        return {
            "symbolic_shape_inference": False,
            "why_not": f"onnxruntime's symbolic shape inference failed (AssertionError {str(e)[:120]!r}); skipped",
        }


def weight_overrides(model, params: dict) -> tuple[dict, list[dict]]:
    """(``init_overrides`` for ``get_qnn_qdq_config``, what each recipe override matched:
    [{"pattern", "weight_bits", "conv": [...], "other": [...]}]), by the rules of the module
    docstring. ``params``: the quantize params (``precision``, ``per_channel``, ``overrides``)."""
    from tasks.qnn.precisions import OVERRIDE_TYPES, get as get_precision
    from tasks.qnn.quantconfig import matching_weights, matmul_weight_overrides, qtype

    p = get_precision(params["precision"])
    out = matmul_weight_overrides(model, p.weight_type) if params["per_channel"] else {}
    users: dict[str, set[str]] = {}
    for n in model.graph.node:
        for i in n.input[1:2]:
            users.setdefault(i, set()).add(n.op_type)
    report = []
    for o in params.get("overrides", []):
        names = sorted(matching_weights(model, o["pattern"]))
        conv = [n for n in names if "Conv" in users.get(n, ()) or "ConvTranspose" in users.get(n, ())]
        for name in names:
            axis = (
                {"axis": 0, "symmetric": True}
                if name in conv
                else {"axis": 1, "symmetric": True}
                if name in out
                else {}
            )
            out[name] = [{"quant_type": qtype(OVERRIDE_TYPES[o["weight_bits"]]), **axis}]
        report.append(
            {
                "pattern": o["pattern"],
                "weight_bits": o["weight_bits"],
                "conv_per_channel": conv,
                "other": [n for n in names if n not in conv],
            }
        )
        if not names:
            some = sorted(i.name for i in model.graph.initializer if len(i.dims) >= 2)[:6]
            raise ValueError(
                f"quantize.overrides pattern {o['pattern']!r}: expected it to match weights of the graph, "
                f"found none (its weights include {', '.join(some)})"
            )
    return out, report


def quantize_graph(src: Path, dst: Path, feeds: list[dict], params: dict) -> dict:
    """Quantize prepared graph ``src`` to QDQ graph ``dst`` calibrated on ``feeds``. ``params``:
    ``precision`` (tasks/precisions.py), ``per_channel``, ``calibrate_method`` (MinMax |
    Percentile), ``overrides``. Returns {"pre_process": :func:`pre_process`'s report,
    "overrides": what each override matched, "quantize_linear", "dequantize_linear",
    "seconds"}. Raises ValueError for an override that matches no weight."""
    from onnxruntime.quantization import CalibrationMethod, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

    from tasks.qnn.precisions import get as get_precision
    from tasks.qnn.quantconfig import qtype

    p = get_precision(params["precision"])
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        pre = Path(tmp) / "pre.onnx"
        info = {"pre_process": pre_process(src, pre)}
        m = onnx.load(str(pre))
        if m.metadata_props:  # quant_pre_process writes some; qnn_preprocess_model then raises TypeError
            del m.metadata_props[:]
            onnx.save(m, str(pre))
        qnn = Path(tmp) / "qnn_pre.onnx"
        if qnn_preprocess_model(str(pre), str(qnn)):
            pre = qnn
        model = onnx.load(str(pre))
        overrides, info["overrides"] = weight_overrides(model, params)
        cfg = get_qnn_qdq_config(
            str(pre),
            FeedReader(feeds),
            calibrate_method=getattr(CalibrationMethod, params.get("calibrate_method", "MinMax")),
            activation_type=qtype(p.activation_type),
            weight_type=qtype(p.weight_type),
            per_channel=params["per_channel"],
            init_overrides=overrides or None,
        )
        quantize(str(pre), str(dst), cfg)
    ops = [n.op_type for n in onnx.load(str(dst), load_external_data=False).graph.node]
    return {
        **info,
        "quantize_linear": ops.count("QuantizeLinear"),
        "dequantize_linear": ops.count("DequantizeLinear"),
        "seconds": round(time.perf_counter() - t, 2),
    }

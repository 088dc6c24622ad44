"""quantize, the encoder implementation (LLMs: ``tasks/llm/quantize.py``): fp32 ONNX ->
QDQ ONNX for QNN HTP, with onnxruntime's QNN quantization helpers.

Precisions: the table in ``tasks/qnn/precisions.py`` (weight and activation types per name);
per-channel weights as the recipe says (default yes).

Steps (onnxruntime docs, "QNN Execution Provider" -> "Generating a quantized model"):
``qnn_preprocess_model`` (fuses ops QNN supports natively) -> ``get_qnn_qdq_config``
(16-bit activations make it upgrade the model to opset 21) -> ``quantize``. Calibration
feeds come from the recipe's text file: the first ``samples`` non-empty lines, tokenized
with the model's tokenizer and padded to ``max_length``. Its content digest enters the key.
``overrides`` keep matching weights (``re.search`` on initializer names) at other bit widths.
With ``w4a16``, :func:`quantize_graph` then re-encodes the int4 weights (``block_size``,
``rounding``) and the embedding table (``embedding_bits``): :mod:`tasks.qnn.weights`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Literal

from tasks import progress
from tasks.proc import lazy
from tasks.datafiles import read_lines
from tasks.qnn.graphs import list_graphs, load_model
from tasks.qnn.precisions import Precision
from tasks.encoder.inputs import encoder_feeds
from tasks.contract.common import copy_rest
from tasks.contract.stage import Param, Stage
from tasks.contract.params import (
    BLOCK_SIZE,
    CALIBRATION_FILE,
    CALIBRATION_SAMPLES,
    EMBEDDING_BITS,
    OVERRIDES,
    PER_CHANNEL,
    GPTQ_SPAN,
    PRECISION,
    ROUNDING,
)

onnx = lazy.module("onnx")


def _no_entropy(v):
    if v == "Entropy":
        raise ValueError(
            "expected MinMax or Percentile, found 'Entropy': through onnxruntime's quantize_static it gives "
            "exactly MinMax's ranges (its entropy calibrator's 128 histogram bins equal its 128 quantized "
            "bins, so the search has one candidate, the full range), so npubuild refuses it"
        )
    return v


CALIBRATION_MAX_LENGTH = Param(
    "quantize",
    "calibration.max_length",
    int,
    128,
    "tokens per calibration sample (padded/truncated)",
    limits={"ge": 1, "le": 131_072},
)
CALIBRATE_METHOD = Param(
    "quantize",
    "calibrate_method",
    Literal["MinMax", "Percentile"],
    "MinMax",
    "onnxruntime's calibrator",
    before=_no_entropy,
)


def preflight(recipe) -> list[tuple[str, str]]:
    """A chat calibration set (``.jsonl``) is for LLMs; an encoder reads one sample per line."""
    f = recipe.quantize.calibration.file
    if f.endswith(".jsonl"):
        return [
            (
                "quantize.calibration.file",
                f"expected a text file with one sample per line for an encoder, found "
                f"{f!r} (.jsonl chat conversations are for LLM recipes)",
            )
        ]
    return []


class ListReader:
    """``onnxruntime.quantization.CalibrationDataReader`` over a list of feed dicts; shows a
    progress bar of the calibration samples as the calibrator takes them."""

    def __init__(self, feeds: list[dict], what: str = "calibration samples"):
        self._it = iter(feeds)
        self._bar = progress.bar(what=what, total=len(feeds), unit="sample")

    def get_next(self):
        feed = next(self._it, None)
        if feed is None:
            self._bar.close()
        else:
            self._bar.update()
        return feed

    def rewind(self):  # pragma: no cover - not used by MinMax
        raise NotImplementedError


def weight_overrides(model: onnx.ModelProto, p: Precision, per_channel: bool) -> dict:
    """``init_overrides`` for ``get_qnn_qdq_config``: {initializer name: [{quant_type, ...}]};
    ``p``: the recipe's precision, resolved once by :func:`quantize_graph`.

    - ``per_channel``: MatMul weights [K, N] get symmetric per-channel scales on axis 1 (the
      output channels). onnxruntime's QNN config leaves MatMul weights per-tensor ("QNN does
      not support per-channel MatMul"), but with QNN SDK 2.51 such graphs compiled fully on
      HTP here, and MiniLM's worst-sentence cosine rose from 0.9971 to 0.9993 on the simulator.
    - 4-bit weights: LayerNormalization scale/bias and Gemm weights stay at 8 bits. Measured
      here (onnxruntime-qnn 2.7.0): QNN HTP rejects LayerNormalization with int4 scale (error
      3110) and left an int4 DequantizeLinear feeding Gemm on the CPU, for either channel axis.
    """
    from onnxruntime.quantization import QuantType

    from tasks.qnn.quantconfig import matmul_weight_overrides

    inits = {i.name for i in model.graph.initializer}
    out = matmul_weight_overrides(model, p.weight_type) if per_channel else {}
    for n in model.graph.node:
        if p.weight_bits == 4 and n.op_type in ("LayerNormalization", "Gemm"):
            for name in n.input[1:3]:
                if name in inits:
                    out[name] = [{"quant_type": QuantType.QUInt8}]
    return out


def quantize_graph(src: Path, dst: Path, feeds: list[dict], params: dict) -> dict:
    """Quantize one graph to QDQ with ``feeds`` as the calibration set. Returns counts of
    QuantizeLinear/DequantizeLinear nodes, the overrides applied and, at 4 bits, what
    :mod:`tasks.qnn.weights` re-encoded (int4 weights, block size, rounding, 8-bit tables).

    4-bit weights (``w4a16``): MatMul + Add pairs that onnxruntime's pre-processing fused into
    Gemm are split again (:func:`tasks.qnn.weights.unfuse_gemm`; HTP does not take int4 Gemm
    weights), so every MatMul weight is int4 unless an override keeps it; then the int4 weights
    are re-encoded per ``block_size`` (LPBQ) and ``rounding`` (GPTQ on ``feeds``), and with
    ``embedding_bits: 8`` the Gather tables are stored at 8 bits."""
    from onnxruntime.quantization import CalibrationMethod, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

    from tasks.qnn import weights
    from tasks.qnn.precisions import OVERRIDE_TYPES, get as get_precision
    from tasks.qnn.quantconfig import fast_int4_packing, matching_weights, qtype

    p = get_precision(params["precision"])
    four = p.weight_bits == 4
    info = {}
    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        pre = Path(tmp) / "pre.onnx"
        if not qnn_preprocess_model(str(src), str(pre)):
            pre = src
        model = load_model(pre, load_external_data=False)
        if four:
            info["unfused_gemm"] = weights.unfuse_gemm(model)
            if info["unfused_gemm"]:
                pre = Path(tmp) / "pre_unfused.onnx"
                onnx.save(model, str(pre))
        overrides = weight_overrides(model, p, params["per_channel"])
        for o in params.get("overrides", []):
            for name in sorted(matching_weights(model, o["pattern"])):
                overrides[name] = [
                    {
                        "quant_type": qtype(OVERRIDE_TYPES[o["weight_bits"]]),
                        **({"symmetric": True, "axis": 1} if name in overrides else {}),
                    }
                ]
        cfg = get_qnn_qdq_config(
            str(pre),
            ListReader(feeds, f"{src.stem} calibration samples"),
            calibrate_method=getattr(CalibrationMethod, params["calibrate_method"]),
            activation_type=qtype(p.activation_type),
            weight_type=qtype(p.weight_type),
            per_channel=params["per_channel"],
            init_overrides=overrides or None,
        )
        big = pre.stat().st_size > 2 * 1024**3
        if big:
            cfg.use_external_data_format = True
        with fast_int4_packing():  # onnxruntime's own int4 packing is a Python loop per byte
            quantize(str(pre), str(dst), cfg)
        if four:
            info.update(
                weights.reencode(
                    pre,
                    dst,
                    feeds,
                    params.get("block_size"),
                    params.get("rounding", "nearest"),
                    params.get("embedding_bits", 16) == 8,
                    span=params.get("gptq_span"),
                )
            )
    q = onnx.load(str(dst), load_external_data=False)
    ops = [n.op_type for n in q.graph.node]
    return {
        "quantize_linear": ops.count("QuantizeLinear"),
        "dequantize_linear": ops.count("DequantizeLinear"),
        "overridden_weights": len(overrides),
        **info,
        "opset": max(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")),
    }


def run(inputs, files, params, out: Path) -> dict:
    """Quantize every graph of ``inputs["model"]`` into ``out`` (same relative paths).
    Raises ValueError when the calibration file has too few lines. onnxruntime's quantizer
    logs advice through the root logger at WARNING (opset upgrade, "Axis 1 is out-of-range"
    for 1-D weights, pre-processing): it goes to the stage's log, and the known lines are kept
    off the console (``tasks/store/stagelog.py`` ``HARMLESS``)."""
    src = inputs["model"]
    cal = params["calibration"]
    report = {}
    texts = read_lines(files["calibration"], cal["samples"])
    for g in list_graphs(src):
        rel = g.relative_to(src).as_posix()
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        report[rel] = quantize_graph(g, out / rel, encoder_feeds(g, inputs["source"], texts, cal["max_length"]), params)
    copy_rest(src, out)
    return {"graphs": report, "calibration_samples": len(texts)}


STAGE = Stage(
    kind="quantize",
    module=__name__,
    version=4,  # 4: block-wise int4 (LPBQ), GPTQ, 8-bit tables, Gemm split at 4 bits
    tools=("onnxruntime", "onnx", "transformers", "tokenizers", "numpy"),
    run=run,
    params=(
        PRECISION,
        PER_CHANNEL,
        BLOCK_SIZE,
        ROUNDING,
        GPTQ_SPAN,
        EMBEDDING_BITS,
        CALIBRATION_SAMPLES,
        CALIBRATION_MAX_LENGTH,
        CALIBRATE_METHOD,
        OVERRIDES,
    ),
    files={CALIBRATION_FILE: "calibration"},
    line_samples=("calibration",),
    preflight=preflight,
)

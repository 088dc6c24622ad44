"""quantize, the LLM implementation (encoders: ``tasks/stages/quantize.py``): each part's
prefill and decode graphs to QDQ (w8a16 / w4a16, per-channel weights, 16-bit activations),
calibrated with real hidden states and KV caches streamed part by part through the fp32
graphs (``tasks/llm/quant.py``, ``tasks/llm/calib.py``). Calibration prompts are the recipe's
``calibration.file`` paragraphs (``samples`` of them).
"""

from __future__ import annotations

from pathlib import Path

from .common import copy_rest

VERSION = 2  # 2: block-wise int4 (LPBQ), GPTQ, 8-bit tables, lm_head int4 with blocks (issue 21)
TOOLS = ("onnxruntime", "onnx", "transformers", "tokenizers", "numpy")


def run(inputs, files, params, out: Path) -> dict:
    """Quantize every part of the LLM export in ``inputs["model"]`` into ``out``. Returns the
    per-part report (calibration and quantize wall time and peak RSS) and the prompt count.
    Raises the memory check's error before work when a part cannot fit."""
    from ..llm.memory import check_export_stage
    from ..precisions import get as get_precision
    from ..llm.quant import quantize_llm

    src = inputs["model"]
    check_export_stage("quantize", src, get_precision(params["precision"]).weight_bits)
    report = quantize_llm(src, inputs["source"], files["calibration"], params, out)
    copy_rest(src, out)
    return {**report, "calibration_prompts": params["calibration"]["samples"]}

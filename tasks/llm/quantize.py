"""quantize, the LLM implementation (encoders: ``tasks/encoder/quantize.py``): each part's
prefill and decode graphs to QDQ (w8a16 / w4a16, per-channel weights, 16-bit activations,
:func:`tasks.llm.qdq.quantize_part`), calibrated on the feeds ``calibrate.part{k}`` recorded
(real hidden states and KV caches streamed part by part through the fp32 graphs:
:mod:`tasks.llm.calibration_feeds`) and the activation ranges it took while running them
(``ranges/``): quantize runs no fp32 graph itself. Calibration prompts are the recipe's ``calibration.file``
paragraphs (``samples`` of them).
"""

from __future__ import annotations

from pathlib import Path

from ..stages.common import copy_rest
from ..stages.contract import Stage
from ..stages.params import LLM_QUANT_PARAMS
from .layout import RANGES
from .qdq import quantize_part
from .memory import plan_estimate


def preflight(recipe) -> list[tuple[str, str]]:
    """An LLM's overrides keep MatMul weights at 8 bits, no other width."""
    return [(f"quantize.overrides[{i}].weight_bits", f"expected 8 in an LLM recipe (its overrides keep MatMul weights "
                                                    f"at 8 bits), found {o.weight_bits}")
            for i, o in enumerate(recipe.quantize.overrides) if o.weight_bits != 8]


def run(inputs, files, params, out: Path) -> dict:
    """Quantize part ``params["part"]`` of the LLM export in ``inputs["model"]`` into ``out``
    with the feeds of ``inputs["calibration"]`` (``calibrate.part{k}``), and copy the
    export's other files (``export.json``, tokenizer, config) beside it, with
    ``quantize.json`` (precision, weight bits). Returns {"graphs": per-graph counts,
    "parts": [{"part", "quantize_s", "quantize_peak_rss"}]}. Raises the memory check's error
    before work when the part cannot fit."""
    import json
    import tempfile
    import time

    from .memory import QUANTIZED_AS, check_export_stage
    from ..precisions import get as get_precision

    src, k = Path(inputs["model"]), params["part"]
    bits = get_precision(params["precision"]).weight_bits
    # with GPTQ the estimate counts its peak; the prompts are at most the prefill feeds (one or two each)
    prompts = len(list((Path(inputs["calibration"]) / "feeds" / "prefill").glob("*.npz")))
    check_export_stage("quantize", src, bits, part=k, gptq_samples=prompts if params.get("rounding") == "gptq" else None,
                       in_child=True)
    desc = json.loads((src / "export.json").read_text())
    t0 = time.perf_counter()
    graphs, peak = quantize_part(src, desc["parts"][k], inputs["calibration"] / "feeds", params, out,
                                 Path(tempfile.mkdtemp(prefix="quantize-")), ranges=inputs["calibration"] / RANGES)
    copy_rest(src, out)
    (out / QUANTIZED_AS).write_text(json.dumps({"precision": params["precision"], "weight_bits": bits}, sort_keys=True)
                                    + "\n")
    return {"graphs": graphs, "parts": [{"part": k, "quantize_s": time.perf_counter() - t0,
                                         "quantize_peak_rss": peak}]}


STAGE = Stage(
    kind="quantize", family="llm", module=__name__, version=4,  # 4: ranges from calibrate
    tools=("onnxruntime", "onnx", "numpy"), run=run, params=LLM_QUANT_PARAMS, wired=("part",), preflight=preflight,
    memory_estimate=plan_estimate,
)

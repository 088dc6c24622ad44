"""quantize, the LLM implementation (encoders: ``tasks/encoder/quantize.py``): each part's
prefill and decode graphs to QDQ (w8a16 / w4a16, per-channel weights, 16-bit activations,
:func:`tasks.llm.qdq.quantize_part`), calibrated on the feeds ``calibrate.part{k}`` recorded
(real hidden states and KV caches streamed part by part through the fp32 graphs:
:mod:`tasks.llm.calibration_feeds`) and the activation ranges it took while running them
(``ranges/``): quantize runs no fp32 graph itself. Calibration prompts are the recipe's ``calibration.file``
paragraphs (``samples`` of them).

The KV cache at the graphs' boundary (``quantize.kv_bits``, :func:`kv_boundary`): with 8
(default) each layer's ``past_{key,value}_{l}`` inputs and ``present_{key,value}_{l}`` outputs
are uint8, symmetric (zero point 128), one scale per layer and K/V shared by past and present
and by the prefill and decode graphs (onnxruntime-genai binds past and present to one buffer,
which both graphs read and write: the bytes a call writes are the next call's input), from the
calibrate stage's ranges of both graphs (``max |x|``; :mod:`tasks.llm.boundary`); 16: uint16
over the layer's range; 32: float32, the layout before. The part's row of the ``export.json``
written beside the graphs declares each quantized KV tensor's ``dtype``, ``scale`` and
``zero_point`` (what the compile stage's read-back expects of the binaries, what the bundle
ships). Every other input and output stays float32. What genai's zero-filled buffer (bytes 0 =
-128 x scale) does to the graphs: nothing (:mod:`tasks.llm.pipeline_graphs`: the slots after
this call's are zeroed in-graph).
"""

from __future__ import annotations

from pathlib import Path

from tasks.contract.common import copy_rest
from tasks.contract.stage import Stage
from tasks.contract.params import KV_BITS, LLM_QUANT_PARAMS
from tasks.llm.layout import RANGES
from tasks.llm.qdq import quantize_part
from tasks.llm.memory import plan_estimate


def preflight(recipe) -> list[tuple[str, str]]:
    """An LLM's overrides keep MatMul weights at 8 bits, no other width."""
    return [
        (
            f"quantize.overrides[{i}].weight_bits",
            f"expected 8 in an LLM recipe (its overrides keep MatMul weights at 8 bits), found {o.weight_bits}",
        )
        for i, o in enumerate(recipe.quantize.overrides)
        if o.weight_bits != 8
    ]


def kv_boundary(row: dict, ranges: Path, kv_bits: int) -> dict[str, dict[str, dict]]:
    """{"prefill" / "decode": {tensor: {"dtype", "scale", "zero_point"}}} of one part (``row``, an
    ``export.json`` part row): the KV cache inputs and outputs of its two graphs
    (:func:`tasks.llm.boundary.kv_cache`) at ``kv_bits`` (module docstring), one encoding per
    layer and K/V over both graphs' ranges in ``ranges`` (the calibrate stage's ``prefill.json``
    and ``decode.json``: {tensor: [lowest, highest]}); empty with ``kv_bits`` 32. Raises
    ValueError naming a KV tensor no range file covers (:func:`tasks.llm.boundary.encodings`)."""
    import json

    from tasks.llm.boundary import encodings, kv_cache

    files = [json.loads((Path(ranges) / f"{g}.json").read_text()) for g in ("prefill", "decode")]
    return {
        g: encodings(files, [t["name"] for t in row[g]["inputs"] + row[g]["outputs"] if kv_cache(t["name"])], kv_bits)
        for g in ("prefill", "decode")
    }


def run(inputs, files, params, out: Path) -> dict:
    """Quantize part ``params["part"]`` of the LLM export in ``inputs["model"]`` into ``out``
    with the feeds of ``inputs["calibration"]`` (``calibrate.part{k}``), and copy the
    export's other files (``export.json``, tokenizer, config) beside it, with
    ``quantize.json`` (precision, weight bits); the KV cache crosses the graphs' boundary at
    ``params["kv_bits"]``, declared in ``out``'s ``export.json`` (:func:`kv_boundary`,
    :func:`tasks.llm.boundary.declare`; an ``export.json`` already in ``out``, another part's, keeps its other
    rows). Returns {"graphs": per-graph counts,
    "parts": [{"part", "quantize_s", "quantize_peak_rss"}]}. Raises the memory check's error
    before work when the part cannot fit."""
    import json
    import tempfile
    import time

    from tasks.llm.boundary import declare
    from tasks.llm.memory import QUANTIZED_AS, check_export_stage
    from tasks.qnn.precisions import get as get_precision

    src, k = Path(inputs["model"]), params["part"]
    precision = get_precision(params["precision"])  # resolved once: the helpers take the object
    bits = precision.weight_bits
    # with GPTQ the estimate counts its peak; the prompts are at most the prefill feeds (one or two each)
    prompts = len(list((Path(inputs["calibration"]) / "feeds" / "prefill").glob("*.npz")))
    check_export_stage(
        "quantize", src, bits, part=k, gptq_samples=prompts if params.get("rounding") == "gptq" else None, in_child=True
    )
    desc = json.loads((src / "export.json").read_text())
    ranges = Path(inputs["calibration"]) / RANGES
    plan = kv_boundary(desc["parts"][k], ranges, params.get("kv_bits", KV_BITS.default))
    t0 = time.perf_counter()
    graphs, peak = quantize_part(
        src,
        desc["parts"][k],
        inputs["calibration"] / "feeds",
        params,
        out,
        Path(tempfile.mkdtemp(prefix="quantize-")),
        ranges=ranges,
        boundary=plan,
        precision=precision,
    )
    copy_rest(src, out)  # export.json among them, unless out has one
    joined = json.loads((out / "export.json").read_text())
    (out / "export.json").write_text(json.dumps(declare(joined, k, plan), indent=1))
    (out / QUANTIZED_AS).write_text(
        json.dumps({"precision": params["precision"], "weight_bits": bits}, sort_keys=True) + "\n"
    )
    return {"graphs": graphs, "parts": [{"part": k, "quantize_s": time.perf_counter() - t0, "quantize_peak_rss": peak}]}


STAGE = Stage(
    kind="quantize",
    module=__name__,
    version=5,  # 5: the KV cache quantized at the boundary
    tools=("onnxruntime", "onnx", "numpy"),
    run=run,
    params=(*LLM_QUANT_PARAMS, KV_BITS),
    wired=("part",),
    preflight=preflight,
    memory_estimate=plan_estimate,
)

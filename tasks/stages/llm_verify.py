"""verify, the LLM implementation (encoders: ``tasks/stages/verify.py``): greedy generation
of the verify prompts through the compiled bundle (onnxruntime-genai or our ``LLMRunner``,
``verify.runtime``) against the fp32 export graphs: token agreement, prefill logits cosine,
perplexity ratio (``tasks/llm/verify.py``); judged by the shared :func:`check`.
"""

from __future__ import annotations

from pathlib import Path

from . import common

VERSION = 1
TOOLS = ("onnxruntime", "onnxruntime-qnn", "qnn-sdk", "transformers", "tokenizers", "numpy", "torch",
         "onnxruntime-genai")
KEY_EXCLUDE = ("thresholds",)
key_extra = common.target_key_extra  # the target as the session sees it
check = common.check  # verify.json against the thresholds


def run(inputs, files, params, out: Path) -> dict:
    """Generate, measure, write ``out/verify.json``. Returns {"backend", "samples", and the
    run's per-part figures}. Raises the memory check's error before work."""
    from ..llm.memory import available_bytes, check_export_stage
    from ..llm.verify import verify_llm

    check_export_stage("verify", inputs["reference"])
    avail = available_bytes()
    report = verify_llm(inputs, files, params, budget_bytes=None if avail is None else avail // 2)
    run_info = report.pop("_run")
    return {**common.write_report(out, report), **run_info}

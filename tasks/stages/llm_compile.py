"""compile, the LLM implementation (encoders: ``tasks/stages/compile.py``): per part, the
prefill and decode graphs each into their own context binary and, with ``weight_sharing``,
both into one weight-shared binary, each compile in its own process (``tasks/llm/compile.py``);
``genai_config.json`` for onnxruntime-genai (``tasks/llm/genai.py``).
"""

from __future__ import annotations

from pathlib import Path

from .common import target_key_extra

VERSION = 1
TOOLS = ("onnxruntime", "onnxruntime-qnn", "qnn-sdk", "onnx")
KEY_EXCLUDE = ("target",)  # the name; the key holds what it resolves to (key_extra)
key_extra = target_key_extra


def run(inputs, files, params, out: Path) -> dict:
    """Compile every part of ``inputs["model"]`` for ``params["target"]``. Returns the per-part
    rows (wall time, peak RSS, binary sizes, shared/single ratio). Raises the memory check's
    error before work, qnn.NotOnNPU or onnxruntime's error."""
    from ..llm.compile import compile_llm
    from ..llm.memory import check_export_stage

    check_export_stage("compile", inputs["model"])
    return compile_llm(inputs["model"], out, params)

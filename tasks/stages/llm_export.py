"""export, the LLM implementation (encoders: ``tasks/stages/export.py``): prefill
(AR-``sequence_length``) and decode (AR-``decode_length``) graphs per part over a fixed context,
in onnxruntime-genai's decoder-pipeline layout, written from the checkpoint one part and one
tensor at a time (``tasks/llm/export.py``), plus the tokenizer and config files.

The estimated peak memory is checked before any work (``tasks/llm/memory.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

from .common import copy_tokenizer

VERSION = 1
TOOLS = ("torch", "transformers", "onnx", "numpy", "safetensors")


def run(inputs, files, params, out: Path) -> dict:
    """Export the checkpoint in ``inputs["source"]`` into ``out``. Returns {"llm": export.json's
    description, "parts": per-part wall time and peak RSS}. Raises MemoryError-like
    ``tasks.llm.memory`` errors before work when the part cannot fit, ValueError for an
    unsupported family or activation."""
    from ..llm.export import export_llm
    from ..llm.memory import check_stage

    src = inputs["source"]
    check_stage("export", json.loads((src / "config.json").read_text(encoding="utf-8")), parts=params["parts"],
                seq_len=params["sequence_length"], context_len=params["context_length"],
                embed_in_part=params["embedding"] == "first-part")
    meter: list = []
    info = export_llm(src, out, seq_len=params["sequence_length"], context_len=params["context_length"],
                      parts=params["parts"], embed={"first-part": "part0", "host": "separate"}[params["embedding"]],
                      meter=meter)
    copy_tokenizer(src, out)
    return {"llm": info, "parts": meter}

"""compile, the LLM implementation (encoders: ``tasks/encoder/compile.py``): per part, the
prefill and decode graphs each into their own context binary and, with ``weight_sharing``,
both into one weight-shared binary, each compile in its own process
(:func:`tasks.llm.part_binaries.compile_part`); every binary read back
(:func:`tasks.llm.part_binaries.read_back`).
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.contract.common import COMPILE_ARTIFACTS, target_key_extra
from tasks.contract.stage import Stage
from tasks.contract.params import WEIGHT_SHARING
from tasks.llm.part_binaries import compile_part, read_back
from tasks.llm.memory import plan_estimate


def run(inputs, files, params, out: Path) -> dict:
    """Compile part ``params["part"]`` of ``inputs["model"]`` for ``params["target"]`` into
    ``out/part{k}/`` (per-graph binaries) and ``out/shared/part{k}/`` (weight-shared). Returns
    the part's row (wall time, peak RSS, binary sizes, shared/single ratio) and ``binaries``
    ({binary: figures}, :func:`read_back`). Raises the memory check's error before work,
    RuntimeError with the compile child's output, context_binary_checks.Mismatch when a binary is not
    what was planned."""
    from tasks.llm.memory import check_export_stage, weight_bits_of

    # the recipe's own bits (a w8a16 LLM's weights count 8, not 4)
    check_export_stage("compile", inputs["model"], weight_bits_of(inputs["model"]), part=params["part"], in_child=True)
    info = compile_part(Path(inputs["model"]), out, params, params["part"])
    desc = json.loads((Path(inputs["model"]) / "export.json").read_text())
    return {**info, "binaries": read_back(out, desc, [params["part"]], params, qdq_dir=inputs["model"])}


STAGE = Stage(
    kind="compile",
    module=__name__,
    version=3,  # 3: every binary read back
    tools=("onnxruntime", "onnxruntime-qnn", "qnn-sdk", "onnx"),
    run=run,
    params=(WEIGHT_SHARING,),
    wired=("target", "part", "per_graph"),
    key_exclude=("target",),  # the name; the key holds what it resolves to (key_extra)
    key_extra=target_key_extra,
    artifacts=COMPILE_ARTIFACTS,
    memory_estimate=plan_estimate,
)

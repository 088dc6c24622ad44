"""compile, the audio implementation: every graph of the QDQ folder to an EPContext model and
its QNN context binary for one target, every node on HTP (:mod:`tasks.qnn.compile_folder`)."""

from __future__ import annotations

from pathlib import Path

from tasks.contract.common import COMPILE_ARTIFACTS, target_key_extra
from tasks.contract.stage import Stage


def run(inputs, files, params, out: Path) -> dict:
    """:func:`tasks.qnn.compile_folder.compile_folder` of ``inputs["model"]``."""
    from tasks.qnn.compile_folder import compile_folder

    return compile_folder(inputs["model"], out, params["target"])


STAGE = Stage(
    kind="compile",
    module=__name__,
    version=1,
    tools=("onnxruntime", "onnxruntime-qnn", "qnn-sdk", "onnx"),
    run=run,
    wired=("target",),
    key_exclude=("target",),
    key_extra=target_key_extra,
    artifacts=COMPILE_ARTIFACTS,
)

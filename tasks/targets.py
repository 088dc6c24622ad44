"""Compile targets: the one table of Snapdragon SoCs we build context binaries for.

``soc_model`` and ``htp_arch`` are the onnxruntime QNN EP provider options of the same names
(QNN SDK ``QnnHtpDevice`` SoC ids and Hexagon architecture versions).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str
    soc_model: int
    htp_arch: int
    soc: str
    devices: str
    source: str


_LITERT = ("google-ai-edge/LiteRT, litert/vendors/qualcomm/core/schema/soc_table.h "
           "(Qualcomm's SnapdragonModel / DspArch table)")

TARGETS: dict[str, Target] = {t.name: t for t in [
    Target("x-elite", 60, 73, "SC8380XP", "Snapdragon X Elite / X Plus laptops",
           "onnxruntime QNN EP docs and microsoft/olive-recipes QNN recipes (soc_model 60, htp_arch 73); "
           "compiled and run here, ../shared/NOTES-qnn.md"),
    Target("8gen2", 43, 73, "SM8550", "Snapdragon 8 Gen 2 phones", _LITERT),
    Target("8gen3", 57, 75, "SM8650", "Snapdragon 8 Gen 3 phones", _LITERT),
    Target("8elite", 69, 79, "SM8750", "Snapdragon 8 Elite phones", _LITERT),
]}


#: the target of a recipe that names none, and of the QNN helpers called without one
DEFAULT_TARGET = "x-elite"


def get(name: str) -> Target:
    """The target ``name``. Raises KeyError listing the known targets."""
    try:
        return TARGETS[name]
    except KeyError:
        raise KeyError(f"unknown target {name!r}; known targets: {', '.join(sorted(TARGETS))}") from None

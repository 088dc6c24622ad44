"""Compile targets: the one table of Snapdragon SoCs we build context binaries for.

``soc_model`` and ``htp_arch`` are the onnxruntime QNN EP provider options of the same names
(QNN SDK ``QnnHtpDevice`` SoC ids and Hexagon architecture versions).

On-device figures, each with its public source (``*_source``), for the catalog's ceilings
(:mod:`tasks.llm.figures`):

- ``dram_gbps``: peak DRAM bandwidth in GB/s (10^9 bytes/s) = the memory's transfer rate
  (MT/s) x the bus width in bytes (X Elite: 128-bit, 16 bytes; the phones: 64-bit, 8 bytes).
- ``npu_tops``: the Hexagon NPU's peak in INT8 TOPS (10^12 ops/s), as Qualcomm states it.

None where no public source was found (the phones' NPU peaks: Qualcomm publishes none for them);
the catalog then states the figure as unknown instead of computing with a guess.
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
    dram_gbps: float | None = None
    dram_source: str = "not found in a public source"
    npu_tops: float | None = None
    npu_source: str = "not found in a public source: Qualcomm publishes no TOPS figure for this SoC's NPU"


_LITERT = (
    "google-ai-edge/LiteRT, litert/vendors/qualcomm/core/schema/soc_table.h "
    "(Qualcomm's SnapdragonModel / DspArch table)"
)

TARGETS: dict[str, Target] = {
    t.name: t
    for t in [
        Target(
            "x-elite",
            60,
            73,
            "SC8380XP",
            "Snapdragon X Elite / X Plus laptops",
            "onnxruntime QNN EP docs and microsoft/olive-recipes QNN recipes (soc_model 60, htp_arch 73); "
            "compiled here and run on the x86_64 HTP simulator",
            dram_gbps=8448 * 16 / 1000,  # 135.2
            dram_source="LPDDR5x-8448 on a 128-bit bus: 8448 MT/s x 16 bytes = 135.2 GB/s (Qualcomm's X1E-84/80/78-100 "
            "spec as reported by notebookcheck.pl, 'Snapdragon X Elite: Qualcomm prezentuje trzy warianty', "
            "2024; Qualcomm's Snapdragon Summit 2023 figure was 136 GB/s at LPDDR5x-8533: "
            "en.mashdigi.com, tweaktown.com news 93943)",
            npu_tops=45.0,
            npu_source="Hexagon NPU 45 TOPS (INT8), Qualcomm's figure for every X Elite SKU (notebookcheck.pl, "
            "as above; allamericansthings.com 2023-10-24 'Snapdragon X Elite announced')",
        ),
        Target(
            "8gen2",
            43,
            73,
            "SM8550",
            "Snapdragon 8 Gen 2 phones",
            _LITERT,
            dram_gbps=8400 * 8 / 1000,  # 67.2
            dram_source="LPDDR5x at 4200 MHz (8400 MT/s) on a 64-bit bus: 67.2 GB/s (droidholic.com "
            "'Snapdragon 8 Gen 3 goes official': 'up to 4800MHz ... compared to 4200MHz for the "
            "Snapdragon 8 Gen 2')",
        ),
        Target(
            "8gen3",
            57,
            75,
            "SM8650",
            "Snapdragon 8 Gen 3 phones",
            _LITERT,
            dram_gbps=9600 * 8 / 1000,  # 76.8
            dram_source="LPDDR5x at 4800 MHz (9600 MT/s) on a 64-bit bus: 76.8 GB/s (droidholic.com and klav.it on "
            "Qualcomm's Snapdragon Summit 2023 spec sheet: 'LPDDR5X RAM with up to 4800MHz')",
        ),
        Target(
            "8elite",
            69,
            79,
            "SM8750",
            "Snapdragon 8 Elite phones",
            _LITERT,
            dram_source="not found in a public source searched here (its LPDDR5x rate)",
        ),
    ]
}


#: the target of a recipe that names none, and of the QNN helpers called without one
DEFAULT_TARGET = "x-elite"


def get(name: str) -> Target:
    """The target ``name``. Raises KeyError listing the known targets."""
    try:
        return TARGETS[name]
    except KeyError:
        raise KeyError(f"unknown target {name!r}; known targets: {', '.join(sorted(TARGETS))}") from None

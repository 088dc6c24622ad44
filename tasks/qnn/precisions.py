"""Precisions: the one table of quantization schemes a recipe names (``quantize.precision``).

Types are :mod:`tasks.qnn.quantconfig` names (``uint8``, ``int4``, ``uint16``), which it turns into
onnxruntime ``QuantType`` values. Activations are what flows between ops; weights are the
constant initializers (MatMul/Gemm/Conv weights; norm scales and biases stay at 8 bits where a
4-bit type is refused, see the quantize implementations). The names follow Qualcomm AI Hub's
("w8a16": 8-bit weights, 16-bit activations).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str
    weight_type: str  # tasks.qnn.quantconfig type name of the weights
    activation_type: str  # ... of the activations
    weight_bits: int
    activation_bits: int


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in [
        Precision("w8a16", "uint8", "uint16", 8, 16),
        Precision("w4a16", "int4", "uint16", 4, 16),
        Precision("w8a8", "uint8", "uint8", 8, 8),
    ]
}
NAMES: tuple[str, ...] = tuple(PRECISIONS)
#: a recipe's precision when it names none
DEFAULT_PRECISION = "w8a16"
#: the precision whose weights are 4-bit: the one the int4 params (block_size, rounding,
#: embedding_bits) apply to
FOUR_BIT = next(p.name for p in PRECISIONS.values() if p.weight_bits == 4)
#: ``quantize.overrides`` ``weight_bits`` -> the type of the weights it selects
OVERRIDE_TYPES = {4: "int4", 8: "uint8", 16: "uint16"}


def get(name: str) -> Precision:
    """The precision ``name``. Raises KeyError listing the known ones."""
    try:
        return PRECISIONS[name]
    except KeyError:
        raise KeyError(f"unknown precision {name!r}; known precisions: {', '.join(NAMES)}") from None


#: session config entry that makes onnxruntime's CPU EP compute a QDQ graph's fused weight
#: MatMuls (``DequantizeLinear`` of an 8/4-bit constant + ``MatMul`` -> ``MatMulNBits``) in fp32,
#: as the graph says: unset, the accuracy level is 4 ("If not provided, default is 4",
#: onnxruntime ``onnxruntime_session_options_config_keys.h``), which quantizes the activations to
#: int8. Measured (onnxruntime 1.32): all-MiniLM-L6-v2's w8a16 QDQ graph, default vs level 1,
#: max |difference| 0.084 in its output; a random Phi-3's logits 1e-2 apart.
QDQ_MATMUL_FP32 = {"session.qdq_matmulnbits_accuracy_level": "1"}

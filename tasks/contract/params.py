"""The recipe keys that more than one stage implementation reads (of one family or several), and
the keys the plan reads itself, each defined once (:class:`tasks.contract.stage.Param`). A key
one implementation alone reads is defined in its module, beside its ``STAGE``, so that no stage
module imports another (a stage's code digest covers what it imports).
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from tasks.qnn.precisions import DEFAULT_PRECISION, FOUR_BIT, NAMES as PRECISION_NAMES
from tasks.qnn.targets import DEFAULT_TARGET, TARGETS
from tasks.contract import DEFAULT_FAMILY, FAMILIES
from tasks.contract.stage import REQUIRED, Param


def close(word: str, options) -> str:
    """ "; did you mean 'x'?" for the closest of ``options`` to ``word`` (difflib ratio >= 0.6), else ""."""
    import difflib

    near = difflib.get_close_matches(str(word), sorted(options), n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else ""


# ---------------------------------------------------------------- read by the plan


def _one_of_each(v, earlier):
    bad = [t for t in v if t not in TARGETS]
    if bad:
        raise ValueError(f"expected targets from {sorted(TARGETS)}, found unknown {bad}{close(bad[0], TARGETS)}")
    if len(set(v)) != len(v):
        raise ValueError(f"expected distinct targets, found {v}")
    return v


FAMILY = Param(
    "export",
    "family",
    Literal[tuple(FAMILIES)],
    DEFAULT_FAMILY,
    "the model family: a folder of tasks/ declaring its stages and the DAG a recipe of it expands "
    "into (tasks.contract.FAMILIES)",
)
TARGETS_PARAM = Param(
    "compile",
    "targets",
    list[str],
    [DEFAULT_TARGET],
    "the SoCs to compile for (tasks/qnn/targets.py): one compile and verify stage each",
    limits={"min_length": 1},
    check=_one_of_each,
)
#: the keys every family's plan reads (a family's own: :attr:`tasks.contract.model_family.Family.params`)
PLAN_PARAMS = (FAMILY, TARGETS_PARAM)

# ---------------------------------------------------------------- export

SEQUENCE_LENGTH = Param(
    "export",
    "sequence_length",
    int,
    128,
    "tokens per call (encoder), or the prefill length AR-N (llm)",
    limits={"ge": 1, "le": 131_072},
)

# ---------------------------------------------------------------- quantize


def _four_bit_only(param: str, default):
    def check(v, earlier):
        precision = earlier.get("precision")
        if v != default and precision not in (None, FOUR_BIT):
            raise ValueError(
                f"expected {json.dumps(default)} with precision {precision} (it applies to 4-bit "
                f"weights: precision {FOUR_BIT}; set it to null where it comes through extends), "
                f"found {json.dumps(v)}"
            )
        if v != default and param != "embedding_bits" and earlier.get("per_channel") is False:
            raise ValueError(
                f"expected per_channel: true with {param} {json.dumps(v)} (block-wise and GPTQ "
                f"weights have scales per output channel), found per_channel: false"
            )
        return v

    return check


PRECISION = Param(
    "quantize",
    "precision",
    Literal[PRECISION_NAMES],
    DEFAULT_PRECISION,
    "weight and activation types (tasks/qnn/precisions.py)",
)
PER_CHANNEL = Param("quantize", "per_channel", bool, True, "one weight scale per output channel")
BLOCK_SIZE = Param(
    "quantize",
    "block_size",
    Literal[16, 32, 64, 128] | None,
    None,
    "4-bit weights: null = per-channel, else rows of in-features per block (LPBQ, "
    "tasks/qnn/weights.py); in-features must divide by it (checked at load against config.json)",
    check=_four_bit_only("block_size", None),
    after=("precision", "per_channel"),
)
ROUNDING = Param(
    "quantize",
    "rounding",
    Literal["nearest", "gptq"],
    "nearest",
    "4-bit weights: round to nearest, or GPTQ on the calibration set (tasks/qnn/weights.py)",
    check=_four_bit_only("rounding", "nearest"),
    after=("precision", "per_channel"),
)


def _gptq_only(v, earlier):
    if v is not None and v % 32:  # tasks.qnn.gptq.SPAN_ALIGN (not imported: it would lengthen the import chain)
        raise ValueError(f"expected a multiple of 32, found {v}")
    if v is not None and earlier.get("rounding") not in (None, "gptq"):  # None: rounding failed, unknown
        raise ValueError(
            f"expected null with rounding {json.dumps(earlier.get('rounding', 'nearest'))} (it applies "
            f"to rounding: gptq; set it to null where it comes through extends), found {json.dumps(v)}"
        )
    return v


GPTQ_SPAN = Param(
    "quantize",
    "gptq_span",
    int | None,
    None,
    "GPTQ: the widest input whose Hessian is taken whole (a multiple of 32); a wider input's is cut "
    "into equal diagonal blocks no wider than this, a row's rounding error carried to the "
    "later rows of its block only (tasks/qnn/gptq.py spans): the factor costs K x span^2 multiply-adds "
    "instead of K^3, the Hessian sums K x span per row instead of K^2. null: the whole Hessian "
    "(the reference method)",
    limits={"ge": 32},
    check=_gptq_only,
    after=("rounding",),
)
EMBEDDING_BITS = Param(
    "quantize",
    "embedding_bits",
    Literal[8, 16],
    16,
    "bits of Gather tables (the token embedding); 8 is taken with 4-bit weights only",
    check=_four_bit_only("embedding_bits", 16),
    after=("precision", "per_channel"),
)
CALIBRATION_FILE = Param(
    "quantize",
    "calibration.file",
    str,
    REQUIRED,
    "the calibration set: a text file, one sample per line (LLMs: also .jsonl chat "
    "conversations), relative to the project root",
)
CALIBRATION_SAMPLES = Param(
    "quantize",
    "calibration.samples",
    int,
    16,
    "calibration samples taken from the file",
    limits={"ge": 1, "le": 100_000},
)
OVERRIDES = Param(
    "quantize",
    "overrides",
    "tasks.contract.override:OVERRIDES",
    [],
    "weights kept at other bit widths, by initializer name",
)
#: the quantize params an LLM part's graphs take (``quantize`` and ``genie_quantize``;
#: ``calibration`` is read by the ``calibrate`` stage)
LLM_QUANT_PARAMS = (PRECISION, PER_CHANNEL, BLOCK_SIZE, ROUNDING, GPTQ_SPAN, EMBEDDING_BITS, OVERRIDES)
KV_BITS = Param(
    "quantize",
    "kv_bits",
    Literal[8, 16, 32],
    8,
    "the KV cache at the LLM graphs' boundary, genai's past_/present_* and Genie's past_*_in/_out "
    "alike: 8 = uint8 symmetric, one scale per layer and K/V (AI Hub's on-device layout; "
    "tasks/llm/boundary.py), 16 = uint16 over the layer's range, 32 = float32 (read by quantize and "
    "genie_quantize)",
)

# ---------------------------------------------------------------- compile

WEIGHT_SHARING = Param(
    "compile",
    "weight_sharing",
    bool,
    True,
    "compile prefill+decode of a part into one binary (read by compile, genie_compile, bundle)",
)

# ---------------------------------------------------------------- verify

BACKEND = Param(
    "verify",
    "backend",
    Literal["htp", "cpu-qdq"],
    "htp",
    "htp: the compiled binaries on the HTP simulator; cpu-qdq: the QDQ graphs on the CPU EP",
)
DATA_FILE = Param(
    "verify",
    "data.file",
    str,
    REQUIRED,
    "the verify set: a text file, one sample per line, relative to the project root",
)
DATA_SAMPLES = Param(
    "verify", "data.samples", int, 16, "verify samples taken from the file", limits={"ge": 1, "le": 100_000}
)


def range_text(low: float, low_in: bool, high: float) -> str:
    """``>= 0`` / ``in (0, 1]``: a threshold's range as error messages print it."""
    if high == math.inf:
        return f"{'>=' if low_in else '>'} {low:g}"
    return f"in {'[' if low_in else '('}{low:g}, {high:g}]"


def raise_at(problems: list[tuple[tuple, str, Any]]):
    """Raise a ValidationError with one error per ``(loc below the field, message, input)``,
    so each problem gets its own key path (e.g. ``verify.thresholds.cosine_min``)."""
    from pydantic import ValidationError
    from pydantic_core import InitErrorDetails, PydanticCustomError

    raise ValidationError.from_exception_data(
        "recipe",
        [
            InitErrorDetails(type=PydanticCustomError("out_of_range", msg), loc=loc, input=value)
            for loc, msg, value in problems
        ],
    )


def _thresholds(v, earlier):
    """Known names (declared by a verify implementation), finite values, each in its range."""
    from tasks.contract import implementations

    known = {t.name: t for st in implementations("verify") for t in st.thresholds}
    bad = [k for k in v if k not in known]
    if bad:
        raise ValueError(f"expected threshold names from {sorted(known)}, found {bad}")
    nan = [k for k, x in v.items() if not math.isfinite(x)]
    if nan:
        raise ValueError(f"expected finite thresholds, found {nan}")
    out = []
    for k, x in v.items():
        t = known[k]
        high = (earlier.get("max_new_tokens") or math.inf) if t.high is None else t.high  # None: unknown (failed)
        if not (t.low <= x <= high) or (x == t.low and not t.low_in):
            out.append(((k,), f"expected {t.what} {range_text(t.low, t.low_in, high)}, found {x!r}", x))
    if out:
        raise_at(out)
    return v


THRESHOLDS = Param(
    "verify",
    "thresholds",
    dict[str, float],
    {},
    "bars the verify figures must meet, by name (each verify implementation declares the ones "
    "it measures); a failed bar fails the build",
    check=_thresholds,
    after=("max_new_tokens",),
)

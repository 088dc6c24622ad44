"""The audio family (``export.family: audio``): a sound model that ships as a finished ONNX graph
called once per frame with a recurrent state (Silero VAD inside the silero-vad wheel), built
download -> export (the graph made static: ``tasks/qnn/prepare.py``; the state a plain float
input and output) -> quantize -> compile -> verify.

What is family-wide lives here: the recipe keys several of its stages read, each defined once,
what it refuses at load (:func:`preflight`), and the input sets its quantize and verify make
(:func:`clip_set`): the lines of a data file spoken by espeak-ng voices, each between stretches of
silence or noise (``tasks/audio/speech.py``), so the speech spans are known; calibration and
verify sets use other lines (files) and other voices.
"""

from __future__ import annotations

from typing import Literal

from tasks.contract.model_family import Family
from tasks.contract.stage import Param

NOISE = ("silence", "white", "brown")

CAL_VOICES = Param(
    "quantize",
    "calibration.voices",
    list[str] | None,
    None,
    "audio: espeak-ng voices that speak the calibration lines, in turn",
)
CAL_SEED = Param(
    "quantize", "calibration.seed", int, 0, "audio: the seed of the silences and noises around speech", limits={"ge": 0}
)
CAL_NOISE = Param(
    "quantize",
    "calibration.noise",
    list[Literal[NOISE]],
    list(NOISE),
    "audio: what may surround the speech: silence, white or brown noise",
)
VER_VOICES = Param(
    "verify",
    "data.voices",
    list[str] | None,
    None,
    "audio: espeak-ng voices that speak the verify lines, none of the calibration's",
)
VER_SEED = Param(
    "verify", "data.seed", int, 1, "audio: the seed of the silences and noises around speech", limits={"ge": 0}
)
VER_NOISE = Param(
    "verify",
    "data.noise",
    list[Literal[NOISE]],
    list(NOISE),
    "audio: what may surround the speech: silence, white or brown noise",
)


def preflight(recipe) -> list[tuple[str, str]]:
    """What an audio recipe lacks or contradicts, before any stage runs: ``export.stream`` and
    the voices, voices shared by calibration and verify, one file for both."""
    e, cal, data = recipe.export, recipe.quantize.calibration, recipe.verify.data
    out = [
        (k, "expected a value in an audio recipe, found nothing")
        for k, v in (
            ("export.stream", e.stream),
            ("quantize.calibration.voices", cal.voices),
            ("verify.data.voices", data.voices),
        )
        if not v
    ]
    if shared := sorted(set(cal.voices or ()) & set(data.voices or ())):
        out.append(
            (
                "verify.data.voices",
                f"expected voices the calibration set does not use (a held-out set), found {shared} in both",
            )
        )
    if cal.file == data.file:
        out.append(
            (
                "verify.data.file",
                f"expected a file other than the calibration's (a held-out set), found {data.file!r} in both",
            )
        )
    if recipe.patches:
        out.append(
            (
                "patches",
                f"expected none in {FAMILY.title} recipe (export rewrites the graph: "
                f"tasks/qnn/prepare.py), found {[s.name for s in recipe.patches]}",
            )
        )
    return out


def io_of(folder) -> dict:
    """The ``io.json`` the export wrote (copied along by the stages after it) in ``folder``."""
    import json
    from pathlib import Path

    return json.loads((Path(folder) / "io.json").read_text(encoding="utf-8"))


def clip_set(lines: list[str], voices: list[str], seed: int, noise: list[str], stream: dict) -> list[dict]:
    """One clip per line (:func:`tasks.audio.speech.clips`), each with its calls: "seq", the
    graph's feeds in order ({stream input: [1, context + frame] float32, each recurrent input:
    zeros of its shape, given in the first feed only}), "frames" the count."""
    from tasks.audio import frames as F, speech as S

    out = []
    for c in S.clips(lines, voices, seed, stream["rate"], tuple(noise)):
        calls = F.frames(c["audio"], stream["frame"], stream["context"])
        c["seq"] = [{stream["input"]: x[None]} for x in calls]
        c["frames"] = len(calls)
        out.append(c)
    return out


def first_state(io: dict) -> dict:
    """{recurrent input: zeros of its shape and dtype} from the export's ``io.json``."""
    import numpy as np

    rec = io["stream"]["recurrent"]
    return {i["name"]: np.zeros(i["shape"], np.float32) for i in io["inputs"] if i["name"] in rec}


def key_material() -> dict:
    """What draws the clips besides the recipe's params: espeak-ng's version."""
    from tasks.audio.speech import espeak_version

    return {"espeak-ng": espeak_version()}


def plan(p) -> list:
    """The stage specs of a audio recipe, in build order (``p``: a :class:`tasks.recipe.plan.Planner`):
    download -> export -> quantize -> compile -> verify, one compile and verify per target
    (``compile@<target>``, ``verify@<target>`` with several). Patch steps do not apply: the graph
    is rewritten at export (``tasks/qnn/prepare.py``); a recipe that names some is refused
    (:func:`preflight`)."""
    r = p.recipe
    specs = [
        p.download(),
        p.spec("export", "export", p.params("export"), {"source": "download"}),
        p.spec(
            "quantize", "quantize", p.params("quantize"), {"model": "export", "source": "download"}, p.files("quantize")
        ),
    ]
    for t, suffix in p.targets():
        specs.append(p.spec(f"compile{suffix}", "compile", {"target": t, **p.params("compile")}, {"model": "quantize"}))
        specs.append(
            p.spec(
                f"verify{suffix}",
                "verify",
                {**p.params("verify"), "target": t, "task": r.task},
                {"compiled": f"compile{suffix}", "qdq": "quantize", "reference": "export", "source": "download"},
                p.files("verify"),
            )
        )
    return specs


#: the bar an audio recipe that sets no ``verify.thresholds`` is judged by: the one the shipped
#: recipe sets (recipes/silero-vad-w8a16.yaml; measured 0.9937 on the simulator)
DEFAULT_THRESHOLDS = {"frame_agreement": 0.98}


def default_thresholds(recipe) -> dict[str, float]:
    """:data:`DEFAULT_THRESHOLDS` when the recipe sets no ``verify.thresholds`` (absent, or null
    through ``extends``), else {} (``Family.default_thresholds``)."""
    return {} if "thresholds" in recipe.verify.model_fields_set else dict(DEFAULT_THRESHOLDS)


FAMILY = Family(
    name="audio",
    title="an audio",
    stages={
        "download": "tasks.sources.download",
        "export": "tasks.audio.export",
        "quantize": "tasks.audio.quantize",
        "compile": "tasks.audio.compile",
        "verify": "tasks.audio.verify",
    },
    plan=plan,
    source_kind="onnx",
    default_thresholds=default_thresholds,
)

"""The vision family (``export.family: vision``): an image model that ships as a finished ONNX
graph (PP-OCR's det, rec and cls inside rapidocr-onnxruntime), built download -> export
(the graph made static: ``tasks/qnn/prepare.py``) -> quantize -> compile -> verify.

What is family-wide lives here: the recipe keys several of its stages read, each defined once
(:class:`tasks.contract.stage.Param`), what it refuses at load (:func:`preflight`), and the
input sets its quantize and verify make (:func:`samples`): text rendered in the recipe's
fonts from the lines of its data files, one sample per line, and photos a wheel ships.

``export.decode`` says what the graph's output is and so which samples it gets:

- ``ctc`` (text recognition, PP-OCR rec): a line image of the line's text; truth: the text;
- ``db`` (text detection, PP-OCR det): a page of ``export.preprocess.size`` holding the file's
  lines from line ``PAGE_LINES x i`` on (wrapping around), as many as fit; truth: each line's
  ink box; ``verify.data.photos``
  adds photos (no truth: judged against fp32's boxes only);
- ``cls`` (text orientation, PP-OCR cls): the line image upright for an even sample, turned by
  180 degrees for an odd one; truth: "0" or "180".

Font and size of sample i: ``fonts[i % len(fonts)]`` at ``sizes[i % len(sizes)]`` px.
"""

from __future__ import annotations

from typing import Literal

from tasks.contract.model_family import Family
from tasks.contract.stage import Param

DECODERS = ("ctc", "db", "cls")
#: lines a page of sample i starts after (``db``): pages of different samples hold different lines
PAGE_LINES = 14

PREPROCESS = Param(
    "export",
    "preprocess",
    "tasks.vision.schema:OPTIONAL_PREPROCESS",
    None,
    "vision: how an image becomes the graph's input (size, resize, mean/std, channel order); its "
    "input dims follow from size",
)
DECODE = Param(
    "export",
    "decode",
    Literal[DECODERS] | None,
    None,
    "vision: what the output is, so how verify reads it and which inputs quantize and verify make: "
    "ctc (text lines), db (text boxes on pages), cls (0 / 180 degree lines)",
)
CAL_FONTS = Param(
    "quantize",
    "calibration.fonts",
    list[str] | None,
    None,
    "vision: fonts the calibration text is rendered in (tasks/vision/inputs.py FONTS)",
)
CAL_SIZES = Param("quantize", "calibration.sizes", list[int] | None, None, "vision: font sizes in px, taken in turn")
VER_FONTS = Param(
    "verify",
    "data.fonts",
    list[str] | None,
    None,
    "vision: fonts the verify text is rendered in, none of the calibration's",
)
VER_SIZES = Param("verify", "data.sizes", list[int] | None, None, "vision: font sizes in px, taken in turn")
VER_PHOTOS = Param(
    "verify",
    "data.photos",
    list[str],
    [],
    "vision, db: photos a wheel ships verified too (tasks/vision/inputs.py PHOTOS: page)",
)


def preflight(recipe) -> list[tuple[str, str]]:
    """What a vision recipe lacks or contradicts, before any stage runs: the keys it must set,
    fonts and photos it names that do not exist, and calibration and verify sets that share a
    data file or a font (the verify set must be held out)."""
    from tasks.vision.inputs import FONTS, PHOTOS

    e, cal, data = recipe.export, recipe.quantize.calibration, recipe.verify.data
    out = []
    for key, value in (
        ("export.preprocess", e.preprocess),
        ("export.decode", e.decode),
        ("quantize.calibration.fonts", cal.fonts),
        ("quantize.calibration.sizes", cal.sizes),
        ("verify.data.fonts", data.fonts),
        ("verify.data.sizes", data.sizes),
    ):
        if not value:
            out.append((key, "expected a value in a vision recipe, found nothing"))
    for key, fonts in (("quantize.calibration.fonts", cal.fonts), ("verify.data.fonts", data.fonts)):
        if bad := [f for f in fonts or () if f not in FONTS]:
            out.append((key, f"expected fonts from {sorted(FONTS)}, found {bad}"))
    if shared := sorted(set(cal.fonts or ()) & set(data.fonts or ())):
        out.append(
            (
                "verify.data.fonts",
                f"expected fonts the calibration set does not use (a held-out set), found {shared} in both",
            )
        )
    if cal.file == data.file:
        out.append(
            (
                "verify.data.file",
                f"expected a file other than the calibration's (a held-out set), found {data.file!r} in both",
            )
        )
    if bad := [p for p in data.photos if p not in PHOTOS]:
        out.append(("verify.data.photos", f"expected photos from {sorted(PHOTOS)}, found {bad}"))
    if data.photos and e.decode != "db":
        out.append(
            (
                "verify.data.photos",
                f"expected none with export.decode {e.decode} (photos have no truth "
                f"but boxes against fp32's: db only), found {data.photos}",
            )
        )
    if any(s < 6 or s > 200 for s in (cal.sizes or []) + (data.sizes or [])):
        out.append(("quantize.calibration.sizes", "expected font sizes of 6..200 px"))
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


def key_files(fonts) -> dict[str, str]:
    """{font: xxh3 of its file} for a stage key: the fonts a set is rendered in are inputs too."""
    from tasks.store import digest
    from tasks.vision.inputs import font_file

    return {f: digest.file_digest(font_file(f)) for f in sorted(set(fonts or ()))}


def file_lines(path) -> list[str]:
    """Every non-empty, stripped line of a data file (as :func:`tasks.datafiles.read_lines` reads
    them): what the pages of a ``db`` set are written with."""
    from pathlib import Path

    return [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]


def samples(
    decode: str,
    lines: list[str],
    fonts: list[str],
    sizes: list[int],
    pre: dict,
    photos: tuple[str, ...] = (),
    pool: list[str] | None = None,
) -> list[dict]:
    """The input set of ``lines`` (one sample each, module docstring; ``pool``: every line of
    the file, what pages are written with), then ``photos``: [{"x": float32 [1, 3, H, W] (the
    graph's input), "image": uint8 [h, w, 3] as rendered, "truth": text | boxes | label | None,
    "text": the line, "font", "size"}]."""
    from tasks.vision import inputs as I

    H, W = pre["size"]
    pool = pool or lines
    out = []
    for i, line in enumerate(lines):
        font, size = fonts[i % len(fonts)], sizes[i % len(sizes)]
        if decode == "db":
            start = PAGE_LINES * i % len(pool)
            img, boxes = I.page_image(pool[start:] + pool[:start], font, size, W, H, seed=i)
            line = pool[start]
            truth = [list(b) for b in boxes]
        else:
            img = I.line_image(line, font, size)
            truth = line
            if decode == "cls":
                truth = "180" if i % 2 else "0"
                img = I.rotate180(img) if i % 2 else img
        out.append(
            {"image": img, "truth": truth, "text": line, "font": font, "size": size, "x": I.preprocess(img, pre)}
        )
    for p in photos:
        img = I.photo(p)
        out.append(
            {"image": img, "truth": None, "text": f"photo {p}", "font": None, "size": None, "x": I.preprocess(img, pre)}
        )
    return out


def plan(p) -> list:
    """The stage specs of a vision recipe, in build order (``p``: a :class:`tasks.recipe.plan.Planner`):
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


#: the bar a vision recipe that sets no ``verify.thresholds`` is judged by, per ``export.decode``:
#: the one each shipped recipe sets (recipes/ppocrv4-rec-w8a16.yaml, ppocrv4-det-w8a16.yaml,
#: ppocr-cls-w8a16.yaml; measured 20/20 lines, 38/38 boxes, 32/32 orientations on the simulator)
DEFAULT_THRESHOLDS = {
    "ctc": {"text_exact_fp32": 0.95},
    "db": {"boxes_matched_fp32": 0.97},
    "cls": {"cls_accuracy": 1.0},
}


def default_thresholds(recipe) -> dict[str, float]:
    """:data:`DEFAULT_THRESHOLDS` of the recipe's decode when it sets no ``verify.thresholds``
    (absent, or null through ``extends``), else {} (``Family.default_thresholds``)."""
    if "thresholds" in recipe.verify.model_fields_set:
        return {}
    return dict(DEFAULT_THRESHOLDS.get(recipe.export.decode, {}))


FAMILY = Family(
    name="vision",
    title="a vision",
    stages={
        "download": "tasks.sources.download",
        "export": "tasks.vision.export",
        "quantize": "tasks.vision.quantize",
        "compile": "tasks.vision.compile",
        "verify": "tasks.vision.verify",
    },
    plan=plan,
    source_kind="onnx",
    default_thresholds=default_thresholds,
)

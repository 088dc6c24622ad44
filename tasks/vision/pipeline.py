"""A page read by published OCR bundles: text detection -> orientation -> recognition, each a
published vision bundle (``dist/<recipe>/``: ``model_ctx.onnx`` + its context binary, ``io.json``,
``metadata.json``, ``manifest.json``) run on QNN HTP (the simulator on x86_64), and the same
pipeline over the fp32 graphs the bundles were built from (the source file their
``manifest.json`` names, made static as ``io.json`` says: :func:`tasks.qnn.prepare.prepare`),
for comparison. ``scripts/ocr_page.py`` is its command line.

Steps: the page preprocessed as the det bundle's ``io.json`` says, its boxes (DB,
:func:`tasks.vision.decode.db_boxes`) mapped back to the page and sorted top to bottom; each box's
crop turned upright when cls says "180"; a crop wider than the rec input's aspect ratio cut at
the emptiest columns into pieces that fit (PP-OCRv4 rec's 48 x 320 input squeezes a longer
line); each piece read (CTC) and the pieces joined with a space. Text: one line per box.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tasks.proc import lazy

np = lazy.module("numpy")


class Bundle:
    """One published vision bundle: its ``io.json``, its metadata, and how to run it."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.io = json.loads((self.folder / "io.json").read_text(encoding="utf-8"))
        meta = self.folder / "metadata.json"
        self.meta = json.loads(meta.read_text(encoding="utf-8")) if meta.is_file() else {}
        self.manifest = json.loads((self.folder / "manifest.json").read_text(encoding="utf-8"))
        self.target = self.manifest["resolved_recipe"]["compile"]["targets"][0]

    def fp32_graph(self, work: Path) -> Path:
        """The fp32 graph this bundle was built from: its recipe's source file, prepared as its
        ``io.json`` says (the export's own rewrites), into ``work``."""
        from tasks.qnn.prepare import prepare
        from tasks.sources import single_file

        src = single_file(self.manifest["resolved_recipe"]["source"])
        dst = work / f"{self.folder.name}.onnx"
        H, W = self.io["preprocess"]["size"]
        prepare(src, dst, {self.io["inputs"][0]["name"]: [1, 3, H, W]}, {})
        return dst


def _run(bundle: Bundle, xs: list, fp32: Path | None) -> list:
    """The first output of ``bundle`` for each input of ``xs``: on HTP, or on the CPU through
    ``fp32`` when given."""
    from tasks.qnn.run_arrays import cpu_sequences, htp_sequences

    if not xs:
        return []
    name = bundle.io["inputs"][0]["name"]
    seqs = [[{name: x}] for x in xs]
    outs = cpu_sequences(fp32, seqs) if fp32 else htp_sequences(bundle.folder / "model_ctx.onnx", bundle.target, seqs)
    return [next(iter(o[0].values())) for o in outs]


def pieces(crop, max_ratio: float) -> list:
    """``crop`` (uint8 [h, w, 3]) cut into pieces no wider than ``max_ratio`` x its height, each cut
    at the column with the least ink in the last third of the allowed width (a gap between
    words, where there is one)."""
    h, w = crop.shape[:2]
    limit = max(8, int(max_ratio * h))
    ink = (255 - crop.mean(-1)).sum(0)
    out, start = [], 0
    while w - start > limit:
        lo = start + 2 * limit // 3
        cut = lo + int(np.argmin(ink[lo : start + limit]))
        out.append(crop[:, start:cut])
        start = cut
    out.append(crop[:, start:])
    return out


def read_page(img, det: Bundle, cls: Bundle, rec: Bundle, fp32: dict | None = None) -> dict:
    """The text of page ``img`` (uint8 [H, W, 3] RGB) through the three bundles (``fp32``:
    {"det", "cls", "rec": prepared fp32 graph} to run the fp32 pipeline instead). Returns
    {"lines": [text], "boxes": [(x0, y0, x1, y1)] in page pixels, "turned": [bool]}."""
    from tasks.vision import decode as D
    from tasks.vision.inputs import preprocess, rotate180

    fp32 = fp32 or {}
    H, W = det.io["preprocess"]["size"]
    scale = 1.0 / min(H / img.shape[0], W / img.shape[1])  # page pixels per input pixel ("fit")
    prob = _run(det, [preprocess(img, det.io["preprocess"])], fp32.get("det"))[0]
    boxes = D.db_boxes(prob, scale)
    crops = [D.crop(img, b) for b in boxes]
    labels = [
        D.CLS_LABELS[int(np.argmax(o))]
        for o in _run(cls, [preprocess(c, cls.io["preprocess"]) for c in crops], fp32.get("cls"))
    ]
    crops = [rotate180(c) if lab == "180" else c for c, lab in zip(crops, labels)]
    rh, rw = rec.io["preprocess"]["size"]
    parts = [pieces(c, 0.98 * rw / rh) for c in crops]
    flat = [p for ps in parts for p in ps]
    texts = iter(
        D.ctc_greedy(o, D.characters(rec.meta))
        for o in _run(rec, [preprocess(p, rec.io["preprocess"]) for p in flat], fp32.get("rec"))
    )
    lines = [" ".join(next(texts).strip() for _ in ps).strip() for ps in parts]
    return {"lines": lines, "boxes": [[round(v, 1) for v in b] for b in boxes], "turned": [x == "180" for x in labels]}


def compare(det_dir: Path, cls_dir: Path, rec_dir: Path, img) -> dict:
    """:func:`read_page` through the bundles on HTP and through their fp32 graphs on the CPU:
    {"npu": ..., "fp32": ..., "cer_vs_fp32": the character error rate of the NPU text against
    the fp32 text (lines joined by newlines)}."""
    from tasks.vision.decode import cer

    b = {"det": Bundle(det_dir), "cls": Bundle(cls_dir), "rec": Bundle(rec_dir)}
    with tempfile.TemporaryDirectory(prefix="ocr-page-") as tmp:
        graphs = {k: v.fp32_graph(Path(tmp)) for k, v in b.items()}
        ref = read_page(img, b["det"], b["cls"], b["rec"], graphs)
    got = read_page(img, b["det"], b["cls"], b["rec"])
    return {"npu": got, "fp32": ref, "cer_vs_fp32": cer("\n".join(got["lines"]), "\n".join(ref["lines"]))}

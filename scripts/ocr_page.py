"""Read a page with the published OCR bundles on the HTP simulator (on a Snapdragon: the NPU):
PP-OCRv4 det -> PP-OCR cls -> PP-OCRv4 rec (``tasks/vision/pipeline.py``), and the same pipeline
over the fp32 graphs they were built from; prints the text and its character error rate against
the fp32 pipeline's (and against the rendered text, for a rendered page).

    .venv/bin/doit publish:ppocrv4-det-w8a16 publish:ppocr-cls-w8a16 publish:ppocrv4-rec-w8a16
    .venv/bin/python scripts/ocr_page.py [--image PNG | --photo page] [--dist dist] [--json OUT]

Without --image or --photo it renders a page of held-out lines (recipes/data/ocr-lines-verify.txt,
Liberation Serif 22 px, 640 x 480). --photo page is scikit-image's photo of a printed page.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dist", default=str(ROOT / "dist"), help="where the bundles were published")
    ap.add_argument("--det", default="ppocrv4-det-w8a16")
    ap.add_argument("--cls", default="ppocr-cls-w8a16")
    ap.add_argument("--rec", default="ppocrv4-rec-w8a16")
    ap.add_argument("--image", help="a page image (PNG, JPEG)")
    ap.add_argument("--photo", help="a photo a wheel ships (tasks/vision/inputs.py PHOTOS: page)")
    ap.add_argument("--lines", type=int, default=8, help="rendered page: how many lines")
    ap.add_argument("--json", help="also write the full result here")
    a = ap.parse_args(argv)
    import numpy as np

    from tasks.vision import inputs as I
    from tasks.vision.decode import cer
    from tasks.vision.pipeline import compare

    truth = None
    if a.image:
        from PIL import Image

        img = np.asarray(Image.open(a.image).convert("RGB"))
    elif a.photo:
        img = I.photo(a.photo)
    else:
        lines = (ROOT / "recipes/data/ocr-lines-verify.txt").read_text(encoding="utf-8").splitlines()[: a.lines]
        img, boxes = I.page_image(lines, "LiberationSerif", 22, 640, 480, seed=0)
        truth = lines[: len(boxes)]
    dist = Path(a.dist)
    for name in (a.det, a.cls, a.rec):
        if not (dist / name / "manifest.json").is_file():
            print(
                f"ocr_page: no published bundle {dist / name}: run `.venv/bin/doit publish:{name}` first",
                file=sys.stderr,
            )
            return 2
    t = time.perf_counter()
    res = compare(dist / a.det, dist / a.cls, dist / a.rec, img)
    res["seconds"] = round(time.perf_counter() - t, 1)
    print("\n".join(res["npu"]["lines"]))
    print(
        f"--- {len(res['npu']['lines'])} lines; character error rate vs the fp32 pipeline's text: "
        f"{res['cer_vs_fp32']:.4f} ({res['seconds']} s)"
    )
    if truth is not None:
        res["cer_vs_truth"] = {
            k: cer("".join("\n".join(res[k]["lines"]).split()), "".join("\n".join(truth).split()))
            for k in ("npu", "fp32")
        }
        print(
            f"--- vs the rendered text (spaces ignored): npu {res['cer_vs_truth']['npu']:.4f}, "
            f"fp32 {res['cer_vs_truth']['fp32']:.4f}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

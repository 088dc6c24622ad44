"""The vision family's inputs (rendered text, the shipped page photo, the declared
preprocessing) and its task metrics (CTC, DB boxes, CER, IoU), on values known by construction."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.vision import decode as D, inputs as I
from tasks.vision.pipeline import pieces

PRE_LINE = {"size": [48, 320], "resize": "height", "mean": [0.5] * 3, "std": [0.5] * 3, "colour": "BGR", "pad": 0.0}


def test_phrases_pack_words_in_order_under_the_width():
    got = I.phrases(["The old lighthouse stood on a rock", "at the end of the bay."], 12)
    assert got == ["The old", "lighthouse", "stood on a", "rock at the", "end of the", "bay."]
    assert all(len(p) <= 12 for p in got)


def test_rendering_is_deterministic_and_the_page_truth_is_the_ink():
    a = I.line_image("Birds fly south.", "DejaVuSerif", 26)
    assert (
        a.dtype == np.uint8
        and a.shape[2] == 3
        and np.array_equal(a, I.line_image("Birds fly south.", "DejaVuSerif", 26))
    )
    page, boxes = I.page_image(["one line", "another line", "a third"], "LiberationSerif", 24, 640, 480, seed=3)
    assert page.shape == (480, 640, 3) and len(boxes) == 3
    for x0, y0, x1, y1 in boxes:  # ink inside each box, white around the page's lines
        assert page[y0:y1, x0:x1].min() < 100
    assert page[: boxes[0][1] - 2].min() == 255


def test_preprocess_height_keeps_the_ratio_and_pads_the_width():
    img = np.full((24, 80, 3), 255, np.uint8)
    img[:, :40] = 0
    x = I.preprocess(img, PRE_LINE)
    assert x.shape == (1, 3, 48, 320) and x.dtype == np.float32
    assert np.allclose(x[0, :, :, :70], -1.0, atol=1e-6) and np.allclose(x[0, :, :, 90:160], 1.0)  # black, white
    assert np.all(x[0, :, :, 160:] == 0.0)  # the padded width
    fit = I.preprocess(I.photo("page"), {**PRE_LINE, "size": [480, 640], "resize": "fit"})
    assert fit.shape == (1, 3, 480, 640) and fit[0, 0, 400:, 600:].min() == 1.0  # white canvas beyond the photo


def test_ctc_greedy_collapses_repeats_and_drops_blanks():
    alphabet = D.characters({"character": "a\nb\nc"})
    assert alphabet == ["blank", "a", "b", "c", " "]
    probs = np.eye(5)[[1, 1, 0, 1, 2, 2, 4, 3, 0, 0]][None]
    assert D.ctc_greedy(probs, alphabet) == "aab c"
    assert D.cer("kitten", "sitting") == pytest.approx(3 / 7) and D.cer("", "") == 0.0 and D.cer("x", "") == 1.0


def test_db_boxes_find_each_region_grown_by_the_unclip_ratio():
    prob = np.zeros((1, 1, 100, 200), np.float32)
    prob[0, 0, 10:20, 20:120] = 0.9
    prob[0, 0, 50:60, 30:80] = 0.9
    prob[0, 0, 80:82, 10:12] = 0.9  # smaller than DB's minimum side: dropped
    prob[0, 0, 85:95, 150:190] = 0.4  # above the threshold, mean below the box threshold: dropped
    boxes = D.db_boxes(prob)
    assert len(boxes) == 2
    w, h = 101, 11  # the region after the 2 x 2 dilation
    d = w * h * 1.6 / (2 * (w + h))
    assert boxes[0] == pytest.approx((20 - d, 10 - d, 121 + d, 21 + d))
    assert D.matched(boxes, [(12, 2, 129, 29), (0, 0, 5, 5)]) == 1 and D.iou(
        (0, 0, 2, 2), (1, 1, 3, 3)
    ) == pytest.approx(1 / 7)


def test_a_long_line_is_cut_into_pieces_the_recognizer_takes_at_a_gap():
    img = I.line_image("a line much too long for one piece of the recognizer", "DejaVuSans", 20)
    ps = pieces(img, 6.5)
    assert len(ps) > 1 and sum(p.shape[1] for p in ps) == img.shape[1]
    assert all(p.shape[1] <= 6.5 * img.shape[0] for p in ps)

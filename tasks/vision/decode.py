"""What the vision family's graph outputs mean, and how verify scores them (PP-OCR's
post-processing, as rapidocr-onnxruntime 1.4.4's ``config.yaml`` sets it, written in numpy):

- **rec** (CTC): per time step the argmax over ``["blank"] + characters + [" "]`` (the
  characters: the graph's ``character`` metadata, one per line, kept aside at export), repeats
  collapsed, blanks dropped (:func:`ctc_greedy`).
- **det** (DB): the probability map thresholded at 0.3, dilated by a 2 x 2 square, cut into
  connected regions; a region whose mean probability is below 0.5 is dropped; each kept
  region's bounding box is grown by ``area x 1.6 / perimeter`` on every side (DB's unclip)
  (:func:`db_boxes`). Axis-aligned boxes: the pages here hold horizontal text.
- **cls**: argmax over ``["0", "180"]`` (degrees the line is turned).

Scores: :func:`cer` (Levenshtein distance / reference length), :func:`matched` (boxes of one set
with a box of the other at IoU > 0.5), :func:`covered` (rendered lines inside a detected box).
"""

from __future__ import annotations

from tasks.proc import lazy

np = lazy.module("numpy")

#: PP-OCR det post-processing (rapidocr-onnxruntime config.yaml ``Det``)
DB_THRESH, DB_BOX_THRESH, DB_UNCLIP, DB_MIN_SIZE = 0.3, 0.5, 1.6, 3
#: cls labels, by output index (``Cls.label_list``)
CLS_LABELS = ("0", "180")


def characters(meta: dict) -> list[str]:
    """The CTC alphabet of PP-OCR rec: "blank", the lines of its ``character`` metadata, " "
    (PaddleOCR's ``use_space_char``). Raises KeyError when the metadata has no ``character``."""
    return ["blank", *meta["character"].splitlines(), " "]


def ctc_greedy(probs, alphabet: list[str]) -> str:
    """Text of rec output ``probs`` (float [1, T, C]): argmax per step, repeats collapsed,
    index 0 (blank) dropped."""
    idx = np.asarray(probs)[0].argmax(-1)
    out, prev = [], -1
    for i in idx:
        if i != prev and i != 0:
            out.append(alphabet[i])
        prev = i
    return "".join(out)


def squeeze_spaces(text: str) -> str:
    """``text`` without spaces: rec texts are compared this way (a 48 px line squeezed into the
    graph's width loses the gaps between words first)."""
    return "".join(text.split())


def cer(got: str, want: str) -> float:
    """Character error rate: Levenshtein distance (insertions, deletions, substitutions) from
    ``got`` to ``want`` over ``len(want)``; 0.0 for two empty strings, 1.0 for an empty ``want``
    against anything else."""
    if not want:
        return 0.0 if not got else 1.0
    prev = list(range(len(want) + 1))
    for i, a in enumerate(got, 1):
        cur = [i]
        for j, b in enumerate(want, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a != b)))
        prev = cur
    return prev[-1] / len(want)


def _components(mask) -> list:
    """Connected regions (4-neighbour) of boolean ``mask`` [H, W]: a list of (ys, xs) index
    arrays, by a union-find over each row's runs."""
    parent: list[int] = []

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    runs = []  # (row, x0, x1 exclusive, id)
    prev_row: list = []
    for y in range(mask.shape[0]):
        row = np.flatnonzero(np.diff(np.concatenate([[0], mask[y].astype(np.int8), [0]])))
        cur = []
        for x0, x1 in zip(row[::2], row[1::2]):
            rid = len(parent)
            parent.append(rid)
            for _, p0, p1, pid in prev_row:
                if p0 < x1 and x0 < p1:
                    ra, rb = find(rid), find(pid)
                    if ra != rb:
                        parent[max(ra, rb)] = min(ra, rb)
            cur.append((y, int(x0), int(x1), rid))
        runs.extend(cur)
        prev_row = cur
    groups: dict[int, list] = {}
    for y, x0, x1, rid in runs:
        groups.setdefault(find(rid), []).append((y, x0, x1))
    out = []
    for g in groups.values():
        ys = np.concatenate([np.full(x1 - x0, y) for y, x0, x1 in g])
        xs = np.concatenate([np.arange(x0, x1) for y, x0, x1 in g])
        out.append((ys, xs))
    return out


def db_boxes(prob, scale: float = 1.0) -> list[tuple[float, float, float, float]]:
    """Text boxes (x0, y0, x1, y1) in input pixels (times ``scale``) from det output ``prob``
    (float [1, 1, H, W]), by the module docstring's rule; sorted top to bottom, left to right."""
    p = np.asarray(prob, np.float32)[0, 0]
    mask = p > DB_THRESH
    dil = mask.copy()  # 2 x 2 dilation (DB's use_dilation), as cv2.dilate with a 2 x 2 kernel anchored top-left
    dil[1:, :] |= mask[:-1, :]
    dil[:, 1:] |= mask[:, :-1]
    dil[1:, 1:] |= mask[:-1, :-1]
    boxes = []
    for ys, xs in _components(dil):
        x0, x1, y0, y1 = xs.min(), xs.max() + 1, ys.min(), ys.max() + 1
        w, h = x1 - x0, y1 - y0
        if min(w, h) < DB_MIN_SIZE or float(p[y0:y1, x0:x1][dil[y0:y1, x0:x1]].mean()) < DB_BOX_THRESH:
            continue
        d = w * h * DB_UNCLIP / (2 * (w + h))
        boxes.append(
            tuple(
                float(v) * scale
                for v in (max(0, x0 - d), max(0, y0 - d), min(p.shape[1], x1 + d), min(p.shape[0], y1 + d))
            )
        )
    return sorted(boxes, key=lambda b: (round(b[1] / 8), b[0]))


def iou(a, b) -> float:
    """Intersection over union of boxes (x0, y0, x1, y1)."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def matched(boxes, others, at: float = 0.5) -> int:
    """How many of ``boxes`` have a box of ``others`` at IoU > ``at``."""
    return sum(1 for a in boxes if any(iou(a, b) > at for b in others))


def covered(truths, boxes, at: float = 0.9) -> int:
    """How many of boxes ``truths`` (a rendered line's ink) lie, at least ``at`` of their area,
    inside one box of ``boxes``: a line found. (IoU against an ink box undercounts: DB's unclip
    grows a box by a margin that is most of a small line's height.)"""

    def inside(t, b):
        ix = max(0.0, min(t[2], b[2]) - max(t[0], b[0]))
        iy = max(0.0, min(t[3], b[3]) - max(t[1], b[1]))
        return ix * iy / max(1e-9, (t[2] - t[0]) * (t[3] - t[1]))

    return sum(1 for t in truths if any(inside(t, b) >= at for b in boxes))


def crop(img, box, pad: int = 2):
    """The part of ``img`` (uint8 [H, W, 3]) inside ``box`` (x0, y0, x1, y1), ``pad`` px more on
    every side, clipped to the image."""
    h, w = img.shape[:2]
    x0, y0 = max(0, int(box[0]) - pad), max(0, int(box[1]) - pad)
    x1, y1 = min(w, int(np.ceil(box[2])) + pad), min(h, int(np.ceil(box[3])) + pad)
    return img[y0:y1, x0:x1]

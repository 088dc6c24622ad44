"""The vision family's inputs, made here and never downloaded: text rendered with Pillow in
fonts from Debian packages (``fonts-dejavu-core``, ``fonts-dejavu-extra``, ``fonts-liberation``;
``.ci/run`` installs them), and photos a wheel ships (scikit-image's ``skimage/data/page.png``,
a photo of a printed page, read as a file: the package is never imported). And the
preprocessing a recipe declares (``export.preprocess``), which turns an image into the graph's
input.

Text comes from the recipe's line files (``quantize.calibration.file``, ``verify.data.file``:
one sample per line), cut into phrases that fit the model's input (:func:`phrases`); which
font and size each sample gets is fixed by its index, so the same file and params give the
same images. Shapes: images are uint8 [H, W, 3] RGB; graph inputs float32 [1, 3, H, W].
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from tasks.errors import UserError
from tasks.proc import lazy

np = lazy.module("numpy")

#: font name (as recipes write it) -> where Debian installs it, and the package that does
FONTS = {
    "DejaVuSans": ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "fonts-dejavu-core"),
    "DejaVuSansMono": ("/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf", "fonts-dejavu-core"),
    "DejaVuSerif": ("/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf", "fonts-dejavu-core"),
    "DejaVuSansCondensed": ("/usr/share/fonts/truetype/dejavu/DejaVuSansCondensed.ttf", "fonts-dejavu-extra"),
    "LiberationSans": ("/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf", "fonts-liberation"),
    "LiberationSerif": ("/usr/share/fonts/truetype/liberation/LiberationSerif-Regular.ttf", "fonts-liberation"),
    "LiberationMono": ("/usr/share/fonts/truetype/liberation/LiberationMono-Regular.ttf", "fonts-liberation"),
}
#: photos shipped in wheels, by name: (import package, file inside its folder)
PHOTOS = {"page": ("skimage", "data/page.png")}


class InputError(UserError):
    """A font or photo an input set needs is not installed."""


def font_file(name: str) -> Path:
    """The file of font ``name`` (:data:`FONTS`). Raises InputError naming the Debian package
    when it is not installed, or KeyError for an unknown name."""
    path, package = FONTS[name]
    if not Path(path).is_file():
        raise InputError(f"font {name}: expected {path}, found nothing (apt-get install {package})")
    return Path(path)


def photo_file(name: str) -> Path:
    """The file of photo ``name`` (:data:`PHOTOS`), found in its package's folder without
    importing the package. Raises InputError when the package is not installed."""
    package, rel = PHOTOS[name]
    spec = importlib.util.find_spec(package)
    f = Path(list(spec.submodule_search_locations)[0]) / rel if spec and spec.submodule_search_locations else None
    if f is None or not f.is_file():
        raise InputError(
            f"photo {name}: expected {rel} of the installed package {package}, found nothing "
            f"(scripts/setup.sh installs scikit-image)"
        )
    return f


@functools.lru_cache(maxsize=64)
def _font(name: str, size: int):
    from PIL import ImageFont

    return ImageFont.truetype(str(font_file(name)), size)


def phrases(lines: list[str], max_chars: int) -> list[str]:
    """The words of ``lines`` (split on whitespace) packed greedily, in order, into phrases of at
    most ``max_chars`` characters (a longer word is a phrase of its own, cut to ``max_chars``):
    text that fits a line image of the model's width."""
    out, cur = [], ""
    for word in " ".join(lines).split():
        word = word[:max_chars]
        if cur and len(cur) + 1 + len(word) > max_chars:
            out.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    if cur:
        out.append(cur)
    return out


def line_image(text: str, font: str, size: int, pad: int = 6):
    """``text`` in black on white, ``font`` at ``size`` px, ``pad`` px around the ink:
    uint8 [H, W, 3]."""
    from PIL import Image, ImageDraw

    f = _font(font, size)
    left, top, right, bottom = f.getbbox(text)
    im = Image.new("RGB", (right - left + 2 * pad, bottom - top + 2 * pad), "white")
    ImageDraw.Draw(im).text((pad - left, pad - top), text, fill="black", font=f)
    return np.asarray(im)


def page_image(texts: list[str], font: str, size: int, width: int, height: int, seed: int):
    """A page: ``texts`` one per line in black on white, indented and spaced by
    ``numpy.random.default_rng(seed)``, as many as fit: (uint8 [height, width, 3], the ink box
    of each line drawn [(x0, y0, x1, y1)])."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    f = _font(font, size)
    im = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(im)
    y, boxes = 20, []
    for t in texts:
        x = int(rng.integers(10, 60))
        box = d.textbbox((x, y), t, font=f)
        if box[3] > height - 10:
            break
        if box[2] > width - 10:
            continue
        d.text((x, y), t, fill="black", font=f)
        boxes.append(tuple(int(v) for v in box))
        y = box[3] + int(rng.integers(12, 30))
    return np.asarray(im), boxes


def photo(name: str):
    """Photo ``name`` (:data:`PHOTOS`) as uint8 [H, W, 3] RGB."""
    from PIL import Image

    with Image.open(photo_file(name)) as im:
        return np.asarray(im.convert("RGB"))


def preprocess(img, pre: dict):
    """Image ``img`` (uint8 [h, w, 3] RGB) -> the graph input float32 [1, 3, H, W], as
    ``pre`` (``export.preprocess``) declares: ``size`` [H, W]; ``resize``: ``height`` (scaled to
    H keeping its aspect ratio, at most W wide, the rest of the width padded with ``pad``
    after normalising: PP-OCR rec and cls) or ``fit`` (scaled up or down to fit in H x W keeping
    its aspect ratio, placed top-left on a white canvas: PP-OCR det, whose own pre-processing
    scales a small image up too: rapidocr's ``limit_type: min``); ``colour``
    ``RGB`` or ``BGR`` (channel order fed); then ``(x / 255 - mean) / std`` per channel.
    Resampling: Pillow's bilinear."""
    from PIL import Image

    H, W = pre["size"]
    h, w = img.shape[:2]
    im = Image.fromarray(img)
    if pre["resize"] == "height":
        rw = max(1, min(W, int(np.ceil(H * w / h))))
        arr = np.asarray(im.resize((rw, H), Image.BILINEAR), np.float32)
        canvas = None
    else:
        s = min(H / h, W / w)
        rh, rw = min(H, max(1, int(round(h * s)))), min(W, max(1, int(round(w * s))))
        small = np.asarray(im.resize((rw, rh), Image.BILINEAR) if (rh, rw) != (h, w) else im, np.float32)
        canvas = np.full((H, W, 3), 255, np.float32)
        canvas[:rh, :rw] = small
        arr, rw = canvas, W
    if pre["colour"] == "BGR":
        arr = arr[..., ::-1]
    mean, std = np.asarray(pre["mean"], np.float32), np.asarray(pre["std"], np.float32)
    norm = ((arr / 255.0 - mean) / std).transpose(2, 0, 1)
    out = np.full((3, H, W), pre.get("pad", 0.0), np.float32)
    out[:, :, :rw] = norm[:, :, :rw]
    return out[None]


def rotate180(img):
    """``img`` turned upside down (what PP-OCR cls tells apart from upright)."""
    return np.ascontiguousarray(img[::-1, ::-1])

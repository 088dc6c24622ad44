"""Calibration feeds on disk (:class:`FeedStore`): what the calibrate stage records for quantize
(:mod:`tasks.llm.calibration_feeds` writes them; GPTQ, :mod:`tasks.qnn.seqgptq`, reads them one feed
and one layer's arrays at a time)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


class FeedStore:
    """Feed dicts kept on disk, one ``.npz`` each (:func:`save_npz`); a sequence (len, index,
    iteration) that loads one feed at a time. Also an onnxruntime ``CalibrationDataReader``
    (``get_next``/``rewind``). An array whose longest axis ends in all-zero slices over at
    least half its length is stored cut before them and padded back with zeros when read
    (exact): a KV buffer's empty cache slots, which for Qwen2.5-7B at C=4096 are ~95 % of a
    part's 117 MB decode feed (deflating those zeros took ~1 s a feed to write and ~0.1 s per
    layer to read back, benchmarks/README.md)."""

    def __init__(self, folder):
        self.dir = Path(folder)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.n = len(list(self.dir.glob("*.npz")))
        self._i = 0

    def add(self, feeds: dict) -> None:
        """Write ``feeds`` ({input name: array}) as the next file, whole or not at all (written
        under a temporary name, then renamed). Raises ValueError for a name this format
        cannot hold (``__cut__``, or one ending in ``.npy``)."""
        import os

        bad = [n for n in feeds if n == _CUTS or n.endswith(".npy")]
        if bad:
            raise ValueError(f"feed names: expected no {_CUTS!r} and none ending in '.npy', found {bad}")
        arrays, cuts = {}, {}
        for name, a in feeds.items():
            arrays[name], cut = _cut_zero_tail(np.asarray(a))
            if cut:
                cuts[name] = cut
        if cuts:
            arrays[_CUTS] = np.array(json.dumps(cuts, sort_keys=True))
        final = self.dir / f"{self.n:06d}.npz"
        tmp = final.with_suffix(".npz.tmp")
        save_npz(tmp, arrays)
        os.replace(tmp, final)
        self.n += 1

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return self.load(i, None)

    def __iter__(self):
        return (self[i] for i in range(self.n))

    def load(self, i: int, names) -> dict:
        """Feed ``i``'s arrays named in ``names`` (those it has): only these are read and
        padded (a piece of a part's graph reads one layer's KV cache of the feed); ``None``:
        every array."""
        with np.load(self.dir / f"{i % self.n:06d}.npz") as z:
            cuts = json.loads(str(z[_CUTS])) if _CUTS in z.files else {}
            names = [k for k in z.files if k != _CUTS] if names is None else [k for k in names if k in z.files]
            return {k: _pad_zero_tail(z[k], *cuts[k]) if k in cuts else z[k] for k in names}

    def get_next(self):
        if self._i >= self.n:
            return None
        self._i += 1
        return self[self._i - 1]

    def rewind(self):
        self._i = 0


#: the member of a :class:`FeedStore` file naming its cut arrays: {name: [axis, full length]}
_CUTS = "__cut__"


def _cut_zero_tail(a):
    """``(a cut, [axis, length] or None)``: ``a`` cut along its longest axis before the
    slices that end it with every bit zero (not -0.0), when they are at least half of that
    axis; else ``a`` as is. Numbers of 1, 2, 4 or 8 bytes only."""
    if a.ndim == 0 or a.dtype.kind not in "fiub" or a.itemsize not in (1, 2, 4, 8):
        return a, None
    ax = int(np.argmax(a.shape))
    n = a.shape[ax]
    if n < 2:
        return a, None
    bits = np.ascontiguousarray(a).view(f"u{a.itemsize}")
    used = np.flatnonzero(bits.any(axis=tuple(i for i in range(a.ndim) if i != ax)))
    m = int(used[-1]) + 1 if used.size else 0
    if m > n // 2:
        return a, None
    return a[(slice(None),) * ax + (slice(0, m),)], [ax, n]


def _pad_zero_tail(a, ax: int, n: int):
    """:func:`_cut_zero_tail` undone: ``a`` with zeros after it along ``ax`` up to length ``n``."""
    shape = list(a.shape)
    shape[ax] = n
    out = np.zeros(shape, a.dtype)
    out[(slice(None),) * ax + (slice(0, a.shape[ax]),)] = a
    return out


def save_npz(path, arrays: dict) -> None:
    """``np.savez`` (stored, not deflated: what is left of a feed once :class:`FeedStore` cuts its
    empty cache slots is mostly float data that deflate shrank by ~7 % at ~1 s a feed) with fixed
    zip member times, so the same arrays give the same bytes (numpy stamps each member with the
    current time; a calibration entry's output digest enters its quantize key, so it must not
    change between two builds of the same inputs)."""
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for name, a in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with z.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(a), allow_pickle=False)

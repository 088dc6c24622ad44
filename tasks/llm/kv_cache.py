"""The host KV cache of the LLM graphs' layers (:class:`KVCache`): the ``past_*`` buffers fed to
a part's graph and the ``present_*`` outputs copied back into them, as onnxruntime-genai keeps
them (the loop that drives it: :mod:`tasks.llm.runner`), saved and loaded whole (.npz).
"""

from __future__ import annotations

import numpy as np


class KVCache:
    """Host KV cache of some layers: per layer ``k[l]``, ``v[l]`` [1, Hkv, C, d] of ``dtype`` (the
    graphs' :attr:`tasks.llm.runner.PartGraph.kv_dtype`), zero bytes at first as genai allocates it (slot j =
    position j; slots >= n hold leftovers or zero bytes) and ``n``, the real tokens so far."""

    def __init__(self, layers, n_kv: int, C: int, head_dim: int, dtype=np.float32):
        self.dtype = np.dtype(dtype)
        self.k = {l: np.zeros((1, n_kv, C, head_dim), self.dtype) for l in layers}
        self.v = {l: np.zeros_like(self.k[l]) for l in layers}
        self.n = 0

    def past(self, layers) -> dict:
        """``past_key_{l}`` / ``past_value_{l}`` feeds: the buffers themselves."""
        out = {}
        for l in layers:
            out[f"past_key_{l}"], out[f"past_value_{l}"] = self.k[l], self.v[l]
        return out

    def write(self, layers, res: dict) -> None:
        """Copy the ``present_*`` outputs into the buffers. Copied, not taken: onnxruntime's
        output arrays keep the memory of the session that made them (its arena) alive, which
        held 4 GiB after a Qwen2.5-7B part's calibration graph was gone (the cache of its last
        prompt, 128 MiB, kept it). Raises TypeError when an output's dtype is not the cache's
        (``casting="no"``: bytes are copied, never converted)."""
        for l in layers:
            np.copyto(self.k[l], res[f"present_key_{l}"], casting="no")
            np.copyto(self.v[l], res[f"present_value_{l}"], casting="no")

    def save(self, path) -> None:
        """Write the cache to ``path`` (.npz, uncompressed), each buffer cut after its last slot
        that is not all zero bytes (slots past the prefill's last window are never written: a 7B
        part's buffers at C=4096 are 128 MiB, their written slots a few MiB); :meth:`load`
        puts the zeros back, so the round trip is exact, leftover slots included."""

        def cut(a):
            used = np.flatnonzero(a.any(axis=(0, 1, 3)))
            return a[:, :, : used[-1] + 1 if used.size else 0]

        np.savez(
            path,
            n=np.int64(self.n),
            **{f"k{l}": cut(a) for l, a in self.k.items()},
            **{f"v{l}": cut(a) for l, a in self.v.items()},
        )

    def load(self, path) -> None:
        """Restore a cache written by :meth:`save` (same layers and shapes)."""

        def full(a, like):
            out = np.zeros_like(like)
            out[:, :, : a.shape[2]] = a
            return out

        with np.load(path) as z:
            self.n = int(z["n"])
            self.k = {l: full(z[f"k{l}"], a) for l, a in self.k.items()}
            self.v = {l: full(z[f"v{l}"], a) for l, a in self.v.items()}

"""Greedy generation over the Genie-layout graphs of :func:`tasks.llm.genie.graphs.export_genie` on any
onnxruntime EP, fed as Genie's SMART_MASK KV manager feeds them (the graph contract is
:mod:`tasks.llm.genie.graphs`'s docstring): a reference for Genie's tokens and the calibration feeds
of the Genie parts (:meth:`GenieHostLoop.teacher_forced`)."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.proc import lazy
from tasks.llm.genie.graphs import GENIE_MASK_NEG

np = lazy.module("numpy")


def rope_half_tables(positions, rotary_dim: int, theta: float) -> tuple:
    """cos, sin float32 [len(positions), rotary_dim/2] as Genie computes them (default RoPE):
    ``inv_freq[j] = theta^(-j / (rotary_dim/2) / 2)``, i.e. HF's ``theta^(-2j/rotary_dim)``."""
    r = rotary_dim // 2
    inv = 1.0 / (theta ** (np.arange(r, dtype=np.float64) * 2.0 / rotary_dim))
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


class GenieHostLoop:
    """Greedy generation over Genie-layout graphs, feeding what Genie's SMART_MASK KV manager
    feeds (:mod:`tasks.llm.genie.graphs`'s docstring; ``KVCache/smart-mask.cpp``): the prompt in chunks of S from its
    start, the last chunk padded at its end (its pad rows fully masked); the host cache per
    layer keys [Hkv, 1, d, C-S_max] / values [Hkv, 1, C-S_max, d] ... sliced to each graph's
    P = C - S; after a call, the first n_process new entries go to slots n_past.. of the cache.
    Unwritten slots hold ``fill`` (0, or e.g. 7e34 to check that the graph ignores them).
    Graphs whose boundary tensors are quantized (``genie_export.json`` declares their dtype,
    scale and zero point: :mod:`tasks.llm.boundary`) are fed and read as Genie does: float
    inputs quantized, the first output dequantized, the KV cache kept as the graph's integers.

    Args:
        export_dir: a :func:`tasks.llm.genie.graphs.export_genie` folder.
        make_session: ``path -> onnxruntime.InferenceSession``.
        suffix: file suffix per graph (``".onnx"`` fp32 on CPU; ``"_ctx.onnx"`` compiled).
        upto: run parts ``0 .. upto-1`` only (default all): what calibrating part ``upto-1``
            needs (:meth:`teacher_forced`); only :meth:`generate` needs the last part.
    """

    def __init__(self, export_dir, make_session, suffix: str = ".onnx", fill: float = 0.0, upto: int | None = None):
        d = Path(export_dir)
        self.desc = json.loads((d / "genie_export.json").read_text())
        rel = lambda p: str(d / (p[: -len(".onnx")] + suffix))  # noqa: E731
        parts = self.desc["parts"][:upto]
        self.prompt = [make_session(rel(p["prompt"]["path"])) for p in parts]
        self.token = [make_session(rel(p["token"]["path"])) for p in parts]
        self.S, self.C, self.fill = self.desc["seq_len"], self.desc["context_len"], float(fill)
        # quantized boundary tensors (tasks/llm/boundary.py): {name: (dtype, scale, zero point)}
        self.enc = {
            t["name"]: (np.dtype(t["dtype"]), t["scale"], t["zero_point"])
            for p in parts
            for kind in ("prompt", "token")
            for t in p[kind]["inputs"] + p[kind]["outputs"]
            if "scale" in t
        }

    def new_cache(self) -> dict:
        """{layer: (keys [Hkv, 1, d, C], values [Hkv, 1, C, d])}, every slot ``fill``: float32, or
        for a KV cache quantized at the boundary its integers, empty slots at the zero point
        (what Genie clears an 8-bit cache to)."""
        D = self.desc

        def buf(name, shape):
            dt, _, z = self.enc.get(name, (np.dtype(np.float32), None, self.fill))
            return np.full(shape, z, dt)

        return {
            l: (
                buf(f"past_key_{l}_in", (D["num_kv_heads"], 1, D["head_dim"], self.C)),
                buf(f"past_value_{l}_in", (D["num_kv_heads"], 1, self.C, D["head_dim"])),
            )
            for l in range(D["num_layers"])
            if any(lo <= l < hi for lo, hi in (p["layers"] for p in D["parts"][: len(self.prompt)]))
        }

    def _quantize(self, name: str, x):
        """``x`` as the graph takes ``name``: quantized with its boundary encoding (onnxruntime's
        QuantizeLinear: round half to even, saturate), else as it is."""
        if name not in self.enc:
            return x
        dt, s, z = self.enc[name]
        info = np.iinfo(dt)
        return np.clip(np.rint(np.asarray(x, np.float32) / np.float32(s)) + z, info.min, info.max).astype(dt)

    def _dequantize(self, name: str, x):
        if name not in self.enc:
            return x
        _, s, z = self.enc[name]
        return ((x.astype(np.int32) - z) * np.float32(s)).astype(np.float32)

    def teacher_forced(self, prompt_ids, next_ids, on_feed) -> None:
        """Feed ``prompt_ids`` (prompt graph, chunks of S) then each of ``next_ids`` (token graph,
        one call each) as Genie would if it generated them, through the parts this loop holds;
        ``on_feed(kind, part, call, feeds)`` sees every call's feed dict of every part before it
        runs (``kind``: ``"prompt"`` / ``"token"``, ``call``: the call's index within its kind).
        The calibration schedule of :func:`tasks.llm.calibration_feeds.schedule` run in Genie's layout."""
        cache, n_past = self.new_cache(), 0
        toks = [int(t) for t in prompt_ids]
        for c, s in enumerate(range(0, len(toks), self.S)):
            chunk = toks[s : s + self.S]
            self._call(self.prompt, self.S, chunk, n_past, cache, lambda k, f, c=c: on_feed("prompt", k, c, f))
            n_past += len(chunk)
        for c, t in enumerate(next_ids):
            self._call(self.token, 1, [int(t)], n_past, cache, lambda k, f, c=c: on_feed("token", k, c, f))
            n_past += 1

    def _call(self, sessions, S, tokens, n_past, cache, before=None):
        C, P, n = self.C, self.C - S, len(tokens)
        ids = np.zeros((1, S), np.int32)
        ids[0, :n] = tokens
        mask = np.full((1, 1, S, C), GENIE_MASK_NEG, np.float32)
        for i in range(n):
            mask[0, 0, i, :n_past] = 0.0
            mask[0, 0, i, P : P + i + 1] = 0.0
        pos = np.arange(n_past, n_past + S)
        cos, sin = rope_half_tables(pos, self.desc["rotary_dim"], self.desc["rope_theta"])
        x = ids
        for k, sess in enumerate(sessions):
            first = sess.get_inputs()[0].name
            feeds = {
                first: x if k == 0 else self._quantize(first, x),
                **{
                    n: self._quantize(n, v)
                    for n, v in (
                        ("attention_mask", mask),
                        ("position_ids_cos", cos[None, None]),
                        ("position_ids_sin", sin[None, None]),
                    )
                },
            }
            lo, hi = self.desc["parts"][k]["layers"]
            for l in range(lo, hi):
                feeds[f"past_key_{l}_in"] = np.ascontiguousarray(cache[l][0][..., :P])
                feeds[f"past_value_{l}_in"] = np.ascontiguousarray(cache[l][1][:, :, :P])
            if before is not None:
                before(k, feeds)
            names = [o.name for o in sess.get_outputs()]
            res = dict(zip(names, sess.run(names, feeds)))
            for l in range(lo, hi):
                cache[l][0][..., n_past : n_past + n] = res[f"past_key_{l}_out"][..., :n]
                cache[l][1][:, :, n_past : n_past + n] = res[f"past_value_{l}_out"][:, :, :n]
            x = self._dequantize(names[0], res[names[0]])
        return x  # the last part's first output, float32: logits [1, 1, S, V] or hidden_states [1, S, D]

    def logits(self, ids) -> np.ndarray:
        """float32 [len(ids), V]: the last part's logits at every position of ``ids``, fed through
        the prompt graph in chunks of S as Genie feeds a prompt (teacher forced). Raises
        ValueError when ``ids`` do not fit the context."""
        if len(ids) > self.C - self.S:
            raise ValueError(f"{len(ids)} tokens do not fit CL={self.C} with AR={self.S}")
        cache, n_past, rows = self.new_cache(), 0, []
        toks = [int(t) for t in ids]
        for s in range(0, len(toks), self.S):
            chunk = toks[s : s + self.S]
            rows.append(self._call(self.prompt, self.S, chunk, n_past, cache)[0, 0, : len(chunk)])
            n_past += len(chunk)
        return np.concatenate(rows)

    def generate(self, prompt_ids, max_new_tokens: int, eos: int | None = None) -> list[int]:
        """Greedy continuation of ``prompt_ids`` (at most ``max_new_tokens``; stops after ``eos``
        when given). Raises ValueError when prompt + new tokens exceed the context."""
        if len(prompt_ids) + max_new_tokens > self.C - 1:
            raise ValueError(f"{len(prompt_ids)} + {max_new_tokens} tokens do not fit CL={self.C}")
        cache = self.new_cache()
        n_past, toks = 0, [int(t) for t in prompt_ids]
        for s in range(0, len(toks), self.S):
            chunk = toks[s : s + self.S]
            logits = self._call(self.prompt, self.S, chunk, n_past, cache)[0, 0, len(chunk) - 1]
            n_past += len(toks[s : s + self.S])
        out = []
        while len(out) < max_new_tokens:
            t = int(np.argmax(logits))
            out.append(t)
            if t == eos:
                break
            logits = self._call(self.token, 1, [t], n_past, cache)[0, 0, 0]
            n_past += 1
        return out

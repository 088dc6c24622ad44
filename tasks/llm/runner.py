"""Greedy prefill + decode loop over the static graphs of :mod:`tasks.llm.export` (any EP).

KV cache layout kept by the host (numpy, float32): per layer ``K, V`` of shape [1, Hkv, C, d];
entries ``0..n-1`` hold the ``n`` tokens processed so far (in order), the rest are zeros (masked).
A graph with S new tokens gets ``cache[:, :, :C-S]`` as ``past_*`` and returns the S new K/V, which
the runner copies into slots ``n..n+m-1`` (m real tokens). Bounds: a prefill chunk needs
``n <= C - S`` cached tokens before it; a decode step needs ``n <= C - 1``.

Prompt chunks shorter than S are *left*-padded: pad rows sit at the start of the new block, attend
only to themselves, and real rows never attend to them; so the last row is always the last real
token, which is what ``lm_head="last"`` graphs return. Positions of real tokens are ``n + j``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .export import MASK_VALUE

_PAST = re.compile(r"^past_(key|value)_(\d+)$")


class PartGraph:
    """One exported part graph's session and what the host needs to know of its inputs."""

    def __init__(self, session):
        self.sess = session
        self.inputs = {i.name: i for i in session.get_inputs()}
        self.output_names = [o.name for o in session.get_outputs()]
        self.mask_shape = list(self.inputs["attention_mask"].shape)  # [1,1,S,C]
        self.S, self.C = int(self.mask_shape[2]), int(self.mask_shape[3])
        self.layers = sorted({int(m.group(2)) for n in self.inputs if (m := _PAST.match(n))})
        self.first_input = next(n for n in ("input_ids", "inputs_embeds", "hidden_states_in")
                                if n in self.inputs)
        self.last = "logits" in self.output_names

    def call(self, x, pos, mask, cache: "KVCache", pad: int, m: int, before=None) -> dict:
        """Run one call (``x``: the first input; ``pos``/``mask``/``pad`` from :func:`block_inputs`)
        with this part's past K/V from ``cache``, write the ``m`` new K/V into it (the caller
        advances ``cache.n``) and return {output name: array}. ``before(feeds)`` sees the feeds
        first (calibration records them)."""
        feeds = {self.first_input: x, "position_ids": pos, "attention_mask": mask,
                 **cache.past(self.layers, self.S)}
        if before is not None:
            before(feeds)
        res = dict(zip(self.output_names, self.sess.run(self.output_names, feeds)))
        cache.write(self.layers, res, pad, m)
        return res


def block_inputs(tokens, n: int, S: int, C: int, pad_id: int = 0, mask_value: float = MASK_VALUE):
    """Host-side inputs of one graph call over ``m = len(tokens) <= S`` new tokens after ``n``
    cached ones (the layout in the module docstring): ``ids`` int32 [1, S] (left-padded with
    ``pad_id``), ``position_ids`` int32 [1, S], the additive ``attention_mask`` float32
    [1, 1, S, C] and the pad count ``S - m``. Raises ValueError when the block does not fit
    (m outside 1..S, or n > C - S)."""
    m, P = len(tokens), C - S
    if not 1 <= m <= S:
        raise ValueError(f"block of {m} tokens for a graph with S={S}")
    if n > P:
        raise ValueError(f"KV cache full: {n} tokens cached, graph allows {P} past entries")
    pad = S - m
    ids = np.full((1, S), pad_id, np.int32)
    ids[0, pad:] = tokens
    pos = np.zeros((1, S), np.int32)
    pos[0, pad:] = np.arange(n, n + m, dtype=np.int32)
    mask = np.full((1, 1, S, C), mask_value, np.float32)
    for i in range(S):
        if i < pad:
            mask[0, 0, i, P + i] = 0.0  # pad row: itself only
        else:
            mask[0, 0, i, :n] = 0.0
            mask[0, 0, i, P + pad:P + i + 1] = 0.0
    return ids, pos, mask, pad


class KVCache:
    """Host KV cache of some layers: per layer ``k[l]``, ``v[l]`` float32 [1, Hkv, C, d]; slots
    ``0..n-1`` hold the tokens processed so far, the rest are zeros."""

    def __init__(self, layers, n_kv: int, C: int, head_dim: int):
        self.k = {l: np.zeros((1, n_kv, C, head_dim), np.float32) for l in layers}
        self.v = {l: np.zeros_like(self.k[l]) for l in layers}
        self.n = 0

    def past(self, layers, S: int) -> dict:
        """``past_key_{l}`` / ``past_value_{l}`` feeds ([1, Hkv, C-S, d] views) for a graph with S new tokens."""
        C = next(iter(self.k.values())).shape[2]
        out = {}
        for l in layers:
            out[f"past_key_{l}"] = self.k[l][:, :, :C - S]
            out[f"past_value_{l}"] = self.v[l][:, :, :C - S]
        return out

    def write(self, layers, res: dict, pad: int, m: int) -> None:
        """Copy the m real new K/V (``present_*`` outputs, pad rows dropped) into slots n..n+m-1
        (``n`` is advanced by the caller once every part has written)."""
        for l in layers:
            self.k[l][:, :, self.n:self.n + m] = res[f"present_key_{l}"][:, :, pad:]
            self.v[l][:, :, self.n:self.n + m] = res[f"present_value_{l}"][:, :, pad:]

    def save(self, path) -> None:
        """Write the filled slots (n) to ``path`` (.npz)."""
        np.savez(path, n=np.int64(self.n), **{f"k{l}": a[:, :, :self.n] for l, a in self.k.items()},
                 **{f"v{l}": a[:, :, :self.n] for l, a in self.v.items()})

    def load(self, path) -> None:
        """Restore a cache written by :meth:`save` (same layers and shapes)."""
        with np.load(path) as z:
            self.n = int(z["n"])
            for l in self.k:
                self.k[l][:] = 0
                self.v[l][:] = 0
                self.k[l][:, :, :self.n] = z[f"k{l}"]
                self.v[l][:, :, :self.n] = z[f"v{l}"]


class LLMRunner:
    """Run exported (fp32, QDQ or EPContext) LLM parts greedily with a host-side KV cache.

    Args:
        parts: list of ``(prefill_model_path, decode_model_path)``, one per part, in order.
        make_session: ``path -> onnxruntime.InferenceSession`` (the caller picks the EP: CPU for
            fp32/QDQ graphs, QNN HTP for ``*_ctx.onnx``). Any object with ``get_inputs()``,
            ``get_outputs()`` and ``run(names, feeds)`` works.
        embed_table: float32 [V, D] host-side embedding table, required iff part 0 takes
            ``inputs_embeds`` (export with ``embed="separate"``; the table is ``embed_tokens.npy``).
        mask_value: additive value for blocked attention entries (default export.MASK_VALUE=-100).
        pad_id: token id fed at padded rows (their results are discarded).
        recorder: optional ``callable(part_index, kind, feeds_dict)`` called before every graph
            run (``kind`` is ``"prefill"`` or ``"decode"``); used by :mod:`tasks.llm.calib`.

    Raises ValueError if the graphs disagree on C or layers, or embed_table is missing.
    """

    def __init__(self, parts: Sequence[tuple], make_session: Callable, *, embed_table=None,
                 mask_value: float = MASK_VALUE, pad_id: int = 0, recorder=None):
        self.prefill = [PartGraph(make_session(str(p))) for p, _ in parts]
        self.decode = [PartGraph(make_session(str(d))) for _, d in parts]
        self.S = self.prefill[0].S
        self.C = self.prefill[0].C
        for g in self.prefill + self.decode:
            if g.C != self.C:
                raise ValueError(f"context length mismatch: {g.C} != {self.C}")
        if self.decode[0].S != 1:
            raise ValueError("decode graphs must take 1 token")
        if self.prefill[0].first_input == "inputs_embeds" and embed_table is None:
            raise ValueError("part 0 takes inputs_embeds: pass embed_table (embed_tokens.npy)")
        self.embed_table = None if embed_table is None else np.asarray(embed_table, np.float32)
        self.mask_value = float(mask_value)
        self.pad_id = int(pad_id)
        self.recorder = recorder
        shp = self.prefill[0].inputs[f"past_key_{self.prefill[0].layers[0]}"].shape
        self.n_kv, self.head_dim = int(shp[1]), int(shp[3])
        self.layers = [l for g in self.prefill for l in g.layers]
        self.reset()

    @classmethod
    def from_export(cls, export_dir, make_session, suffix: str = ".onnx", **kw) -> "LLMRunner":
        """Build from an :func:`tasks.llm.export.export_llm` folder; ``suffix`` picks the files
        (e.g. ``".onnx"`` for fp32, ``"_ctx.onnx"`` if compiled models were written next to them
        with that naming). Loads ``embed_tokens.npy`` when present."""
        export_dir = Path(export_dir)
        desc = json.loads((export_dir / "export.json").read_text())
        parts = []
        for p in desc["parts"]:
            paths = [export_dir / p[g]["path"] for g in ("prefill", "decode")]
            parts.append(tuple(str(q.with_name(q.name[:-len(".onnx")] + suffix)) for q in paths))
        if desc.get("embed_file") and "embed_table" not in kw:
            kw["embed_table"] = np.load(export_dir / desc["embed_file"])
        kw.setdefault("mask_value", desc.get("mask_value", MASK_VALUE))
        return cls(parts, make_session, **kw)

    def reset(self) -> None:
        """Empty the KV cache (n = 0)."""
        self.cache = KVCache(self.layers, self.n_kv, self.C, self.head_dim)

    @property
    def n(self) -> int:
        return self.cache.n

    @property
    def k(self):
        return self.cache.k

    @property
    def v(self):
        return self.cache.v

    # -- one call of all parts over a block of m <= S new tokens ----------------------------------
    def _run(self, tokens: list[int], kind: str) -> np.ndarray:
        graphs = self.prefill if kind == "prefill" else self.decode
        S, m = graphs[0].S, len(tokens)
        ids, pos, mask, pad = block_inputs(tokens, self.cache.n, S, self.C, self.pad_id, self.mask_value)
        x = ids
        if graphs[0].first_input == "inputs_embeds":
            x = self.embed_table[ids]
        out = None
        for pi, g in enumerate(graphs):
            rec = None if self.recorder is None else (lambda f, pi=pi: self.recorder(pi, kind, f))
            res = g.call(x, pos, mask, self.cache, pad, m, rec)
            out = res["logits"] if g.last else res["hidden_states"]
            x = out
        self.cache.n += m
        return out[0, -1].astype(np.float32)  # logits of the last (real) token, [V]

    def feed(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Append tokens to the cache: full/partial chunks of S through the prefill graphs.
        Returns float32 [V] logits after the last token. Raises ValueError if the cache overflows."""
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("empty prompt")
        logits = None
        for s in range(0, len(prompt_ids), self.S):
            logits = self._run(prompt_ids[s:s + self.S], "prefill")
        return logits

    def step(self, token: int) -> np.ndarray:
        """Append one token through the decode graphs; returns float32 [V] next-token logits."""
        return self._run([int(token)], "decode")

    def prefill_logits(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Reset, prefill ``prompt_ids`` and return the float32 [V] logits predicting the next token."""
        self.reset()
        return self.feed(prompt_ids)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int,
                 eos_token_id: int | None = None) -> list[int]:
        """Greedy decoding: reset, prefill the prompt, then ``max_new_tokens - 1`` decode steps.

        Returns only the new token ids (``len <= max_new_tokens``; stops after ``eos_token_id``).
        Raises ValueError if prompt + new tokens exceed the context (C - 1 cached tokens for decode).
        """
        logits = self.prefill_logits(prompt_ids)
        out = []
        for i in range(max_new_tokens):
            tok = int(np.argmax(logits))
            out.append(tok)
            if tok == eos_token_id or i == max_new_tokens - 1:
                break
            logits = self.step(tok)
        return out


def write_genai_config(export_desc: dict, out_path, *, model_files: dict | None = None,
                       eos_token_id: int = 0, pad_token_id: int = 0, provider: str = "qnn") -> dict:
    """Write a *best-effort, unverified* onnxruntime-genai ``genai_config.json`` for an export.

    What it expresses: genai's ``decoder-pipeline`` model type (used by its QNN examples) lists
    one entry per graph with ``filename``, ``inputs``, ``outputs``, ``run_on_prompt`` /
    ``run_on_token_gen`` and per-graph ``session_options`` (provider options); the KV naming
    templates ``past_key_%d`` / ``present_key_%d`` map to our names. ``sliding_window`` (with
    ``window_size`` = seq_len and ``alignment`` = "left") is genai's static-shape/KV mode.

    The key names used here (``decoder-pipeline``, ``run_on_prompt``, ``run_on_token_gen``,
    ``sliding_window``/``window_size``/``pad_value``/``alignment``/``slide_key_value_cache``,
    ``past_key_names``-style templates) were checked only as strings inside the onnxruntime-genai
    0.18.0 wheel (downloaded with ``pip download --no-deps``, not installed, not run: it would pull
    its own onnxruntime into the shared venv). Its default KV names are ``past_key_values.%d.key`` /
    ``present.%d.key``, hence the explicit templates below.

    What it cannot express (so genai will NOT run these graphs unmodified, to our knowledge; no
    genai run was possible here and no string in the wheel hints at an additive 4-D float mask):
      * our ``attention_mask`` is an additive float [1,1,S,C] tensor built by the host; genai feeds
        an integer [1, L] 0/1 mask (or total_seq_len/seqlens_k for GroupQueryAttention graphs)
        and has no hook to build an additive 4-D mask. A small extra "mask builder" graph in the
        pipeline (int mask -> additive float mask) would be needed.
      * our ``present_*`` outputs hold only the S new entries and the host scatters them into slot
        ``n``; genai's sliding-window KV update assumes its own layout (past window shifted left).
      * int32 ``position_ids`` of shape [1,S] are supported; the int32 ``input_ids`` likely are too.
    The file is therefore a starting point and documentation of the mapping, marked with
    ``"_unverified": true``. Returns the dict written.
    """
    parts = export_desc["parts"]
    files = model_files or {}
    opts = [{"qnn": {"backend_path": "QnnHtp.dll", "htp_performance_mode": "burst"}}] \
        if provider == "qnn" else []
    pipeline = []
    for p in parts:
        for g in ("prefill", "decode"):
            key = f"part{p['index']}_{'context' if g == 'prefill' else 'iterator'}"
            pipeline.append({key: {
                "filename": files.get(key, p[g]["path"].replace(".onnx", "_ctx.onnx")),
                "inputs": [i["name"] for i in p[g]["inputs"]],
                "outputs": [o["name"] for o in p[g]["outputs"]],
                "session_options": {"provider_options": opts},
                "run_on_prompt": g == "prefill",
                "run_on_token_gen": g == "decode",
            }})
    cfg = {
        "_unverified": True,
        "_note": "additive float mask [1,1,S,C] and new-only present K/V are not genai-native; "
                 "see tasks/llm/runner.py:write_genai_config docstring",
        "model": {
            "type": "decoder-pipeline",
            "context_length": export_desc["context_len"],
            "vocab_size": export_desc["vocab_size"],
            "eos_token_id": eos_token_id, "pad_token_id": pad_token_id, "bos_token_id": eos_token_id,
            "decoder": {
                "head_size": export_desc["head_dim"],
                "hidden_size": export_desc["hidden_size"],
                "num_attention_heads": export_desc["num_heads"],
                "num_key_value_heads": export_desc["num_kv_heads"],
                "num_hidden_layers": export_desc["num_layers"],
                "inputs": {"input_ids": "input_ids", "position_ids": "position_ids",
                           "attention_mask": "attention_mask",
                           "past_key_names": "past_key_%d", "past_value_names": "past_value_%d"},
                "outputs": {"logits": "logits", "present_key_names": "present_key_%d",
                            "present_value_names": "present_value_%d"},
                "sliding_window": {"window_size": export_desc["seq_len"], "pad_value": 0,
                                   "alignment": "left", "slide_key_value_cache": False},
                "pipeline": pipeline,
            },
        },
        "search": {"do_sample": False, "max_length": export_desc["context_len"], "num_beams": 1},
    }
    Path(out_path).write_text(json.dumps(cfg, indent=1))
    return cfg


class PartStream:
    """Greedy generation (or teacher forcing) of many prompts at once, holding at most
    ``resident`` parts' sessions (issue 8: a 7 B model's parts do not fit in memory together).

    Per step, every prompt goes through part 0, then part 1, ...; a part's prefill or decode
    session is created when first needed and dropped (least recently used) once more than
    ``resident`` parts are open, so with ``resident=1`` one part is in memory at a time and
    each part is loaded once per generated token. The hidden states between parts ([1, S, D]
    per prompt and call) and each prompt's KV cache stay in memory: layers x 2 x Hkv x C x d x 4
    bytes per prompt (Qwen2.5-7B at C=4096: 28 x 2 x 8 MiB = 448 MiB).

    Args:
        desc: the export description (``export.json``).
        graph_path: ``(part_index, "prefill"|"decode") -> path`` of the graph to run.
        make_session: ``path -> session`` (CPU for fp32/QDQ graphs, QNN HTP for ``*_ctx.onnx``).
        resident: parts kept open at once (>= 1).
        embed_table: float32 [V, D] host-side table when part 0 takes ``inputs_embeds``.
        pad_id: token fed at padded rows.
    """

    def __init__(self, desc: dict, graph_path, make_session, *, resident: int = 1, embed_table=None,
                 pad_id: int = 0):
        self.desc, self.graph_path, self.make_session = desc, graph_path, make_session
        self.resident = max(1, int(resident))
        self.embed_table = embed_table
        self.pad_id = pad_id
        self.S, self.C = desc["seq_len"], desc["context_len"]
        self.mask_value = desc.get("mask_value", MASK_VALUE)
        self.parts = desc["parts"]
        self._open: dict[tuple, PartGraph] = {}
        self.loads = 0

    def _graph(self, i: int, kind: str) -> "PartGraph":
        key = (i, kind)
        if key in self._open:
            self._open[key] = self._open.pop(key)  # most recently used last
            return self._open[key]
        while len({k[0] for k in self._open} | {i}) > self.resident:
            self._open.pop(next(iter(self._open)))
        self.loads += 1
        self._open[key] = PartGraph(self.make_session(str(self.graph_path(i, kind))))
        return self._open[key]

    def run(self, prompts: list[list[int]], steps: int, forced: list[list[int]] | None = None,
            progress: str | None = None):
        """Feed each prompt, then ``steps - 1`` more tokens: the greedy argmax, or
        ``forced[b][j]`` (teacher forcing). Returns ``(tokens, logits)``: per prompt the ``steps``
        chosen tokens and the ``steps`` float32 [V] logits rows that predicted them (row 0 from
        the prompt's last token). ``progress``: show a progress bar of the steps with this
        description (``tasks.progress.bar``). Raises ValueError when a prompt plus steps overflow C."""
        from .. import progress as _progress

        B = len(prompts)
        caches = [[KVCache(range(*p["layers"]), self.desc["num_kv_heads"], self.C, self.desc["head_dim"])
                   for p in self.parts] for _ in range(B)]
        tokens = [[] for _ in range(B)]
        logits = [[] for _ in range(B)]
        for j in (_progress.bar(range(steps), progress, unit="step") if progress else range(steps)):
            kind = "prefill" if j == 0 else "decode"
            Sg = self.S if kind == "prefill" else 1
            if j == 0:
                blocks = [[list(p[s:s + self.S]) for s in range(0, len(p), self.S)] for p in prompts]
            else:
                blocks = [[[tokens[b][-1] if forced is None else forced[b][j - 1]]] for b in range(B)]
            xs, meta = [], []
            for b in range(B):
                xs.append([])
                n = caches[b][0].n
                meta.append([])
                for blk in blocks[b]:
                    ids, pos, mask, pad = block_inputs(blk, n, Sg, self.C, self.pad_id, self.mask_value)
                    meta[b].append((pos, mask, pad, len(blk)))
                    xs[b].append(ids if self.embed_table is None else np.asarray(self.embed_table[ids], np.float32))
                    n += len(blk)
            for i, p in enumerate(self.parts):
                g = self._graph(i, kind)
                for b in range(B):
                    c = caches[b][i]
                    for k, (pos, mask, pad, m) in enumerate(meta[b]):
                        res = g.call(xs[b][k], pos, mask, c, pad, m)
                        c.n += m
                        xs[b][k] = res["logits"] if g.last else res["hidden_states"]
            for b in range(B):
                row = xs[b][-1][0, -1].astype(np.float32)
                logits[b].append(row)
                tokens[b].append(int(np.argmax(row)))
        return tokens, logits

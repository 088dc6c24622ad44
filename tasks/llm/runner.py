"""Greedy prefill + decode loop over the static graphs of :mod:`tasks.llm.export` (any EP).

The host side does what onnxruntime-genai 0.18.0's decoder pipeline does with these graphs, so
the same compiled graphs get the same feeds under either loop (onnxruntime-genai ``src/``:
``generators.cpp`` ``AllocateInputIdsOnDevice`` with ``alignment: "left"``,
``models/input_ids.cpp`` ``WindowedInputIDs``, ``models/kv_cache.cpp`` ``DefaultKeyValueCache``
with a shared past/present buffer, ``models/logits.cpp``):

- a prompt is cut into windows of S tokens from its start; the last window is padded at its
  end with ``pad_id``;
- ``past_seq_len`` [1, 1] = (real tokens before the call) + S - 1 (so after prompt window k it
  is k*S - 1, in decode the number of real tokens so far), ``total_seq_len`` [1] = the
  generation's max length (genai: ``search.max_length``; the graphs ignore its value);
- the KV cache of a layer is one [1, Hkv, C, d] buffer of the graphs' KV dtype (float32, or the
  uint8 integers of ``quantize.kv_bits: 8``: :mod:`tasks.llm.quantize`), zero bytes at first as
  genai allocates it, fed as ``past_*`` and replaced by ``present_*``; the graph writes the
  call's rows at slots n..n+S-1 (pad rows too; the next call overwrites them);
- the logits of a call are the row of its last real token.

Bounds: slots n..n+S-1 must exist, so n + S <= C before every call (raises ValueError).
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Callable, Sequence

import numpy as np

from tasks.errors import InputError
from tasks.llm.kv_cache import KVCache

#: onnxruntime's float element type names (``NodeArg.type`` "tensor(<name>)") that numpy spells otherwise
_ORT_FLOATS = {"float": np.float32, "float16": np.float16, "double": np.float64}


def ort_dtype(type_name: str) -> np.dtype:
    """The numpy dtype of an onnxruntime ``NodeArg.type``: ``"tensor(float)"`` -> float32,
    ``"tensor(uint8)"`` -> uint8. Raises TypeError for a type numpy does not know."""
    inner = type_name.removeprefix("tensor(").removesuffix(")")
    return np.dtype(_ORT_FLOATS.get(inner, inner))


class PartGraph:
    """One exported part graph's session and what the host needs to know of its inputs
    (``kv_dtype``: the numpy dtype of its ``past_*`` inputs)."""

    def __init__(self, session):
        self.sess = session
        self.inputs = {i.name: i for i in session.get_inputs()}
        self.output_names = [o.name for o in session.get_outputs()]
        self.layers = sorted(int(n[len("past_key_") :]) for n in self.inputs if n.startswith("past_key_"))
        self.kv_dtype = ort_dtype(self.inputs[f"past_key_{self.layers[0]}"].type)
        self.first_input = next(
            n for n in self.inputs if n == "input_ids" or n == "inputs_embeds" or n.startswith("hidden_states_")
        )
        self.S = int(self.inputs[self.first_input].shape[1])
        self.C = int(self.inputs[f"past_key_{self.layers[0]}"].shape[2])
        self.last = "logits" in self.output_names
        self.out = "logits" if self.last else next(n for n in self.output_names if n.startswith("hidden_states_"))

    def call(self, x, cache: KVCache, total: int | None = None, before=None) -> dict:
        """Run one call on ``x`` (the first input, [1, S] ids or [1, S, D]) for the tokens after
        ``cache.n``: feeds ``past_seq_len`` = n + S - 1, ``total_seq_len`` = ``total`` (default
        C) and this part's cache, which the ``present_*`` outputs then replace; returns
        {output name: array}. ``before(feeds)`` sees the feeds first (calibration records them).
        Raises ValueError when slots n..n+S-1 do not fit in C, or when the cache's dtype is not
        the graph's KV dtype (its bytes would be cast, not fed)."""
        if cache.n + self.S > self.C:
            raise ValueError(f"context full: {cache.n} tokens cached, a call writes {self.S} slots, C={self.C}")
        if cache.dtype != self.kv_dtype:
            raise ValueError(
                f"expected a {self.kv_dtype.name} KV cache (the graph's past_* inputs), found {cache.dtype.name}"
            )
        feeds = {
            self.first_input: x,
            "past_seq_len": np.array([[cache.n + self.S - 1]], np.int32),
            "total_seq_len": np.array([self.C if total is None else total], np.int32),
            **cache.past(self.layers),
        }
        if before is not None:
            before(feeds)
        res = dict(zip(self.output_names, self.sess.run(self.output_names, feeds)))
        cache.write(self.layers, res)
        return res


def prompt_windows(tokens: Sequence[int], S: int) -> list[list[int]]:
    """A prompt cut as genai cuts it with ``alignment: "left"``: windows of S tokens from the
    start, the last one shorter (padded at its end by :func:`block_ids`)."""
    tokens = [int(t) for t in tokens]
    return [tokens[s : s + S] for s in range(0, len(tokens), S)]


def block_ids(tokens, S: int, pad_id: int = 0) -> np.ndarray:
    """``input_ids`` int32 [1, S] of a call over ``len(tokens) <= S`` tokens, padded at the end
    with ``pad_id``. Raises ValueError when the block is empty or longer than S."""
    if not 1 <= len(tokens) <= S:
        raise ValueError(f"block of {len(tokens)} tokens for a graph with S={S}")
    ids = np.full((1, S), pad_id, np.int32)
    ids[0, : len(tokens)] = tokens
    return ids


class LLMRunner:
    """Run exported (fp32, QDQ or EPContext) LLM parts greedily with a host-side KV cache.

    Args:
        parts: list of ``(prefill_model_path, decode_model_path)``, one per part, in order.
        make_session: ``path -> onnxruntime.InferenceSession`` (the caller picks the EP: CPU for
            fp32/QDQ graphs, QNN HTP for ``*_ctx.onnx``). Any object with ``get_inputs()``,
            ``get_outputs()`` and ``run(names, feeds)`` works.
        embed_table: float32 [V, D] host-side embedding table, required iff part 0 takes
            ``inputs_embeds`` (export with ``embed="separate"``; the table is ``embed_tokens.npy``).
        pad_id: token id fed at padded rows (their results are discarded; genai uses the
            config's ``pad_token_id``).
        recorder: optional ``callable(part_index, kind, feeds_dict)`` called before every graph
            run (``kind`` is ``"prefill"`` or ``"decode"``); used by :mod:`tasks.llm.calibration_feeds`.

    Raises ValueError if the graphs disagree on C or layers, or embed_table is missing.
    """

    def __init__(
        self, parts: Sequence[tuple], make_session: Callable, *, embed_table=None, pad_id: int = 0, recorder=None
    ):
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
        self.pad_id = int(pad_id)
        self.recorder = recorder
        shp = self.prefill[0].inputs[f"past_key_{self.prefill[0].layers[0]}"].shape
        self.n_kv, self.head_dim = int(shp[1]), int(shp[3])
        self.layers = [l for g in self.prefill for l in g.layers]
        self.kv_dtype = self.prefill[0].kv_dtype  # a graph of another KV dtype refuses the cache (PartGraph.call)
        self.reset()

    @classmethod
    def from_export(cls, export_dir, make_session, suffix: str = ".onnx", **kw) -> LLMRunner:
        """Build from an :func:`tasks.llm.export.export_llm` folder; ``suffix`` picks the files
        (e.g. ``".onnx"`` for fp32, ``"_ctx.onnx"`` if compiled models were written next to them
        with that naming). Loads ``embed_tokens.npy`` when present."""
        export_dir = Path(export_dir)
        desc = json.loads((export_dir / "export.json").read_text())
        parts = []
        for p in desc["parts"]:
            paths = [export_dir / p[g]["path"] for g in ("prefill", "decode")]
            parts.append(tuple(str(q.with_name(q.name[: -len(".onnx")] + suffix)) for q in paths))
        if desc.get("embed_file") and "embed_table" not in kw:
            kw["embed_table"] = np.load(export_dir / desc["embed_file"])
        return cls(parts, make_session, **kw)

    def reset(self) -> None:
        """Empty the KV cache (n = 0; zero bytes, as genai allocates it)."""
        self.cache = KVCache(self.layers, self.n_kv, self.C, self.head_dim, self.kv_dtype)

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
        x = block_ids(tokens, graphs[0].S, self.pad_id)
        if graphs[0].first_input == "inputs_embeds":
            x = self.embed_table[x]
        for pi, g in enumerate(graphs):
            rec = None if self.recorder is None else (lambda f, pi=pi: self.recorder(pi, kind, f))
            x = g.call(x, self.cache, before=rec)[g.out]
        self.cache.n += len(tokens)
        return x[0, len(tokens) - 1].astype(np.float32)  # logits of the last real token, [V]

    def feed(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Append a prompt through the prefill graphs in genai's windows (:func:`prompt_windows`).
        Returns float32 [V] logits after the last token. Raises ValueError if the context overflows."""
        if not len(prompt_ids):
            raise ValueError("empty prompt")
        logits = None
        for blk in prompt_windows(prompt_ids, self.S):
            logits = self._run(blk, "prefill")
        return logits

    def step(self, token: int) -> np.ndarray:
        """Append one token through the decode graphs; returns float32 [V] next-token logits."""
        return self._run([int(token)], "decode")

    def prefill_logits(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Reset, prefill ``prompt_ids`` and return the float32 [V] logits predicting the next token."""
        self.reset()
        return self.feed(prompt_ids)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id: int | None = None) -> list[int]:
        """Greedy decoding: reset, prefill the prompt, then ``max_new_tokens - 1`` decode steps.

        Returns only the new token ids (``len <= max_new_tokens``; stops after ``eos_token_id``).
        Raises ValueError if the context overflows (see the module docstring).
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


class PartStream:
    """Greedy generation (or teacher forcing) of many prompts at once, holding at most
    ``resident`` parts' sessions (a 7 B model's parts do not fit in memory together).

    Sessions are created when first needed and dropped (least recently used) once more than
    ``resident`` parts are open; :attr:`loads` counts the sessions made. What each method loads:

    - :meth:`score` and :meth:`run` with ``forced`` (teacher forcing): part-major, each prompt
      with its forced tokens through part 0's prefill graph in windows of S tokens, then part
      1's, ...: each prefill graph once, no decode graph, whatever the number of tokens
      (``parts`` loads). In memory: the hidden states between two parts (per prompt and window
      [1, S, D], the last part's logits rows [1, S, V]) and one part's KV caches.
    - :meth:`run` greedy: each part's prefill graph once (part-major), then per step every
      prompt through the decode graphs of parts 0, 1, ...: a decode graph is loaded once when
      ``resident`` covers every part, else once per step (the next token needs the last part's
      output). In memory: every prompt's KV cache for every part, layers x 2 x Hkv x C x d x the
      graphs' KV element bytes per prompt (Qwen2.5-7B at C=4096: 28 x 2 x 8 MiB = 448 MiB at
      float32, 112 MiB at uint8).

    Args:
        desc: the export description (``export.json``).
        graph_path: ``(part_index, "prefill"|"decode") -> path`` of the graph to run.
        make_session: ``path -> session`` (CPU for fp32/QDQ graphs, QNN HTP for ``*_ctx.onnx``).
        resident: parts kept open at once (>= 1).
        embed_table: float32 [V, D] host-side table when part 0 takes ``inputs_embeds``.
        pad_id: token fed at padded rows.
    """

    def __init__(self, desc: dict, graph_path, make_session, *, resident: int = 1, embed_table=None, pad_id: int = 0):
        self.desc, self.graph_path, self.make_session = desc, graph_path, make_session
        self.resident = max(1, int(resident))
        self.embed_table = embed_table
        self.pad_id = pad_id
        self.S, self.C = desc["seq_len"], desc["context_len"]
        self.parts = desc["parts"]
        self._open: dict[tuple, PartGraph] = {}
        self.loads = 0

    def _graph(self, i: int, kind: str) -> PartGraph:
        key = (i, kind)
        if key in self._open:
            self._open[key] = self._open.pop(key)  # most recently used last
            return self._open[key]
        while len({k[0] for k in self._open} | {i}) > self.resident:
            self._open.pop(next(iter(self._open)))
        self.loads += 1
        self._open[key] = PartGraph(self.make_session(str(self.graph_path(i, kind))))
        return self._open[key]

    def _drop(self, kind: str) -> None:
        """Close the open sessions of ``kind`` graphs (a graph this stream needs no more)."""
        for key in [k for k in self._open if k[1] == kind]:
            del self._open[key]

    def _cache(self, i: int) -> KVCache:
        """An empty KV cache of part ``i``'s layers (one prompt's), of its prefill graph's KV dtype
        (the graph is opened if it is not: the next call runs it)."""
        dtype = self._graph(i, "prefill").kv_dtype
        return KVCache(range(*self.parts[i]["layers"]), self.desc["num_kv_heads"], self.C, self.desc["head_dim"], dtype)

    def _inputs(self, blocks: list[list[int]], width: int) -> list:
        """Part 0's inputs for token windows ``blocks``, each padded to ``width``: int32 ids
        [1, width], or float32 [1, width, D] rows of the host-side table (``embed_table``)."""
        ids = [block_ids(blk, width, self.pad_id) for blk in blocks]
        return ids if self.embed_table is None else [np.asarray(self.embed_table[x], np.float32) for x in ids]

    def close(self) -> None:
        """Drop every open session (a finished stream must not hold a part's weights while
        another stream runs: the LLM verify runs the compiled side, then the fp32 side)."""
        self._open.clear()

    def _through(self, i: int, kind: str, blocks: list[list[list[int]]], xs: list[list], caches: list) -> None:
        """Every prompt's calls ``blocks[b]`` (token windows) through part ``i``'s ``kind`` graph,
        in place: ``xs[b][k]`` (the call's input) becomes its output, ``caches[b]`` the
        prompt's cache of part ``i``. The graph is loaded if it is not open, and this call's
        reference to it goes before returning (what stays open is the stream's: ``resident``),
        so with ``resident=1`` no other session is alive when the next one is made."""
        g = self._graph(i, kind)
        for b, calls in enumerate(blocks):
            for k, blk in enumerate(calls):
                xs[b][k] = g.call(xs[b][k], caches[b])[g.out]
                caches[b].n += len(blk)
        # a reference kept here would keep this part's session (its weights) alive while the
        # next part's loads: two parts at once, +7.8 GB in the 7B verify (17.2 GiB)
        del g

    def score(self, ids: list[int]) -> np.ndarray:
        """Teacher-forced logits of one token sequence through the prefill (AR-N) graphs:
        float32 [len(ids) - 1, V], row t the logits after ``ids[:t + 1]`` (what predicts
        ``ids[t + 1]``). The sequence goes in windows of S tokens, each part loaded once, so a
        perplexity over n tokens costs one pass per part, not n - 1 decode steps of every part
        (the 7B verify ran over 11 minutes of them without finishing on a 64-token text).
        :meth:`run` ``score=`` gives the same rows within its own pass. Raises ValueError when
        ``ids`` overflow C or hold fewer than 2 tokens."""
        return self.run([], 1, score=ids)[2]

    def run(
        self,
        prompts: list[list[int]],
        steps: int,
        forced: list[list[int]] | None = None,
        progress: str | None = None,
        score: list[int] | None = None,
    ):
        """Feed each prompt, then ``steps - 1`` more tokens: the greedy argmax, or
        ``forced[b][j]`` (teacher forcing: the prompt and its forced tokens go through the
        prefill graphs in windows of S, part-major, each prefill graph loaded once; row j is the
        prefill's logits at the position of the token fed at step j, what the decode graph
        computes step by step, equal to fp32 rounding). Returns
        ``(tokens, logits)``: per prompt the ``steps`` argmax tokens and the ``steps`` float32
        [V] logits rows they come from (row 0 from the prompt's last token, row j from the
        token fed at step j: the greedy token j - 1, or ``forced[b][j - 1]``). ``score``: a
        token sequence also run through each part's prefill graph while it is open; then
        returns ``(tokens, logits, rows)`` with ``rows`` what :meth:`score` returns for it.
        ``progress``: a progress bar with this description (``tasks.progress.bar``): of the
        steps (greedy) or of the part graphs (forced). Raises ValueError when ``steps`` < 1,
        when ``forced`` does not give ``steps - 1`` tokens for every prompt, when a prompt plus
        steps overflow C, when ``score`` overflows C or holds fewer than 2 tokens."""
        from tasks import progress as _progress

        B, P = len(prompts), len(self.parts)
        if steps < 1:
            raise ValueError(f"expected at least 1 step, found {steps}")
        if forced is not None and (len(forced) != B or any(len(f) < steps - 1 for f in forced)):
            raise ValueError(
                f"expected {steps - 1} forced tokens for each of {B} prompts, found {[len(f) for f in forced]}"
            )
        if score is not None and len(score) < 2:
            raise ValueError(f"expected at least 2 tokens to score, found {len(score)}")
        seqs = [list(p) + list(forced[b][: steps - 1]) if forced is not None else p for b, p in enumerate(prompts)]
        # what goes through the prefill graphs whole: the scored text, each prompt with its forced tokens
        longest = max(
            [len(q) for q in seqs if forced is not None] + ([len(score)] if score is not None else []), default=0
        )
        if longest > self.C:
            raise InputError(f"expected at most the context length {self.C} tokens, found {longest}")
        bar = (
            _progress.bar(
                what=progress, total=P if forced is not None else steps, unit="graph" if forced is not None else "step"
            )
            if progress
            else None
        )
        blocks = [prompt_windows(q, self.S) for q in seqs] + ([prompt_windows(score, self.S)] if score else [])
        xs = [self._inputs(blk, self.S) for blk in blocks]
        caches = [[None] * P for _ in range(B)]
        for i in range(P):
            part = [self._cache(i) for _ in blocks]  # part i's cache of each prompt, then of the scored text
            self._through(i, "prefill", blocks, xs, part)
            self._drop("prefill")  # used once: a part's prefill session goes before the next part's is made
            if forced is None:
                for b in range(B):
                    caches[b][i] = part[b]
            if bar is not None:
                bar.update(1 if forced is not None else 0)

        def positions(b, lo=0, hi=None):
            """float32 [hi - lo, V]: the last part's logits at real positions lo..hi - 1 of call b."""
            hi = sum(map(len, blocks[b])) if hi is None else hi
            out, at = [], 0
            for x, w in zip(xs[b], blocks[b]):
                if at < hi and at + len(w) > lo:
                    out.append(x[0, max(lo - at, 0) : min(hi - at, len(w))])
                at += len(w)
            return np.concatenate(out).astype(np.float32)

        rows = positions(B)[:-1] if score else None
        if forced is not None:
            logits = [list(positions(b, len(prompts[b]) - 1, len(prompts[b]) - 1 + steps)) for b in range(B)]
        else:
            logits = [[xs[b][-1][0, len(blocks[b][-1]) - 1].astype(np.float32)] for b in range(B)]
            if bar is not None:
                bar.update()
            for _ in range(steps - 1):
                fed = [[[int(np.argmax(logits[b][-1]))]] for b in range(B)]  # one 1-token call per prompt
                ys = [self._inputs(fed[b], 1) for b in range(B)]
                for i in range(P):
                    self._through(i, "decode", fed, ys, [caches[b][i] for b in range(B)])
                for b in range(B):
                    logits[b].append(ys[b][0][0, 0].astype(np.float32))
                if bar is not None:
                    bar.update()
        if bar is not None:
            bar.close()
        tokens = [[int(np.argmax(r)) for r in per] for per in logits]
        return (tokens, logits) if score is None else (tokens, logits, rows)

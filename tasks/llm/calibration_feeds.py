"""Calibration feeds for the exported LLM graphs, streamed one part at a time (the ``calibrate``
stage, :mod:`tasks.llm.calibrate`, runs :func:`run_part` for one part).

What is recorded (the deployment layout of :mod:`tasks.llm.runner`, which is what
onnxruntime-genai feeds: prompt windows padded at the end, ``past_seq_len``, whole-context KV
buffers), over real text, teacher forced:

* prefill feeds: prompts of varied length (shorter than S -> padded; longer than S -> a second
  chunk with a real, non-empty past), and
* decode feeds: steps over the text that follows each prompt, so ``past_key_*`` / ``past_value_*``
  are REAL caches of the fp32 model at many fill levels n;
* parts i > 0 get the real ``hidden_states_{i-1}`` produced by the fp32 part i-1.

How, in bounded memory: the whole schedule of graph calls is fixed by the text alone (teacher
forcing), so the fp32 graphs can run part by part instead of token by token. Part i runs every
prompt's prefill chunks with its prefill graph (keeping each prompt's KV cache on disk), then
every decode step with its decode graph, reading part i-1's hidden states from disk and
writing its own for part i+1; the feeds to keep go to ``.npz`` files (:class:`tasks.llm.feed_store.FeedStore`). At
any time one part's fp32 session (weights memory-mapped, :func:`tasks.llm.sessions.cpu_session`),
one prompt's KV cache and one call's activations are in memory.

Ranges: while it records, :func:`run_part` runs the graph with a ReduceMin and a ReduceMax
after every tensor onnxruntime's MinMax calibrator calibrates (:class:`RangeTaps`) and keeps
their extremes over the recorded calls: the MinMax ranges of the feeds it writes, saved in the
calibrate entry (``ranges/{prefill,decode}.json``, :func:`save_ranges`) for quantize, which
then needs no second pass over the feeds. The taps stop some of onnxruntime's fusions, so the
recorded calls' outputs (hidden states, KV caches) differ from the untapped graph's in the
last float32 bits (measured on the tiny Qwen2: at most 4e-6); the other calls run untapped.

:func:`collect_ranges` (the Genie graphs' quantize): streaming min/max over the outputs of an augmented graph
(ReduceMin/ReduceMax added after every float tensor onnxruntime's MinMax calibrator would
calibrate; the weights stay memory-mapped from the graph's data file), one feed at a time, so the peak does not grow
with the number of samples. Not onnxruntime's calibrator itself: it loads the whole model into a ``ModelProto`` before
making a session (two copies of the weights), and its ``CalibMaxIntermediateOutputs`` chunking clears the
buffered outputs without merging them (``MinMaxCalibrater.collect_data``, onnxruntime 1.32), so
it drops data and raises "No data is collected" when the feed count is a multiple of the chunk.
The result is onnxruntime's own ``TensorsData`` (MinMax), written with ``save_tensors_data`` and
given to ``quantize_static(calibration_cache_path=...)``; a test checks it equals
``MinMaxCalibrater`` on the same feeds.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np

from tasks.llm.feed_store import FeedStore
from tasks.llm.kv_cache import KVCache
from tasks.llm.runner import PartGraph, block_ids, prompt_windows
from tasks.errors import InputError


def conversations(path) -> list[list[dict]]:
    """The conversations of a ``.jsonl`` chat calibration file: one JSON object per line with a
    non-empty list ``messages`` of ``{"role": str, "content": str}`` (blank lines skipped, a
    UTF-8 BOM allowed). Raises ValueError naming the file, the line and what was found."""
    path = Path(path)
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except ValueError as e:
            raise InputError(f"{where}: expected one JSON object per line, found invalid JSON ({e})") from None
        msgs = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(msgs, list) or not msgs:
            raise InputError(f"{where}: expected a JSON object with a non-empty list 'messages', found {line[:80]!r}")
        for k, m in enumerate(msgs):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise InputError(
                    f'{where}: expected messages[{k}] to be {{"role": text, "content": text}}, '
                    f"found {json.dumps(m, ensure_ascii=False)[:80]}"
                )
        out.append(msgs)
    return out


def samples_of(tok, text_path) -> list[str]:
    """The calibration samples of ``text_path`` as text: a ``.jsonl`` file holds one
    conversation per line (:func:`conversations`, e.g. ``recipes/data/calib-chat.jsonl``),
    rendered with the tokenizer's chat template when it has one (what the model sees in chat
    use), else its contents joined by blank lines; any other file is UTF-8 text whose
    paragraphs (blank-line separated) are the samples. Raises ValueError (:func:`conversations`)."""
    path = Path(text_path)
    if path.suffix != ".jsonl":
        return [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    if getattr(tok, "chat_template", None):
        return [tok.apply_chat_template(msgs, tokenize=False) for msgs in conversations(path)]
    return ["\n\n".join(m["content"] for m in msgs) for msgs in conversations(path)]


def text_ids(model_dir, text_path) -> tuple[list[int], int]:
    """(token ids, eos id) of the calibration samples (:func:`samples_of`), each tokenized and
    followed by eos, joined."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    eos = tok.eos_token_id if tok.eos_token_id is not None else 0
    ids: list[int] = []
    for p in samples_of(tok, text_path):
        ids += tok(p)["input_ids"] + [eos]
    return ids, eos


def schedule(
    ids: list[int], S: int, C: int, *, n_prompts: int = 8, decode_steps: int = 4, decode_keep: int = 4, seed: int = 0
) -> list[dict]:
    """The teacher-forced calls: per prompt ``{"prompt": ids, "decode": ids, "keep": [steps]}``.
    Prompt lengths cycle over ~S/4, S/2, S, 1.5*S (capped so prompt + decode fits C); ``keep``
    are ``decode_keep`` evenly spaced decode steps whose feeds are recorded. Raises ValueError
    when the text is too short.

    By default every decode step is recorded (4 of 4): a decode call reads all of its part's
    weights whether or not it is recorded, so a step run only to move the cache costs a whole
    call (a Qwen2.5-7B part: 0.35 s, against 4.1 s for a prefill call; 24 steps with 4 kept
    made 320 of a part's 384 decode calls, ~112 s of its ~290 s calibrate, benchmarks/README.md
    "Where the rest of the 7B's time went"). The cache fill levels the decode feeds see come from the
    prompt lengths' cycle."""
    rng = random.Random(seed)
    lengths = [max(1, S // 4), max(1, S // 2), S, S + max(1, S // 2)]
    max_prompt = min(C - S, C - 1 - decode_steps)  # every call needs n + S <= C (runner.PartGraph.call)
    keep = sorted(set(np.linspace(0, decode_steps - 1, decode_keep).round().astype(int).tolist()))
    out = []
    for k in range(n_prompts):
        L = min(lengths[k % len(lengths)], max_prompt)
        if L < 1:
            raise InputError(
                f"expected a context of more than {max(S, decode_steps + 1)} tokens for a calibration "
                f"prompt and {decode_steps} decode steps, found {C}"
            )
        if len(ids) < L + decode_steps + 1:
            raise InputError(
                f"expected at least {L + decode_steps + 1} tokens of text (a {L}-token prompt and "
                f"{decode_steps} decode steps), found {len(ids)}"
            )
        start = rng.randrange(0, len(ids) - L - decode_steps)
        out.append(
            {"prompt": ids[start : start + L], "decode": ids[start + L : start + L + decode_steps], "keep": keep}
        )
    return out


def run_part(
    desc: dict,
    export_dir: Path,
    p: dict,
    sched: list[dict],
    work: Path,
    make_session,
    record: bool,
    pad_id: int,
    embed_table,
    bar=None,
    *,
    prev: Path,
    here: Path,
    feeds: Path,
    ranges: Path | None = None,
) -> dict:
    """Run part ``p`` (fp32) over the whole schedule; see the module docstring. Returns
    {"prefill": FeedStore, "decode": FeedStore} in ``feeds`` (empty when not ``record``).
    ``ranges``: with ``record``, run each graph with :class:`RangeTaps` (the graph read from
    ``export_dir``, ``make_session`` unused) and write the MinMax ranges of its recorded
    calls to ``ranges/{prefill,decode}.json`` (:func:`save_ranges`).
    ``prev``: the folder of part i-1's hidden states (read only; unused for part 0), ``here``:
    where this part's go (created; nothing is written for the last part), ``work``: scratch
    for the prompts' KV caches (removed). ``bar``: a progress bar (``tasks.progress.bar``),
    advanced once per prompt and graph."""
    i, (lo, hi) = p["index"], p["layers"]
    last = i == len(desc["parts"]) - 1
    S, C = desc["seq_len"], desc["context_len"]
    layers = list(range(lo, hi))
    kv = work / "kv" / f"part{i}"
    for d in (kv,) if last else (here, kv):
        d.mkdir(parents=True, exist_ok=True)
    stores = {k: FeedStore(feeds / k) for k in ("prefill", "decode")}
    for kind in ("prefill", "decode"):
        taps = RangeTaps(export_dir / p[kind]["path"]) if record and ranges is not None else None
        g = PartGraph(taps.session if taps else make_session(export_dir / p[kind]["path"]))
        first, Sg = g.first_input, g.S
        for q, pr in enumerate(sched):
            cache = KVCache(layers, desc["num_kv_heads"], C, desc["head_dim"])
            if kind == "prefill":
                blocks = prompt_windows(pr["prompt"], S)
            else:
                cache.load(kv / f"{q}.npz")
                blocks = [[t] for t in pr["decode"]]
            for c, blk in enumerate(blocks):
                ids = block_ids(blk, Sg, pad_id)
                if first == "input_ids":
                    x = ids
                elif first == "inputs_embeds":
                    x = np.asarray(embed_table[ids], np.float32)
                else:
                    x = np.load(prev / f"{kind}_{q}_{c}.npy")
                keep = record and (kind == "prefill" or c in pr["keep"])
                if taps:
                    taps.armed = keep  # the ranges of the recorded calls: the feeds quantize calibrates on
                res = g.call(x, cache, before=stores[kind].add if keep else None)
                cache.n += len(blk)
                if not last:
                    np.save(here / f"{kind}_{q}_{c}.npy", res[g.out])
            if kind == "prefill":
                cache.save(kv / f"{q}.npz")
            if bar is not None:
                bar.update()
        if taps:
            save_ranges(taps.ranges(), Path(ranges) / f"{kind}.json")
        # the part's session (and its mapped weights) go before the next graph, and with it the
        # last call's outputs (onnxruntime's output arrays keep their session's memory alive)
        res = cache = None
        del g, taps
    shutil.rmtree(kv, ignore_errors=True)
    return stores


#: bytes of a graph's ranges file (:func:`save_ranges`) per layer, at most: the tiny Qwen2's
#: 4-layer part with its embedding and head writes 21.8 kB per graph
RANGE_BYTES_PER_LAYER = 8192


def disk_bytes(desc: dict, sched: list[dict], part: int) -> int:
    """Estimated bytes :func:`run_part` writes for part ``part`` of the export ``desc``
    (``export.json``) over the schedule ``sched`` (:func:`schedule`), at their most (just before
    the scratch is removed): the kept feeds (``.npz``: every input in full except
    the past K/V buffers, counted by their written slots, since :class:`tasks.llm.feed_store.FeedStore` cuts the
    empty ones), the hidden states for the next part (``.npy``, every call; none for the
    last part) and the prompts' KV caches in the scratch folder (:meth:`KVCache.save`, written
    slots only). The slots are known from the schedule alone: a prompt of L tokens fills
    ``ceil(L/S) * S`` slots (its last window is padded), decode step t then ``max(that, L+t)``.
    With the two graphs' ranges files (:data:`RANGE_BYTES_PER_LAYER`, the embedding and the
    head counted as a layer each). Counts what is written: the tiny Qwen2 in 3 parts, 1.12-1.13x what the entries hold,
    scratch included (tests/llm/test_llm_parts.py); Qwen2.5-7B's shape at 16 prompts (S=128, C=4096), 0.37-0.52 GB
    a part where its entries held about 0.28 GB (benchmarks/README.md)."""
    p = desc["parts"][part]
    S, C = desc["seq_len"], desc["context_len"]
    last = part == len(desc["parts"]) - 1

    def nbytes(t):  # export.json's dtypes are numpy's names
        return int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize

    def graph(kind):
        g = p[kind]
        kv = ("past_key_", "past_value_")
        slot = sum(
            nbytes(t) // t["shape"][2]
            for t in g["inputs"]  # [1, Hkv, C, d]: bytes per slot, all layers
            if t["name"].startswith(kv)
        )
        rest = sum(nbytes(t) for t in g["inputs"] if not t["name"].startswith(kv))
        out = 0 if last else sum(nbytes(t) + 128 for t in g["outputs"] if not t["name"].startswith("present_"))
        return slot, rest, out

    (slot, rest_p, out_p), (_, rest_d, out_d) = graph("prefill"), graph("decode")
    total = 0
    for pr in sched:
        L, steps = len(pr["prompt"]), len(pr["decode"])
        w = -(-L // S)
        total += sum(rest_p + min(c * S, C) * slot for c in range(w))  # prefill feeds: every window
        total += sum(rest_d + min(max(w * S, L + t), C) * slot for t in pr["keep"] if t < steps)
        total += w * out_p + steps * out_d  # hidden states
        total += min(w * S, C) * slot  # the prompt's scratch KV cache
    lo, hi = p["layers"]
    return total + 2 * (hi - lo + 2) * RANGE_BYTES_PER_LAYER  # the two graphs' ranges files


def augment_for_ranges(model):
    """``(augmented ModelProto, tensor names)``: a ReduceMin and a ReduceMax output
    (``<t>__min`` / ``<t>__max``, scalars) after every float tensor that onnxruntime's MinMax
    calibrator calibrates: float inputs/outputs of nodes that are not initializers
    (``CalibraterBase.select_tensors_to_calibrate``). ``model`` is read without weights."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    vi = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    inits = {i.name for i in model.graph.initializer}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    names = sorted(
        {
            t
            for n in model.graph.node
            for t in [*n.input, *n.output]
            if t in vi and t not in inits and vi[t].type.tensor_type.elem_type in floats
        }
    )
    aug = type(model).FromString(model.SerializeToString())
    for t in names:
        for op, suffix in (("ReduceMin", "__min"), ("ReduceMax", "__max")):
            aug.graph.node.append(onnx.helper.make_node(op, [t], [t + suffix], keepdims=0, name=t + suffix))
            aug.graph.output.append(onnx.helper.make_tensor_value_info(t + suffix, onnx.TensorProto.FLOAT, []))
    return aug, names


class RangeTaps:
    """A graph run with MinMax taps, seen as one session (``get_inputs``, ``get_outputs``,
    ``run``: the graph's own outputs). While :attr:`armed`, a run goes through a CPU session on
    the graph with :func:`augment_for_ranges`' outputs after its own and takes the taps into
    the extremes (:meth:`ranges`); unarmed, through the same session without the taps' outputs.
    The weights are mapped from the graph's folder, which may be read-only
    (:func:`tasks.llm.sessions.cpu_session_on`). The taps stop onnxruntime's fusions: the
    tapped graph computes node by node (its outputs equal the graph's at ``ORT_DISABLE_ALL``,
    bit for bit, on the tiny Qwen2), which on a Qwen2.5-0.5B part (12 layers, S=128, C=4096)
    took 2.71 s a prefill call where the fused graph took 2.26 s (decode 0.29 s vs 0.22 s).
    One session, not a second fused one for the calls not recorded: two sessions map the
    weights twice into this process, and a Qwen2.5-7B part's calibrate took the same time with
    one (49.3 vs 49.7 s, 4 prompts) at 10.4 instead of 11.7 GiB. Its memory arena is off: the
    unfused attention's tensors grew the arena by ~2 GiB a prefill call (4.5 GiB after two
    calls on a 7B part; 0.4 GiB without it, peak within a call 7.7 GiB of which 5.3 GiB the
    mapped weights); the 7B part's calibrate, 4 prompts: peak 8.1 instead of 10.1 GiB, 57.5
    instead of 49.3 s. Its nodes run in onnxruntime's priority-based order: in its default order a
    call of the tapped graph held most of its tensors at once (a 0.86 B part of 11 layers at
    C=4096: 3.09 GiB a prefill call, 1.22 in priority order, the same outputs and taps bit for
    bit: :func:`tasks.llm.sessions.cpu_session_on`)."""

    def __init__(self, model_path):
        import onnx

        from tasks.llm.sessions import cpu_session_on

        self.path = Path(model_path)
        aug, self.names = augment_for_ranges(onnx.load(str(self.path), load_external_data=False))
        self.sess = cpu_session_on(aug, self.path.parent, arena=False, priority_order=True)
        self.taps = [t + s for t in self.names for s in ("__min", "__max")]
        tapped = set(self.taps)
        self.outputs = [o for o in self.sess.get_outputs() if o.name not in tapped]
        self.lo = {t: np.inf for t in self.names}
        self.hi = {t: -np.inf for t in self.names}
        self.count = 0
        self.armed = False

    @property
    def session(self):
        """The object to run calls through: this one (a property, not an attribute holding
        ``self``: a reference cycle would keep the sessions and their mapped weights until
        the garbage collector ran, measured 10 GiB held after a 7B part's calibrate)."""
        return self

    def get_inputs(self):
        return self.sess.get_inputs()

    def get_outputs(self):
        return self.outputs

    def run(self, names, feeds):
        """``session.run`` of the graph's outputs ``names``; armed, the taps' too, into the extremes."""
        if not self.armed:
            return self.sess.run(names, feeds)
        res = self.sess.run(list(names) + self.taps, feeds)
        for j, t in enumerate(self.names):
            self.lo[t] = min(self.lo[t], float(res[len(names) + 2 * j]))
            self.hi[t] = max(self.hi[t], float(res[len(names) + 2 * j + 1]))
        self.count += 1
        return res[: len(names)]

    def ranges(self):
        """onnxruntime's ``TensorsData`` (MinMax) of the calls added, as :func:`collect_ranges`
        builds it. Raises ValueError when none was added."""
        if not self.count:
            raise ValueError(f"{self.path}: no calibration feeds")
        return minmax_data(self.lo, self.hi)


def minmax_data(lo: dict, hi: dict):
    """onnxruntime's MinMax ``TensorsData`` from {tensor: lowest} and {tensor: highest} (float32
    [1] each, as ``MinMaxCalibrater.compute_data`` gives them), in ``lo``'s order."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

    return TensorsData(
        CalibrationMethod.MinMax,
        {t: TensorData(lowest=np.array([lo[t]], np.float32), highest=np.array([hi[t]], np.float32)) for t in lo},
    )


def save_ranges(data, path) -> None:
    """Write MinMax ``TensorsData`` as JSON {tensor: [lowest, highest]} (float32 values, exact
    as JSON numbers; keys sorted: the same ranges give the same bytes). Creates the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = {
        t: [float(np.ravel(d.range_value[0])[0]), float(np.ravel(d.range_value[1])[0])] for t, d in data.data.items()
    }
    path.write_text(json.dumps(rows, sort_keys=True, separators=(",", ":")) + "\n")


def load_ranges(path):
    """The ``TensorsData`` (MinMax, float32 [1] lowest/highest per tensor) :func:`save_ranges`
    wrote to ``path``. Raises OSError when the file is missing, ValueError when it is not
    {tensor: [lowest, highest]}."""
    rows = json.loads(Path(path).read_text())
    if not isinstance(rows, dict) or not all(isinstance(v, list) and len(v) == 2 for v in rows.values()):
        raise ValueError(f"{path}: expected {{tensor: [lowest, highest]}}")
    return minmax_data({t: lo for t, (lo, _) in rows.items()}, {t: hi for t, (_, hi) in rows.items()})


def collect_ranges(model_path, feeds):
    """MinMax ranges of ``model_path``'s tensors over ``feeds`` (an iterable of feed dicts), in
    memory independent of the number of feeds. The augmented graph is written beside the model
    for the session (so its folder must be writable) and removed. Returns onnxruntime's ``TensorsData``
    (``CalibrationMethod.MinMax``, {tensor: TensorData(lowest, highest)}), as
    ``MinMaxCalibrater.compute_data`` would. Raises ValueError on an empty ``feeds``."""
    import onnx

    from tasks.llm.sessions import cpu_session_for

    model_path = Path(model_path)
    aug, names = augment_for_ranges(onnx.load(str(model_path), load_external_data=False))
    sess = cpu_session_for(aug, model_path.parent, f".{model_path.stem}.ranges.onnx")
    outs = [t + s for t in names for s in ("__min", "__max")]
    lo = {t: np.inf for t in names}
    hi = {t: -np.inf for t in names}
    count = 0
    for f in feeds:
        res = sess.run(outs, f)
        for j, t in enumerate(names):
            lo[t] = min(lo[t], float(res[2 * j]))
            hi[t] = max(hi[t], float(res[2 * j + 1]))
        count += 1
    if not count:
        raise ValueError(f"{model_path}: no calibration feeds")
    return minmax_data(lo, hi)

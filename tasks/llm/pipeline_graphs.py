"""A HF decoder LLM (the architectures of :mod:`tasks.llm.architectures`) written as static-shape,
NPU-friendly ONNX prefill/decode graphs, part by part (the ``export`` stage: :mod:`tasks.llm.export`).

The graph I/O is what onnxruntime-genai 0.18.0's decoder pipeline feeds a static-shape graph
(``model.type = "decoder-pipeline"``, ``sliding_window`` with ``slide_key_value_cache: false``,
``alignment: "left"``; the layout Olive's ``StaticLLM`` pass writes for QNN), so genai runs the
compiled bundle unchanged (:mod:`tasks.llm.genai`). Sources, onnxruntime-genai ``src/``:
``models/input_ids.cpp`` (``WindowedInputIDs``: input_ids windows, ``past_sequence_length`` /
``total_sequence_length``), ``models/kv_cache.cpp`` (``DefaultKeyValueCache``: a fixed KV
length in the graph turns on one shared past/present buffer per layer), ``generators.cpp``
(``AllocateInputIdsOnDevice``: "left" alignment pads the prompt at its end),
``models/decoder_only_pipeline.cpp`` (stages linked by tensor name), ``models/logits.cpp``.
genai 0.18.0 does not give pipeline models its sliding ``WindowedKeyValueCache`` (measured,
see :mod:`tasks.llm.genai`), so the cache is the shared buffer and the graph writes into it.

Graph contract (per part ``i``; S = seq_len for ``prefill`` (genai's "context" graph, S = its
``window_size``), S = 1 for ``decode`` (genai's "iterator" graph); C = context_len;
Hkv = num_key_value_heads; d = head_dim; D = hidden_size; V = vocab_size):

inputs
  - part 0: ``input_ids`` int32 [1, S] (or ``inputs_embeds`` float32 [1, S, D] if ``embed="separate"``)
  - part i > 0: ``hidden_states_{i-1}`` float32 [1, S, D] (the output of part i-1, same name:
    genai links pipeline stages by tensor name)
  - ``past_seq_len`` int32 [1, 1]: q = (slot of this call's first token) + S - 1 (genai's
    GroupQueryAttention convention ``seqlens_k``: after prompt window k it is k*S - 1, then the
    number of real tokens before the new one). The S tokens go to cache slots
    p0..p0+S-1, p0 = q + 1 - S, with positions p0 + i; each in [0, C-1].
  - ``total_seq_len`` int32 [1]: genai feeds ``search.max_length``; it changes nothing (the
    positions, all < C, are clipped to Max(total_seq_len, C)), but genai feeds ``past_seq_len``
    only to a graph that takes both, and an input no node reads is dropped by the compile.
  - for each layer l of the part: ``past_key_{l}`` (rotary applied) and ``past_value_{l}``,
    float32 [1, Hkv, C, d] (uint8 once quantized: :mod:`tasks.llm.quantize`): the whole cache,
    slot j = the token at position j; slots >= p0 may hold anything finite (genai starts them
    at zero bytes: -128 x scale in 8 bits), the graph zeroes them before attention reads them.
outputs
  - last part: ``logits`` float32 [1, S, V], every row: genai reads the row of the last real
    token (the prompt is padded at its end, so that is not always row S-1; ``logits.cpp``);
    other parts: ``hidden_states_{i}`` float32 [1, S, D].
  - for each layer l: ``present_key_{l}``, ``present_value_{l}`` [1, Hkv, C, d], ``past_*``'s
    dtype: the cache with slots p0..p0+S-1 replaced by this call's K/V, the slots after zero
    (genai binds them to ``past_*``'s buffer; :class:`tasks.llm.kv_cache.KVCache` swaps them in).

Inside: positions = Gather(table [C, S] of p0 + i, q); the new K/V are written with a one-hot
matrix Gather(eye [C, C], positions) (exact 0/1 values, no Scatter/Where/Equal): present =
past * keep + onehotᵀ @ new, keep = 1 - colsum(onehot) - (the mask row of the call's last
position / MASK_VALUE): 1 for slots < p0, 0 from p0 on; attention reads the updated cache with
the additive causal mask Gather(table [C, C], positions) (row p: 0 for slots <= p, MASK_VALUE
after), tiled over the query group. -100 (not -inf / float-min) keeps the 16-bit range of the
masked scores small (exp(-100) ~ 4e-44) but does not hide every key: slots at -100 moved the
tiny Qwen2's fp32 logits by 18.1 (6 prompts x 16 steps), hence the zeroing. With the 8-bit
cache and no zeroing, zero bytes (-128 x scale), byte 128 (0.0) and random bytes there gave
the same logits bit for bit (the quantized scores are clipped to their calibrated range
first): a bound only while that range spans less than ~80; the zeroing holds for any model,
at three ops on [1, C] per call. The two [C, C] tables live in the part's weight file
(16-bit after quantization: 2*C*C bytes each, 32 MiB at C=4096).

Layer ``l`` uses its global index in names, so names are unique across parts.

How: the graphs are written directly with ``onnx.helper`` (the writer and the layer ops:
:mod:`tasks.llm.graph_ops`) from the checkpoint's tensors, one
part at a time and one tensor at a time (:class:`tasks.llm.checkpoint.Checkpoint`), never
from a loaded ``transformers`` model. That is what bounds memory: exporting a 7 B
model through ``torch.onnx.export`` needs the whole model in fp32 (~30 GB) plus the exporter's
copies (transposed weights after constant folding, the serialized protobuf). onnxruntime-genai's
model builder works the same way (graph from config + weights), but emits GroupQueryAttention /
RotaryEmbedding contrib ops and dynamic shapes that QNN HTP does not run, so it is not used.
Optimum's ``text-generation-with-past`` export brings a ``Where`` on the mask path (QNN error
6007 at compile), int64 ids and dynamic axes. The ops are the ones the earlier TorchScript
export produced and that compiled fully on HTP: RMSNorm as Pow/ReduceMean/Add/Sqrt/Div/Mul,
q/k/v/o and MLP projections as MatMul (+ Add for Qwen2's q/k/v biases), rotate-half RoPE with
Slice/Neg/Concat, GQA without repeating K/V (the ``g`` query heads of a KV head are folded into
the row axis and the mask is tiled ``g`` times), SiLU as ``x * Sigmoid(x)`` (Gemma's tanh GELU:
:func:`tasks.llm.graph_ops._activation`).

The RoPE table is a constant [C, d] cos and sin table indexed by ``position_ids`` (Gather), not
``Cos(position * inv_freq)``: a 16-bit activation quantizing ``position * inv_freq`` (range up to C)
would lose ~C/65535 radians; a table lookup keeps full precision in the (16-bit) table. ``inv_freq``
and the attention scaling come from ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` for
the config's ``rope_scaling`` (default, linear, dynamic, yarn, longrope, llama3), as HF's own
rotary module computes them. The tables are initializers named ``rope_cos`` / ``rope_sin`` (see
:data:`ROPE_TABLES`); quantize them as 16-bit (:mod:`tasks.llm.qdq` does).

Weights: each part's prefill and decode graphs reference ONE external data file,
``part{i}/weights.data`` (float32, each tensor at a 64 KiB-aligned offset so onnxruntime can
map it instead of copying), so the part's weights are written and stored once. Opset 21 (what
onnxruntime's quantizer upgrades to for 16-bit activations anyway). Determinism: the same
checkpoint and arguments give byte-identical files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tasks.proc import lazy

from tasks.llm.graph_ops import OPSET, _Graph, _rmsnorm, _rotary, _split_names, layer_heads, layer_tail
from tasks.llm.layout import IO_LAYOUT
from tasks.llm.part_weights import (
    MASK_VALUE,
    WEIGHTS_FILE,
    cache_tables,
    embedding_table,
    model_dims,
    rope_tables,
    special_tokens,
    write_part_weights,
)
from tasks.llm.parts import MAX_TENSOR_ELEMENTS

np = lazy.module("numpy")


def build_graph(
    dims: dict,
    lo: int,
    hi: int,
    first: bool,
    last: bool,
    S: int,
    C: int,
    embed: str,
    weights: dict,
    has_bias: bool,
    part: int = 0,
):
    """The ONNX ModelProto of one part for AR-``S`` (see the module docstring for the contract).
    ``weights`` are the part's external-data TensorProtos (:func:`write_part_weights`)."""
    H, Hkv, d = dims["num_heads"], dims["num_kv_heads"], dims["head_dim"]
    grp, eps = H // Hkv, dims["rms_eps"]
    g = _Graph(weights)
    ins, outs = io_spec(dims, lo, hi, first, last, S, C, embed, part)
    x = ins[0][0]
    if first and embed == "part0":
        tables = _split_names(g, "model.embed_tokens.weight")
        cols = [g.op("model/embed_tokens", "Gather", [g.w(t), "input_ids"]) for t in tables]
        x = cols[0] if len(cols) == 1 else g.op("model/embed_tokens", "Concat", cols, axis=-1)
    # positions of this call's rows: Gather(table [C, S] of q + 1 - S + i, past_seq_len [1, 1])
    pos = g.op("positions", "Gather", [g.const(f"pos_table_{S}", position_table(S, C), np.int32), "past_seq_len"])
    pos = g.op("positions", "Reshape", [pos, g.const(f"shape_1_{S}", [1, S])])  # [1, S] int32
    cos = g.op("rope", "Unsqueeze", [g.op("rope", "Gather", [g.w("rope_cos"), pos]), g.const("ax1", [1])])
    sin = g.op("rope", "Unsqueeze", [g.op("rope", "Gather", [g.w("rope_sin"), pos]), g.const("ax1", [1])])
    # genai feeds past_seq_len only to graphs that also take total_seq_len, and a graph input no
    # node reads is dropped by the compile: positions (all < C) are clipped to Max(total, C), a no-op
    total = g.op("positions", "Max", ["total_seq_len", g.const("context_len", [C], np.int32)])
    pos = g.op("positions", "Min", [pos, total])
    onehot = g.op("cache", "Gather", [g.w("kv_eye"), g.op("cache", "Squeeze", [pos, g.const("ax0", [0])])])  # [S, C]
    mask = g.op("mask", "Gather", [g.w("causal_mask"), g.op("mask", "Squeeze", [pos, g.const("ax0", [0])])])  # [S, C]
    # keep: 1 for the slots before this call's, 0 for its own and every slot after (module docstring)
    last_row = (
        mask
        if S == 1
        else g.op("cache", "Slice", [mask, g.const(f"s_{S - 1}", [S - 1]), g.const(f"s_{S}", [S]), g.const("ax0", [0])])
    )  # [1, C]: the last position's mask
    after = g.op("cache", "Mul", [last_row, g.const("inv_mask_value", 1.0 / MASK_VALUE, np.float32)])  # [1, C] 0/1
    keep = g.op(
        "cache",
        "Sub",
        [g.const("one", 1.0, np.float32), g.op("cache", "ReduceSum", [onehot, g.const("ax0", [0])], keepdims=1)],
    )  # [1, C]
    keep = g.op("cache", "Sub", [keep, after])
    keep = g.op("cache", "Reshape", [keep, g.const(f"shape_keep_{C}", [1, 1, C, 1])])
    onehot_t = g.op("cache", "Transpose", [onehot], perm=[1, 0])  # [C, S]
    if grp > 1:
        mask = g.op("mask", "Concat", [mask] * grp, axis=0)  # [grp*S, C]
    scale = g.const("attn_scale", 1.0 / math.sqrt(d), np.float32)
    for l in range(lo, hi):
        p = f"model.layers.{l}"
        s = f"model/layers.{l}"
        heads = layer_heads(g, s, p, x, dims, eps, S, has_bias, weights)
        q = g.op(f"{s}/self_attn/q", "Transpose", [heads["q"]], perm=[0, 2, 1, 3])
        k = g.op(f"{s}/self_attn/k", "Transpose", [heads["k"]], perm=[0, 2, 1, 3])
        v = g.op(f"{s}/self_attn/v", "Transpose", [heads["v"]], perm=[0, 2, 1, 3])
        q = _rotary(g, f"{s}/self_attn/rope_q", q, cos, sin, d, dims["rotary_dim"])
        k = _rotary(g, f"{s}/self_attn/rope_k", k, cos, sin, d, dims["rotary_dim"])
        # write the S new rows into the cache: past * keep + onehotᵀ @ new  ([1, Hkv, C, d])
        cache = {}
        for nm, new in (("key", k), ("value", v)):
            kept = g.op(f"{s}/self_attn/{nm}_cache", "Mul", [f"past_{nm}_{l}", keep])
            put = g.op(f"{s}/self_attn/{nm}_cache", "MatMul", [onehot_t, new])
            cache[nm] = g.op(f"{s}/self_attn/{nm}_cache", "Add", [kept, put], out=f"present_{nm}_{l}")
        # the grp query heads of a KV head folded into rows: [1, H, S, d] -> [1, Hkv, grp*S, d]
        qg = g.op(f"{s}/self_attn", "Reshape", [q, g.const(f"shape_g_{S}", [1, Hkv, grp * S, d])])
        kt = g.op(f"{s}/self_attn", "Transpose", [cache["key"]], perm=[0, 1, 3, 2])
        scores = g.op(f"{s}/self_attn", "Mul", [g.op(f"{s}/self_attn", "MatMul", [qg, kt]), scale])
        probs = g.op(f"{s}/self_attn", "Softmax", [g.op(f"{s}/self_attn", "Add", [scores, mask])], axis=-1)
        o = g.op(f"{s}/self_attn", "MatMul", [probs, cache["value"]])
        x = layer_tail(g, s, p, x, o, dims, eps, S, out=None if (l < hi - 1 or last) else hidden_name(part))
    if last:
        x = _rmsnorm(g, "model/norm", x, "model.norm.weight", eps)
        heads = _split_names(g, "lm_head.weight.T")
        if len(heads) == 1:
            g.op("lm_head", "MatMul", [x, g.w(heads[0])], out="logits")
        else:
            g.op("lm_head", "Concat", [g.op("lm_head", "MatMul", [x, g.w(h)]) for h in heads], out="logits", axis=-1)
    return g.model(ins, outs)


def hidden_name(part: int) -> str:
    """Name of the hidden states part ``part`` hands to part ``part + 1`` (its output and the
    next part's input: genai's pipeline passes a stage's outputs on by name)."""
    return f"hidden_states_{part}"


def position_table(S: int, C: int) -> np.ndarray:
    """int32 [C, S]: row q holds the positions q + 1 - S + i of a call whose ``past_seq_len`` is q
    (module docstring), clipped at 0 (rows q < S - 1 are not used by genai's windows)."""
    q = np.arange(C, dtype=np.int64)[:, None] + 1 - S + np.arange(S)[None, :]
    return np.clip(q, 0, C - 1).astype(np.int32)


def io_spec(dims: dict, lo, hi, first, last, S, C, embed, part: int = 0):
    """[(name, shape, dtype)] of a part graph's inputs and outputs (the contract above).
    ``part``: the part's index (names of the hidden states)."""
    hd, D, Hkv, V = dims["head_dim"], dims["hidden_size"], dims["num_kv_heads"], dims["vocab_size"]
    ins = []
    if first and embed == "part0":
        ins.append(("input_ids", [1, S], "int32"))
    elif first:
        ins.append(("inputs_embeds", [1, S, D], "float32"))
    else:
        ins.append((hidden_name(part - 1), [1, S, D], "float32"))
    ins += [("past_seq_len", [1, 1], "int32"), ("total_seq_len", [1], "int32")]
    for l in range(lo, hi):
        ins += [(f"past_key_{l}", [1, Hkv, C, hd], "float32"), (f"past_value_{l}", [1, Hkv, C, hd], "float32")]
    outs = []
    if last:
        outs.append(("logits", [1, S, V], "float32"))
    else:
        outs.append((hidden_name(part), [1, S, D], "float32"))
    for l in range(lo, hi):
        outs += [(f"present_key_{l}", [1, Hkv, C, hd], "float32"), (f"present_value_{l}", [1, Hkv, C, hd], "float32")]
    return ins, outs


def export_llm(
    model_dir,
    out_dir,
    *,
    seq_len: int = 128,
    context_len: int = 4096,
    parts: int = 1,
    embed: str = "part0",
    only_parts=None,
    meter: list | None = None,
    max_tensor_elements: int = MAX_TENSOR_ELEMENTS,
) -> dict:
    """Export ``model_dir`` (a decoder of :mod:`tasks.llm.architectures`) to ``out_dir/part{i}/{prefill,decode}.onnx``.

    Args:
        model_dir: HF folder: ``config.json`` + ``model.safetensors`` (or an index + shards).
        out_dir: output folder (created). Also gets ``export.json`` (the returned description) and,
            for ``embed="separate"``, ``embed_tokens.npy`` (float32 [V, D], for a host-side lookup).
        seq_len: S of the prefill graph (AR-S); the decode graph is AR-1. 1 <= S < context_len.
        context_len: C, total attention span (past + new) of both graphs; also the RoPE table size,
            so every position must be < C.
        parts: number of parts; decoder layers split so that no part is much heavier, the
            embedding and LM head counted in layers (:func:`tasks.llm.parts.split_for`).
        embed: ``"part0"`` (token embedding Gather inside part 0, ``input_ids`` int32 in) or
            ``"separate"`` (part 0 takes ``inputs_embeds``; embedding table saved as .npy).
        only_parts: optional set of part indices to write (the ``export.part{k}`` stage writes
            one); ``export.json`` still describes every part, with ``weight_bytes`` for the
            written ones; ``embed_tokens.npy`` is written with part 0.
        max_tensor_elements: the embedding table and LM head are split into column chunks of
            at most this many elements (:data:`MAX_TENSOR_ELEMENTS`).
        meter: optional list; gets one ``{"part", "seconds", "peak_rss"}`` per written part
            (wall time; this process's peak RSS in bytes while writing it). Kept out of
            ``export.json``, which must not vary between runs.

    Memory: one part's tensors are read (in the checkpoint's dtype, converted one tensor at a
    time to float32); the largest single array alive is one weight matrix and its transpose.

    Returns a JSON-able dict: ``{"model_type", "seq_len", "context_len", "mask_value", "num_layers",
    "num_kv_heads", "head_dim", "hidden_size", "vocab_size", "embed", "embed_file", "io_layout", "eos_token_id",
    "pad_token_id", "bos_token_id", "parts": [{"index", "layers": [lo, hi], "prefill": {"path", "inputs", "outputs"},
    "decode": {...}, "weights": file, "weight_bytes": n}]}`` where inputs/outputs are lists of
    ``{"name", "shape", "dtype"}`` and paths are relative to ``out_dir``.

    Raises ValueError on bad arguments, an unsupported ``model_type`` or activation (:mod:`tasks.llm.architectures`).
    """
    from tasks.llm.checkpoint import Checkpoint
    from tasks.llm.parts import split_for

    import time

    import onnx

    from tasks.proc.rss import peak_rss, peak_rss_reset

    if embed not in ("part0", "separate"):
        raise ValueError(f"embed must be 'part0' or 'separate', got {embed!r}")
    if not 1 <= seq_len < context_len:
        raise ValueError(f"need 1 <= seq_len < context_len, got {seq_len}, {context_len}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt = Checkpoint(model_dir)
    dims = model_dims(ckpt.config)
    ranges = split_for(ckpt.config, parts, embed_in_part=embed == "part0")
    has_bias = "model.layers.0.self_attn.q_proj.bias" in ckpt
    rope = rope_tables(model_dir, context_len)
    desc = {
        "model_type": ckpt.config["model_type"],
        "seq_len": seq_len,
        "context_len": context_len,
        "mask_value": MASK_VALUE,
        **{k: dims[k] for k in ("num_layers", "num_kv_heads", "num_heads", "head_dim", "hidden_size", "vocab_size")},
        "embed": embed,
        "embed_file": None,
        "opset": OPSET,
        "io_layout": IO_LAYOUT,
        "exporter": "tasks.llm.export (onnx.helper, weights streamed from safetensors)",
        "parts": [],
    }
    desc.update(special_tokens(ckpt.config))
    if embed == "separate":
        if only_parts is None or 0 in only_parts:  # part 0 takes inputs_embeds
            np.save(out_dir / "embed_tokens.npy", embedding_table(ckpt))
        desc["embed_file"] = "embed_tokens.npy"
    from tasks import progress

    for i, (lo, hi) in progress.bar(list(enumerate(ranges)), "parts", unit="part"):
        first, last = i == 0, i == len(ranges) - 1
        pdir = out_dir / f"part{i}"
        pdesc = {"index": i, "layers": [lo, hi], "weights": f"part{i}/{WEIGHTS_FILE}"}
        t0 = time.perf_counter()
        peak_rss_reset()
        if only_parts is None or i in only_parts:
            pdir.mkdir(exist_ok=True)
            weights = write_part_weights(
                ckpt,
                lo,
                hi,
                embed=first and embed == "part0",
                head=last,
                rope=rope,
                path=pdir / WEIGHTS_FILE,
                tables=cache_tables(context_len),
                max_tensor_elements=max_tensor_elements,
            )
            pdesc["weight_bytes"] = (pdir / WEIGHTS_FILE).stat().st_size
        for gname, S in (("prefill", seq_len), ("decode", 1)):
            ins, outs = io_spec(dims, lo, hi, first, last, S, context_len, embed, i)
            path = pdir / f"{gname}.onnx"
            if only_parts is None or i in only_parts:
                m = build_graph(dims, lo, hi, first, last, S, context_len, embed, weights, has_bias, i)
                onnx.save(m, str(path))
            pdesc[gname] = {
                "path": str(path.relative_to(out_dir)),
                "inputs": [{"name": n, "shape": s, "dtype": d} for n, s, d in ins],
                "outputs": [{"name": n, "shape": s, "dtype": d} for n, s, d in outs],
            }
        desc["parts"].append(pdesc)
        if meter is not None and (only_parts is None or i in only_parts):
            meter.append({"part": i, "seconds": time.perf_counter() - t0, "peak_rss": peak_rss()})
    desc["checkpoint_bytes_read"] = ckpt.bytes_read
    (out_dir / "export.json").write_text(json.dumps(desc, indent=1))
    return desc

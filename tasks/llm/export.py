"""Export a HF decoder LLM (Qwen2 / Llama) to static-shape, NPU-friendly ONNX prefill/decode graphs.

Graph contract (per part ``i``; S = seq_len for ``prefill``, S = 1 for ``decode``; C = context_len;
P = C - S; Hkv = num_key_value_heads; d = head_dim; D = hidden_size; V = vocab_size):

inputs
  - part 0: ``input_ids`` int32 [1, S] (or ``inputs_embeds`` float32 [1, S, D] if ``embed="separate"``)
  - part i > 0: ``hidden_states_in`` float32 [1, S, D] (output of part i-1)
  - ``position_ids`` int32 [1, S]: absolute positions, each in [0, C-1] (used to Gather rows of a
    constant cos/sin table of shape [C, d]; positions >= C are out of range -> error/garbage).
  - ``attention_mask`` float32 [1, 1, S, C]: *additive* mask, 0.0 = attend, :data:`MASK_VALUE`
    (-100.0) = blocked. Columns 0..P-1 address the past K/V inputs, columns P..C-1 the S new
    tokens of this call. The caller builds it (causality, padding); the graph only adds it, so there
    is no Where / IsNaN / Equal on the mask path. -100 (not -inf / float-min) keeps the 16-bit
    quantization range of the masked scores small (exp(-100) ~ 4e-44, i.e. fully blocked).
  - for each layer l of the part: ``past_key_{l}``, ``past_value_{l}`` float32 [1, Hkv, P, d]
    (rotary already applied to keys). Entries that the mask blocks may hold anything finite.
outputs
  - last part: ``logits`` float32 [1, 1, V] (``lm_head="last"``: only position S-1) or
    [1, S, V] (``lm_head="all"``); other parts: ``hidden_states`` float32 [1, S, D].
  - for each layer l: ``present_key_{l}``, ``present_value_{l}`` float32 [1, Hkv, S, d]: only the K/V
    of the S new tokens; the caller writes them into its cache (:mod:`tasks.llm.runner`).

Layer ``l`` uses its global index in names, so names are unique across parts.

How: the graphs are written directly with ``onnx.helper`` from the checkpoint's tensors, one
part at a time and one tensor at a time (:class:`tasks.llm.checkpoint.Checkpoint`), never
from a loaded ``transformers`` model. That is what bounds memory (issue 8): exporting a 7 B
model through ``torch.onnx.export`` needs the whole model in fp32 (~30 GB) plus the exporter's
copies (transposed weights after constant folding, the serialized protobuf). onnxruntime-genai's
model builder works the same way (graph from config + weights), but emits GroupQueryAttention /
RotaryEmbedding contrib ops and dynamic shapes that QNN HTP does not run, so it is not used.
Optimum's ``text-generation-with-past`` export brings a ``Where`` on the mask path (QNN error
6007, NOTES-qnn.md), int64 ids and dynamic axes. The ops are the ones the earlier TorchScript
export produced and that compiled fully on HTP: RMSNorm as Pow/ReduceMean/Add/Sqrt/Div/Mul,
q/k/v/o and MLP projections as MatMul (+ Add for Qwen2's q/k/v biases), rotate-half RoPE with
Slice/Neg/Concat, GQA without repeating K/V (the ``g`` query heads of a KV head are folded into
the row axis and the mask is tiled ``g`` times), SiLU as ``x * Sigmoid(x)``.

The RoPE table is a constant [C, d] cos and sin table indexed by ``position_ids`` (Gather), not
``Cos(position * inv_freq)``: a 16-bit activation quantizing ``position * inv_freq`` (range up to C)
would lose ~C/65535 radians; a table lookup keeps full precision in the (16-bit) table. ``inv_freq``
and the attention scaling come from ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` for
the config's ``rope_scaling`` (default, linear, dynamic, yarn, longrope, llama3), as HF's own
rotary module computes them. The tables are initializers named ``rope_cos`` / ``rope_sin`` (see
:data:`ROPE_TABLES`); quantize them as 16-bit (``tasks.llm.quant`` does).

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

import numpy as np

from .checkpoint import Checkpoint, part_tensor_names
from .parts import SUPPORTED, split_layers  # noqa: F401  (part of this module's API)

MASK_VALUE = -100.0
ROPE_TABLES = ("rope_cos", "rope_sin")
OPSET = 21
IR_VERSION = 10
WEIGHTS_FILE = "weights.data"
ALIGN = 65536  # Windows' allocation granularity; a multiple of Linux's page size
# Largest weight initializer, in elements. onnxruntime's quantizer holds about four float copies
# of the tensor it is quantizing (quant_utils.quantize_nparray: astype, divide, round, add), so a
# 545 M-element table (Qwen2.5-7B's embedding or LM head, 2.2 GB in float32) alone cost ~9 GB
# (measured: 2.4 GB peak for a 0.55 GB Gather table). Wider tables are split along their output
# axis into equal chunks (then a Concat): exact in float32, and per-channel weight scales are
# unchanged; a 16-bit Gather table gets one scale per column group instead of one.
MAX_TENSOR_ELEMENTS = 1 << 27


def split_sizes(rows: int, cols: int, limit: int = MAX_TENSOR_ELEMENTS) -> list[int]:
    """Column counts of the chunks a [rows, cols] weight is split into so that each chunk has at
    most ``limit`` elements: the fewest equal chunks (a divisor of ``cols``), else near-equal."""
    if rows * cols <= limit:
        return [cols]
    k = -(-rows * cols // limit)
    for n in range(k, cols + 1):
        if cols % n == 0 and rows * (cols // n) <= limit:
            return [cols // n] * n
    base, rem = divmod(cols, k)
    return [base + (1 if i < rem else 0) for i in range(k)]


def model_dims(config: dict) -> dict:
    """The dims the graphs need from a HF ``config.json`` dict: ``num_layers, hidden_size,
    num_heads, num_kv_heads, head_dim, vocab_size, intermediate_size, rms_eps``. Raises
    ValueError for an unsupported ``model_type`` (see :data:`SUPPORTED`) or activation."""
    mt = config.get("model_type")
    if mt not in SUPPORTED:
        raise ValueError(f"unsupported model_type {mt!r}; supported LLM families: {', '.join(SUPPORTED)}")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported hidden_act {act!r} (only silu / SwiGLU MLPs)")
    H = config["num_attention_heads"]
    return {"num_layers": config["num_hidden_layers"], "hidden_size": config["hidden_size"],
            "num_heads": H, "num_kv_heads": config.get("num_key_value_heads") or H,
            "head_dim": config.get("head_dim") or config["hidden_size"] // H,
            "vocab_size": config["vocab_size"], "intermediate_size": config["intermediate_size"],
            "rms_eps": float(config.get("rms_norm_eps", 1e-6))}


def rope_tables(model_dir, context_len: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables, float32 [context_len, head_dim], row p = position p, including HF's
    ``attention_scaling``; computed by transformers' own rope init for the config's rope type."""
    import torch
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    rs = getattr(cfg, "rope_scaling", None) or {}
    rope_type = rs.get("rope_type", rs.get("type", "default"))
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg, torch.device("cpu"))
    pos = torch.arange(context_len, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq.float()[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return ((emb.cos() * float(scaling)).numpy().astype(np.float32),
            (emb.sin() * float(scaling)).numpy().astype(np.float32))


class _WeightFile:
    """Appends float32 tensors to one external data file and makes the TensorProtos that point
    into it (location relative to the graphs' folder)."""

    def __init__(self, path: Path):
        self.path = path
        self.f = open(path, "wb")
        self.protos: dict[str, object] = {}

    def add(self, name: str, arr: np.ndarray) -> None:
        import onnx

        arr = np.ascontiguousarray(arr, dtype=np.float32)
        off = self.f.tell()
        if off % ALIGN:
            self.f.write(b"\0" * (ALIGN - off % ALIGN))
            off = self.f.tell()
        self.f.write(arr.tobytes())
        t = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT, dims=list(arr.shape),
                             data_location=onnx.TensorProto.EXTERNAL)
        for k, v in (("location", self.path.name), ("offset", str(off)), ("length", str(arr.nbytes))):
            e = t.external_data.add()
            e.key, e.value = k, v
        self.protos[name] = t

    def close(self) -> None:
        self.f.close()


def write_part_weights(ckpt: Checkpoint, lo: int, hi: int, *, embed: bool, head: bool,
                       rope: tuple[np.ndarray, np.ndarray], path: Path,
                       max_tensor_elements: int = MAX_TENSOR_ELEMENTS) -> dict:
    """Write one part's weights to ``path``, one tensor in memory at a time. Linear weights
    ([out, in] in HF) are stored transposed ([in, out], the MatMul's B) under the HF name with
    ``.T`` appended; norms, biases and the embedding table keep their HF names; the embedding
    table and LM head are split above ``max_tensor_elements`` (:func:`split_sizes`). Returns
    {name: TensorProto with external data}."""
    wf = _WeightFile(path)
    try:
        for name, table in zip(ROPE_TABLES, rope):
            wf.add(name, table)
        for n in part_tensor_names(ckpt, lo, hi, embed=embed, head=False):
            a = ckpt.get(n)
            if n.endswith("_proj.weight"):
                wf.add(n + ".T", a.T)
            elif n == "model.embed_tokens.weight":  # [V, D], split along D
                _add_split(wf, n, a, max_tensor_elements)
            else:
                wf.add(n, a)
            del a
        if head:
            wf.add("model.norm.weight", ckpt.get("model.norm.weight"))
            head_name = part_tensor_names(ckpt, 0, 0, embed=False, head=True)[-1]
            _add_split(wf, "lm_head.weight.T", ckpt.get(head_name).T, max_tensor_elements)  # [D, V], split along V
    finally:
        wf.close()
    return wf.protos


def _add_split(wf: "_WeightFile", name: str, a: np.ndarray, limit: int) -> None:
    """Add a 2-D weight whole (``name``) or, above :data:`MAX_TENSOR_ELEMENTS`, as column
    chunks ``name.0``, ``name.1``, ... (:func:`split_sizes`)."""
    sizes = split_sizes(*a.shape, limit)
    if len(sizes) == 1:
        wf.add(name, a)
        return
    at = 0
    for j, n in enumerate(sizes):
        wf.add(f"{name}.{j}", a[:, at:at + n])
        at += n


def _split_names(g: "_Graph", name: str) -> list[str]:
    """The initializer name(s) :func:`_add_split` gave ``name``."""
    if name in g.weights:
        return [name]
    out, j = [], 0
    while f"{name}.{j}" in g.weights:
        out.append(f"{name}.{j}")
        j += 1
    return out


class _Graph:
    """Minimal ONNX graph writer: nodes get names ``/<scope>/<Op>_<k>`` and outputs ``<name>_out``."""

    def __init__(self, weights: dict):
        self.weights = weights
        self.nodes, self.inits, self.used = [], {}, []
        self.count: dict[str, int] = {}

    def w(self, name: str) -> str:
        if name not in self.used:
            self.used.append(name)
        return name

    def const(self, name: str, value, dtype=np.int64) -> str:
        import onnx

        if name not in self.inits:
            self.inits[name] = onnx.numpy_helper.from_array(np.asarray(value, dtype=dtype), name)
        return name

    def op(self, scope: str, op: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        import onnx

        k = self.count.get(f"{scope}/{op}", 0)
        self.count[f"{scope}/{op}"] = k + 1
        name = f"/{scope}/{op}" + (f"_{k}" if k else "")
        out = out or name + "_out"
        self.nodes.append(onnx.helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def model(self, inputs, outputs):
        import onnx

        def vi(n, shape, dt):
            return onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)

        inits = [self.weights[n] for n in self.used] + list(self.inits.values())
        g = onnx.helper.make_graph(self.nodes, "part", [vi(*i) for i in inputs], [vi(*o) for o in outputs],
                                   initializer=inits)
        return onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", OPSET)],
                                      ir_version=IR_VERSION, producer_name="npubuild")


def _rmsnorm(g: _Graph, scope: str, x: str, weight: str, eps: float) -> str:
    sq = g.op(scope, "Pow", [x, g.const("two", 2.0, np.float32)])
    mean = g.op(scope, "ReduceMean", [sq, g.const("axis_last", [-1])], keepdims=1)
    rstd = g.op(scope, "Div", [g.const("one", 1.0, np.float32),
                               g.op(scope, "Sqrt", [g.op(scope, "Add", [mean, g.const("eps", eps, np.float32)])])])
    return g.op(scope, "Mul", [g.op(scope, "Mul", [x, rstd]), g.w(weight)])


def _linear(g: _Graph, scope: str, x: str, prefix: str, bias: bool) -> str:
    y = g.op(scope, "MatMul", [x, g.w(prefix + ".weight.T")])
    return g.op(scope, "Add", [y, g.w(prefix + ".bias")]) if bias else y


def _rotate(g: _Graph, scope: str, t: str, cos: str, sin: str, half: int, out: str | None = None) -> str:
    hi = g.op(scope, "Slice", [t, g.const(f"s_{half}", [half]), g.const("s_max", [2**62]), g.const("axis_last", [-1])])
    lo = g.op(scope, "Slice", [t, g.const("s_0", [0]), g.const(f"s_{half}", [half]), g.const("axis_last", [-1])])
    rot = g.op(scope, "Concat", [g.op(scope, "Neg", [hi]), lo], axis=-1)
    return g.op(scope, "Add", [g.op(scope, "Mul", [t, cos]), g.op(scope, "Mul", [rot, sin])], out=out)


def build_graph(dims: dict, lo: int, hi: int, first: bool, last: bool, S: int, C: int, lm_head: str,
                embed: str, weights: dict, has_bias: bool):
    """The ONNX ModelProto of one part for AR-``S`` (see the module docstring for the contract).
    ``weights`` are the part's external-data TensorProtos (:func:`write_part_weights`)."""
    H, Hkv, d = dims["num_heads"], dims["num_kv_heads"], dims["head_dim"]
    grp, eps = H // Hkv, dims["rms_eps"]
    g = _Graph(weights)
    ins, outs = io_spec(dims, lo, hi, first, last, S, C, lm_head, embed)
    x = ins[0][0]
    if first and embed == "part0":
        tables = _split_names(g, "model.embed_tokens.weight")
        cols = [g.op("model/embed_tokens", "Gather", [g.w(t), "input_ids"]) for t in tables]
        x = cols[0] if len(cols) == 1 else g.op("model/embed_tokens", "Concat", cols, axis=-1)
    cos = g.op("rope", "Unsqueeze", [g.op("rope", "Gather", [g.w("rope_cos"), "position_ids"]), g.const("ax1", [1])])
    sin = g.op("rope", "Unsqueeze", [g.op("rope", "Gather", [g.w("rope_sin"), "position_ids"]), g.const("ax1", [1])])
    mask = "attention_mask"
    if grp > 1:
        mask = g.op("mask", "Concat", [mask] * grp, axis=2)
    scale = g.const("attn_scale", 1.0 / math.sqrt(d), np.float32)
    for l in range(lo, hi):
        p = f"model.layers.{l}"
        s = f"model/layers.{l}"
        h = _rmsnorm(g, f"{s}/input_layernorm", x, f"{p}.input_layernorm.weight", eps)
        heads = {}
        for nm, nh in (("q", H), ("k", Hkv), ("v", Hkv)):
            t = _linear(g, f"{s}/self_attn/{nm}_proj", h, f"{p}.self_attn.{nm}_proj", has_bias)
            t = g.op(f"{s}/self_attn/{nm}", "Reshape", [t, g.const(f"shape_{S}_{nh}_{d}", [1, S, nh, d])])
            heads[nm] = t
        q = g.op(f"{s}/self_attn/q", "Transpose", [heads["q"]], perm=[0, 2, 1, 3])
        k = g.op(f"{s}/self_attn/k", "Transpose", [heads["k"]], perm=[0, 2, 1, 3])
        v = g.op(f"{s}/self_attn/v", "Transpose", [heads["v"]], perm=[0, 2, 1, 3], out=f"present_value_{l}")
        q = _rotate(g, f"{s}/self_attn/rope_q", q, cos, sin, d // 2)
        k = _rotate(g, f"{s}/self_attn/rope_k", k, cos, sin, d // 2, out=f"present_key_{l}")
        k_all = g.op(f"{s}/self_attn", "Concat", [f"past_key_{l}", k], axis=2)
        v_all = g.op(f"{s}/self_attn", "Concat", [f"past_value_{l}", v], axis=2)
        qg = g.op(f"{s}/self_attn", "Reshape", [q, g.const(f"shape_g_{S}", [1, Hkv, grp * S, d])])
        kt = g.op(f"{s}/self_attn", "Transpose", [k_all], perm=[0, 1, 3, 2])
        scores = g.op(f"{s}/self_attn", "Mul", [g.op(f"{s}/self_attn", "MatMul", [qg, kt]), scale])
        probs = g.op(f"{s}/self_attn", "Softmax", [g.op(f"{s}/self_attn", "Add", [scores, mask])], axis=-1)
        o = g.op(f"{s}/self_attn", "MatMul", [probs, v_all])
        o = g.op(f"{s}/self_attn", "Reshape", [o, g.const(f"shape_h_{S}", [1, H, S, d])])
        o = g.op(f"{s}/self_attn", "Transpose", [o], perm=[0, 2, 1, 3])
        o = g.op(f"{s}/self_attn", "Reshape", [o, g.const(f"shape_o_{S}", [1, S, H * d])])
        x = g.op(s, "Add", [x, _linear(g, f"{s}/self_attn/o_proj", o, f"{p}.self_attn.o_proj", False)])
        h = _rmsnorm(g, f"{s}/post_attention_layernorm", x, f"{p}.post_attention_layernorm.weight", eps)
        gate = _linear(g, f"{s}/mlp/gate_proj", h, f"{p}.mlp.gate_proj", False)
        act = g.op(f"{s}/mlp/act", "Mul", [gate, g.op(f"{s}/mlp/act", "Sigmoid", [gate])])
        up = _linear(g, f"{s}/mlp/up_proj", h, f"{p}.mlp.up_proj", False)
        down = _linear(g, f"{s}/mlp/down_proj", g.op(f"{s}/mlp", "Mul", [act, up]), f"{p}.mlp.down_proj", False)
        x = g.op(s, "Add", [x, down], out=None if (l < hi - 1 or last) else "hidden_states")
    if last:
        x = _rmsnorm(g, "model/norm", x, "model.norm.weight", eps)
        if lm_head == "last":
            x = g.op("lm_head", "Slice", [x, g.const(f"s_{S - 1}", [S - 1]), g.const(f"s_{S}", [S]), g.const("ax1", [1])])
        heads = _split_names(g, "lm_head.weight.T")
        if len(heads) == 1:
            g.op("lm_head", "MatMul", [x, g.w(heads[0])], out="logits")
        else:
            g.op("lm_head", "Concat", [g.op("lm_head", "MatMul", [x, g.w(h)]) for h in heads], out="logits", axis=-1)
    return g.model(ins, outs)


def io_spec(dims: dict, lo, hi, first, last, S, C, lm_head, embed):
    """[(name, shape, dtype)] of a part graph's inputs and outputs (the contract above)."""
    hd, D, Hkv, V = dims["head_dim"], dims["hidden_size"], dims["num_kv_heads"], dims["vocab_size"]
    ins = []
    if first and embed == "part0":
        ins.append(("input_ids", [1, S], "int32"))
    elif first:
        ins.append(("inputs_embeds", [1, S, D], "float32"))
    else:
        ins.append(("hidden_states_in", [1, S, D], "float32"))
    ins += [("position_ids", [1, S], "int32"), ("attention_mask", [1, 1, S, C], "float32")]
    for l in range(lo, hi):
        ins += [(f"past_key_{l}", [1, Hkv, C - S, hd], "float32"),
                (f"past_value_{l}", [1, Hkv, C - S, hd], "float32")]
    outs = []
    if last:
        outs.append(("logits", [1, 1 if lm_head == "last" else S, V], "float32"))
    else:
        outs.append(("hidden_states", [1, S, D], "float32"))
    for l in range(lo, hi):
        outs += [(f"present_key_{l}", [1, Hkv, S, hd], "float32"),
                 (f"present_value_{l}", [1, Hkv, S, hd], "float32")]
    return ins, outs


def export_llm(model_dir, out_dir, *, seq_len: int = 128, context_len: int = 4096, parts: int = 1,
               embed: str = "part0", lm_head: str = "last", only_parts=None, meter: list | None = None,
               max_tensor_elements: int = MAX_TENSOR_ELEMENTS) -> dict:
    """Export ``model_dir`` (HF Qwen2/Llama folder, safetensors) to ``out_dir/part{i}/{prefill,decode}.onnx``.

    Args:
        model_dir: HF folder: ``config.json`` + ``model.safetensors`` (or an index + shards).
        out_dir: output folder (created). Also gets ``export.json`` (the returned description) and,
            for ``embed="separate"``, ``embed_tokens.npy`` (float32 [V, D], for a host-side lookup).
        seq_len: S of the prefill graph (AR-S); the decode graph is AR-1. 1 <= S < context_len.
        context_len: C, total attention span (past + new) of both graphs; also the RoPE table size,
            so every position must be < C.
        parts: number of parts; decoder layers are split evenly (:func:`split_layers`).
        embed: ``"part0"`` (token embedding Gather inside part 0, ``input_ids`` int32 in) or
            ``"separate"`` (part 0 takes ``inputs_embeds``; embedding table saved as .npy).
        lm_head: ``"last"`` (logits of position S-1 only: [1,1,V]) or ``"all"`` ([1,S,V]).
        only_parts: optional set of part indices to write (benchmarks); ``export.json`` still
            describes every part.
        max_tensor_elements: the embedding table and LM head are split into column chunks of
            at most this many elements (:data:`MAX_TENSOR_ELEMENTS`).
        meter: optional list; gets one ``{"part", "seconds", "peak_rss"}`` per written part
            (wall time; this process's peak RSS in bytes while writing it). Kept out of
            ``export.json``, which must not vary between runs.

    Memory: one part's tensors are read (in the checkpoint's dtype, converted one tensor at a
    time to float32); the largest single array alive is one weight matrix and its transpose.

    Returns a JSON-able dict: ``{"model_type", "seq_len", "context_len", "mask_value", "num_layers",
    "num_kv_heads", "head_dim", "hidden_size", "vocab_size", "embed", "lm_head", "embed_file",
    "parts": [{"index", "layers": [lo, hi], "prefill": {"path", "inputs", "outputs"},
    "decode": {...}, "weights": file, "weight_bytes": n}]}`` where inputs/outputs are lists of
    ``{"name", "shape", "dtype"}`` and paths are relative to ``out_dir``.

    Raises ValueError on bad arguments or an unsupported ``model_type`` (only qwen2, llama).
    """
    import time

    import onnx

    from .memory import peak_rss, peak_rss_reset

    if embed not in ("part0", "separate"):
        raise ValueError(f"embed must be 'part0' or 'separate', got {embed!r}")
    if lm_head not in ("last", "all"):
        raise ValueError(f"lm_head must be 'last' or 'all', got {lm_head!r}")
    if not 1 <= seq_len < context_len:
        raise ValueError(f"need 1 <= seq_len < context_len, got {seq_len}, {context_len}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt = Checkpoint(model_dir)
    dims = model_dims(ckpt.config)
    ranges = split_layers(dims["num_layers"], parts)
    has_bias = "model.layers.0.self_attn.q_proj.bias" in ckpt
    rope = rope_tables(model_dir, context_len)
    desc = {"model_type": ckpt.config["model_type"], "seq_len": seq_len, "context_len": context_len,
            "mask_value": MASK_VALUE, **{k: dims[k] for k in ("num_layers", "num_kv_heads", "num_heads",
                                                                 "head_dim", "hidden_size", "vocab_size")},
            "embed": embed, "lm_head": lm_head, "embed_file": None, "opset": OPSET,
            "exporter": "tasks.llm.export (onnx.helper, weights streamed from safetensors)", "parts": []}
    if embed == "separate":
        np.save(out_dir / "embed_tokens.npy", ckpt.get("model.embed_tokens.weight"))
        desc["embed_file"] = "embed_tokens.npy"
    from .. import progress

    for i, (lo, hi) in progress.bar(list(enumerate(ranges)), "parts", unit="part"):
        first, last = i == 0, i == len(ranges) - 1
        pdir = out_dir / f"part{i}"
        pdesc = {"index": i, "layers": [lo, hi], "weights": f"part{i}/{WEIGHTS_FILE}"}
        t0 = time.perf_counter()
        peak_rss_reset()
        if only_parts is None or i in only_parts:
            pdir.mkdir(exist_ok=True)
            weights = write_part_weights(ckpt, lo, hi, embed=first and embed == "part0", head=last,
                                         rope=rope, path=pdir / WEIGHTS_FILE, max_tensor_elements=max_tensor_elements)
            pdesc["weight_bytes"] = (pdir / WEIGHTS_FILE).stat().st_size
        for gname, S in (("prefill", seq_len), ("decode", 1)):
            ins, outs = io_spec(dims, lo, hi, first, last, S, context_len, lm_head, embed)
            path = pdir / f"{gname}.onnx"
            if only_parts is None or i in only_parts:
                m = build_graph(dims, lo, hi, first, last, S, context_len, lm_head, embed, weights, has_bias)
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

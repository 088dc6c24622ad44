"""Export a HF decoder LLM in the graph layout Qualcomm's Genie runtime drives, write its config,
and run it through ``libGenie.so``.

The graphs are the same decoder :mod:`tasks.llm.export` writes (RMSNorm as Pow/ReduceMean/..., q/k/v
projections as MatMul, rotate-half RoPE, GQA with the query group folded into rows, SwiGLU; the
helpers are shared), but with Genie's inputs and outputs and a KV cache that Genie keeps on the
host. Sources of the contract: public copies of Genie's ``qualla/engines/qnn-htp/nsp-model.cpp``
(``checkShape``; float mask values 0 / -1000: ``m_attention_negative_value``; RoPE tables
``inv_freq[j] = theta^(-j/pos_dim)``, not duplicated), ``nsp-graph.cpp`` (AR from ``input_ids``,
CL from ``attention_mask``'s last dim), ``KVCache/smart-mask.cpp`` (``new_idx = CL - AR``) and
quic/ai-hub-models ``qai_hub_models/models/_shared/llm/model.py`` (tensor names, KV shapes,
graph names); checked on the x86_64 HTP simulator (``experiments/genie-run``, this module's
test).

Graph contract (per part ``i`` of ``N``; S = AR = tokens per call: ``seq_len`` for the prompt
graph, 1 for the token graph; C = CL = context length; P = C - S; Hkv = num_key_value_heads;
d = head_dim; r = rotary_dim / 2; D = hidden_size; V = vocab_size; all float32 unless said):

inputs
  - part 0: ``input_ids`` int32 [1, S]; part i > 0: ``hidden_states_{i-1}`` [1, S, D] (the
    output of part i-1 under the same name: Genie treats an input named like an output of
    another split as the same buffer, ``initializeUnconnectedInputs``)
  - ``attention_mask`` [1, 1, S, C], additive: 0 = attend, -1000 = masked (what Genie writes
    into a float mask). Columns 0..P-1 are the past slots ``past_*_in`` hold (the first
    ``n_past`` valid, left-aligned), columns P..C-1 this call's S new tokens (causal among
    themselves). Rows past the real tokens of a padded last prompt chunk are all -1000.
  - ``position_ids_cos``, ``position_ids_sin`` [1, 1, S, r]: cos / sin of ``pos * inv_freq[j]``
    for each row's position (Genie computes them from ``rope-theta`` and ``pos-id-dim``); the
    graph makes the rotate-half tables [.., 2r] by ``Concat(t, t)``.
  - per layer l of the part: ``past_key_{l}_in`` [Hkv, 1, d, P] (keys transposed) and
    ``past_value_{l}_in`` [Hkv, 1, P, d]: Genie's host cache, RoPE already applied to keys.
outputs
  - last part: ``logits`` [1, 1, S, V] (every row; Genie reads the row of the last real token);
    other parts ``hidden_states_{i}`` [1, S, D].
  - per layer l: ``past_key_{l}_out`` [Hkv, 1, d, S] and ``past_value_{l}_out`` [Hkv, 1, S, d]:
    this call's new entries only (Genie copies the first n_process of them into its cache).

Graph names: ``prompt_ar{S}_cl{C}_{i+1}_of_{N}`` / ``token_ar1_cl{C}_{i+1}_of_{N}`` (AI Hub's).
Genie reads AR and CL from the tensors above, but orders the N splits of one (AR, CL) by the
``_{i}_of_{N}`` in the graph name: a compiled binary must carry that name (:func:`rename_graph`;
onnxruntime names graphs after a hash of the model path, so the ONNX files are named after the
graphs to keep the names apart).

``sanitize_past`` (default True): the past K/V are multiplied by 0/1 per slot, taken from the
mask (``keep = Relu(1 + mask[row 0, :P] / 1000)``), before attention. Genie does not clear its
cache buffers; their unwritten slots can hold leftover heap bytes (seen: 7e34 as float32 in the
first prefill's ``past_key_0_in``, ``experiments/genie-run/NOTES.md``), and an additive -1000
does not hide a score of that size: fp32 K/V need this, quantized K/V are bounded by their
encoding. NaN/Inf leftovers would still pass through ``* 0``.

Only the default RoPE (no ``rope_scaling``) is written: Genie computes the tables, and the
scaled variants need Genie's ``positional-encoding.rope-scaling`` block, not set here.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from ..proc import lazy

np = lazy.module("numpy")

#: what Genie writes into a float32 / float16 attention mask for a masked slot (nsp-model.cpp)
GENIE_MASK_NEG = -1000.0
WEIGHTS_FILE = "weights.data"
IO_LAYOUT = ("genie: int32 input_ids [1,S], attention_mask [1,1,S,C] (0/-1000), position_ids_cos/sin "
             "[1,1,S,d/2], past_key_{l}_in [Hkv,1,d,C-S], past_value_{l}_in [Hkv,1,C-S,d]; "
             "outputs logits [1,1,S,V], past_*_{l}_out (new entries only)")


def graph_name(kind: str, S: int, C: int, part: int, parts: int) -> str:
    """AI Hub's graph name: ``prompt_ar{S}_cl{C}_{part+1}_of_{parts}`` for ``kind="prompt"``,
    ``token_ar1_cl{C}_...`` for ``kind="token"`` (``part`` counts from 0)."""
    return f"{kind}_ar{S}_cl{C}_{part + 1}_of_{parts}"


def io_spec(dims: dict, lo: int, hi: int, first: bool, last: bool, S: int, C: int, part: int = 0):
    """[(name, shape, dtype)] of one part graph's inputs and outputs (module docstring)."""
    from .pipeline_graphs import hidden_name

    d, D, Hkv, V = dims["head_dim"], dims["hidden_size"], dims["num_kv_heads"], dims["vocab_size"]
    r, P = dims["rotary_dim"] // 2, C - S
    ins = [("input_ids", [1, S], "int32") if first else (hidden_name(part - 1), [1, S, D], "float32"),
           ("attention_mask", [1, 1, S, C], "float32"),
           ("position_ids_cos", [1, 1, S, r], "float32"), ("position_ids_sin", [1, 1, S, r], "float32")]
    for l in range(lo, hi):
        ins += [(f"past_key_{l}_in", [Hkv, 1, d, P], "float32"), (f"past_value_{l}_in", [Hkv, 1, P, d], "float32")]
    outs = [("logits", [1, 1, S, V], "float32") if last else (hidden_name(part), [1, S, D], "float32")]
    for l in range(lo, hi):
        outs += [(f"past_key_{l}_out", [Hkv, 1, d, S], "float32"), (f"past_value_{l}_out", [Hkv, 1, S, d], "float32")]
    return ins, outs


def build_graph(dims: dict, lo: int, hi: int, first: bool, last: bool, S: int, C: int, weights: dict,
                has_bias: bool, part: int = 0, parts: int = 1, sanitize_past: bool = True):
    """ONNX ModelProto of part ``part`` (layers ``lo..hi-1``) for AR-``S``, CL-``C`` in Genie's
    layout (module docstring). ``weights``: the part's external-data TensorProtos
    (:func:`tasks.llm.export.write_part_weights`)."""
    from .pipeline_graphs import _Graph, _linear, _rmsnorm, _rotate, _split_names, hidden_name, layer_tail

    H, Hkv, d = dims["num_heads"], dims["num_kv_heads"], dims["head_dim"]
    grp, eps, rd, P = H // Hkv, dims["rms_eps"], dims["rotary_dim"], C - S
    g = _Graph(weights)
    ins, outs = io_spec(dims, lo, hi, first, last, S, C, part)
    x = ins[0][0]
    if first:
        tables = _split_names(g, "model.embed_tokens.weight")
        cols = [g.op("model/embed_tokens", "Gather", [g.w(t), "input_ids"]) for t in tables]
        x = cols[0] if len(cols) == 1 else g.op("model/embed_tokens", "Concat", cols, axis=-1)
    # rotate-half tables [1, 1, S, rd] from Genie's [1, 1, S, rd/2]
    cos = g.op("rope", "Concat", ["position_ids_cos", "position_ids_cos"], axis=-1)
    sin = g.op("rope", "Concat", ["position_ids_sin", "position_ids_sin"], axis=-1)
    mask = "attention_mask"  # [1, 1, S, C]
    if sanitize_past:
        row0 = g.op("mask", "Slice", [mask, g.const("s_0", [0]), g.const("s_1", [1]), g.const("ax2", [2])])
        row0 = g.op("mask", "Slice", [row0, g.const("s_0", [0]), g.const(f"s_{P}", [P]), g.const("axis_last", [-1])])
        keep = g.op("mask", "Relu", [g.op("mask", "Add", [g.const("one", 1.0, np.float32), g.op(
            "mask", "Mul", [row0, g.const("inv_mask_neg", -1.0 / GENIE_MASK_NEG, np.float32)])])])  # [1,1,1,P] 0/1
        keep_rows = g.op("mask", "Reshape", [keep, g.const(f"shape_keep_{P}", [1, 1, P, 1])])
    if grp > 1:
        mask = g.op("mask", "Concat", [mask] * grp, axis=2)  # [1, 1, grp*S, C]
    scale = g.const("attn_scale", 1.0 / math.sqrt(d), np.float32)

    def rotary(scope, t):
        if rd == d:
            return _rotate(g, scope, t, cos, sin, rd // 2)
        rot = g.op(scope, "Slice", [t, g.const("s_0", [0]), g.const(f"s_{rd}", [rd]), g.const("axis_last", [-1])])
        rest = g.op(scope, "Slice", [t, g.const(f"s_{rd}", [rd]), g.const("s_max", [2**62]), g.const("axis_last", [-1])])
        return g.op(scope, "Concat", [_rotate(g, scope, rot, cos, sin, rd // 2), rest], axis=-1)

    for l in range(lo, hi):
        p, s = f"model.layers.{l}", f"model/layers.{l}"
        h = _rmsnorm(g, f"{s}/input_layernorm", x, f"{p}.input_layernorm.weight", eps)
        heads = {}
        for nm, nh in (("q", H), ("k", Hkv), ("v", Hkv)):
            t = _linear(g, f"{s}/self_attn/{nm}_proj", h, f"{p}.self_attn.{nm}_proj", has_bias)
            t = g.op(f"{s}/self_attn/{nm}", "Reshape", [t, g.const(f"shape_{S}_{nh}_{d}", [1, S, nh, d])])
            if f"{p}.self_attn.{nm}_norm.weight" in weights:  # Qwen3: RMSNorm over head_dim, per head
                t = _rmsnorm(g, f"{s}/self_attn/{nm}_norm", t, f"{p}.self_attn.{nm}_norm.weight", eps)
            heads[nm] = t
        q = rotary(f"{s}/self_attn/rope_q", g.op(f"{s}/self_attn/q", "Transpose", [heads["q"]], perm=[0, 2, 1, 3]))
        k = rotary(f"{s}/self_attn/rope_k", g.op(f"{s}/self_attn/k", "Transpose", [heads["k"]], perm=[0, 2, 1, 3]))
        # new entries in Genie's layout: keys [Hkv, 1, d, S], values [Hkv, 1, S, d]
        k_out = g.op(f"{s}/self_attn/k", "Transpose", [k], perm=[1, 0, 3, 2], out=f"past_key_{l}_out")
        v_out = g.op(f"{s}/self_attn/v", "Transpose", [heads["v"]], perm=[2, 0, 1, 3], out=f"past_value_{l}_out")
        k_past, v_past = f"past_key_{l}_in", f"past_value_{l}_in"
        if sanitize_past:
            k_past = g.op(f"{s}/self_attn/key_cache", "Mul", [k_past, keep])
            v_past = g.op(f"{s}/self_attn/value_cache", "Mul", [v_past, keep_rows])
        k_all = g.op(f"{s}/self_attn/key_cache", "Concat", [k_past, k_out], axis=3)  # [Hkv, 1, d, C]
        v_all = g.op(f"{s}/self_attn/value_cache", "Concat", [v_past, v_out], axis=2)  # [Hkv, 1, C, d]
        # the grp query heads of a KV head folded into rows: [1, H, S, d] -> [Hkv, 1, grp*S, d]
        qg = g.op(f"{s}/self_attn", "Reshape", [q, g.const(f"shape_g_{S}", [Hkv, 1, grp * S, d])])
        scores = g.op(f"{s}/self_attn", "Mul", [g.op(f"{s}/self_attn", "MatMul", [qg, k_all]), scale])
        probs = g.op(f"{s}/self_attn", "Softmax", [g.op(f"{s}/self_attn", "Add", [scores, mask])], axis=-1)
        o = g.op(f"{s}/self_attn", "MatMul", [probs, v_all])  # [Hkv, 1, grp*S, d]
        x = layer_tail(g, s, p, x, o, dims, eps, S, out=None if (l < hi - 1 or last) else hidden_name(part))
    if last:
        x = _rmsnorm(g, "model/norm", x, "model.norm.weight", eps)
        heads = _split_names(g, "lm_head.weight.T")
        lg = (g.op("lm_head", "MatMul", [x, g.w(heads[0])]) if len(heads) == 1 else
              g.op("lm_head", "Concat", [g.op("lm_head", "MatMul", [x, g.w(t)]) for t in heads], axis=-1))
        g.op("lm_head", "Reshape", [lg, g.const(f"shape_logits_{S}", [1, 1, S, dims["vocab_size"]])], out="logits")
    m = g.model(ins, outs)
    m.graph.name = graph_name("prompt" if S > 1 else "token", S, C, part, parts)
    return m


def export_genie(model_dir, out_dir, *, seq_len: int = 128, context_len: int = 4096, parts: int = 1,
                 sanitize_past: bool = True, only_parts=None) -> dict:
    """Export ``model_dir`` (a HF decoder folder of :mod:`tasks.llm.architectures`, safetensors) to
    ``out_dir/part{i}/{graph name}.onnx`` (:func:`graph_name`) in Genie's layout (module docstring), one part and one
    tensor at a time like :func:`tasks.llm.pipeline_graphs.export_llm` (the same ``part{i}/weights.data``
    writer; both graphs of a part reference it), plus the tokenizer files and ``genie_export.json``.

    Args:
        seq_len: AR of the prompt graph (1 < seq_len < context_len); the token graph is AR-1.
        context_len: CL of both graphs.
        parts: number of parts (:func:`tasks.llm.parts.split_for`, embedding in part 0).
        sanitize_past: zero the masked past slots in-graph (module docstring).
        only_parts: indices of the parts whose graphs and weights are written (default all);
            the description lists every part (names and I/O do not need the weights).

    Returns (and writes as ``genie_export.json``) ``{"model_type", "seq_len", "context_len",
    "num_layers", "num_kv_heads", "num_heads", "head_dim", "rotary_dim", "hidden_size",
    "vocab_size", "rope_theta", "io_layout", "sanitize_past", "eos_token_id", "bos_token_id",
    "pad_token_id", "genie_bos_token" (:func:`prepended_bos`), "parts": [{"index", "layers", "prompt": {"path", "graph", "inputs", "outputs"},
    "token": {...}}]}``. Raises ValueError for an unsupported family, a ``rope_scaling`` config
    or bad sizes.
    """
    import onnx

    from ..stages.common import copy_tokenizer
    from .checkpoint import Checkpoint
    from .part_weights import model_dims, special_tokens, write_part_weights
    from .parts import split_for

    if not 1 < seq_len < context_len:
        raise ValueError(f"need 1 < seq_len < context_len, got {seq_len}, {context_len}")
    ckpt = Checkpoint(model_dir)
    if ckpt.config.get("rope_scaling"):
        raise ValueError(f"rope_scaling {ckpt.config['rope_scaling']!r}: the Genie export writes default RoPE only")
    dims = model_dims(ckpt.config)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ranges = split_for(ckpt.config, parts, embed_in_part=True)
    has_bias = "model.layers.0.self_attn.q_proj.bias" in ckpt
    desc = {"model_type": ckpt.config["model_type"], "seq_len": seq_len, "context_len": context_len,
            **{k: dims[k] for k in ("num_layers", "num_kv_heads", "num_heads", "head_dim", "rotary_dim",
                                    "hidden_size", "vocab_size")},
            "rope_theta": float(ckpt.config.get("rope_theta", 10000.0)), "io_layout": IO_LAYOUT,
            "sanitize_past": sanitize_past, **special_tokens(ckpt.config), "parts": []}
    for i, (lo, hi) in enumerate(ranges):
        first, last = i == 0, i == len(ranges) - 1
        write = only_parts is None or i in only_parts
        pdir = out_dir / f"part{i}"
        if write:
            pdir.mkdir(exist_ok=True)
            weights = write_part_weights(ckpt, lo, hi, embed=first, head=last,
                                         rope=(np.zeros((1, 1), np.float32),) * 2, path=pdir / WEIGHTS_FILE)
        pdesc = {"index": i, "layers": [lo, hi], "weights": f"part{i}/{WEIGHTS_FILE}"}
        for kind, S in (("prompt", seq_len), ("token", 1)):
            name = graph_name(kind, S, context_len, i, len(ranges))
            if write:
                m = build_graph(dims, lo, hi, first, last, S, context_len, weights, has_bias, i, len(ranges),
                                sanitize_past)
                # the file name makes the compiled graph's name: onnxruntime names it after a hash of
                # the path as given (tasks/qnn.py), and Genie keys graphs by name: two parts' graphs
                # both compiled from "prompt.onnx" got one name, and GenieDialog_create failed with
                # "<name> : input_ids - Tensor not found" (status -1)
                onnx.save(m, str(pdir / f"{name}.onnx"))
            ins, outs = io_spec(dims, lo, hi, first, last, S, context_len, i)
            pdesc[kind] = {"path": f"part{i}/{name}.onnx", "graph": name,
                           "inputs": [{"name": n, "shape": s, "dtype": t} for n, s, t in ins],
                           "outputs": [{"name": n, "shape": s, "dtype": t} for n, s, t in outs]}
        desc["parts"].append(pdesc)
    copy_tokenizer(Path(model_dir), out_dir)
    desc["genie_bos_token"] = prepended_bos(out_dir)
    (out_dir / "genie_export.json").write_text(json.dumps(desc, indent=1))
    return desc


def prepended_bos(tokenizer_dir) -> int:
    """The token id the HF tokenizer in ``tokenizer_dir`` puts before every text (its BOS when
    ``tokenizer("a")`` starts with it), else -1. Genie prepends its ``bos-token`` to the first
    query of a dialog (text and token queries alike; seen in its tensor dumps), so the config
    gets this value: -1 ("unset") for Qwen2, whose tokenizer adds nothing."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = tok("a")["input_ids"]
    return int(ids[0]) if tok.bos_token_id is not None and ids and ids[0] == tok.bos_token_id else -1


def rename_graph(bin_path, name: str) -> str:
    """Give the one graph in context binary ``bin_path`` the name ``name``, in place; returns the
    old name. A workaround: onnxruntime's QNN EP names a compiled graph
    ``QNNExecutionProvider_QNNExecutionProvider_<hash of the model path>_1_0`` (no option sets
    it; ``ep.context_node_name_prefix`` did not), and Genie orders the splits of one (AR, CL) by
    ``<prefix>_<i>_of_<N>`` in the graph name, putting other names after them in string order
    (its log: "does not follow the expected split naming"); with ORT's names part 1's prompt
    graph came first and GenieDialog_create failed ("logits - Tensor not found"). The name is
    stored as plain bytes (3 times in our binaries); it is replaced by ``name`` left-padded with
    ``_`` to the same length, so no offset in the binary moves. Checked on the x86_64 simulator
    (QnnContext_createFromBinary accepts it, 2-part tokens = transformers); not on a device.
    Raises ValueError when the binary does not hold exactly one ORT graph name or ``name`` is
    longer than it."""
    import re

    p = Path(bin_path)
    data = p.read_bytes()
    names = set(re.findall(rb"QNNExecutionProvider_QNNExecutionProvider_\d+_\d+_\d+", data))
    if len(names) != 1:
        raise ValueError(f"{p}: expected one onnxruntime graph name, found {sorted(names)}")
    old = names.pop()
    if len(name) > len(old):
        raise ValueError(f"graph name {name!r} is longer than {old.decode()!r}")
    p.write_bytes(data.replace(old, name.encode().rjust(len(old), b"_")))
    return old.decode()


def rename_graphs(bin_path, names: dict[str, str]) -> dict[str, str]:
    """Give the graphs of context binary ``bin_path`` new names, in place: ``names`` maps each
    onnxruntime graph name in it (the EPContext node's name in its ``_ctx.onnx``) to the new
    one (a weight-shared binary holds two). Each is written as :func:`rename_graph` does:
    ``_``-padded on the left to the old length, so no offset moves; the name libQnnSystem and
    Genie read is that padded one (Genie takes the split from its ``_{i}_of_{N}`` end). Returns
    {old: name as written}. Raises ValueError when an old name is not in the binary exactly
    as often as the others' (every ORT name is stored the same number of times) or a new name
    is longer than its old one."""
    p = Path(bin_path)
    data = p.read_bytes()
    written, counts = {}, set()
    for old, new in names.items():
        o = old.encode()
        counts.add(data.count(o))
        if not data.count(o):
            raise ValueError(f"{p}: expected graph name {old!r} in the binary, found it 0 times")
        if len(new) > len(o):
            raise ValueError(f"{p}: graph name {new!r} is longer than {old!r} ({len(new)} > {len(o)} bytes)")
        written[old] = new.rjust(len(o), "_")
        data = data.replace(o, written[old].encode())
    if len(counts) != 1:
        raise ValueError(f"{p}: expected every onnxruntime graph name the same number of times, found {sorted(counts)}")
    p.write_bytes(data)
    return written


# ---------------------------------------------------------------- host loop (reference, any EP)

def rope_half_tables(positions, rotary_dim: int, theta: float) -> tuple:
    """cos, sin float32 [len(positions), rotary_dim/2] as Genie computes them (default RoPE):
    ``inv_freq[j] = theta^(-j / (rotary_dim/2) / 2)``, i.e. HF's ``theta^(-2j/rotary_dim)``."""
    r = rotary_dim // 2
    inv = 1.0 / (theta ** (np.arange(r, dtype=np.float64) * 2.0 / rotary_dim))
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


class GenieHostLoop:
    """Greedy generation over Genie-layout graphs, feeding what Genie's SMART_MASK KV manager
    feeds (module docstring; ``KVCache/smart-mask.cpp``): the prompt in chunks of S from its
    start, the last chunk padded at its end (its pad rows fully masked); the host cache per
    layer keys [Hkv, 1, d, C-S_max] / values [Hkv, 1, C-S_max, d] ... sliced to each graph's
    P = C - S; after a call, the first n_process new entries go to slots n_past.. of the cache.
    Unwritten slots hold ``fill`` (0, or e.g. 7e34 to check that the graph ignores them).

    Args:
        export_dir: a :func:`export_genie` folder.
        make_session: ``path -> onnxruntime.InferenceSession``.
        suffix: file suffix per graph (``".onnx"`` fp32 on CPU; ``"_ctx.onnx"`` compiled).
        upto: run parts ``0 .. upto-1`` only (default all): what calibrating part ``upto-1``
            needs (:meth:`teacher_forced`); only :meth:`generate` needs the last part.
    """

    def __init__(self, export_dir, make_session, suffix: str = ".onnx", fill: float = 0.0, upto: int | None = None):
        d = Path(export_dir)
        self.desc = json.loads((d / "genie_export.json").read_text())
        rel = lambda p: str(d / (p[:-len(".onnx")] + suffix))  # noqa: E731
        parts = self.desc["parts"][:upto]
        self.prompt = [make_session(rel(p["prompt"]["path"])) for p in parts]
        self.token = [make_session(rel(p["token"]["path"])) for p in parts]
        self.S, self.C, self.fill = self.desc["seq_len"], self.desc["context_len"], float(fill)

    def new_cache(self) -> dict:
        """{layer: (keys [Hkv, 1, d, C], values [Hkv, 1, C, d])} float32, every slot ``fill``."""
        D = self.desc
        return {l: (np.full((D["num_kv_heads"], 1, D["head_dim"], self.C), self.fill, np.float32),
                    np.full((D["num_kv_heads"], 1, self.C, D["head_dim"]), self.fill, np.float32))
                for l in range(D["num_layers"])}

    def teacher_forced(self, prompt_ids, next_ids, on_feed) -> None:
        """Feed ``prompt_ids`` (prompt graph, chunks of S) then each of ``next_ids`` (token graph,
        one call each) as Genie would if it generated them, through the parts this loop holds;
        ``on_feed(kind, part, call, feeds)`` sees every call's feed dict of every part before it
        runs (``kind``: ``"prompt"`` / ``"token"``, ``call``: the call's index within its kind).
        The calibration schedule of :func:`tasks.llm.calibration_feeds.schedule` run in Genie's layout."""
        cache, n_past = self.new_cache(), 0
        toks = [int(t) for t in prompt_ids]
        for c, s in enumerate(range(0, len(toks), self.S)):
            chunk = toks[s:s + self.S]
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
            mask[0, 0, i, P:P + i + 1] = 0.0
        pos = np.arange(n_past, n_past + S)
        cos, sin = rope_half_tables(pos, self.desc["rotary_dim"], self.desc["rope_theta"])
        x = ids
        for k, sess in enumerate(sessions):
            feeds = {sess.get_inputs()[0].name: x, "attention_mask": mask,
                     "position_ids_cos": cos[None, None], "position_ids_sin": sin[None, None]}
            lo, hi = self.desc["parts"][k]["layers"]
            for l in range(lo, hi):
                feeds[f"past_key_{l}_in"] = np.ascontiguousarray(cache[l][0][..., :P])
                feeds[f"past_value_{l}_in"] = np.ascontiguousarray(cache[l][1][:, :, :P])
            if before is not None:
                before(k, feeds)
            names = [o.name for o in sess.get_outputs()]
            res = dict(zip(names, sess.run(names, feeds)))
            for l in range(lo, hi):
                cache[l][0][..., n_past:n_past + n] = res[f"past_key_{l}_out"][..., :n]
                cache[l][1][:, :, n_past:n_past + n] = res[f"past_value_{l}_out"][:, :, :n]
            x = res[names[0]]
        return x  # the last part's first output: logits [1, 1, S, V] or hidden_states [1, S, D]

    def generate(self, prompt_ids, max_new_tokens: int, eos: int | None = None) -> list[int]:
        """Greedy continuation of ``prompt_ids`` (at most ``max_new_tokens``; stops after ``eos``
        when given). Raises ValueError when prompt + new tokens exceed the context."""
        if len(prompt_ids) + max_new_tokens > self.C - 1:
            raise ValueError(f"{len(prompt_ids)} + {max_new_tokens} tokens do not fit CL={self.C}")
        cache = self.new_cache()
        n_past, toks = 0, [int(t) for t in prompt_ids]
        for s in range(0, len(toks), self.S):
            chunk = toks[s:s + self.S]
            logits = self._call(self.prompt, self.S, chunk, n_past, cache)[0, 0, len(chunk) - 1]
            n_past += len(toks[s:s + self.S])
        out = []
        while len(out) < max_new_tokens:
            t = int(np.argmax(logits))
            out.append(t)
            if t == eos:
                break
            logits = self._call(self.token, 1, [t], n_past, cache)[0, 0, 0]
            n_past += 1
        return out


# ---------------------------------------------------------------- Genie config files

def genie_config(desc: dict, ctx_bins: list[str], *, tokenizer: str = "tokenizer.json",
                 extensions: str = "htp_backend_ext_config.json", n_threads: int = 1,
                 use_mmap: bool = False, debug: dict | None = None) -> dict:
    """``genie_config.json`` (a ``dialog`` of type basic; schema: Genie's embedded
    ``urn:genie:schema:dialog``) for a :func:`export_genie` description and its compiled
    binaries ``ctx_bins`` (paths as Genie opens them: relative to its working folder).
    Sampler greedy (``top-k`` 1, ``greedy``); context size = CL; ``bos-token``: what the HF
    tokenizer prepends (:func:`prepended_bos`, -1 = none), so Genie's token sequence is HF's; ``kv-dim`` = head_dim;
    ``pos-id-dim`` = rotary_dim / 2; ``rope-theta`` from the HF config (Genie reads an int)."""
    cfg = {"dialog": {
        "version": 1, "type": "basic",
        "context": {"version": 1, "size": desc["context_len"], "n-vocab": desc["vocab_size"],
                    "bos-token": desc["genie_bos_token"], "eos-token": desc["eos_token_id"]},
        "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 1, "top-p": 1.0, "greedy": True},
        "tokenizer": {"version": 1, "path": tokenizer},
        "engine": {"version": 1, "n-threads": n_threads,
                   "backend": {"version": 1, "type": "QnnHtp",
                               "QnnHtp": {"version": 1, "use-mmap": use_mmap, "spill-fill-bufsize": 0,
                                          "mmap-budget": 0, "poll": False, "cpu-mask": "0x1",
                                          "kv-dim": desc["head_dim"], "pos-id-dim": desc["rotary_dim"] // 2,
                                          "allow-async-init": False, "rope-theta": int(desc["rope_theta"])},
                               "extensions": extensions},
                   "model": {"version": 1, "type": "binary", "binary": {"version": 1, "ctx-bins": list(ctx_bins)}}}}}
    if debug:
        cfg["dialog"]["debug"] = dict(debug)
    return cfg


def htp_backend_ext_config(target: str, weight_sharing: bool = False) -> dict:
    """``htp_backend_ext_config.json`` for ``target`` (a name in ``tasks/targets.py``: its QNN
    ``soc_model`` and ``v{htp_arch}``): one device, one core (burst), shared-buffer memory (AI
    Hub's ``create_genie_config`` fields)."""
    from ..targets import get as get_target

    tgt = get_target(target)
    return {"devices": [{"soc_model": tgt.soc_model, "dsp_arch": f"v{tgt.htp_arch}",
                         "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 100}]}],
            "memory": {"mem_type": "shared_buffer"},
            "context": {"weight_sharing_enabled": weight_sharing}}


# ---------------------------------------------------------------- libGenie.so through ctypes

class GenieError(RuntimeError):
    """A Genie C API call returned a non-zero status (``Genie_Status_t``; 4 = context exceeded
    is a warning and not raised)."""


class GenieDialog:
    """A Genie dialog from ``libGenie.so`` (onnxruntime-qnn's wheel; Genie API 1.21). On x86_64
    ``libQnnHtp.so`` runs the binaries on the HTP simulator.

    ``config``: the ``genie_config.json`` text; paths in it are opened relative to the current
    folder. ``log_level``: 1 error .. 4 verbose, None for no logger; ``log``: a callable taking
    each formatted line (default: dropped). Use as a context manager: every handle must be freed
    (without ``GenieDialog_free`` / ``GenieDialogConfig_free`` / ``GenieLog_free`` the process
    segfaulted at exit, experiments/genie-run)."""

    def __init__(self, config: str, *, log_level: int | None = None, log=None):
        import ctypes as C

        import onnxruntime_qnn

        self.C = C
        lib = self.lib = C.CDLL(os.path.join(os.path.dirname(onnxruntime_qnn.__file__), "libGenie.so"))
        vp, i32, u32 = C.c_void_p, C.c_int32, C.c_uint32
        self._LOGCB = C.CFUNCTYPE(None, vp, C.c_char_p, C.c_int, C.c_uint64, vp)
        self._TOKCB = C.CFUNCTYPE(None, C.POINTER(u32), u32, C.c_int, vp)
        self._TXTCB = C.CFUNCTYPE(None, C.c_char_p, C.c_int, vp)
        sigs = {"GenieLog_create": [vp, self._LOGCB, C.c_int, C.POINTER(vp)], "GenieLog_free": [vp],
                "GenieDialogConfig_createFromJson": [C.c_char_p, C.POINTER(vp)],
                "GenieDialogConfig_bindLogger": [vp, vp], "GenieDialogConfig_free": [vp],
                "GenieDialog_create": [vp, C.POINTER(vp)], "GenieDialog_free": [vp], "GenieDialog_reset": [vp],
                "GenieDialog_setMaxNumTokens": [vp, u32],
                "GenieDialog_tokenQuery": [vp, C.POINTER(u32), u32, C.c_int, self._TOKCB, vp],
                "GenieDialog_query": [vp, C.c_char_p, C.c_int, self._TXTCB, vp]}
        for f, args in sigs.items():
            getattr(lib, f).argtypes, getattr(lib, f).restype = args, i32
        self.log_handle, self.cfg, self.dialog = vp(), vp(), vp()
        self._logcb = None
        if log_level is not None:
            libc = C.CDLL(None)
            libc.vsnprintf.argtypes = [C.c_char_p, C.c_size_t, C.c_char_p, vp]
            sink = log or (lambda line: None)

            def _cb(_h, fmt, level, ts, args):
                buf = C.create_string_buffer(16384)
                libc.vsnprintf(buf, 16384, fmt, args)
                sink(buf.value.decode(errors="replace").rstrip())

            self._logcb = self._LOGCB(_cb)
            self._check("GenieLog_create", lib.GenieLog_create(None, self._logcb, log_level, C.byref(self.log_handle)))
        self._check("GenieDialogConfig_createFromJson",
                    lib.GenieDialogConfig_createFromJson(config.encode(), C.byref(self.cfg)))
        if self.log_handle.value:
            self._check("GenieDialogConfig_bindLogger", lib.GenieDialogConfig_bindLogger(self.cfg, self.log_handle))
        t = time.perf_counter()
        self._check("GenieDialog_create", lib.GenieDialog_create(self.cfg, C.byref(self.dialog)))
        self.create_seconds = time.perf_counter() - t

    def _check(self, what, status):
        if status not in (0, 4):
            self.close()
            raise GenieError(f"{what} -> status {status}")
        return status

    def generate(self, prompt_ids, max_new_tokens: int) -> tuple[list[int], int, float]:
        """``GenieDialog_tokenQuery`` (sentence COMPLETE) on the token ids ``prompt_ids`` after
        ``GenieDialog_reset``, at most ``max_new_tokens`` (``GenieDialog_setMaxNumTokens``).
        Returns (generated token ids, the query's status, seconds)."""
        C = self.C
        self._check("GenieDialog_reset", self.lib.GenieDialog_reset(self.dialog))
        self._check("GenieDialog_setMaxNumTokens", self.lib.GenieDialog_setMaxNumTokens(self.dialog, max_new_tokens))
        out: list[int] = []

        def _cb(tok, n, code, ud):
            out.extend(tok[i] for i in range(n))

        cb = self._TOKCB(_cb)
        ids = (C.c_uint32 * len(prompt_ids))(*[int(t) for t in prompt_ids])
        t = time.perf_counter()
        s = self._check("GenieDialog_tokenQuery", self.lib.GenieDialog_tokenQuery(self.dialog, ids, len(prompt_ids), 0, cb, None))
        return out, s, time.perf_counter() - t

    def query(self, text: str) -> tuple[str, int, float]:
        """``GenieDialog_query`` (sentence COMPLETE) on ``text`` (Genie's tokenizer): (reply,
        status, seconds)."""
        out: list[str] = []
        cb = self._TXTCB(lambda resp, code, ud: out.append(resp.decode(errors="replace") if resp else ""))
        t = time.perf_counter()
        s = self._check("GenieDialog_query", self.lib.GenieDialog_query(self.dialog, text.encode(), 0, cb, None))
        return "".join(out), s, time.perf_counter() - t

    def close(self) -> None:
        """Free the dialog, its config and the logger (each once)."""
        if self.dialog.value:
            self.lib.GenieDialog_free(self.dialog)
            self.dialog = self.C.c_void_p()
        if self.cfg.value:
            self.lib.GenieDialogConfig_free(self.cfg)
            self.cfg = self.C.c_void_p()
        if self.log_handle.value:
            self.lib.GenieLog_free(self.log_handle)
            self.log_handle = self.C.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------- checks (read-back, config parser)

#: genie_export.json dtypes (numpy names) -> the ONNX names tasks.context_binary reports
_ONNX_DTYPE = {"float32": "FLOAT", "int32": "INT32", "float16": "FLOAT16"}


def expected_graph(desc: dict, name: str, source: str = "genie_export.json"):
    """``tasks.context_binary.Expected`` for graph ``name`` of a :func:`export_genie` description:
    its inputs and outputs (ONNX dtype name, shape). Raises KeyError for a name no part has."""
    from ..context_binary import Expected

    for p in desc["parts"]:
        for kind in ("prompt", "token"):
            if p[kind]["graph"] == name:
                io = lambda ts: {t["name"]: (_ONNX_DTYPE[t["dtype"]], tuple(t["shape"])) for t in ts}  # noqa: E731
                return Expected(name, io(p[kind]["inputs"]), io(p[kind]["outputs"]), source)
    raise KeyError(f"{source}: no graph {name!r}")


def check_binaries(root, plan: dict[str, list[str]], desc: dict, target: str,
                   source: str = "genie_export.json") -> dict:
    """Read back the Genie context binaries ``plan`` names ({path relative to ``root``: graph
    names}) through libQnnSystem (:func:`tasks.context_binary.read`) and check each: it exists,
    holds exactly those graphs (a graph name as written by :func:`rename_graphs`, its ``_``
    padding stripped), each with the inputs and outputs ``desc`` (``genie_export.json``)
    declares (name, dtype, shape), prepared for ``target``'s SoC model (``tasks/targets.py``). Returns {binary: figures, with
    ``"graph_names"``: the names as libQnnSystem read them}. Raises
    ``tasks.context_binary.Mismatch``, one line per difference."""
    from dataclasses import replace

    from .. import context_binary

    root, lines, found = Path(root), [], {}
    for rel, graphs in sorted(plan.items()):
        if not (root / rel).is_file():
            lines.append(f"{rel}: expected (Genie binary of graphs {', '.join(graphs)}), found no such file")
            continue
        b = context_binary.read(root / rel)
        stripped = replace(b, graphs=tuple(replace(g, name=g.name.lstrip("_")) for g in b.graphs))
        lines += context_binary.check(stripped, [expected_graph(desc, g, source) for g in graphs], target,
                                      label=rel)
        found[rel] = {**b.figures(), "graph_names": [g.name for g in b.graphs]}
    if lines:
        print("npubuild: Genie context binaries read back, differences:\n  " + "\n  ".join(lines), flush=True)
        raise context_binary.Mismatch(lines)
    return found


def config_binaries(config: dict, desc: dict) -> dict[str, list[str]]:
    """{ctx-bins path: the graphs Genie will look for in it} of a ``genie_config.json``
    (:func:`genie_config`): a per-part weight-shared binary (``*_part_{i}_of_{N}.bin``) holds
    part i's prompt and token graphs, a per-graph binary (``{graph}.bin``) its graph. Raises
    ValueError naming a ctx-bins entry that is neither."""
    import re

    parts = {i + 1: p for i, p in enumerate(desc["parts"])}
    graphs = {p[k]["graph"]: p[k]["graph"] for p in desc["parts"] for k in ("prompt", "token")}
    out = {}
    for rel in config["dialog"]["engine"]["model"]["binary"]["ctx-bins"]:
        stem = Path(rel).stem
        m = re.fullmatch(r".*_part_(\d+)_of_(\d+)", stem)
        if stem in graphs:
            out[rel] = [stem]
        elif m and int(m.group(2)) == len(parts) and int(m.group(1)) in parts:
            p = parts[int(m.group(1))]
            out[rel] = [p["prompt"]["graph"], p["token"]["graph"]]
        else:
            raise ValueError(f"genie_config.json, dialog.engine.model.binary.ctx-bins: expected {{graph}}.bin or "
                             f"*_part_{{i}}_of_{len(parts)}.bin, found {rel!r}")
    return out


def _parse_child(text: str) -> None:
    """Child side of :func:`parse_config`: prints ``STATUS <n>`` (libGenie prints its reason)."""
    import ctypes as C

    import onnxruntime_qnn

    lib = C.CDLL(os.path.join(os.path.dirname(onnxruntime_qnn.__file__), "libGenie.so"))
    lib.GenieDialogConfig_createFromJson.argtypes = [C.c_char_p, C.POINTER(C.c_void_p)]
    lib.GenieDialogConfig_free.argtypes = [C.c_void_p]
    h = C.c_void_p()
    s = lib.GenieDialogConfig_createFromJson(text.encode(), C.byref(h))
    if h.value:
        lib.GenieDialogConfig_free(h)
    print(f"\nSTATUS {s}", flush=True)


def parse_config(text: str) -> tuple[int, str]:
    """Genie's own parser on a ``genie_config.json`` text (``GenieDialogConfig_createFromJson``
    of the wheel's ``libGenie.so``, schema ``urn:genie:schema:dialog``), in a child process
    (libGenie prints its reason to the console). Returns (status: 0 accepted, e.g. -8 schema
    error; the reason in one line, "" when accepted): e.g. ``at '/engine': ... validation failed
    for additional property 'n-threadz'``."""
    import re

    from ..proc.child import run_function

    r = run_function(_parse_child, text, timeout=300)
    said = r.stdout + "\n" + r.stderr
    m = re.search(r"^STATUS (-?\d+)$", said, re.M)
    if r.returncode != 0 or m is None:
        return -1, f"the parser's process ended with exit {r.returncode}: {r.tail(300)}"
    status = int(m.group(1))
    if status == 0:
        return 0, ""
    reasons = [ln.strip(" -") for ln in said.splitlines() if ln.strip().startswith("- at ")]
    first = next((ln.strip() for ln in said.splitlines() if "Failed" in ln or "failed" in ln), "")
    why = "; ".join(reasons) or first or "no reason printed"
    why = re.sub(r"(at least one subschema has failed, but all of them are required to validate - )+", "", why)
    return status, why


def _dialog_child(config: str, prompts: list[list[int]], max_new_tokens: int) -> None:
    """Child side of :func:`generate_in_child`: one JSON line per prompt."""
    with GenieDialog(config) as d:
        print(json.dumps({"create_seconds": d.create_seconds}), flush=True)
        for ids in prompts:
            toks, status, secs = d.generate(ids, max_new_tokens)
            print(json.dumps({"tokens": toks, "status": status, "seconds": secs}), flush=True)


def generate_in_child(folder, prompts: list[list[int]], max_new_tokens: int, timeout: float = 3600) -> dict:
    """Greedy tokens of every prompt (token ids) through ``GenieDialog_tokenQuery`` on
    ``folder/genie_config.json`` (paths in it relative to ``folder``), in a child process
    working in ``folder`` (a crash in the QNN libraries stays there). Returns {"tokens": [[id]],
    "status": [Genie status per prompt], "seconds": [per prompt], "create_seconds"}. Raises
    RuntimeError with the child's output tail when it fails or answers fewer prompts."""
    from ..proc.child import run_function

    text = (Path(folder) / "genie_config.json").read_text()
    r = run_function(_dialog_child, text, [[int(t) for t in p] for p in prompts], max_new_tokens, cwd=str(folder),
                     timeout=timeout)
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    got = [x for x in rows if "tokens" in x]
    if r.returncode != 0 or len(got) != len(prompts):
        raise RuntimeError(f"Genie on {folder}: expected {len(prompts)} answers, found {len(got)} "
                           f"(exit {r.returncode}): {r.tail(1500)}")
    return {"tokens": [x["tokens"] for x in got], "status": [x["status"] for x in got],
            "seconds": [x["seconds"] for x in got], "create_seconds": rows[0].get("create_seconds")}

"""Export a HF decoder LLM in the graph layout Qualcomm's Genie runtime drives. Beside it: the
host loop that feeds these graphs as Genie does (:mod:`tasks.llm.genie.host_loop`), the graph
names patched into the compiled binaries and their read-back (:mod:`tasks.llm.genie.binaries`),
Genie's config files (:mod:`tasks.llm.genie.config`) and ``libGenie.so`` itself
(:mod:`tasks.qnn.libgenie`).

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
``_{i}_of_{N}`` in the graph name: a compiled binary must carry that name
(:func:`tasks.llm.genie.binaries.rename_graph`; onnxruntime names graphs after a hash of the model path, so the ONNX
files are named after the graphs to keep the names apart).

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
from pathlib import Path

from tasks.proc import lazy
from tasks.errors import InputError

np = lazy.module("numpy")

#: what Genie writes into a float32 / float16 attention mask for a masked slot (nsp-model.cpp)
GENIE_MASK_NEG = -1000.0
WEIGHTS_FILE = "weights.data"
IO_LAYOUT = (
    "genie: int32 input_ids [1,S], attention_mask [1,1,S,C] (0/-1000), position_ids_cos/sin "
    "[1,1,S,d/2], past_key_{l}_in [Hkv,1,d,C-S], past_value_{l}_in [Hkv,1,C-S,d]; "
    "outputs logits [1,1,S,V], past_*_{l}_out (new entries only)"
)


def graph_name(kind: str, S: int, C: int, part: int, parts: int) -> str:
    """AI Hub's graph name: ``prompt_ar{S}_cl{C}_{part+1}_of_{parts}`` for ``kind="prompt"``,
    ``token_ar1_cl{C}_...`` for ``kind="token"`` (``part`` counts from 0)."""
    return f"{kind}_ar{S}_cl{C}_{part + 1}_of_{parts}"


def io_spec(dims: dict, lo: int, hi: int, first: bool, last: bool, S: int, C: int, part: int = 0):
    """[(name, shape, dtype)] of one part graph's inputs and outputs (module docstring)."""
    from tasks.llm.pipeline_graphs import hidden_name

    d, D, Hkv, V = dims["head_dim"], dims["hidden_size"], dims["num_kv_heads"], dims["vocab_size"]
    r, P = dims["rotary_dim"] // 2, C - S
    ins = [
        ("input_ids", [1, S], "int32") if first else (hidden_name(part - 1), [1, S, D], "float32"),
        ("attention_mask", [1, 1, S, C], "float32"),
        ("position_ids_cos", [1, 1, S, r], "float32"),
        ("position_ids_sin", [1, 1, S, r], "float32"),
    ]
    for l in range(lo, hi):
        ins += [(f"past_key_{l}_in", [Hkv, 1, d, P], "float32"), (f"past_value_{l}_in", [Hkv, 1, P, d], "float32")]
    outs = [("logits", [1, 1, S, V], "float32") if last else (hidden_name(part), [1, S, D], "float32")]
    for l in range(lo, hi):
        outs += [(f"past_key_{l}_out", [Hkv, 1, d, S], "float32"), (f"past_value_{l}_out", [Hkv, 1, S, d], "float32")]
    return ins, outs


def build_graph(
    dims: dict,
    lo: int,
    hi: int,
    first: bool,
    last: bool,
    S: int,
    C: int,
    weights: dict,
    has_bias: bool,
    part: int = 0,
    parts: int = 1,
    sanitize_past: bool = True,
):
    """ONNX ModelProto of part ``part`` (layers ``lo..hi-1``) for AR-``S``, CL-``C`` in Genie's
    layout (module docstring). ``weights``: the part's external-data TensorProtos
    (:func:`tasks.llm.part_weights.write_part_weights`)."""
    from tasks.llm.graph_ops import _Graph, _rmsnorm, _rotary, _split_names, layer_heads, layer_tail
    from tasks.llm.pipeline_graphs import hidden_name

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
        keep = g.op(
            "mask",
            "Relu",
            [
                g.op(
                    "mask",
                    "Add",
                    [
                        g.const("one", 1.0, np.float32),
                        g.op("mask", "Mul", [row0, g.const("inv_mask_neg", -1.0 / GENIE_MASK_NEG, np.float32)]),
                    ],
                )
            ],
        )  # [1,1,1,P] 0/1
        keep_rows = g.op("mask", "Reshape", [keep, g.const(f"shape_keep_{P}", [1, 1, P, 1])])
    if grp > 1:
        mask = g.op("mask", "Concat", [mask] * grp, axis=2)  # [1, 1, grp*S, C]
    scale = g.const("attn_scale", 1.0 / math.sqrt(d), np.float32)

    for l in range(lo, hi):
        p, s = f"model.layers.{l}", f"model/layers.{l}"
        heads = layer_heads(g, s, p, x, dims, eps, S, has_bias, weights)
        q = _rotary(
            g,
            f"{s}/self_attn/rope_q",
            g.op(f"{s}/self_attn/q", "Transpose", [heads["q"]], perm=[0, 2, 1, 3]),
            cos,
            sin,
            d,
            rd,
        )
        k = _rotary(
            g,
            f"{s}/self_attn/rope_k",
            g.op(f"{s}/self_attn/k", "Transpose", [heads["k"]], perm=[0, 2, 1, 3]),
            cos,
            sin,
            d,
            rd,
        )
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
        lg = (
            g.op("lm_head", "MatMul", [x, g.w(heads[0])])
            if len(heads) == 1
            else g.op("lm_head", "Concat", [g.op("lm_head", "MatMul", [x, g.w(t)]) for t in heads], axis=-1)
        )
        g.op("lm_head", "Reshape", [lg, g.const(f"shape_logits_{S}", [1, 1, S, dims["vocab_size"]])], out="logits")
    m = g.model(ins, outs)
    m.graph.name = graph_name("prompt" if S > 1 else "token", S, C, part, parts)
    return m


def export_genie(
    model_dir,
    out_dir,
    *,
    seq_len: int = 128,
    context_len: int = 4096,
    parts: int = 1,
    sanitize_past: bool = True,
    only_parts=None,
) -> dict:
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
    "pad_token_id", "genie_bos_token" (:func:`prepended_bos`), "parts": [{"index", "layers", "prompt": {"path", "graph",
    "inputs", "outputs"}, "token": {...}}]}``. Raises ValueError for an unsupported family, a ``rope_scaling`` config
    or bad sizes.
    """
    import onnx

    from tasks.contract.common import copy_tokenizer
    from tasks.llm.checkpoint import Checkpoint
    from tasks.llm.part_weights import model_dims, special_tokens, write_part_weights
    from tasks.llm.parts import split_for

    if not 1 < seq_len < context_len:
        raise ValueError(f"need 1 < seq_len < context_len, got {seq_len}, {context_len}")
    ckpt = Checkpoint(model_dir)
    if ckpt.config.get("rope_scaling"):
        raise InputError(f"rope_scaling {ckpt.config['rope_scaling']!r}: the Genie export writes default RoPE only")
    dims = model_dims(ckpt.config)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ranges = split_for(ckpt.config, parts, embed_in_part=True)
    has_bias = "model.layers.0.self_attn.q_proj.bias" in ckpt
    desc = {
        "model_type": ckpt.config["model_type"],
        "seq_len": seq_len,
        "context_len": context_len,
        **{
            k: dims[k]
            for k in ("num_layers", "num_kv_heads", "num_heads", "head_dim", "rotary_dim", "hidden_size", "vocab_size")
        },
        "rope_theta": float(ckpt.config.get("rope_theta", 10000.0)),
        "io_layout": IO_LAYOUT,
        "sanitize_past": sanitize_past,
        **special_tokens(ckpt.config),
        "parts": [],
    }
    for i, (lo, hi) in enumerate(ranges):
        first, last = i == 0, i == len(ranges) - 1
        write = only_parts is None or i in only_parts
        pdir = out_dir / f"part{i}"
        if write:
            pdir.mkdir(exist_ok=True)
            weights = write_part_weights(
                ckpt, lo, hi, embed=first, head=last, rope=(np.zeros((1, 1), np.float32),) * 2, path=pdir / WEIGHTS_FILE
            )
        pdesc = {"index": i, "layers": [lo, hi], "weights": f"part{i}/{WEIGHTS_FILE}"}
        for kind, S in (("prompt", seq_len), ("token", 1)):
            name = graph_name(kind, S, context_len, i, len(ranges))
            if write:
                m = build_graph(
                    dims, lo, hi, first, last, S, context_len, weights, has_bias, i, len(ranges), sanitize_past
                )
                # the file name makes the compiled graph's name: onnxruntime names it after a hash of
                # the path as given (tasks/qnn/ep.py), and Genie keys graphs by name: two parts' graphs
                # both compiled from "prompt.onnx" got one name, and GenieDialog_create failed with
                # "<name> : input_ids - Tensor not found" (status -1)
                onnx.save(m, str(pdir / f"{name}.onnx"))
            ins, outs = io_spec(dims, lo, hi, first, last, S, context_len, i)
            pdesc[kind] = {
                "path": f"part{i}/{name}.onnx",
                "graph": name,
                "inputs": [{"name": n, "shape": s, "dtype": t} for n, s, t in ins],
                "outputs": [{"name": n, "shape": s, "dtype": t} for n, s, t in outs],
            }
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

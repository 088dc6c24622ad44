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

Why ``torch.onnx.export`` (TorchScript exporter, ``dynamo=False``, opset 17) on a thin wrapper and
not optimum's exporter: optimum's ``text-generation-with-past`` export uses HF's cache/mask code
(Where on the mask path -> QNN error 6007 on HTP, see NOTES-qnn.md), int64 ids, growing past
length and dynamic axes. Wrapping our module in a custom ``OnnxConfig`` would only route the same
``torch.onnx.export`` call through optimum's input generators and dynamic-axes machinery, which we
must then switch off again; the wrapper needs none of it. The wrapper re-implements the decoder
forward from the HF module's own weights (RMSNorm, q/k/v/o projections, SwiGLU MLP, rotate-half
RoPE with HF's ``inv_freq`` and ``attention_scaling``), so it follows the checkpoint's rope config.

The RoPE table is a constant [C, d] cos and sin table indexed by ``position_ids`` (Gather), not
``Cos(position * inv_freq)``: a 16-bit activation quantizing ``position * inv_freq`` (range up to C)
would lose ~C/65535 radians; a table lookup keeps full precision in the (16-bit) table. The
tables are initializers named ``rope_cos`` / ``rope_sin`` (see :data:`ROPE_TABLES`); quantize
them as 16-bit (``tasks.llm.quant`` does).

Determinism: exporting the same model twice gives byte-identical ONNX files (same torch version).
External data (``<graph>.onnx.data``) is used only when a graph's weights exceed 2 GB.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

MASK_VALUE = -100.0
ROPE_TABLES = ("rope_cos", "rope_sin")
OPSET = 17
_TWO_GB = 2 * 1024**3


def _torch_modules():
    import torch
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, hf_norm):
            super().__init__()
            self.weight = hf_norm.weight
            self.eps = float(getattr(hf_norm, "variance_epsilon", getattr(hf_norm, "eps", 1e-6)))

        def forward(self, x):
            var = x.pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(var + self.eps) * self.weight

    class PartWrapper(nn.Module):
        """One part: [embedding] + layers[lo:hi] + [final norm + lm_head]."""

        def __init__(self, hf_model, lo, hi, first, last, seq_len, context_len, lm_head, embed):
            super().__init__()
            cfg = hf_model.config
            base = hf_model.model
            self.lo, self.hi, self.first, self.last = lo, hi, first, last
            self.S, self.C = seq_len, context_len
            self.lm_head_mode, self.embed_mode = lm_head, embed
            self.n_heads = cfg.num_attention_heads
            self.n_kv = cfg.num_key_value_heads
            self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            self.groups = self.n_heads // self.n_kv
            self.layers = nn.ModuleList(base.layers[lo:hi])
            self.norms_in = nn.ModuleList(RMSNorm(l.input_layernorm) for l in self.layers)
            self.norms_post = nn.ModuleList(RMSNorm(l.post_attention_layernorm) for l in self.layers)
            if first and embed == "part0":
                self.embed_tokens = base.embed_tokens
            if last:
                self.final_norm = RMSNorm(base.norm)
                self.lm_head = hf_model.lm_head
            rot = base.rotary_emb
            inv_freq = rot.inv_freq.detach().float()
            scaling = float(getattr(rot, "attention_scaling", 1.0))
            pos = torch.arange(context_len, dtype=torch.float32)
            freqs = pos[:, None] * inv_freq[None, :]
            emb = torch.cat([freqs, freqs], dim=-1)
            self.register_buffer("rope_cos", (emb.cos() * scaling).contiguous())
            self.register_buffer("rope_sin", (emb.sin() * scaling).contiguous())

        @staticmethod
        def _rotate_half(x):
            h = x.shape[-1] // 2
            return torch.cat([-x[..., h:], x[..., :h]], dim=-1)

        def forward(self, x, position_ids, attention_mask, *past):
            S, d, H, Hkv = self.S, self.head_dim, self.n_heads, self.n_kv
            if self.first and self.embed_mode == "part0":
                x = self.embed_tokens(x)
            # Gather rope rows: [1,S] int32 -> [1,1,S,d]
            cos = self.rope_cos[position_ids[0]].unsqueeze(0).unsqueeze(0)
            sin = self.rope_sin[position_ids[0]].unsqueeze(0).unsqueeze(0)
            presents = []
            for j, layer in enumerate(self.layers):
                attn = layer.self_attn
                h = self.norms_in[j](x)
                q = attn.q_proj(h).view(1, S, H, d).transpose(1, 2)
                k = attn.k_proj(h).view(1, S, Hkv, d).transpose(1, 2)
                v = attn.v_proj(h).view(1, S, Hkv, d).transpose(1, 2)
                q = q * cos + self._rotate_half(q) * sin
                k = k * cos + self._rotate_half(k) * sin
                presents += [k, v]
                k_all = torch.cat([past[2 * j], k], dim=2)  # [1,Hkv,C,d]
                v_all = torch.cat([past[2 * j + 1], v], dim=2)
                # GQA without repeating K/V: fold the `groups` query heads of each KV head into
                # the row axis: [1,H,S,d] -> [1,Hkv,g*S,d]; the mask is tiled g times (Concat).
                qg = q.reshape(1, Hkv, self.groups * S, d)
                mask = attention_mask if self.groups == 1 else torch.cat([attention_mask] * self.groups, dim=2)
                scores = torch.matmul(qg, k_all.transpose(2, 3)) * (1.0 / math.sqrt(d))
                probs = torch.softmax(scores + mask, dim=-1)
                o = torch.matmul(probs, v_all)  # [1,Hkv,g*S,d]
                o = o.reshape(1, H, S, d).transpose(1, 2).reshape(1, S, H * d)
                x = x + attn.o_proj(o)
                h = self.norms_post[j](x)
                mlp = layer.mlp
                x = x + mlp.down_proj(mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h))
            if self.last:
                x = self.final_norm(x)
                if self.lm_head_mode == "last":
                    x = x[:, -1:, :]
                x = self.lm_head(x)
            return (x, *presents)

    return PartWrapper


def split_layers(n_layers: int, parts: int) -> list[tuple[int, int]]:
    """Even split of ``n_layers`` into ``parts`` contiguous [lo, hi) ranges (earlier parts get the
    remainder). Raises ValueError if parts < 1 or parts > n_layers."""
    if not 1 <= parts <= n_layers:
        raise ValueError(f"parts must be in [1, {n_layers}], got {parts}")
    base, rem = divmod(n_layers, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + base + (1 if i < rem else 0)
        out.append((lo, hi))
        lo = hi
    return out


def _io_spec(cfg, lo, hi, first, last, S, C, lm_head, embed):
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    D, Hkv, V = cfg.hidden_size, cfg.num_key_value_heads, cfg.vocab_size
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
               embed: str = "part0", lm_head: str = "last") -> dict:
    """Export ``model_dir`` (HF Qwen2/Llama folder, fp32) to ``out_dir/part{i}/{prefill,decode}.onnx``.

    Args:
        model_dir: folder loadable by ``AutoModelForCausalLM.from_pretrained`` (offline).
        out_dir: output folder (created). Also gets ``export.json`` (the returned description) and,
            for ``embed="separate"``, ``embed_tokens.npy`` (float32 [V, D], for a host-side lookup).
        seq_len: S of the prefill graph (AR-S); the decode graph is AR-1. 1 <= S < context_len.
        context_len: C, total attention span (past + new) of both graphs; also the RoPE table size,
            so every position must be < C.
        parts: number of parts; decoder layers are split evenly (:func:`split_layers`).
        embed: ``"part0"`` (token embedding Gather inside part 0, ``input_ids`` int32 in) or
            ``"separate"`` (part 0 takes ``inputs_embeds``; embedding table saved as .npy).
        lm_head: ``"last"`` (logits of position S-1 only: [1,1,V]) or ``"all"`` ([1,S,V]).

    Returns a JSON-able dict: ``{"model_type", "seq_len", "context_len", "mask_value", "num_layers",
    "num_kv_heads", "head_dim", "hidden_size", "vocab_size", "embed", "lm_head", "embed_file",
    "parts": [{"index", "layers": [lo, hi], "prefill": {"path", "inputs", "outputs"},
    "decode": {...}}]}`` where inputs/outputs are lists of ``{"name", "shape", "dtype"}`` and paths
    are relative to ``out_dir``.

    Raises ValueError on bad arguments or an unsupported ``model_type`` (only qwen2, llama).
    Tested with transformers 4.57, torch 2.13 (TorchScript exporter, opset 17).
    """
    import numpy as np
    import onnx
    import torch
    from transformers import AutoModelForCausalLM

    if embed not in ("part0", "separate"):
        raise ValueError(f"embed must be 'part0' or 'separate', got {embed!r}")
    if lm_head not in ("last", "all"):
        raise ValueError(f"lm_head must be 'last' or 'all', got {lm_head!r}")
    if not 1 <= seq_len < context_len:
        raise ValueError(f"need 1 <= seq_len < context_len, got {seq_len}, {context_len}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    cfg = model.config
    if cfg.model_type not in ("qwen2", "llama"):
        raise ValueError(f"unsupported model_type {cfg.model_type!r} (qwen2, llama)")
    PartWrapper = _torch_modules()
    ranges = split_layers(cfg.num_hidden_layers, parts)
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    desc = {
        "model_type": cfg.model_type, "seq_len": seq_len, "context_len": context_len,
        "mask_value": MASK_VALUE, "num_layers": cfg.num_hidden_layers,
        "num_kv_heads": cfg.num_key_value_heads, "num_heads": cfg.num_attention_heads,
        "head_dim": hd, "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
        "embed": embed, "lm_head": lm_head, "embed_file": None, "opset": OPSET,
        "exporter": f"torch.onnx.export(dynamo=False) torch {torch.__version__}", "parts": [],
    }
    if embed == "separate":
        np.save(out_dir / "embed_tokens.npy",
                model.model.embed_tokens.weight.detach().float().numpy())
        desc["embed_file"] = "embed_tokens.npy"
    for i, (lo, hi) in enumerate(ranges):
        first, last = i == 0, i == len(ranges) - 1
        pdesc = {"index": i, "layers": [lo, hi]}
        pdir = out_dir / f"part{i}"
        pdir.mkdir(exist_ok=True)
        for gname, S in (("prefill", seq_len), ("decode", 1)):
            wrapper = PartWrapper(model, lo, hi, first, last, S, context_len, lm_head, embed).eval()
            ins, outs = _io_spec(cfg, lo, hi, first, last, S, context_len, lm_head, embed)
            feeds = []
            for name, shape, dt in ins:
                if dt == "int32":
                    feeds.append(torch.arange(S, dtype=torch.int32).reshape(shape))
                else:
                    feeds.append(torch.zeros(shape, dtype=torch.float32))
            path = pdir / f"{gname}.onnx"
            n_bytes = sum(p.numel() * 4 for p in wrapper.parameters()) + 2 * context_len * hd * 4
            tmp = path.with_suffix(".tmp.onnx")
            with torch.no_grad():
                torch.onnx.export(
                    wrapper, tuple(feeds), str(tmp), input_names=[n for n, _, _ in ins],
                    output_names=[n for n, _, _ in outs], opset_version=OPSET,
                    do_constant_folding=True, dynamo=False)
            m = onnx.load(str(tmp))
            tmp.unlink()
            for extra in out_dir.glob(f"part{i}/*.tmp.onnx*"):
                extra.unlink()
            _name_rope_initializers(m)
            if n_bytes > _TWO_GB:
                onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                          location=path.name + ".data", size_threshold=1024)
            else:
                onnx.save(m, str(path))
            pdesc[gname] = {
                "path": str(path.relative_to(out_dir)),
                "inputs": [{"name": n, "shape": s, "dtype": d} for n, s, d in ins],
                "outputs": [{"name": n, "shape": s, "dtype": d} for n, s, d in outs],
            }
        desc["parts"].append(pdesc)
    (out_dir / "export.json").write_text(json.dumps(desc, indent=1))
    return desc


def _name_rope_initializers(m) -> None:
    """Rename the two [C, d] RoPE table initializers to ``rope_cos`` / ``rope_sin`` (the exporter
    may name them after the buffer or give them numeric names)."""
    for init in m.graph.initializer:
        if init.name.endswith("rope_cos") or init.name.endswith("rope_sin"):
            new = "rope_cos" if init.name.endswith("rope_cos") else "rope_sin"
            old = init.name
            if old == new:
                continue
            init.name = new
            for node in m.graph.node:
                for k, n in enumerate(node.input):
                    if n == old:
                        node.input[k] = new

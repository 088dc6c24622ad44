"""One LLM part's weights, written from the checkpoint one tensor at a time: the external data
file ``part{i}/weights.data`` that a part's prefill and decode graphs share (float32, each tensor
at a 64 KiB-aligned offset so onnxruntime can map it instead of copying), the RoPE and cache
tables stored in it, and the model facts the graphs need from ``config.json``
(:func:`model_dims`, :func:`special_tokens`).

Weights: per layer, the architecture's canonical tensors (:mod:`tasks.llm.architectures`: a
fused tensor is read once and cut into its row ranges); Linear weights ([out, in] in HF) are
stored transposed ([in, out], the MatMul's B). The RoPE table is a constant [C, d] cos and sin
table indexed by position (Gather), not ``Cos(position * inv_freq)``: a 16-bit activation
quantizing ``position * inv_freq`` (range up to C) would lose ~C/65535 radians; a table lookup
keeps full precision in the (16-bit) table. ``inv_freq`` and the attention scaling come from
``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` for the config's ``rope_scaling``
(default, linear, dynamic, yarn, longrope, llama3), as HF's own rotary module computes them.
The tables are initializers named ``rope_cos`` / ``rope_sin`` (:data:`tasks.llm.layout.ROPE_TABLES`);
the quantizer keeps them 16-bit (:mod:`tasks.llm.qdq`). Determinism: the same checkpoint and
arguments give byte-identical files.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.proc import lazy

from tasks.llm.layout import ROPE_TABLES
from tasks.llm.parts import MAX_TENSOR_ELEMENTS, split_sizes

if TYPE_CHECKING:
    from tasks.llm.checkpoint import Checkpoint

np = lazy.module("numpy")

MASK_VALUE = -100.0
WEIGHTS_FILE = "weights.data"
ALIGN = 65536  # Windows' allocation granularity; a multiple of Linux's page size


def model_dims(config: dict) -> dict:
    """The dims the graphs need from a HF ``config.json`` dict: ``num_layers, hidden_size,
    num_heads, num_kv_heads, head_dim, rotary_dim, vocab_size, intermediate_size, rms_eps``.
    Raises ValueError for an unsupported ``model_type`` (see :data:`SUPPORTED`,
    :mod:`tasks.llm.architectures`) or activation (``act``: :func:`tasks.llm.architectures.activation`)."""
    from tasks.llm.architectures import activation, architecture, rotary_dim

    architecture(config.get("model_type"))  # ValueError naming the supported architectures
    H = config["num_attention_heads"]
    return {
        "num_layers": config["num_hidden_layers"],
        "hidden_size": config["hidden_size"],
        "num_heads": H,
        "num_kv_heads": config.get("num_key_value_heads") or H,
        "head_dim": config.get("head_dim") or config["hidden_size"] // H,
        "rotary_dim": rotary_dim(config),
        "vocab_size": config["vocab_size"],
        "intermediate_size": config["intermediate_size"],
        "rms_eps": float(config.get("rms_norm_eps", 1e-6)),
        "act": activation(config),
    }


def special_tokens(config: dict) -> dict:
    """``eos_token_id``, ``pad_token_id``, ``bos_token_id`` (ints) from a HF config dict: the first
    eos of a list; pad falls back to eos, bos to eos, eos to 0 (genai's config needs all three)."""

    def first(v):
        return v[0] if isinstance(v, list) else v

    eos = first(config.get("eos_token_id"))
    eos = 0 if eos is None else int(eos)
    pad, bos = first(config.get("pad_token_id")), first(config.get("bos_token_id"))
    return {
        "eos_token_id": eos,
        "pad_token_id": eos if pad is None else int(pad),
        "bos_token_id": eos if bos is None else int(bos),
    }


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
    return (
        (emb.cos() * float(scaling)).numpy().astype(np.float32),
        (emb.sin() * float(scaling)).numpy().astype(np.float32),
    )


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
        arr.tofile(self.f)  # no bytes copy: tobytes() held the tensor a second time (the 7B's export parts 1-2)
        t = onnx.TensorProto(
            name=name, data_type=onnx.TensorProto.FLOAT, dims=list(arr.shape), data_location=onnx.TensorProto.EXTERNAL
        )
        for k, v in (("location", self.path.name), ("offset", str(off)), ("length", str(arr.nbytes))):
            e = t.external_data.add()
            e.key, e.value = k, v
        self.protos[name] = t

    def close(self) -> None:
        self.f.close()


def cache_tables(C: int) -> dict:
    """The constant [C, C] float32 tables the graphs Gather rows of (module docstring):
    ``kv_eye`` (identity: row p is the one-hot of slot p) and ``causal_mask`` (row p: 0 for
    slots <= p, MASK_VALUE after)."""
    eye = np.eye(C, dtype=np.float32)
    return {"kv_eye": eye, "causal_mask": np.triu(np.full((C, C), MASK_VALUE, np.float32), 1)}


def write_part_weights(
    ckpt: Checkpoint,
    lo: int,
    hi: int,
    *,
    embed: bool,
    head: bool,
    rope: tuple[np.ndarray, np.ndarray],
    path: Path,
    tables: dict | None = None,
    max_tensor_elements: int = MAX_TENSOR_ELEMENTS,
) -> dict:
    """Write one part's weights to ``path``, one checkpoint tensor in memory at a time. Per
    layer, the architecture's canonical tensors (:func:`tasks.llm.architectures.pieces`: a fused tensor is
    read once and cut into its row ranges); Linear weights ([out, in] in HF) are stored
    transposed ([in, out], the MatMul's B) under the canonical name with ``.T`` appended; norms,
    biases and the embedding table keep their names; the embedding table and LM head are split
    above ``max_tensor_elements`` (:func:`split_sizes`). Returns {name: TensorProto with
    external data}. ``tables``: more constant tables to store first ({name: array}, e.g.
    :func:`cache_tables`)."""
    from tasks.llm.checkpoint import part_tensor_names
    from tasks.llm.architectures import architecture, is_norm

    wf = _WeightFile(path)
    fam = architecture(ckpt.config.get("model_type"))
    try:
        for name, table in [*zip(ROPE_TABLES, rope), *(tables or {}).items()]:
            wf.add(name, table)
        for l in range(lo, hi):
            held: dict = {}  # the layer's current source tensor (a fused one serves several pieces)
            for piece in fam.pieces:
                src = f"model.layers.{l}.{piece.source}"
                if src not in ckpt:
                    if piece.optional:
                        continue
                    raise KeyError(f"{ckpt.dir}: checkpoint has no tensor {src!r}")
                if src not in held:
                    held = {src: ckpt.get(src)}
                a = held[src]
                if piece.rows is not None:
                    r0, r1 = piece.rows(ckpt.config)
                    a = a[r0:r1]
                n = f"model.layers.{l}.{piece.name}"
                if is_norm(n) and fam.norm_offset:
                    a = a.astype(np.float32) + np.float32(fam.norm_offset)
                wf.add(n + ".T", a.T) if n.endswith("_proj.weight") else wf.add(n, a)
                del a
            del held
        if embed:  # [V, D], split along D
            _add_split(wf, "model.embed_tokens.weight", embedding_table(ckpt), max_tensor_elements)
        if head:
            wf.add("model.norm.weight", ckpt.get("model.norm.weight").astype(np.float32) + np.float32(fam.norm_offset))
            head_name = part_tensor_names(ckpt, 0, 0, embed=False, head=True)[-1]
            _add_split(wf, "lm_head.weight.T", ckpt.get(head_name).T, max_tensor_elements)  # [D, V], split along V
    finally:
        wf.close()
    return wf.protos


def embedding_table(ckpt: Checkpoint) -> np.ndarray:
    """float32 [V, D]: the token embedding as the graphs (or a host-side lookup) use it: the
    checkpoint's ``model.embed_tokens.weight``, times ``sqrt(hidden_size)`` for an architecture with
    :attr:`tasks.llm.architectures.Architecture.embed_scale` (Gemma)."""
    from tasks.llm.architectures import architecture

    table = ckpt.get("model.embed_tokens.weight").astype(np.float32, copy=False)
    if architecture(ckpt.config.get("model_type")).embed_scale:
        table = table * np.float32(math.sqrt(ckpt.config["hidden_size"]))
    return table


def _add_split(wf: _WeightFile, name: str, a: np.ndarray, limit: int) -> None:
    """Add a 2-D weight whole (``name``) or, above :data:`MAX_TENSOR_ELEMENTS`, as column
    chunks ``name.0``, ``name.1``, ... (:func:`split_sizes`)."""
    sizes = split_sizes(*a.shape, limit)
    if len(sizes) == 1:
        wf.add(name, a)
        return
    at = 0
    for j, n in enumerate(sizes):
        wf.add(f"{name}.{j}", a[:, at : at + n])
        at += n

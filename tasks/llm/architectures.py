"""The decoder architectures (``model_type``s) the LLM export writes, as data: how an
architecture's checkpoint tensors map to the one graph :mod:`tasks.llm.pipeline_graphs` builds.

The graph is a Llama-style decoder (RMSNorm, rotary attention with GQA, SwiGLU MLP). An
architecture says where each *canonical* per-layer tensor comes from in its checkpoint (a whole tensor, or a
row range of a fused one) and which optional pieces it has; the export reads the table, never
its name. Sources (``transformers`` 4.57 ``models/<model_type>/modeling_<model_type>.py``):

- ``llama``: q/k/v/o and gate/up/down projections, no biases (``attention_bias`` may add them).
  Llama 3.x ``rope_scaling`` (``rope_type: llama3``) is applied by the RoPE table
  (:func:`tasks.llm.part_weights.rope_tables` uses transformers' ``ROPE_INIT_FUNCTIONS``).
- ``qwen2``: as llama, with q/k/v biases.
- ``qwen3``: as llama, plus ``self_attn.q_norm`` / ``self_attn.k_norm``: an RMSNorm over
  ``head_dim`` applied to each head of q and k before the rotary embedding
  (``Qwen3Attention.forward``: ``self.q_norm(self.q_proj(x).view(hidden_shape))``).
- ``phi3`` (Phi-3, Phi-3.5, Phi-4-mini): fused ``self_attn.qkv_proj`` ([(H + 2 Hkv) d, D]: q rows,
  then k, then v) and ``mlp.gate_up_proj`` ([2 I, D]: gate rows, then up; ``Phi3MLP`` chunks
  its output in two); ``partial_rotary_factor`` < 1 rotates only the first
  ``head_dim * factor`` dims of each head (``apply_rotary_pos_emb`` in ``modeling_phi3``).
- ``gemma`` (Gemma 1: 2B, 7B, CodeGemma): llama's tensors, with three differences that are
  data here (:class:`Architecture`): RMSNorm scales by ``1 + weight`` (``GemmaRMSNorm.forward``),
  the embeddings are multiplied by ``sqrt(hidden_size)`` (``GemmaModel.forward``:
  ``normalizer``), the MLP's activation is ``gelu_pytorch_tanh`` (``config.hidden_act``);
  ``head_dim`` is explicit (256, not hidden/heads) and the LM head is tied. Gemma 2 and 3
  (logit soft-capping, sliding-window layers, extra norms) are other model_types, not supported.

The MLP activation is read from the config's ``hidden_act`` for every architecture
(:func:`activation`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.errors import InputError


@dataclass(frozen=True)
class Piece:
    """One canonical per-layer tensor (name under ``model.layers.{l}.``): read from ``source``
    (same naming), rows ``rows(config)`` of it when the source is fused (None: all of it).
    ``optional``: absent from some checkpoints of the architecture (biases)."""

    name: str
    source: str
    rows: object = None  # callable(config) -> (start, stop), or None
    optional: bool = False


def _dims(c: dict) -> tuple[int, int, int, int]:
    H = c["num_attention_heads"]
    d = c.get("head_dim") or c["hidden_size"] // H
    return H, c.get("num_key_value_heads") or H, d, c["intermediate_size"]


def _q_rows(c):
    H, Hkv, d, _ = _dims(c)
    return 0, H * d


def _k_rows(c):
    H, Hkv, d, _ = _dims(c)
    return H * d, (H + Hkv) * d


def _v_rows(c):
    H, Hkv, d, _ = _dims(c)
    return (H + Hkv) * d, (H + 2 * Hkv) * d


def _gate_rows(c):
    return 0, _dims(c)[3]


def _up_rows(c):
    I = _dims(c)[3]
    return I, 2 * I


_NORMS = (
    Piece("input_layernorm.weight", "input_layernorm.weight"),
    Piece("post_attention_layernorm.weight", "post_attention_layernorm.weight"),
)
_SEPARATE_QKV = tuple(
    Piece(f"self_attn.{p}_proj.{w}", f"self_attn.{p}_proj.{w}", optional=w == "bias")
    for p in "qkv"
    for w in ("weight", "bias")
)
_SEPARATE_MLP = tuple(Piece(f"mlp.{p}_proj.weight", f"mlp.{p}_proj.weight") for p in ("gate", "up"))
_COMMON = (
    Piece("self_attn.o_proj.weight", "self_attn.o_proj.weight"),
    Piece("mlp.down_proj.weight", "mlp.down_proj.weight"),
)


@dataclass(frozen=True)
class Architecture:
    """How one ``model_type``'s checkpoint maps to the graph.

    ``pieces``: its canonical per-layer tensors. ``norm_offset``: added to every RMSNorm weight
    when it is written (Gemma's ``1 + weight``: exact in float32, so the graph's norm stays
    ``x * rstd * w``). ``embed_scale``: the embedding table is written multiplied by
    ``sqrt(hidden_size)`` in float32 (Gemma's ``normalizer``; the same float product as
    scaling each looked-up row, and the tied LM head keeps the unscaled table)."""

    pieces: tuple[Piece, ...]
    norm_offset: float = 0.0
    embed_scale: bool = False


_LLAMA = _NORMS + _SEPARATE_QKV + _COMMON + _SEPARATE_MLP

#: model_type -> how its checkpoints map to the graph
ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(_LLAMA),
    "qwen2": Architecture(_LLAMA),
    "qwen3": Architecture(
        _LLAMA
        + (
            Piece("self_attn.q_norm.weight", "self_attn.q_norm.weight"),
            Piece("self_attn.k_norm.weight", "self_attn.k_norm.weight"),
        )
    ),
    "phi3": Architecture(
        _NORMS
        + _COMMON
        + (
            Piece("self_attn.q_proj.weight", "self_attn.qkv_proj.weight", _q_rows),
            Piece("self_attn.k_proj.weight", "self_attn.qkv_proj.weight", _k_rows),
            Piece("self_attn.v_proj.weight", "self_attn.qkv_proj.weight", _v_rows),
            Piece("mlp.gate_proj.weight", "mlp.gate_up_proj.weight", _gate_rows),
            Piece("mlp.up_proj.weight", "mlp.gate_up_proj.weight", _up_rows),
        )
    ),
    "gemma": Architecture(_LLAMA, norm_offset=1.0, embed_scale=True),
}
SUPPORTED = tuple(ARCHITECTURES)
#: config ``hidden_act`` values the graph's gated MLP implements (``transformers.activations``)
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


#: config keys of features the graph does not implement -> what they are (Gemma 2: ``Gemma2Attention``
#: caps attention logits with ``tanh(x / c) * c``, ``Gemma2ForCausalLM`` caps the final logits, and
#: every other layer attends only to the last ``sliding_window`` positions; transformers 4.57
#: ``models/gemma2/modeling_gemma2.py``)
UNSUPPORTED_FEATURES = {
    "attn_logit_softcapping": "attention-logit soft-capping",
    "final_logit_softcapping": "final-logit soft-capping",
    "sliding_window": "sliding-window attention layers",
}


def unsupported(config: dict) -> list[str]:
    """What of a HF config the LLM export does not implement, one phrase each with its key and
    value (e.g. ``attention-logit soft-capping (attn_logit_softcapping 50.0)``); [] when
    nothing. Qwen2's ``sliding_window`` counts only with ``use_sliding_window: true`` (its
    configs carry the key with the feature off)."""
    out = []
    for key, what in UNSUPPORTED_FEATURES.items():
        v = config.get(key)
        if v in (None, False, 0):
            continue
        if key == "sliding_window" and (
            config.get("model_type") in ("qwen2", "qwen3", "phi3", "llama")
            and not config.get("use_sliding_window", False)
        ):
            continue
        out.append(f"{what} ({key} {v})")
    return out


def architecture(model_type: str) -> Architecture:
    """The :class:`Architecture` of ``model_type``. Raises ValueError naming the supported ones
    for any other."""
    if model_type not in ARCHITECTURES:
        raise InputError(f"unsupported model_type {model_type!r}; supported LLM families: {', '.join(SUPPORTED)}")
    return ARCHITECTURES[model_type]


def pieces(model_type: str) -> tuple[Piece, ...]:
    """The canonical per-layer tensors of ``model_type`` (ValueError as :func:`architecture`)."""
    return architecture(model_type).pieces


def activation(config: dict) -> str:
    """The MLP activation of a HF config dict (``hidden_act``, default ``silu``), one of
    :data:`ACTIVATIONS`. Raises ValueError naming the supported ones."""
    act = config.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise InputError(f"unsupported hidden_act {act!r}; the LLM export writes {', '.join(ACTIVATIONS)}")
    return act


def is_norm(name: str) -> bool:
    """Whether a canonical tensor name is an RMSNorm weight (gets :attr:`Architecture.norm_offset`)."""
    return name.endswith("norm.weight")


def rotary_dim(config: dict) -> int:
    """Dims of each head that the rotary embedding turns (``head_dim * partial_rotary_factor``,
    the rest passes through; Phi-4-mini: 0.75), even."""
    d = _dims(config)[2]
    r = int(d * float(config.get("partial_rotary_factor", 1.0)))
    return r - r % 2

"""Read one part of a Hugging Face decoder checkpoint at a time (safetensors, single or sharded).

A 7 B model in fp32 is ~30 GB; a stage must never hold it whole. :class:`Checkpoint`
opens the checkpoint's ``*.safetensors`` shards lazily (``safetensors.safe_open``, which reads a
tensor's bytes only when asked) and hands out one tensor at a time, converted to float32
numpy. :func:`part_tensor_names` lists exactly the tensors one part needs, so a caller can load a
part and nothing else; ``tensors_read`` / ``bytes_read`` count what was read (tests use them).

HF tensor names: ``model.embed_tokens.weight`` [V, D]; per layer ``model.layers.{l}.`` + the
family's tensors (:mod:`tasks.llm.architectures`: e.g. ``self_attn.{q,k,v,o}_proj.weight``, Linear
[out, in], or Phi-3's fused ``self_attn.qkv_proj.weight``); ``model.norm.weight``;
``lm_head.weight`` [V, D], absent when ``tie_word_embeddings`` (then the embedding table is the
LM head).
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.proc import lazy
from tasks.llm.architectures import pieces
from tasks.errors import InputMissing

np = lazy.module("numpy")


class Checkpoint:
    """Lazy, counted access to the tensors of a safetensors checkpoint folder.

    Args:
        model_dir: folder with ``config.json`` and either ``model.safetensors`` or
            ``model.safetensors.index.json`` + shards.

    Raises FileNotFoundError when the folder has no safetensors weights (``.bin`` pickles are
    not read: they cannot be loaded one tensor at a time).
    """

    def __init__(self, model_dir):
        self.dir = Path(model_dir)
        self.config = json.loads((self.dir / "config.json").read_text(encoding="utf-8"))
        index = self.dir / "model.safetensors.index.json"
        if index.is_file():
            self.weight_map = dict(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
        elif (self.dir / "model.safetensors").is_file():
            from safetensors import safe_open

            with safe_open(str(self.dir / "model.safetensors"), framework="pt") as f:
                self.weight_map = {k: "model.safetensors" for k in f.keys()}
        else:
            raise InputMissing(
                f"{self.dir}: no model.safetensors or model.safetensors.index.json "
                "(only safetensors checkpoints can be read part by part)"
            )
        self.tensors_read = 0
        self.bytes_read = 0
        self.names_read: list[str] = []
        self.shards_opened: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def _shard(self, fname: str):
        """A fresh ``safe_open`` handle. Not kept open: safetensors maps the whole shard, and the
        pages a read touches stay in this process's resident set while the map lives (file
        backed, but counted in RSS), so a cached handle would grow RSS to every byte read."""
        from safetensors import safe_open

        self.shards_opened.add(fname)
        return safe_open(str(self.dir / fname), framework="pt")

    def get(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a float32 numpy array (its stored shape). Only this tensor's bytes
        are read. Raises KeyError naming the checkpoint when the tensor is absent, SourceError naming
        the shard and the tensor when it holds NaN or Inf."""
        if name not in self.weight_map:
            raise KeyError(f"{self.dir}: checkpoint has no tensor {name!r}")
        import torch

        from tasks.sources import SourceError
        from tasks.sources.facts import nonfinite

        with self._shard(self.weight_map[name]) as f:
            t = f.get_tensor(name)
            if bad := nonfinite(name, t):  # named here, not an AssertionError in quantize
                raise SourceError(f"{self.weight_map[name]}: {bad}")
            self.tensors_read += 1
            self.names_read.append(name)
            self.bytes_read += t.numel() * t.element_size()
            return t.to(torch.float32, copy=True).numpy()  # owns its memory once the map is gone


def tied_lm_head(config: dict) -> bool:
    """Whether the LM head reuses ``model.embed_tokens.weight`` (HF ``tie_word_embeddings``,
    default True in ``PretrainedConfig``)."""
    return bool(config.get("tie_word_embeddings", True))


def part_tensor_names(ckpt: Checkpoint, lo: int, hi: int, *, embed: bool, head: bool) -> list[str]:
    """The checkpoint tensors one part reads: layers ``lo..hi-1`` (the sources of the family's
    pieces, :func:`tasks.llm.architectures.pieces`, each once), plus the embedding table when
    ``embed`` and the final norm + LM head when ``head``. Optional tensors (biases) that the
    checkpoint lacks are left out; a missing required one raises KeyError; an unsupported
    ``model_type`` raises ValueError."""
    names = []
    for l in range(lo, hi):
        for piece in pieces(ckpt.config.get("model_type")):
            n = f"model.layers.{l}.{piece.source}"
            if n in ckpt:
                if n not in names:
                    names.append(n)
            elif not piece.optional:
                raise KeyError(f"{ckpt.dir}: checkpoint has no tensor {n!r}")
    if embed:
        names.append("model.embed_tokens.weight")
    if head:
        names.append("model.norm.weight")
        names.append(
            "lm_head.weight"
            if "lm_head.weight" in ckpt and not tied_lm_head(ckpt.config)
            else "model.embed_tokens.weight"
        )
    return names


def config_shape_problem(model_dir) -> str:
    """ "" when the checkpoint in ``model_dir`` holds every tensor its ``config.json`` implies at
    the shape it implies, else one line naming the first tensor that differs
    (:func:`tasks.sources.facts.shape_problem`: its file, the shape expected, the shape found or
    "no such tensor", how many more differ).

    The rule is transformers' own: the parameters ``AutoModelForCausalLM`` makes for the config
    (:func:`tasks.sources.shape.parameter_shapes`, built on the ``meta`` device: names and
    shapes, no memory). A tied LM head is not expected; a tensor the architecture marks
    optional (:class:`tasks.llm.architectures.Piece`, biases) may be absent (the export writes
    none); tensors the model does not make are ignored. Before this check, a checkpoint of
    another shape exported and failed at calibrate in onnxruntime, and a missing tensor was a
    KeyError (issue 51 case 2)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from tasks.sources.facts import shape_problem
    from tasks.sources.shape import parameter_shapes

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    optional = {
        f"model.layers.{l}.{p.source}"
        for l in range(config.num_hidden_layers)
        for p in pieces(config.model_type)
        if p.optional
    }
    return shape_problem(
        model_dir,
        parameter_shapes(config),
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type, "AutoModelForCausalLM"),
        optional,
    )

"""Facts of a model folder checked before its export, one line each: weights that
are numbers, and a tokenizer whose ids the embedding has rows for. Both families' exports call
these on the download stage's copy; the errors are :class:`tasks.sources.SourceError`."""

from __future__ import annotations

import json
from pathlib import Path

from . import SourceError


def nonfinite(name: str, t) -> str:
    """"" when torch tensor ``t`` holds only finite values, else the message naming tensor
    ``name`` and its NaN / Inf counts."""
    import torch

    if not t.is_floating_point():
        return ""
    flat = t.reshape(-1)
    step = 1 << 24  # elements per look: the bool temporary stays <= 16 MB for a 545 M-element table
    if all(bool(torch.isfinite(flat[i:i + step]).all()) for i in range(0, flat.numel(), step)):
        return ""
    nan = int(torch.isnan(flat).sum())
    inf = int(torch.isinf(flat).sum())
    return f"tensor {name!r} {tuple(t.shape)}: expected finite weights, found {nan} NaN and {inf} Inf values"


def check_finite_weights(folder: Path) -> int:
    """Read every tensor of every ``*.safetensors`` file of ``folder``, one at a time, and raise
    SourceError naming the file and the first tensor with NaN or Inf values (onnxruntime's
    quantizer would stop with ``AssertionError: scale issue`` and no name). Returns the number
    of tensors read. ``.bin`` pickles are not read. (The LLM export checks each tensor as it
    reads it: ``tasks.llm.checkpoint``.)"""
    from safetensors import safe_open

    n = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                n += 1
                if bad := nonfinite(name, st.get_tensor(name)):
                    raise SourceError(f"{f.name}: {bad}")
    return n


def check_vocabulary(folder: Path) -> None:
    """Raise SourceError when the tokenizer of ``folder`` can give ids the token embedding has
    no row for: ``len(tokenizer)`` (added tokens included) above ``config.json``'s
    ``vocab_size``. Such a model builds, and the shipped graphs fail on the first such id
    (a Gather out of range on HTP). A folder without a tokenizer or ``vocab_size`` passes."""
    cfg = Path(folder) / "config.json"
    if not cfg.is_file():
        return
    rows = json.loads(cfg.read_text(encoding="utf-8")).get("vocab_size")
    if not isinstance(rows, int):
        return
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError):  # no tokenizer files: the stages that need one say so
        return
    if len(tok) > rows:
        raise SourceError(f"tokenizer: {len(tok)} tokens (ids 0..{len(tok) - 1}), expected at most the {rows} rows "
                          f"of the token embedding (config.json vocab_size)")

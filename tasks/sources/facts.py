"""Facts of a model folder checked before its export, one line each: weights that
are numbers, tensors of the names and shapes the config implies, and a tokenizer whose ids the
embedding has rows for. Both families' exports call
these on the download stage's copy; the errors are :class:`tasks.sources.SourceError`."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.sources import SourceError


def nonfinite(name: str, t) -> str:
    """ "" when torch tensor ``t`` holds only finite values, else the message naming tensor
    ``name`` and its NaN / Inf counts."""
    import torch

    if not t.is_floating_point():
        return ""
    flat = t.reshape(-1)
    step = 1 << 24  # elements per look: the bool temporary stays <= 16 MB for a 545 M-element table
    if all(bool(torch.isfinite(flat[i : i + step]).all()) for i in range(0, flat.numel(), step)):
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


def stored_shapes(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (file, shape)} of the ``*.safetensors`` files of ``folder`` (the single file
    or the shards), read from their headers alone (no tensor bytes); {} without any."""
    from safetensors import safe_open

    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            out.update({n: (f.name, tuple(st.get_slice(n).get_shape())) for n in st.keys()})
    return out


def shape_problem(
    folder: Path, expected, model: str, optional=frozenset(), prefix: str = "", require: bool = True
) -> str:
    """ "" when the safetensors checkpoint of ``folder`` holds each tensor of ``expected`` (an
    iterable of (name, shape), the parameters ``model``, a transformers class name, makes for
    the folder's config.json) at that shape, else one line: the first that differs, as
    ``<file>: tensor '<name>': expected shape (..) (transformers' <model> for config.json),
    found (..)`` (or "found no such tensor"; the file is the index, else the single file, when
    the tensor is absent), then how many more differ. A name may be stored under
    ``prefix + "."`` (a task model's checkpoint of the base model, as transformers loads it).
    An absent tensor is a difference when ``require`` and its name is not in ``optional``.
    A folder without safetensors files passes (``.bin`` pickles are not read)."""
    stored = stored_shapes(folder)
    if not stored:
        return ""
    whole = (
        "model.safetensors.index.json"
        if (Path(folder) / "model.safetensors.index.json").is_file()
        else "model.safetensors"
    )
    bad = []
    for name, shape in expected:
        hit = stored.get(name) or (stored.get(f"{prefix}.{name}") if prefix else None)
        if hit is None and (not require or name in optional):
            continue
        if hit is None or hit[1] != tuple(shape):
            bad.append(
                f"{hit[0] if hit else whole}: tensor {name!r}: expected shape {tuple(shape)} (transformers' "
                f"{model} for config.json), found {hit[1] if hit else 'no such tensor'}"
            )
    if not bad:
        return ""
    more = len(bad) - 1
    return bad[0] + (f"; {more} more tensor{'s differ' if more > 1 else ' differs'}" if more else "")


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
        raise SourceError(
            f"tokenizer: {len(tok)} tokens (ids 0..{len(tok) - 1}), expected at most the {rows} rows "
            f"of the token embedding (config.json vocab_size)"
        )

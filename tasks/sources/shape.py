"""Shape builds: a source of random weights in a Hub model's exact configuration.

``source: {hf: <repo>, revision: <commit>, shape: true, tokenizer: <folder>}`` builds the model
without the Hub: the download stage writes a seeded random checkpoint whose ``config.json`` is
the model's kept facts (``recipes/models/``, :mod:`tasks.sources.model_facts`) and whose tensors
are every parameter ``transformers`` makes for that config, by name and shape (taken from the
model built on PyTorch's ``meta`` device: no memory), in bf16 (the dtype the field's checkpoints
ship), written as sharded safetensors with an index as on the Hub, one shard in memory at a time.
Norm weights are ones, every other tensor N(0, 0.02) from one ``torch.Generator`` seeded with
``seed``, so the same recipe gives the same bytes. The tokenizer files come from ``tokenizer``
(a folder in the project; its ids must be below the model's vocabulary).

What it is for: time, memory and disk of every stage at the real shapes (the plan, the parts,
the budget). A shape build's verify figures measure quantization of random weights, not model
quality (random networks pass on more rounding error: benchmarks/README.md), and the catalog
marks it as a shape build.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.sources.errors import SourceError

#: bytes per shard file (the Hub's checkpoints shard at 2-5 GB)
SHARD_BYTES = 2 * 10**9
#: tokenizer files taken from the ``tokenizer`` folder (the model's own config.json is written)
#: (every file set :data:`tasks.sources.folder_files.TOKENIZERS` accepts is among them)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.txt",
    "added_tokens.json",
    "generation_config.json",
)


def facts_of(params: dict) -> tuple[Path, dict]:
    """(facts file, document) of the source's Hub model. Raises SourceError when none is kept."""
    from tasks.sources.model_facts import find

    hit = find(params.get("hf"), params.get("revision"))
    if hit is None:
        raise SourceError(
            f"source.shape: expected kept facts of {params.get('hf')!r} at revision "
            f"{params.get('revision')!r} in recipes/models/, found none (a shape build writes that config)"
        )
    return hit


def tokenizer_problem(folder: Path, rel: str) -> str:
    """ "" when ``folder`` (``source.tokenizer`` ``rel``, as the recipe writes it) holds one of
    the file sets a tokenizer is saved as (:data:`tasks.sources.folder_files.TOKENIZERS`, the
    download's own completeness rule), else the message saying what it holds. A folder with
    only ``tokenizer_config.json`` was taken, and transformers failed at download in a 44-line
    TypeError / AttributeError (issue 51 case 3)."""
    from tasks.sources.folder_files import TOKENIZER_WANTED, TOKENIZERS

    if not folder.is_dir():
        return f"expected a folder of tokenizer files with {TOKENIZER_WANTED}, found no folder at {rel}"
    names = sorted(f.name for f in folder.iterdir() if f.is_file())
    if any(all(n in names for n in group) for group in TOKENIZERS):
        return ""
    found = f"only {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}" if names else "no files"
    return f"expected a folder of tokenizer files with {TOKENIZER_WANTED}, found {found} in {rel}"


def tokenizer_folder(params: dict) -> Path:
    """The ``tokenizer`` folder, resolved in the project. Raises SourceError when it does not
    hold a tokenizer's files (:func:`tokenizer_problem`)."""
    from tasks.store import paths

    rel = params.get("tokenizer")
    if not rel:
        raise SourceError("source.shape: expected source.tokenizer (a folder of tokenizer files), found none")
    folder = Path(paths.root()) / rel
    if bad := tokenizer_problem(folder, rel):
        raise SourceError(f"source.tokenizer: {bad}")
    return folder


def key_material(params: dict) -> dict:
    """What the checkpoint is a function of: the facts file's and the tokenizer files' xxh3."""
    from tasks.store import digest

    f, _ = facts_of(params)
    tok = tokenizer_folder(params)
    return {
        "facts": digest.file_digest(f),
        "tokenizer": {n: digest.file_digest(tok / n) for n in TOKENIZER_FILES if (tok / n).is_file()},
        "seed": int(params.get("seed", 0)),
    }


def parameter_shapes(config) -> list[tuple[str, tuple[int, ...]]]:
    """[(name, shape)] of every parameter ``transformers`` makes for ``config`` (a
    PretrainedConfig), in its state-dict order, built on the ``meta`` device (no memory); a
    tied LM head is left out (the checkpoint holds the table once, as the Hub's do)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tied = getattr(config, "tie_word_embeddings", False)
    return [(n, tuple(t.shape)) for n, t in model.state_dict().items() if not (tied and n == "lm_head.weight")]


def write_checkpoint(out: Path, params: dict) -> dict:
    """Write the shape build's model folder into ``out`` (module docstring). Returns {"source":
    "shape", "repo", "commit", "parameters", "shards", "files"}. Raises SourceError for missing
    facts or tokenizer files, a tokenizer transformers cannot load (its exception's type and
    message, one line), or a tokenizer with ids the model has no row for."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    f, doc = facts_of(params)
    tok = tokenizer_folder(params)
    facts = dict(doc["config"])
    config = AutoConfig.for_model(facts.pop("model_type"), **facts)
    config.torch_dtype = "bfloat16"
    try:
        vocab = len(AutoTokenizer.from_pretrained(str(tok), local_files_only=True))
    except Exception as e:  # files present that transformers cannot load: its reason, one line
        why = " ".join(str(e).split())[:300]
        raise SourceError(
            f"source.tokenizer {params['tokenizer']!r}: expected a tokenizer transformers loads, found "
            f"{type(e).__name__}: {why}"
        ) from None
    if vocab > config.vocab_size:
        raise SourceError(
            f"source.tokenizer {params['tokenizer']!r}: expected at most {config.vocab_size} tokens "
            f"(the model's vocab_size), found {vocab}"
        )
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(int(params.get("seed", 0)))
    shards, cur, size, total = [], {}, 0, 0

    def flush():
        nonlocal cur, size
        if cur:
            shards.append(sorted(cur))
            save_file(cur, str(out / f"shard-{len(shards)}.safetensors"), metadata={"format": "pt"})
            cur, size = {}, 0

    for name, shape in parameter_shapes(config):
        t = (
            torch.ones(shape, dtype=torch.bfloat16)
            if name.endswith("norm.weight")
            else (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
        )
        cur[name] = t
        size += t.numel() * 2
        total += t.numel()
        if size >= SHARD_BYTES:
            flush()
    flush()
    n = len(shards)
    weight_map = {}
    for k, names in enumerate(shards, 1):
        final = f"model-{k:05d}-of-{n:05d}.safetensors"
        (out / f"shard-{k}.safetensors").rename(out / final)
        weight_map.update({name: final for name in names})
    size_bytes = sum(p.stat().st_size for p in out.glob("model-*.safetensors"))
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": size_bytes}, "weight_map": dict(sorted(weight_map.items()))}, indent=1)
        + "\n"
    )
    (out / "config.json").write_text(
        json.dumps(
            {**config.to_dict(), "architectures": [type(config).__name__.replace("Config", "ForCausalLM")]},
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    import shutil

    copied = [n for n in TOKENIZER_FILES if (tok / n).is_file()]
    for name in copied:
        shutil.copyfile(tok / name, out / name)
    return {
        "source": "shape",
        "repo": params["hf"],
        "commit": params["revision"],
        "facts": f.name,
        "parameters": total,
        "shards": n,
        "files": n + 2 + len(copied),
    }

"""Shared helpers for the LLM tests (tests/llm/, no conftest): cached trained fixtures and exports.

Fixtures are cached under /work/main/.fixtures/llm/<arch>-<key>/ where key hashes the fixture
code, corpus and parameters (scripts/tiny_llm.py fixture_key); a file lock makes parallel builds safe.
"""

from __future__ import annotations

import fcntl
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import tiny_llm as fixtures  # noqa: E402  (scripts/tiny_llm.py: the fixture trainer, outside the package)

CACHE = ROOT / ".fixtures" / "llm"
SEQ_LEN, CONTEXT_LEN = 16, 64  # small graphs: the HTP simulator is slow

# the first lines of recipes/data/prompts-tiny.txt
PROMPTS = [
    "The old lighthouse",
    "Every morning the farmer",
    "The teacher wrote a question on the board.",
    "In the autumn the",
    "A purple dog walked into the bakery and",
    "To plant a tree,",
]


def hf_reference(model_dir, prompts_ids, max_new_tokens):
    """fp32 ``transformers`` greedy continuations (exactly ``max_new_tokens`` each) and the
    last prompt position's logits: [(token ids, float32 [V])], one per prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts_ids:
            x = torch.tensor([ids])
            g = m.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                min_new_tokens=max_new_tokens,
            )
            out.append((g[0, len(ids) :].tolist(), m(x).logits[0, -1].numpy()))
    return out


def _locked_build(target: Path, build) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    if (target / ".done").exists():
        return target
    with open(CACHE / ".lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        if not (target / ".done").exists():
            tmp = target.with_name(target.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            build(tmp)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
            (target / ".done").write_text("ok\n")
    return target


def _model_dir(arch: str, seed: int = 0, train_seconds: float = 60) -> Path:
    return CACHE / f"{arch}-{fixtures.fixture_key(arch, seed, train_seconds)}"


def tiny_model(arch: str, seed: int = 0, train_seconds: float = 60) -> Path:
    """Path of the cached trained fixture (built on first use, ~1 min each). The first call that
    finds its default fixture missing trains every missing default fixture (one per
    ``fixtures.ARCHS``), as many at once as the machine has cores: each trains on one thread
    with fixed seeds, so the bytes do not depend on how many ran at once, and the suite uses
    them all."""
    target = _model_dir(arch, seed, train_seconds)
    if (seed, train_seconds) == (0, 60) and not (target / ".done").exists():
        _train_missing_in_parallel()
    return _locked_build(target, lambda d: fixtures.make_tiny_model(arch, d, seed, train_seconds))


def _train_missing_in_parallel() -> None:
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        missing = [a for a in fixtures.ARCHS if not (_model_dir(a) / ".done").exists()]
        if len(missing) < 2:
            return
        tmps = {a: _model_dir(a).with_name(_model_dir(a).name + ".tmp") for a in missing}
        for t in tmps.values():
            shutil.rmtree(t, ignore_errors=True)
        with ProcessPoolExecutor(
            min(len(missing), os.cpu_count() or 1), mp_context=multiprocessing.get_context("spawn")
        ) as pool:
            for a, fut in [(a, pool.submit(fixtures.make_tiny_model, a, str(tmps[a]))) for a in missing]:
                fut.result()
                shutil.rmtree(_model_dir(a), ignore_errors=True)
                tmps[a].rename(_model_dir(a))
                (_model_dir(a) / ".done").write_text("ok\n")


def export_code(module: str) -> dict:
    """{dotted name: file} of every module of ``tasks`` that ``module`` runs (what
    :func:`tiny_export`'s cache key hashes)."""
    from tasks.core import keys
    from tasks.core.session import Session

    session = Session()
    return {name: keys.module_file(session, name) for name in keys.code_modules(session, module)}


def tiny_export(
    arch: str, seq_len: int = SEQ_LEN, context_len: int = CONTEXT_LEN, parts: int = 1, embed: str = "part0"
) -> Path:
    """Cached export of the fixture, keyed by the fixture dir, the params and the source of
    every module the export runs (``tasks.core.keys.code_modules``: pipeline_graphs.py and what it
    imports, part_weights.py, checkpoint.py, architectures.py, parts.py, ...)."""
    import hashlib

    from tasks.llm import pipeline_graphs

    mdir = tiny_model(arch)
    h = hashlib.sha256()
    for name, f in export_code(pipeline_graphs.__name__).items():
        h.update(name.encode() + b"\0" + f.read_bytes())
    h.update(repr((mdir.name, seq_len, context_len, parts, embed)).encode())
    target = CACHE / f"export-{arch}-{h.hexdigest()[:16]}"
    return _locked_build(
        target,
        lambda d: pipeline_graphs.export_llm(
            mdir, d, seq_len=seq_len, context_len=context_len, parts=parts, embed=embed
        ),
    )


def random_phi3_hd80(out: Path) -> Path:
    """Issue 32 item 2's model: a *random* (seeded, untrained) Phi-3 with head_dim 80 (hidden
    160, 2 heads, 2 layers, vocab 2048, pad 0 / bos 1 / eos 2 as the report wrote it), saved to
    ``out`` with the tiny Qwen2 fixture's tokenizer files. Random weights give near ties
    between the top logits, which is what exposed genai's CPU sessions computing other numbers
    than LLMRunner's (``tasks/llm/sessions.py``). Returns ``out``."""
    import torch
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(1234)
    Phi3ForCausalLM(
        Phi3Config(
            vocab_size=2048,
            hidden_size=160,
            intermediate_size=320,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    ).save_pretrained(out)
    src = tiny_model("qwen2")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(src / f, Path(out) / f)
    return Path(out)


def export_entry(model_dir, export_dir, into: Path) -> Path:
    """What the ``export`` stage's entries hold, seen as one folder ``into``: links to the cached
    export's files (:func:`tiny_export`) and the source's tokenizer and config files, copied as
    the stage copies them (``tasks.contract.common.copy_tokenizer``). Returns ``into``."""
    import os

    from tasks.contract.common import copy_tokenizer

    into = Path(into)
    into.mkdir(parents=True, exist_ok=True)
    for f in Path(export_dir).iterdir():
        if f.name != ".done":
            os.symlink(f, into / f.name, target_is_directory=f.is_dir())
    copy_tokenizer(Path(model_dir), into)
    return into


def calibrate_parts(model_dir, entry: Path, out: Path, samples: int) -> list[Path]:
    """Run the ``calibrate`` stage (``tasks.llm.calibrate.run``) of every part of the export
    ``entry`` (:func:`export_entry`) over ``samples`` prompts of the fixture corpus, part k into
    ``out/part{k}`` reading part k-1's entry, as ``calibrate.part{k}`` does. Returns the parts'
    folders (each holding ``feeds/{prefill,decode}``)."""
    import json

    from tasks.llm import calibrate

    P = len(json.loads((Path(entry) / "export.json").read_text())["parts"])
    dirs = []
    for k in range(P):
        d = Path(out) / f"part{k}"
        d.mkdir(parents=True)
        inputs = {"model": Path(entry)}
        inputs.update({"source": Path(model_dir)} if k == 0 else {"previous": dirs[-1]})
        calibrate.run(
            inputs,
            {"calibration": fixtures.CORPUS_PATH} if k == 0 else {},
            {"part": k, "calibration": {"samples": samples}},
            d,
        )
        dirs.append(d)
    return dirs


def feed_stores(dirs: list[Path]) -> dict:
    """{"prefill": [FeedStore per part], "decode": [...]} of :func:`calibrate_parts`' folders."""
    from tasks.llm.feed_store import FeedStore

    return {g: [FeedStore(d / "feeds" / g) for d in dirs] for g in ("prefill", "decode")}


def quantize_parts(entry: Path, calibrated: list[Path], params: dict, out: Path) -> Path:
    """Run the ``quantize`` stage (``tasks.llm.quantize.run``) of every part into ``out`` (one
    folder, as the verify stage joins the parts' entries). Returns ``out``."""
    from tasks.llm import quantize

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for k, cal in enumerate(calibrated):
        quantize.run({"model": Path(entry), "calibration": cal}, {}, {"per_channel": True, **params, "part": k}, out)
    return out

"""Tiny, *trained* decoder LLM fixtures (Qwen2 / Llama / Qwen3 / Phi-3 / Gemma) for export, quantization and QNN tests.

Not part of the package (nothing in ``tasks/`` imports it): the tests, the benchmarks and the
tiny recipes' sources use it. ``.venv/bin/python scripts/tiny_llm.py [arch ...]`` trains into
``.fixtures/tiny-<arch>`` (what ``recipes/tiny-*.yaml`` read); no argument: every arch.

Why trained: a random-init tiny LLM greedily repeats one token, so fp32 / QDQ / HTP outputs agree
trivially and token-agreement tests cannot fail. These fixtures are
trained for a fixed number of steps on ``data/tiny-corpus.txt`` (~10.6 KB of plain English written
for this repo), so greedy continuations are varied and confident.

Determinism: the number of optimizer steps is derived from ``train_seconds`` through a fixed nominal
rate (:data:`STEPS_PER_SECOND`), never from the wall clock, and training runs with
``torch.manual_seed(seed)``, ``torch.use_deterministic_algorithms(True)`` and a fixed thread count
(:data:`TRAIN_THREADS`). On the same machine/torch build two calls give byte-identical folders
(checked: sha256 of every file; see ``tests/test_llm_fixture.py``). Across CPUs / BLAS builds the
float results of training may differ in the last bits, so bytes are not promised across machines.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

# the corpus is also a recipe data file (calibration of the tiny recipes), so it stays in the package
CORPUS_PATH = Path(__file__).resolve().parent.parent / "tasks" / "llm" / "data" / "tiny-corpus.txt"

#: nominal optimizer steps per "second" of training budget (measured ~on a 2-core x86_64 machine).
STEPS_PER_SECOND = 6.0
#: intra-op threads used while training: 1 keeps the float results independent of core count
#: and avoids thread oversubscription on shared machines.
TRAIN_THREADS = 1
VOCAB_SIZE = 1024
EOS_TOKEN = "<|endoftext|>"

#: architecture hyper-parameters: 4 layers, hidden 192, 6 query heads / 2 KV heads (GQA), head_dim 32
ARCH_PARAMS = dict(
    hidden_size=192,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)
TRAIN_PARAMS = dict(seq=64, batch=16, lr=3e-3, warmup=20, weight_decay=0.01)


def fixture_key(arch: str, seed: int = 0, train_seconds: float = 60) -> str:
    """Hex digest (16 chars) of this file's source, the corpus and the parameters.

    Use it as a cache key for a built fixture: any change to the fixture code, the corpus or the
    parameters changes the key.
    """
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(CORPUS_PATH.read_bytes())
    h.update(json.dumps([arch, seed, float(train_seconds)]).encode())
    return h.hexdigest()[:16]


def train_tokenizer(corpus_path: Path = CORPUS_PATH, vocab_size: int = VOCAB_SIZE):
    """Train a byte-level BPE tokenizer (``tokenizers`` library) on ``corpus_path``.

    Returns a ``transformers.PreTrainedTokenizerFast`` with ``<|endoftext|>`` as eos and pad token,
    no automatic BOS. Deterministic for a given corpus and tokenizers version.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(corpus_path)], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, model_max_length=4096
    )


ARCHS = ("qwen2", "llama", "qwen3", "phi3", "gemma")


def _build_config(arch: str, vocab_size: int, eos_id: int):
    from transformers import GemmaConfig, LlamaConfig, Phi3Config, Qwen2Config, Qwen3Config

    common = dict(
        ARCH_PARAMS,
        vocab_size=vocab_size,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        torch_dtype="float32",
    )
    if arch == "qwen2":
        # Qwen2: q/k/v biases, tied embeddings (as in the small Qwen2.5 checkpoints)
        return Qwen2Config(**common, tie_word_embeddings=True, use_sliding_window=False)
    if arch == "llama":
        return LlamaConfig(**common, tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    if arch == "qwen3":
        # Qwen3: q_norm / k_norm per head, explicit head_dim, no biases, tied embeddings (0.6B-4B)
        return Qwen3Config(
            **common, head_dim=32, attention_bias=False, tie_word_embeddings=True, use_sliding_window=False
        )
    if arch == "phi3":
        # Phi-3 / Phi-4-mini: fused qkv_proj and gate_up_proj; partial rotary as in Phi-4-mini (0.75)
        return Phi3Config(
            **common,
            partial_rotary_factor=0.75,
            tie_word_embeddings=False,
            sliding_window=None,
            original_max_position_embeddings=4096,
        )
    if arch == "gemma":
        # Gemma 1: (1 + w) RMSNorm, sqrt(hidden)-scaled embeddings, tanh-GELU gated MLP, explicit
        # head_dim, tied embeddings (GemmaConfig's defaults besides the sizes)
        return GemmaConfig(
            **common, head_dim=32, hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True, attention_bias=False
        )
    raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")


def make_tiny_model(arch: str, out_dir, seed: int = 0, train_seconds: float = 60) -> Path:
    """Build, train and save a tiny causal LM; return ``out_dir`` as a Path.

    Args:
        arch: ``"qwen2"`` (Qwen2ForCausalLM, qkv bias, tied embeddings), ``"llama"``
            (LlamaForCausalLM, no bias, untied lm_head), ``"qwen3"`` (Qwen3ForCausalLM, q/k norms,
            tied), ``"phi3"`` (Phi3ForCausalLM, fused qkv / gate_up, partial rotary 0.75, untied) or
            ``"gemma"`` (GemmaForCausalLM: (1 + w) norms, scaled embeddings, tanh GELU, tied).
        out_dir: folder to write (created; existing files are overwritten).
        seed: seed for torch / python RNG (weights init and batch sampling).
        train_seconds: training budget; converted to ``round(train_seconds * STEPS_PER_SECOND)``
            AdamW steps (batch 16 x 64 tokens), i.e. wall time depends on the machine, results do not.

    Output folder: ``config.json``, ``model.safetensors`` (fp32), ``generation_config.json``
    (greedy), ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``,
    ``train_log.json`` (steps, first/last loss, seconds). Loadable offline with
    ``AutoModelForCausalLM.from_pretrained(out_dir)`` / ``AutoTokenizer.from_pretrained(out_dir)``.
    ~2.5 M parameters, 4 layers, 6 query heads / 2 KV heads, head_dim 32, vocab 1024.

    Raises ValueError for an unknown ``arch``.
    """
    import time

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    config = _build_config(arch, len(tokenizer), eos_id)

    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(TRAIN_THREADS)
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(seed)
        rng = random.Random(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        model.train()
        text = CORPUS_PATH.read_text()
        paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
        ids = []
        for p in paragraphs:
            ids.extend(tokenizer(p)["input_ids"] + [eos_id])
        data = torch.tensor(ids, dtype=torch.long)
        tp = TRAIN_PARAMS
        steps = max(1, round(train_seconds * STEPS_PER_SECOND))
        opt = torch.optim.AdamW(model.parameters(), lr=tp["lr"], weight_decay=tp["weight_decay"], betas=(0.9, 0.95))
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / tp["warmup"]) * max(0.05, 1 - s / steps)
        )
        losses = []
        t0 = time.perf_counter()
        for _ in range(steps):
            starts = [rng.randrange(0, len(data) - tp["seq"] - 1) for _ in range(tp["batch"])]
            batch = torch.stack([data[s : s + tp["seq"]] for s in starts])
            loss = model(input_ids=batch, labels=batch).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
        elapsed = time.perf_counter() - t0
    finally:
        torch.set_num_threads(prev_threads)
        torch.use_deterministic_algorithms(prev_det)

    model.eval()
    model.generation_config = GenerationConfig(
        do_sample=False, eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=eos_id
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    n_params = sum(p.numel() for p in model.parameters())
    (out_dir / "train_log.json").write_text(
        json.dumps(
            {
                "arch": arch,
                "seed": seed,
                "steps": steps,
                "params": n_params,
                "loss_first": losses[0],
                "loss_last10": sum(losses[-10:]) / min(10, len(losses)),
                "corpus_tokens": len(ids),
            },
            indent=1,
        )
    )
    # wall time is printed, not saved: the folder's bytes (its content digest is the download
    # stage's key) must not depend on how busy the machine was
    print(f"trained tiny {arch}: {steps} steps in {elapsed:.1f} s, {n_params} parameters", flush=True)
    return out_dir


def ensure_fixture(arch: str, dest: Path, seed: int = 0, train_seconds: float = 60) -> Path:
    """Make ``dest`` hold the tiny ``arch`` fixture, training it only when ``dest`` was made by
    other fixture code/params (``dest/.fixture-key``). Atomic: trains in ``dest.tmp``, renames."""
    import shutil

    dest = Path(dest)
    key = fixture_key(arch, seed, train_seconds)
    if (dest / ".fixture-key").is_file() and (dest / ".fixture-key").read_text().strip() == key:
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    make_tiny_model(arch, tmp, seed, train_seconds)
    (tmp / ".fixture-key").write_text(key + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


if __name__ == "__main__":  # .venv/bin/python scripts/tiny_llm.py qwen2 llama qwen3 phi3 gemma
    import sys

    from tasks.store.paths import root

    for a in sys.argv[1:] or list(ARCHS):
        print(ensure_fixture(a, root() / ".fixtures" / f"tiny-{a}"))

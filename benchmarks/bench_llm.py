"""Benchmark: an LLM with Qwen2.5-0.5B's real dimensions through every stage (run by hand).

    .venv/bin/python benchmarks/bench_llm.py [--context 4096] [--parts 2] [--layers 24]

A random-init ``Qwen2ForCausalLM`` with Qwen2.5-0.5B's config (24 layers, hidden 896, 14 query
/ 2 KV heads, intermediate 4864, vocab 151,936, tied embeddings: 494 M parameters; dims from
the model's public config.json) and the tiny fixtures' tokenizer (its ids are < 1024, valid
in the big vocabulary) is built at w4a16 with ``parts: 2``, AR-128 prefill + AR-1 decode, and
the ``cpu-qdq`` verify (a random model's tokens are meaningless: the point is time and
memory). Each stage runs as its own ``doit <stage>:bench`` process; the script prints its wall
time and peak RSS (``ru_maxrss`` of the process and the children it waited for, from
``os.wait4``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)

RECIPE = """\
task: text-generation
source: {{path: model}}
export: {{family: llm, sequence_length: 128, context_length: {context}, parts: {parts}}}
quantize:
  precision: w4a16
  calibration: {{file: data/corpus.txt, samples: {calib}}}
  overrides: [{{pattern: lm_head, weight_bits: 8}}]
verify:
  backend: cpu-qdq
  data: {{file: data/prompts.txt, samples: 2}}
  max_new_tokens: 8
"""


def make_model(out: Path, layers: int) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from llm_fixtures import tiny_model

    torch.manual_seed(0)
    cfg = Qwen2Config(**dict(QWEN25_05B, num_hidden_layers=layers))
    Qwen2ForCausalLM(cfg).eval().save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model("qwen2")).save_pretrained(out)


def run_stage(root: Path, env: dict, task: str) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "-d", str(root), task],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    secs = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code:
        print(out.decode()[-3000:])
    return secs, ru.ru_maxrss / (1 << 20), code  # KiB -> GiB


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--calib", type=int, default=4, help="calibration prompts")
    ap.add_argument("--make-model", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.make_model:
        return make_model(Path(a.make_model), a.layers)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "recipes").mkdir()
        (root / "data").mkdir()
        (root / "data" / "corpus.txt").write_text((REPO / "tasks/llm/data/tiny-corpus.txt").read_text())
        (root / "data" / "prompts.txt").write_text("The old lighthouse\nEvery morning the farmer\n")
        (root / "recipes" / "bench.yaml").write_text(RECIPE.format(context=a.context, parts=a.parts, calib=a.calib))
        t0 = time.perf_counter()
        # in a child process: a process started by fork+exec inherits its parent's peak RSS in
        # ru_maxrss, so this one must stay small for the per-stage figures to mean anything
        subprocess.run([sys.executable, __file__, "--make-model", str(root / "model"), "--layers", str(a.layers)],
                       check=True)
        print(f"random-init model with Qwen2.5-0.5B dims ({a.layers} layers) made in {time.perf_counter() - t0:.0f} s")
        env = dict(os.environ, NPUBUILD_ROOT=str(root), NPUBUILD_CACHE=str(root / "cache"),
                   NPUBUILD_BUILD=str(root / "build"), NPUBUILD_HOME=str(root / ".npubuild"), HF_HUB_OFFLINE="1")
        print(f"{'stage':<10} {'wall s':>8} {'peak RSS GiB':>13}  (context {a.context}, parts {a.parts}, w4a16)")
        for stage in ("download", "export", "quantize", "compile", "verify"):
            secs, rss, code = run_stage(root, env, f"{stage}:bench")
            print(f"{stage:<10} {secs:8.1f} {rss:13.2f}{'  FAILED' if code else ''}", flush=True)
            if code:
                break
        sizes = sorted((p.relative_to(root / "cache").as_posix(), p.stat().st_size)
                       for p in (root / "cache" / "compile").rglob("*.bin"))
        for rel, n in sizes:
            print(f"  {rel.split('/out/')[-1]:<40} {n / 1e6:8.1f} MB")


if __name__ == "__main__":
    main()

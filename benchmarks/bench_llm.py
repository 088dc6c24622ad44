"""Benchmark: LLMs with real model shapes through every stage (run by hand; prints, asserts nothing).

    .venv/bin/python benchmarks/bench_llm.py [--shape qwen2.5-0.5b] [--context 4096] [--parts 2] [--calib 4]
    .venv/bin/python benchmarks/bench_llm.py --shape qwen2.5-7b [--keep DIR]
    .venv/bin/python benchmarks/bench_llm.py --recipe llama3.2-1b-shape [--keep DIR] [--memory-gb G] [--task
    compile.part0:...]

Both shapes use a random-weight checkpoint with the model's exact config.json (dims from the
public config of Qwen/Qwen2.5-0.5B-Instruct and Qwen/Qwen2.5-7B-Instruct), bf16, sharded
safetensors (``model-0000k-of-0000n.safetensors`` + index, as on the Hub), written one shard at
a time (bounded memory), and the tiny fixtures' tokenizer (its ids are < 1024, valid in the big
vocabulary). A random model's tokens are meaningless: the point is time and memory.

* ``qwen2.5-0.5b`` and ``qwen2-0.86b`` (issue 22's 0.86 B model: ``--shape qwen2-0.86b --parts 4
  --context 256 --precision w8a16 --memory-gb 4``): a recipe (``--precision``, default w4a16;
  ``--parts``, default 2; AR-128 + AR-1 over ``--context``; ``cpu-qdq`` verify).
  ``--extends NAME`` puts the same shape on a repo recipe's settings instead (``extends:
  NAME``: its compile, bundle and verify; ``--genie`` adds Genie to the bundle), e.g. issue 54's
  ``--shape qwen2-0.86b --parts 4 --context 256 --precision w4a16 --block-size 128
  --embedding-bits 8 --rounding gptq --extends tiny-qwen2-w8a16 --genie --memory-gb 4``.
* ``qwen2.5-7b``: the recipe ``extends: qwen7b-int4`` and only swaps ``source`` for the local
  folder (context 4096, AR-128 + AR-1, 4 parts, w4a16, 16 calibration prompts, ``cpu-qdq``
  verify), built with ``doit build:bench`` (every part's export, calibrate, quantize and
  compile, the bundle and verify; issue 22). A killed run resumes from the build cache: call
  it again with the same ``--keep``. Then the stage x part table, from the cache manifests.

Printed: wall time and peak RSS per stage and part, both shapes built with ``doit build:``
(``--memory-gb`` sets NPUBUILD_MEMORY_GB, the memory budget). Each stage's manifest holds its
process's peak (VmHWM reset at the stage's start, ``stage_peak_rss``) and its
children's; the table prints both and their sum, an upper bound of the tree's peak, and the
tree's peak sampled once a second while the stage ran (``benchmarks/treerss.py``: VmRSS summed
over doit and its children; stages built by this call), then the tree peak and the estimate
the manifest records (``info["memory"]``: the figures the memory budget's promise is about).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
from treerss import TreeSampler  # noqa: E402  (benchmarks/, the script's own folder)

# config.json of Qwen/Qwen2.5-0.5B-Instruct and Qwen/Qwen2.5-7B-Instruct (public, Hub)
SHAPES = {
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        shard_gb=0.5,
    ),
    # issue 22's "random 0.86 B Qwen2" (its config was not kept): 28 layers of 1024 x 5632,
    # untied embedding and LM head of 151936 rows, 0.862 B parameters
    "qwen2-0.86b": dict(
        hidden_size=1024,
        intermediate_size=5632,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        shard_gb=1.0,
    ),
    "qwen2.5-7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        shard_gb=4.0,
    ),
}

RECIPE_05B = """\
task: text-generation
source: {{path: model}}
export: {{family: llm, sequence_length: 128, context_length: {context}, parts: {parts}}}
quantize:
  precision: {precision}{quant_more}
  calibration: {{file: tasks/llm/data/tiny-corpus.txt, samples: {calib}}}
verify:
  backend: cpu-qdq
  data: {{file: recipes/data/prompts-tiny.txt, samples: 2}}
  max_new_tokens: 8
"""

#: ``--extends NAME``: the same shape on a repo recipe's settings (its compile, bundle and
#: verify: ``tiny-qwen2-w8a16`` verifies on the HTP simulator with onnxruntime-genai beside
#: LLMRunner), the export and quantize keys of the shape; random weights fail quality bars by
#: construction, so those are off (the runtimes' agreement bars stay)
RECIPE_EXTENDS = """\
extends: {extends}
description: a random {shape} on {extends}'s settings (benchmarks/bench_llm.py --extends)
source: {{path: model}}
export: {{family: llm, sequence_length: 128, context_length: {context}, parts: {parts}}}
quantize:
  precision: {precision}{quant_more}
  calibration: {{file: tasks/llm/data/tiny-corpus.txt, samples: {calib}}}{bundle}
verify: {{thresholds: {{token_agreement: null, logits_cosine_mean: null, perplexity_ratio: null}}}}
"""

RECIPE_7B = """\
extends: qwen7b-int4
source: {hf: null, revision: null, allow_patterns: null, path: model}
"""


def make_checkpoint(out: Path, shape: str, seed: int = 0) -> dict:
    """Write a random bf16 checkpoint with ``shape``'s config to ``out`` (sharded safetensors +
    index + the tiny tokenizer), holding at most one shard in memory. Returns the config."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from llm_fixtures import tiny_model

    dims = dict(SHAPES[shape])
    shard_bytes = int(dims.pop("shard_gb") * 1e9)
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 0,
        "use_cache": True,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_sliding_window": False,
        "sliding_window": 131072,
        "max_window_layers": dims["num_hidden_layers"],
        **dims,
    }
    D, I, V = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    kv = dims["num_key_value_heads"] * D // dims["num_attention_heads"]
    names = [("model.embed_tokens.weight", (V, D))]
    for l in range(dims["num_hidden_layers"]):
        p = f"model.layers.{l}."
        names += [
            (p + "input_layernorm.weight", (D,)),
            (p + "self_attn.q_proj.weight", (D, D)),
            (p + "self_attn.q_proj.bias", (D,)),
            (p + "self_attn.k_proj.weight", (kv, D)),
            (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, D)),
            (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (D, D)),
            (p + "post_attention_layernorm.weight", (D,)),
            (p + "mlp.gate_proj.weight", (I, D)),
            (p + "mlp.up_proj.weight", (I, D)),
            (p + "mlp.down_proj.weight", (D, I)),
        ]
    names.append(("model.norm.weight", (D,)))
    if not dims["tie_word_embeddings"]:
        names.append(("lm_head.weight", (V, D)))
    g = torch.Generator().manual_seed(seed)
    shards, cur, size = [], {}, 0
    for name, shp in names:
        if name.endswith("norm.weight"):
            t = torch.ones(shp, dtype=torch.bfloat16)
        else:
            t = (torch.randn(shp, generator=g) * 0.02).to(torch.bfloat16)
        cur[name] = t
        size += t.numel() * 2
        if size >= shard_bytes:
            shards.append(cur)
            _write_shard(out, len(shards), cur, save_file)
            cur, size = {}, 0
    if cur:
        shards.append(cur)
        _write_shard(out, len(shards), cur, save_file)
    n = len(shards)
    weight_map = {}
    for k in range(1, n + 1):
        final = f"model-{k:05d}-of-{n:05d}.safetensors"
        (out / f"shard-{k}.safetensors").rename(out / final)
    for k, sh in enumerate(shards, 1):
        for name in sh:
            weight_map[name] = f"model-{k:05d}-of-{n:05d}.safetensors"
    total = sum(p.stat().st_size for p in out.glob("model-*.safetensors"))
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    AutoTokenizer.from_pretrained(tiny_model("qwen2")).save_pretrained(out)
    return cfg


def _write_shard(out: Path, k: int, tensors: dict, save_file) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / f"shard-{k}.safetensors"), metadata={"format": "pt"})
    for name in list(tensors):
        tensors[name] = None  # keep the name (for the index), drop the memory


def bench_05b(a) -> None:
    """The 0.5b shape through ``doit build:bench`` (every part's stages, bundle, verify) in a
    project at ``--keep`` (else a temporary one), then the stage x part table."""
    root = Path(a.keep or tempfile.mkdtemp(prefix="bench05b-"))
    print(f"project in {root}")
    _project(root)
    more = "".join(
        f"\n  {k}: {v}"
        for k, v in (("block_size", a.block_size), ("embedding_bits", a.embedding_bits), ("rounding", a.rounding))
        if v is not None
    )
    fmt = dict(context=a.context, parts=a.parts, calib=a.calib, precision=a.precision, quant_more=more)
    if a.extends:
        shutil.copyfile(REPO / "recipes" / f"{a.extends}.yaml", root / "recipes" / f"{a.extends}.yaml")
        bundle = "\nbundle: {runtimes: [genai, genie]}" if a.genie else ""
        text = RECIPE_EXTENDS.format(extends=a.extends, shape=a.shape, bundle=bundle, **fmt)
    else:
        text = RECIPE_05B.format(**fmt)
    (root / "recipes" / "bench.yaml").write_text(text)
    if not (root / "model" / "model.safetensors.index.json").exists():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--make", str(root / "model"), "--shape", a.shape], check=True)
        print(f"random {a.shape} checkpoint made in {time.perf_counter() - t0:.0f} s")
    _build_and_print(root, a)


def bench_recipe(a) -> None:
    """A repo recipe (a shape build, e.g. ``llama3.2-1b-shape``: random weights of the model's
    kept config, made by its download stage) through ``doit build:<recipe>`` in a project at
    ``--keep`` (else a temporary one) holding a copy of the repo's ``recipes/`` and the tiny
    Qwen2's tokenizer (``.fixtures/tiny-qwen2``, what the shape recipes name); then the stage x
    part table. Resumable like the 7B: call it again with the same ``--keep``."""
    from llm_fixtures import tiny_model

    root = Path(a.keep or tempfile.mkdtemp(prefix=f"bench-{a.recipe}-"))
    print(f"project in {root}")
    if not (root / "recipes").is_dir():
        shutil.copytree(REPO / "recipes", root / "recipes")
        shutil.copytree(REPO / "tasks" / "llm" / "data", root / "tasks" / "llm" / "data")
    tok = root / ".fixtures" / "tiny-qwen2"
    if not tok.is_dir():
        shutil.copytree(tiny_model("qwen2"), tok)
    _build_and_print(root, a, a.recipe)


def _build_and_print(root: Path, a, recipe: str = "bench", task: str | None = None, table: bool = True) -> None:
    """``doit build:<recipe>`` (or ``task`` / ``--task``, one stage of it and what it needs) in
    ``root``, the process tree sampled, then (``table``) the stage x part table of what it recorded."""
    target = task or a.task or f"build:{recipe}"
    env = {**os.environ, **_env(root), "NPUBUILD_PROGRESS": "0"}
    if a.memory_gb:
        env["NPUBUILD_MEMORY_GB"] = str(a.memory_gb)
    print(f"memory budget: {a.memory_gb or 'none'} (NPUBUILD_MEMORY_GB)")
    t0 = time.perf_counter()
    r = subprocess.Popen([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "-d", str(root), target], env=env)
    sampler = TreeSampler(r.pid, 1.0)
    r.wait()
    sampler.stop()
    print(
        f"doit {target} exited {r.returncode} after {time.perf_counter() - t0:.0f} s (this call); "
        f"process tree peak {sampler.peak / 2**30:.2f} GiB (VmRSS summed over doit and its children, sampled 1/s)"
    )
    if table:
        print_table(root, recipe, sampler)


def _print_bins(folder: Path) -> None:
    for p in sorted(folder.rglob("*.bin")):
        print(f"  {p.as_posix().split('/out/')[-1]:<40} {p.stat().st_size / 1e6:8.1f} MB")


def _project(root: Path) -> None:
    (root / "recipes").mkdir(parents=True, exist_ok=True)
    for rel in (
        "tasks/llm/data/tiny-corpus.txt",
        "recipes/data/prompts-tiny.txt",
        "recipes/data/ppl-tiny.txt",
        "recipes/data/calib-chat.jsonl",
        "recipes/qwen7b-int4.yaml",
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, root / rel)


def _env(root: Path) -> dict:
    return dict(
        NPUBUILD_ROOT=str(root),
        NPUBUILD_CACHE=str(root / "cache"),
        NPUBUILD_BUILD=str(root / "build"),
        NPUBUILD_HOME=str(root / ".npubuild"),
        NPUBUILD_RECIPES=str(root / "recipes"),
        HF_HUB_OFFLINE="1",
    )


def bench_7b(a) -> None:
    """The 7B shape through the real CLI: ``doit build:bench`` in a project at ``--keep``, every
    part and verify; then the stage x part table from the cache manifests. A killed or
    interrupted run resumes from the cache (run the same command again: built stages are cache
    hits; the table always covers every stage of the recipe)."""
    root = Path(a.keep or tempfile.mkdtemp(prefix="bench7b-"))
    _project(root)
    (root / "recipes" / "bench.yaml").write_text(RECIPE_7B)
    if not (root / "model" / "model.safetensors.index.json").exists():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--make", str(root / "model"), "--shape", a.shape], check=True)
        print(
            f"random {a.shape} checkpoint made in {time.perf_counter() - t0:.0f} s "
            f"({sum(p.stat().st_size for p in (root / 'model').glob('*.safetensors')) / 1e9:.1f} GB)"
        )
    # the download stage first, then the checkpoint's files become links to its entry's (also
    # before ``--task bundle:bench``: compile and bundle, without verify)
    _build_and_print(root, a, task="download:bench", table=False)
    _link_to_entry(root / "model", root / "build" / "bench" / "stages.json")
    if a.task != "download:bench":
        _build_and_print(root, a)


def _link_to_entry(model: Path, stages: Path) -> None:
    """Make each file of the path source ``model`` a hard link to the same file in the download
    stage's entry, when the bytes are equal (compared in full): the key, a digest of the folder's
    content, stays the same and the 15 GB checkpoint is on disk once, not twice (the 7B build
    needs ~80 GB otherwise: issue 35's DiskFull at quantize.part3). For the benchmark only: a
    user's source folder is never linked into the cache (an edit in place would change an entry)."""
    import filecmp

    st = json.loads(stages.read_text()) if stages.is_file() else {}
    entry = Path(st["download"]["entry"]) / "out" if "download" in st else None
    freed = 0
    for f in sorted(model.iterdir()) if entry else []:
        twin = entry / f.name
        if not twin.is_file() or twin.stat().st_ino == f.stat().st_ino or not filecmp.cmp(f, twin, shallow=False):
            continue
        tmp = f.with_name(f.name + ".link")
        os.link(twin, tmp)
        os.replace(tmp, f)
        freed += twin.stat().st_size
    print(f"path source linked to the download entry's files: {freed / 1e9:.1f} GB freed")


def print_table(root: Path, recipe: str, sampler: TreeSampler | None = None) -> None:
    """The stage x part table of ``recipe``'s last build in ``root`` (``build/<recipe>/stages.json``
    names each stage's entry): wall seconds of the build that made the entry, the stage
    process's peak RSS, its largest child's (per-graph quantize / compile processes) and their
    sum (an upper bound of the process tree's peak: the stage waits while its child runs);
    with ``sampler``, the tree's sampled peak while the stage ran (stages this call built); the
    tree peak the stage's manifest records and the estimate checked before it ran
    (``info["memory"]``: :func:`tasks.proc.budget.manifest_memory`; "-" for an entry built
    before manifests held them)."""
    st = json.loads((root / "build" / recipe / "stages.json").read_text())
    print(
        "\n| stage | part | wall s | stage GiB | child GiB | tree GiB (sum) | tree GiB (sampled) "
        "| tree GiB (manifest) | estimate GiB |\n|---|---|---|---|---|---|---|---|---|"
    )
    total = 0.0
    for name, row in st.items():
        mf = Path(row["entry"]) / "manifest.json"
        if not mf.is_file():  # a failed build's record names entries of an earlier one, maybe gone
            print(f"| {name} | (no entry: {row['entry']}) | | | | | |")
            continue
        m = json.loads(mf.read_text())
        info, secs = m.get("info", {}), m.get("timings", {}).get("build_seconds", 0.0)
        total += secs
        rows = info.get("parts") if isinstance(info.get("parts"), list) else []  # the bundle's is a count
        kids = [
            v
            for prow in rows
            if isinstance(prow, dict)
            for k, v in prow.items()
            if k.endswith("peak_rss") and k != "calibrate_peak_rss" and isinstance(v, int)
        ]
        stage, _, part = name.partition(".part")
        # export and calibrate measure their own part too (from the part's start): the larger
        own = max(
            [info.get("stage_peak_rss") or 0, info.get("peak_rss") or 0]
            + ([] if stage in ("quantize", "compile") else kids)
        )
        child = max(kids, default=0) if stage in ("quantize", "compile") else 0  # the others run in-process
        t = m.get("timings", {})
        seen = sampler.peak_between(t["finished"] - secs, t["finished"]) if sampler and "finished" in t else None
        mem = info.get("memory") or {}  # the stage's measured tree peak and the estimate checked before it ran

        def gib(b):
            return "-" if b is None else f"{b / 2**30:.2f}"

        print(
            f"| {stage} | {part or '-'} | {secs:.0f} | {own / 2**30:.2f} | {child / 2**30:.2f} | "
            f"{(own + child) / 2**30:.2f} | {'-' if seen is None else f'{seen / 2**30:.2f}'} "
            f"| {gib(mem.get('peak'))} | {gib(mem.get('estimate'))} |"
        )
    print(f"stages' build time summed: {total:.0f} s ({total / 60:.1f} min)")
    v = next((Path(r["entry"]) for n, r in st.items() if n.startswith("verify")), None)
    if v is not None and (v / "out" / "verify.json").exists():
        rep = json.loads((v / "out" / "verify.json").read_text())
        print("verify:", rep["backend"], json.dumps(rep["metrics"]))
    _print_bins(root / "cache" / "compile")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--calib", type=int, default=4, help="calibration prompts (0.5b shape)")
    ap.add_argument("--precision", default="w4a16", help="0.5b shape: quantize.precision")
    ap.add_argument("--block-size", type=int, help="0.5b shape: quantize.block_size (LPBQ, w4a16)")
    ap.add_argument("--embedding-bits", type=int, help="0.5b shape: quantize.embedding_bits")
    ap.add_argument("--rounding", choices=("nearest", "gptq"), help="0.5b shape: quantize.rounding (w4a16)")
    ap.add_argument(
        "--extends",
        help="0.5b / 0.86b shape: a repo recipe whose settings the shape takes (its compile, "
        "bundle and verify, e.g. tiny-qwen2-w8a16: htp verify with onnxruntime-genai)",
    )
    ap.add_argument("--genie", action="store_true", help="with --extends: bundle.runtimes [genai, genie]")
    ap.add_argument("--memory-gb", type=float, help="NPUBUILD_MEMORY_GB for the build (the memory budget)")
    ap.add_argument(
        "--keep",
        help="project folder to use and keep (7b shape: reuses a made checkpoint and the "
        "build cache, so a second call resumes; 0.5b: the doit project)",
    )
    ap.add_argument(
        "--recipe",
        help="a repo recipe to build instead (a shape build: llama3.2-1b-shape, ...); --keep, --memory-gb apply",
    )
    ap.add_argument(
        "--task",
        help="with --recipe: one doit task of it instead of build:<recipe> (what it needs is "
        "built too), e.g. compile.part0:llama3.1-8b-shape",
    )
    ap.add_argument("--make", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.make:
        make_checkpoint(Path(a.make), a.shape)
        return
    if a.recipe:
        bench_recipe(a)
        return
    (bench_7b if a.shape == "qwen2.5-7b" else bench_05b)(a)


if __name__ == "__main__":
    main()

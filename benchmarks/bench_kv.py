"""Quality of the Genie-layout graphs by the KV cache's type at the graph boundary
(``quantize.kv_bits``: 32 = float32, the layout before; 8 = uint8 symmetric, the field's), on
every family's tiny trained fixture (``scripts/tiny_llm.py``), against the same model's fp32
Genie graphs.

For each arch and each ``kv_bits`` it builds ``tiny-{arch}-w8a16`` plus Genie through the doit
CLI in a project of its own (``--work``; the build cache is the resume: a second call rebuilds
nothing), so verify has run Genie on the HTP simulator and compared its tokens with LLMRunner's
on the genai binaries (``genie_runner_agreement``, measured; no bar here, so a flip is reported,
not fatal). Then it feeds the Genie QDQ graphs of the ``genie_quantize``
entry on the CPU EP as Genie feeds them (:class:`tasks.llm.genie.host_loop.GenieHostLoop`:
quantized mask / RoPE / hidden states, the KV cache kept as the graph's integers) and the fp32
Genie export alike:

- ``token_agreement``: the quantized side generates 16 greedy tokens per verify prompt; the share
  of them equal to fp32's argmax after the same history (both teacher forced through the prompt
  graph);
- ``logits_cosine``: mean and worst cosine of the two sides' logits at those positions;
- ``perplexity_ratio``: perplexity of ``recipes/data/ppl-tiny.txt`` (the first 32 tokens), quantized / fp32.

Usage: ``.venv/bin/python benchmarks/bench_kv.py [--archs qwen2 llama ...] [--work DIR]``.
Prints one JSON line per (arch, kv_bits) and a Markdown table. ``--traffic BUILD_DIR ...``
instead prints, per built recipe folder, what each runtime layout's shipped binaries move per
decode call and prefill window and hold (read back now: also for a build of an older commit).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ARCHS = ("qwen2", "llama", "qwen3", "phi3", "gemma")
DATA = ("tasks/llm/data/tiny-corpus.txt", "recipes/data/prompts-tiny.txt", "recipes/data/ppl-tiny.txt")


def project(work: Path, archs) -> dict:
    """The project root (recipes, data, fixtures) and its environment for the doit CLI."""
    root = work / "proj"
    (root / "recipes").mkdir(parents=True, exist_ok=True)
    for rel in DATA:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, root / rel)
    for a in archs:
        shutil.copyfile(REPO / "recipes" / f"tiny-{a}-w8a16.yaml", root / "recipes" / f"tiny-{a}-w8a16.yaml")
        fx = root / ".fixtures" / f"tiny-{a}"
        if not fx.exists():  # a copy: a path source must lie inside the project
            shutil.copytree(REPO / ".fixtures" / f"tiny-{a}", fx)
        for bits in (32, 8):
            (root / "recipes" / f"tiny-{a}-kv{bits}.yaml").write_text(
                f"extends: tiny-{a}-w8a16\nbundle: {{runtimes: [genai, genie]}}\nquantize: {{kv_bits: {bits}}}\n"
            )
    env = dict(
        os.environ,
        NPUBUILD_ROOT=str(root),
        NPUBUILD_CACHE=str(root / "cache"),
        NPUBUILD_BUILD=str(root / "build"),
        NPUBUILD_HOME=str(root / ".npubuild"),
        NPUBUILD_DIST=str(root / "dist"),
        NPUBUILD_CATALOG=str(root / "catalog"),
        HF_HUB_OFFLINE="1",
    )
    return {"root": root, "env": env}


def build(proj: dict, recipe: str) -> Path:
    """``doit build:<recipe>`` in the project; returns its build folder. Raises RuntimeError
    with doit's output when the build fails."""
    p = subprocess.run(
        [sys.executable, "-m", "doit", "run", "-f", str(REPO / "dodo.py"), "-d", str(proj["root"]), f"build:{recipe}"],
        env=proj["env"],
        capture_output=True,
        text=True,
    )
    if p.returncode:
        raise RuntimeError(f"build:{recipe} failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return proj["root"] / "build" / recipe


def measure(build_dir: Path, prompts: list[str], ppl_text: str, K: int = 16) -> dict:
    """The module docstring's figures for one built recipe."""
    import numpy as np
    from transformers import AutoTokenizer

    from tasks.llm.genie.graphs import export_genie
    from tasks.llm.genie.host_loop import GenieHostLoop
    from tasks.llm.sessions import cpu_session

    stages = json.loads((build_dir / "stages.json").read_text())
    entry = Path(stages["genie_quantize.part0"]["entry"]) / "out"
    source = Path(stages["download"]["entry"]) / "out"
    desc = json.loads((entry / "genie_export.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(source))
    v = json.loads((build_dir / "verify.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        export_genie(source, tmp, seq_len=desc["seq_len"], context_len=desc["context_len"], parts=len(desc["parts"]))
        ref = GenieHostLoop(tmp, cpu_session)
        got = GenieHostLoop(entry, cpu_session)
        agree, cos = [], []
        for text in prompts:
            ids = tok(text)["input_ids"]
            toks = got.generate(ids, K)
            seq = ids + toks[:-1]
            a, b = got.logits(seq)[len(ids) - 1 :], ref.logits(seq)[len(ids) - 1 :]
            agree += list(np.argmax(b, -1) == np.array(toks))
            cos += [float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))) for x, y in zip(a, b)]
        ids = tok(ppl_text)["input_ids"][:33]

        def ppl(loop):
            lg = loop.logits(ids[:-1]).astype(np.float64)
            lg -= lg.max(-1, keepdims=True)
            logp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
            return float(np.exp(-np.mean(logp[np.arange(len(ids) - 1), ids[1:]])))

        kv = [t for t in desc["parts"][0]["token"]["inputs"] if t["name"].startswith("past_key")][0]
        return {
            "kv_dtype": kv["dtype"],
            "token_agreement": float(np.mean(agree)),
            "logits_cosine_mean": float(np.mean(cos)),
            "logits_cosine_min": float(np.min(cos)),
            "perplexity_ratio": ppl(got) / ppl(ref),
            "genie_runner_agreement": v["metrics"]["genie_runner_agreement"],
        }


def traffic(build_dir: Path) -> dict:
    """{runtime: figures} of a built LLM recipe's folder, from its context binaries read back
    now (any build, also one made before verify recorded I/O tensors):
    :func:`tasks.llm.figures.layout_traffic` per runtime whose binaries are there."""
    from tasks.qnn import context_binary
    from tasks.llm.figures import layout_traffic

    bins = {
        p.relative_to(build_dir).as_posix(): context_binary.read(p).figures()
        for p in sorted(Path(build_dir).rglob("*.bin"))
    }
    out = {}
    for rt in ("genai", "genie"):
        t = layout_traffic(bins, rt)
        if t and (rt == "genai" or any(k.startswith("genie/") for k in bins)):
            out[rt] = t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", nargs="+", default=list(ARCHS))
    ap.add_argument("--work", default=str(REPO / ".bench-kv"))
    ap.add_argument(
        "--traffic",
        nargs="+",
        metavar="BUILD_DIR",
        help="only print what each runtime layout of these built recipes moves per decode call and "
        "prefill window (read back from their binaries), as JSON",
    )
    a = ap.parse_args()
    if a.traffic:
        for d in a.traffic:
            print(json.dumps({"build": d, **traffic(Path(d))}))
        return
    proj = project(Path(a.work), a.archs)
    prompts = (REPO / "recipes/data/prompts-tiny.txt").read_text().splitlines()[:6]
    ppl_text = (REPO / "recipes/data/ppl-tiny.txt").read_text()
    rows = []
    for arch in a.archs:
        for bits in (32, 8):
            r = {"arch": arch, "kv_bits": bits, **measure(build(proj, f"tiny-{arch}-kv{bits}"), prompts, ppl_text)}
            print(json.dumps(r), flush=True)
            rows.append(r)
    print(
        "\n| fixture | KV at the boundary | token agreement | logits cosine mean (worst) | perplexity ratio "
        "| Genie = LLMRunner |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| tiny-{r['arch']} | {r['kv_dtype']} | {r['token_agreement']:.3f} | {r['logits_cosine_mean']:.5f} "
            f"({r['logits_cosine_min']:.5f}) | {r['perplexity_ratio']:.4f} | {r['genie_runner_agreement']:.2f} |"
        )


if __name__ == "__main__":
    main()

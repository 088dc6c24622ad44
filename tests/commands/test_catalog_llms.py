"""The field's LLM recipes: loaded, explained and cataloged offline from the facts kept in
``recipes/models/`` (never built here), the download's check of those facts against a fake
local Hub cache, an unpinned revision refused in one line, and the catalog's on-device
ceilings and terminal table through the doit CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from hub_cache import COMMIT, fake_hub_cache
from tasks.sources import SourceError, download, model_facts

HUB_REPO = "acme/tiny-bert"


def _doit(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """``doit <args>`` on this checkout's recipes, with a cache, build and catalog of its own
    (so nothing is built or found built) and the Hub offline."""
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        NPUBUILD_CACHE=str(tmp / "cache"),
        NPUBUILD_BUILD=str(tmp / "build"),
        NPUBUILD_HOME=str(tmp / "home"),
        NPUBUILD_CATALOG=str(tmp / "catalog"),
        NPUBUILD_DIST=str(tmp / "dist"),
    )
    env.pop("NPUBUILD_ROOT", None)
    cmd = ["list"] if args[0] == "list" else ["run"]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "doit",
            *cmd,
            "-f",
            str(REPO / "dodo.py"),
            "-d",
            str(tmp),
            "--db-file",
            str(tmp / ".doit.db"),
            *[a for a in args if a != "list"],
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("catalog-llms")
    run = _doit(tmp, "catalog")
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {r["name"]: r for r in json.loads((tmp / "catalog" / "catalog.json").read_text())["recipes"]}
    return run, rows, tmp


def _facts(name: str) -> dict:
    return json.loads((REPO / "recipes" / "models" / f"{name}.json").read_text())


def test_qwen7b_decode_ceiling_on_x_elite(catalog):
    """decode ceiling = DRAM bandwidth / (weights read + KV cache read and written per token),
    to 1 %, the KV cache recomputed here from the kept config (uint8: quantize.kv_bits 8; genai's
    layout reads and rewrites the whole buffer every call), and each figure with its source."""
    from tasks.qnn.targets import get

    _, rows, _ = catalog
    f = rows["qwen7b-int4"]["device"]["x-elite"]
    c = _facts("Qwen2.5-7B-Instruct")["config"]
    kv = (
        c["num_hidden_layers"]
        * 2
        * c["num_key_value_heads"]
        * 4096
        * (c["hidden_size"] // c["num_attention_heads"])
        * 1
    )
    assert f["runtime"] == "genai" and f["kv_dtype"] == "uint8" and list(f["runtimes"]) == ["genai"]
    assert f["kv_cache_bytes"] == kv and f["kv_bytes_read_per_token"] == kv and f["kv_bytes_written_per_token"] == kv
    # the weights read: the bundle less the 8-bit token table, one row of which is read
    table = c["vocab_size"] * c["hidden_size"]
    assert f["weight_bytes_read_per_token"] == f["bundle_bytes"] - table + c["hidden_size"]
    per_token = f["weight_bytes_read_per_token"] + 2 * kv
    bw = get("x-elite").dram_gbps * 1e9
    assert f["dram_gbps"] * 1e9 == bw and f["bytes_per_token"] == per_token
    assert f["decode_tokens_per_s_ceiling"] == pytest.approx(bw / per_token, rel=0.01)
    assert "LPDDR5x" in f["dram_source"] and "TOPS" in f["npu_source"] and "ceilings" in f["note"]
    assert f["first_token_s_lower_bound"] == pytest.approx(f["prefill_ops"] / (f["npu_tops"] * 1e12), rel=1e-9)
    assert f["runtime_bytes"] is None and "not included" in f["memory_note"]
    assert f["memory_bytes"] == f["bundle_bytes"] + kv  # not built: spill-fill and I/O unknown, not counted
    assert "estimated" in f["bundle_bytes_from"]


def test_catalog_rows_and_terminal_table(catalog):
    run, rows, tmp = catalog
    for name in (
        "qwen2.5-0.5b-w4a16",
        "llama3.2-1b-w4a16",
        "phi3.5-mini-w4a16",
        "qwen3-8b-w4a16",
        "deepseek-r1-qwen-7b-w4a16",
        "gemma2-2b-w4a16",
    ):
        assert rows[name]["precision"] == "w4a16" and rows[name]["targets"] == ["x-elite"]
        assert (
            rows[name]["source"]["revision"]
            == _facts(
                next(
                    p.stem
                    for p in (REPO / "recipes" / "models").glob("*.json")
                    if json.loads(p.read_text())["repo"] == rows[name]["source"]["repo"]
                )
            )["revision"]
        )
    g = rows["gemma2-2b-w4a16"]
    assert g["state"] == "unsupported" and "soft-capping" in g["reason"] and "sliding-window" in g["reason"]
    lines = run.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("NAME "))
    assert lines[head].split() == ["NAME", "STATE", "PARAMS", "PRECISION", "BUNDLE", "MEMORY", "DECODE", "CEILING"]
    table = {ln.split()[0]: ln for ln in lines[head + 1 :] if ln.split() and ln.split()[0] in rows}
    assert set(table) == set(rows)
    q = rows["qwen7b-int4"]
    cells = table["qwen7b-int4"].split()
    assert cells[1] == "not-built" and "w4a16" in cells[2:]
    assert f"x-elite {q['device']['x-elite']['decode_tokens_per_s_ceiling']:.1f} tok/s" in table["qwen7b-int4"]
    assert table["gemma2-2b-w4a16"].split()[1] == "unsupported"
    md = (tmp / "catalog" / "README.md").read_text()
    assert "Decode ceiling" in md and "Memory on device" in md
    assert "Decode ceiling" in (tmp / "catalog" / "index.html").read_text()


def test_explain_offline_prints_parts_and_estimates(tmp_path):
    run = _doit(tmp_path, "explain:llama3.1-8b-w4a16")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "parts: 4, layers [0, " in out and "memory estimate per stage (largest part, GiB): export " in out
    assert "disk estimate (GB): checkpoint " in out and "on x-elite (genai layout): memory " in out
    assert "decode ceiling " in out and " x the weights read)" in out


def test_gemma2_is_unsupported_in_one_line_where_asked(tmp_path):
    """The gemma-2 recipe loads as unsupported: ``doit list`` exits 0 and says so in one line,
    another recipe's command says nothing of it, its build fails with one line naming what
    gemma-2 needs."""
    run = _doit(tmp_path, "list")
    line = [ln for ln in run.stderr.splitlines() if "gemma2-2b-w4a16" in ln]
    assert run.returncode == 0 and len(line) == 1 and "unsupported model" in line[0], run.stderr
    assert "attn_logit_softcapping 50.0" in line[0]
    run = _doit(tmp_path, "explain:tiny-qwen2-w8a16")
    assert "gemma2" not in run.stdout + run.stderr
    run = _doit(tmp_path, "build:gemma2-2b-w4a16")
    assert run.returncode != 0
    line = [ln for ln in (run.stdout + run.stderr).splitlines() if "gemma2" in ln and "soft-capping" in ln]
    assert len(line) == 1 and "attn_logit_softcapping 50.0" in line[0], run.stdout + run.stderr


def test_unpinned_revision_refused_in_one_line():
    with pytest.raises(SourceError) as e:
        download.resolve_revision("acme/model", model_facts.UNPINNED)
    msg = str(e.value)
    assert "\n" not in msg and "unpinned" in msg and "40-hex commit" in msg and "acme/model" in msg


@pytest.fixture
def facts_project(tmp_path, tiny_bert, monkeypatch):
    """A fake local Hub cache holding a model at COMMIT, and a project whose recipes/models/
    keeps facts of it: the model's own config.json values."""
    from huggingface_hub import constants

    hub = fake_hub_cache(tmp_path / "hub", HUB_REPO, tiny_bert)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("NPUBUILD_ROOT", str(tmp_path / "proj"))
    cfg = json.loads((tiny_bert / "config.json").read_text())
    (tmp_path / "proj" / "recipes" / "models").mkdir(parents=True)
    facts = tmp_path / "proj" / "recipes" / "models" / "tiny.json"
    kept = {k: cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")}
    facts.write_text(json.dumps({"repo": HUB_REPO, "revision": COMMIT, "config": kept}))
    model_facts._all.cache_clear()
    download.resolve_revision.cache_clear()
    yield facts, kept
    model_facts._all.cache_clear()


def test_download_checks_kept_facts(facts_project, tmp_path):
    facts, kept = facts_project
    params = {"hf": HUB_REPO, "revision": COMMIT, "allow_patterns": None}
    info = download.run({}, {}, params, tmp_path / "out1")  # the facts match: downloads
    assert info["commit"] == COMMIT and (tmp_path / "out1" / "config.json").is_file()
    doc = json.loads(facts.read_text())
    doc["config"]["num_hidden_layers"] = kept["num_hidden_layers"] + 1
    facts.write_text(json.dumps(doc))
    model_facts._all.cache_clear()
    with pytest.raises(SourceError) as e:
        download.run({}, {}, params, tmp_path / "out2")
    msg = str(e.value)
    assert "\n" not in msg
    assert (
        f"config.json key 'num_hidden_layers': expected {kept['num_hidden_layers'] + 1} (kept in "
        f"recipes/models/tiny.json), found {kept['num_hidden_layers']}"
    ) in msg


def _binary(ar: int, nbytes: int, kv_dtype: str = "UINT8") -> dict:
    """A read-back binary's figures (tasks.qnn.context_binary.ContextBinary.figures) holding one
    genai graph of ``ar`` tokens per call: ids in, logits and 2 layers' KV buffers in and out."""
    kv = [
        [f"{d}_{kind}_{l}", kv_dtype, [1, 2, 64, 32], 4096]
        for d in ("past",)
        for kind in ("key", "value")
        for l in range(2)
    ]
    out = [[n.replace("past", "present"), t, s, b] for n, t, s, b in kv]
    return {
        "bytes": nbytes,
        "sdk_build_id": "v2.51",
        "soc_model": 60,
        "graphs": {
            f"g{ar}": {
                "weight_bytes": nbytes - 4096,
                "shared_weight_bytes": 0,
                "spill_fill_bytes": 0,
                "io_bytes": 0,
                "inputs": [["input_ids", "INT32", [1, ar], 4 * ar], *kv],
                "outputs": [["logits", "FLOAT", [1, ar, 1024], 4096 * ar], *out],
            }
        },
    }


def test_without_weight_sharing_a_token_streams_the_decode_binary_only(tmp_path):
    """Per-graph binaries (``compile.weight_sharing: false``) each hold every weight; a decoded
    token runs the decode graph's binary alone, so the weights read per token are that binary's
    (a breaker found both binaries counted: bytes per token 2 x, the ceiling half)."""
    from tasks.llm.figures import device_figures
    from tasks.recipe.load import load_recipe

    (tmp_path / "r.yaml").write_text(
        (REPO / "recipes" / "tiny-qwen2-w8a16.yaml")
        .read_text()
        .replace("source: {path: .fixtures/tiny-qwen2}", "source: {path: m}")
        .replace("weight_sharing: true", "weight_sharing: false")
    )
    (tmp_path / "m").mkdir()
    r = load_recipe(tmp_path / "r.yaml")
    cfg = {
        "num_hidden_layers": 2,
        "hidden_size": 192,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "vocab_size": 1024,
        "intermediate_size": 512,
        "tie_word_embeddings": False,
    }
    f = device_figures(
        cfg,
        r,
        "x-elite",
        {"part0/prefill_ctx_qnn.bin": _binary(16, 3_000_000), "part0/decode_ctx_qnn.bin": _binary(1, 2_900_000)},
    )
    table = 1024 * 192 * 2  # the 16-bit token table, one row of which a token reads
    assert f["bundle_bytes"] == 5_900_000 and f["weight_bytes_read_per_token"] == 2_900_000 - table + 192 * 2
    assert f["kv_bytes_read_per_token"] == 4 * 4096 and f["io_bytes_written_per_token"] == 4 * 4096 + 4096
    assert f["memory_bytes"] == 5_900_000 + 4 * 4096 + f["io_bytes"]

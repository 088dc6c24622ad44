"""The repo's tiny LLM recipes end to end through the real doit CLI: trained tiny Qwen2 and
Llama (GQA), prefill AR-16 + decode AR-1 over a context of 64, w8a16, compiled for x-elite with
every node on HTP, weight-shared binaries, verified by greedy generation on the HTP simulator
against fp32 transformers, through onnxruntime-genai (``verify.runtime: genai``) with the same
tokens as LLMRunner on the same binaries for every prompt; and the w4a16 variant reusing
download and export."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import REPO, Project
from llm_fixtures import random_phi3_hd80, tiny_model
from llm_projects import DATA, assert_within_estimates, stage_manifests


@pytest.fixture(scope="module")
def llm_project(tmp_path_factory, tiny_bert) -> Project:
    proj = Project(tmp_path_factory.mktemp("llm") / "proj", tiny_bert)
    for rel in DATA:
        (proj.root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, proj.root / rel)
    for name in (
        "tiny-qwen2-w8a16",
        "tiny-llama-w8a16",
        "tiny-qwen2-w4a16",
        "tiny-qwen3-w8a16",
        "tiny-phi3-w8a16",
        "tiny-gemma-w8a16",
    ):
        shutil.copyfile(REPO / "recipes" / f"{name}.yaml", proj.root / "recipes" / f"{name}.yaml")
    for arch in ("qwen2", "llama", "qwen3", "phi3", "gemma"):
        shutil.copytree(tiny_model(arch), proj.root / ".fixtures" / f"tiny-{arch}")
    return proj


def _report(proj: Project, recipe: str) -> dict:
    return json.loads((proj.root / "build" / recipe / "verify.json").read_text())


def _compile_info(proj: Project, recipe: str) -> dict:
    """{"parts": [row per part]} from the recipe's ``compile.part{k}`` entries (issue 22)."""
    state = json.loads((proj.root / "build" / recipe / "stages.json").read_text())
    names = sorted((n for n in state if n.startswith("compile.part")), key=lambda n: int(n.split("part")[1]))
    return {
        "parts": [
            row
            for n in names
            for row in json.loads((Path(state[n]["entry"]) / "manifest.json").read_text())["info"]["parts"]
        ]
    }


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "phi3", "gemma"])
def test_tiny_llm_w8a16_builds_and_matches_fp32_on_htp(llm_project, arch):
    recipe = f"tiny-{arch}-w8a16"
    llm_project.doit("run", f"build:{recipe}")
    r = _report(llm_project, recipe)
    assert r["backend"] == "htp" and r["all_on_htp"] is True and r["ran"].startswith("per-graph context binaries")
    assert r["runtime"] == "genai" and "onnxruntime-genai 0.18.0" in r["ran"]
    assert len(r["samples"]) == 6 and all(len(s["runner_tokens"]) == 16 for s in r["samples"])
    # onnxruntime-genai's greedy tokens == LLMRunner's on the same binaries, every prompt: the token
    # lists themselves (genai stops at eos and leaves it out), not verify's own flag
    eos = json.loads((llm_project.root / "build" / recipe / "export.json").read_text())["eos_token_id"]
    for s in r["samples"]:
        n = len(s["tokens"])
        assert s["tokens"] == s["runner_tokens"][:n] and (n == 16 or s["runner_tokens"][n] == eos), s
    assert r["metrics"]["genai_runner_agreement"] == 1.0 and all(s["genai_equals_runner"] for s in r["samples"])
    # the fp32 reference is not one repeated token, so agreement can fail
    assert all(s["reference_distinct_tokens"] >= 4 for s in r["samples"])
    m = r["metrics"]
    assert m["token_agreement"] >= 0.85, m  # measured: 1.00 for both (see README)
    assert m["logits_cosine_mean"] >= 0.999 and 0.9 <= m["perplexity_ratio"] <= 1.05, m
    # weight sharing: one binary for both graphs of the part, < 0.7 x the two single binaries
    (part,) = _compile_info(llm_project, recipe)["parts"]
    assert part["shared_ratio"] < 0.7, part
    # the shipped weight-shared binary, read back: both graphs, their weights shared, its size
    shared = r["binaries"]["shared/part0/prefill_ctx_qnn.bin"]
    assert len(shared["graphs"]) == 2 and shared["bytes"] == part["shared_bytes"], shared
    assert all(g["shared_weight_bytes"] > g["weight_bytes"] for g in shared["graphs"].values()), shared
    assert shared["soc_model"] == 60 and shared["sdk_build_id"].startswith("v2."), shared
    b = llm_project.root / "build" / recipe
    assert (b / "export.json").is_file()
    # the shipped genai_config.json names the weight-shared binaries and parses as genai's Config
    # (loading them would need a device: the simulator crashes on two-graph binaries)
    import onnxruntime_genai as og

    cfg = json.loads((b / "genai_config.json").read_text())
    assert [next(iter(p.values()))["filename"] for p in cfg["model"]["decoder"]["pipeline"]] == [
        "shared/part0/prefill_ctx.onnx",
        "shared/part0/decode_ctx.onnx",
    ]
    og.Config(str(b))
    # every stage within the memory estimate checked before it ran, its whole process tree
    assert_within_estimates(stage_manifests(llm_project, recipe))


def test_w4a16_after_w8a16_reuses_download_and_export(llm_project):
    llm_project.doit("run", "build:tiny-qwen2-w8a16")
    run = llm_project.doit("run", "build:tiny-qwen2-w4a16")
    # download and export.part0 are shared; calibration differs (64 prompts, not 8)
    assert run.ran() == [
        f"{s}:tiny-qwen2-w4a16" for s in ("bundle", "calibrate.part0", "compile.part0", "quantize.part0", "verify")
    ]
    m = _report(llm_project, "tiny-qwen2-w4a16")["metrics"]
    # int4 block-wise + GPTQ, lm_head too, v/down projections 8-bit: measured 100 % / 0.9979 (issue 21);
    # with calibrate recording 4 consecutive decode steps (was 4 of 24) 95 of 96 tokens / 0.99803
    # (min 0.99748 vs 0.99756, perplexity ratio 0.990 vs 0.967): one near tie flipped
    assert m["token_agreement"] >= 0.98 and m["logits_cosine_mean"] >= 0.997, m
    assert m["genai_runner_agreement"] == 1.0, m
    key = json.loads((llm_project.root / "build" / "tiny-qwen2-w4a16" / "stages.json").read_text())["quantize.part0"][
        "key"
    ]
    graphs = json.loads((llm_project.cache / "quantize" / key / "manifest.json").read_text())["info"]["graphs"]
    for (
        g
    ) in graphs.values():  # 4 layers x 5 int4 projections (v, down at 8 bits) + lm_head, all LPBQ; the table at 8 bits
        assert g["block_wise_weights"] == g["int4_weights"] == 21, g
        assert g["tables_8bit"] == ["model.embed_tokens.weight_quantized"], g
    (part,) = _compile_info(llm_project, "tiny-qwen2-w4a16")["parts"]
    assert part["shared_bytes"] < _compile_info(llm_project, "tiny-qwen2-w8a16")["parts"][0]["shared_bytes"]
    # compile's and verify's memory checks count the weights at the recipe's bits (issue 22, item 5)
    from tasks.llm.memory import weight_bits_of

    for recipe, bits in (("tiny-qwen2-w8a16", 8), ("tiny-qwen2-w4a16", 4)):
        qkey = json.loads((llm_project.root / "build" / recipe / "stages.json").read_text())["quantize.part0"]["key"]
        assert weight_bits_of(llm_project.cache / "quantize" / qkey / "out") == bits, recipe


def _kv_io(build: Path) -> dict:
    """{(binary, graph, tensor): (dtype, shape)} of every KV cache input and output of every
    context binary under ``build`` (genai's ``past_*`` / ``present_*``), read back through
    libQnnSystem (``tasks.qnn.context_binary.read``)."""
    from tasks.qnn import context_binary

    out = {}
    for b in sorted(build.rglob("*.bin")):
        for g in context_binary.read(b).graphs:
            for t in (*g.inputs, *g.outputs):
                if re.fullmatch(r"(past|present)_(key|value)_\d+", t.name):
                    out[(b.relative_to(build).as_posix(), g.name, t.name)] = (t.dtype, tuple(t.shape))
    return out


def test_the_genai_binaries_take_the_kv_cache_in_8_bits(llm_project):
    """Issue 48 item 1, genai layout: every context binary tiny-qwen2-w8a16 builds (the
    weight-shared one that ships, the per-graph ones verify runs), read back, takes and gives
    each layer's KV cache as UINT8 [1, Hkv, C, d], not one as FLOAT; the shipped export.json
    declares its encoding: symmetric (zero point 128), one scale per layer and K/V for past and
    present, prefill and decode (onnxruntime-genai binds them to one buffer). The same recipe
    with ``quantize.kv_bits: 32`` compiles binaries that read back FLOAT, which the read-back of
    the compile and verify stages refuses against that export.json, a line per KV tensor."""
    llm_project.doit("run", "build:tiny-qwen2-w8a16")
    build = llm_project.root / "build" / "tiny-qwen2-w8a16"
    desc = json.loads((build / "export.json").read_text())
    kv = _kv_io(build)
    layers, shape = desc["num_layers"], (1, desc["num_kv_heads"], desc["context_len"], desc["head_dim"])
    assert sorted({b for b, _, _ in kv}) == [
        "part0/decode_ctx_qnn.bin",
        "part0/prefill_ctx_qnn.bin",
        "shared/part0/prefill_ctx_qnn.bin",
    ]
    assert len(kv) == 4 * layers * 4  # 4 graphs (2 per-graph binaries, 2 in the shared one) x 4 tensors a layer
    assert set(kv.values()) == {("UINT8", shape)}, sorted({v for v in kv.values()})
    enc = {}
    for g in ("prefill", "decode"):
        for t in desc["parts"][0][g]["inputs"] + desc["parts"][0][g]["outputs"]:
            if re.fullmatch(r"(past|present)_(key|value)_\d+", t["name"]):
                assert t["dtype"] == "uint8" and t["zero_point"] == 128, t
                enc.setdefault(t["name"].split("_", 1)[1], set()).add(t["scale"])
    assert sorted(enc) == sorted(f"{c}_{l}" for c in ("key", "value") for l in range(layers))
    assert all(len(s) == 1 for s in enc.values()), enc  # one scale per layer and K/V

    llm_project.recipe("tiny-qwen2-kv32", "extends: tiny-qwen2-w8a16\nquantize: {kv_bits: 32}\n")
    llm_project.doit("run", "compile.part0:tiny-qwen2-kv32")  # the stages up to it, no verify
    explain = llm_project.doit("run", "explain:tiny-qwen2-kv32").log()
    key = re.search(r"compile\.part0:tiny-qwen2-kv32\s+\w+\s+([0-9a-f]{16})\s", explain).group(1)
    (entry,) = [d for d in (llm_project.cache / "compile").iterdir() if d.name.startswith(key)]
    assert set(_kv_io(entry / "out").values()) == {("FLOAT", shape)}
    # the read-back compile and verify run refuses them against the 8-bit export.json, one line a tensor
    from tasks.qnn.context_binary_checks import Mismatch
    from tasks.llm.part_binaries import read_back

    with pytest.raises(Mismatch) as e:
        read_back(entry / "out", desc, [0], {"target": "x-elite", "weight_sharing": True, "per_graph": True})
    assert len(e.value.lines) == 4 * layers * 4, e.value.lines
    assert {ln.split(",")[0] for ln in e.value.lines} == {b for b, _, _ in kv}
    assert all(ln.endswith(": expected UINT8 (export.json), found FLOAT") for ln in e.value.lines), e.value.lines


def test_an_llm_threshold_fails_the_build_and_stays_out_of_the_verify_key(llm_project):
    """Issue 23's test gap: a recipe that only raises a bar reuses the verify entry (thresholds
    are not in its key) and the build fails naming the metric, its value and the bar."""
    llm_project.doit("run", "build:tiny-qwen2-w8a16")
    got = _report(llm_project, "tiny-qwen2-w8a16")["metrics"]["logits_cosine_mean"]
    llm_project.recipe(
        "tiny-qwen2-strict", "extends: tiny-qwen2-w8a16\nverify: {thresholds: {logits_cosine_mean: 0.9999999}}\n"
    )
    before = {k: llm_project.entries(k) for k in ("quantize", "compile", "verify")}
    run = llm_project.doit("run", "build:tiny-qwen2-strict", check=False)
    # the verify task runs only to judge the cached entry: no stage built anything
    assert run.code != 0 and run.ran() == ["verify:tiny-qwen2-strict"], run.log()
    assert {k: llm_project.entries(k) for k in before} == before
    assert f"logits_cosine_mean = {got:.5f}, threshold >= 0.9999999" in run.log(), run.log()
    key = json.loads((llm_project.root / "build" / "tiny-qwen2-w8a16" / "stages.json").read_text())["verify"]["key"]
    strict = llm_project.doit("run", "explain:tiny-qwen2-strict").tasks["explain:tiny-qwen2-strict"]["out"]
    assert key[:16] in strict and "fails: logits_cosine_mean" in strict, strict


def test_genai_and_the_runner_agree_on_a_phi3_with_head_dim_80(llm_project):
    """Issue 23's case 6: a random Phi-3 with head_dim 80 (hidden 160, 2 heads, vocab 2048,
    partial rotary 0.75 as the fixture) through compile and verify on the HTP simulator:
    onnxruntime-genai and LLMRunner give the same tokens on every prompt (the report said one
    prompt of six differed at token 3; not reproduced here, so this guards it)."""
    import torch
    from transformers import AutoTokenizer, Phi3Config, Phi3ForCausalLM

    src = llm_project.root / ".fixtures" / "tiny-phi3"
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(hidden_size=160, num_attention_heads=2, num_key_value_heads=2, vocab_size=2048)
    for k in ("architectures", "transformers_version", "dtype"):
        cfg.pop(k, None)
    torch.manual_seed(0)
    out = llm_project.root / "models" / "phi3-hd80"
    Phi3ForCausalLM(Phi3Config(**cfg)).eval().save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    llm_project.recipe(
        "phi3-hd80",
        "extends: tiny-phi3-w8a16\nsource: {path: models/phi3-hd80}\n"
        "verify: {thresholds: {token_agreement: 0.1, logits_cosine_mean: 0.9, perplexity_ratio: 1.5, "
        "genai_runner_agreement: 1.0}}\n",
    )  # random weights: near ties, so loose bars but genai = runner
    llm_project.doit("run", "build:phi3-hd80")
    r = _report(llm_project, "phi3-hd80")
    assert json.loads((out / "config.json").read_text())["hidden_size"] // 2 == 80
    assert r["runtime"] == "genai" and r["metrics"]["genai_runner_agreement"] == 1.0, r["metrics"]
    assert all(s["genai_equals_runner"] and len(s["runner_tokens"]) == 16 for s in r["samples"]), r["samples"]


def test_genai_and_the_runner_agree_on_the_cpu_on_a_random_phi3(llm_project):
    """Issue 32 item 2, the report's recipe through the real CLI: ``tiny-qwen2-w8a16`` with a
    random Phi-3 of head_dim 80 as its source (:func:`llm_fixtures.random_phi3_hd80`) and
    ``verify.backend: cpu-qdq``: onnxruntime-genai and LLMRunner give the same tokens on every
    prompt (the report: genai_runner_agreement 0.833, "To plant a tree," apart at token 3,
    because genai's CPU sessions computed the QDQ graphs' weight MatMuls with int8 activations:
    ``tasks/llm/sessions.py``). The other bars are loosened: random weights, near ties."""
    random_phi3_hd80(llm_project.root / "models" / "phi3-hd80-seeded")
    llm_project.recipe(
        "phi3-hd80-cpu",
        "extends: tiny-qwen2-w8a16\nsource: {path: models/phi3-hd80-seeded}\n"
        "verify: {backend: cpu-qdq, thresholds: {token_agreement: 0.1, logits_cosine_mean: 0.9, "
        "perplexity_ratio: 1.5, genai_runner_agreement: 1.0}}\n",
    )
    run = llm_project.doit("run", "build:phi3-hd80-cpu", check=False)
    assert run.code == 0, run.log()
    r = _report(llm_project, "phi3-hd80-cpu")
    assert r["backend"] == "cpu-qdq" and r["runtime"] == "genai", r
    assert r["metrics"]["genai_runner_agreement"] == 1.0, r["metrics"]
    assert all(s["genai_equals_runner"] and len(s["runner_tokens"]) == 16 for s in r["samples"]), r["samples"]
    assert all(s["reference_distinct_tokens"] >= 2 for s in r["samples"])  # not one repeated token


def test_tiny_llm_builds_byte_identical_in_two_folders(llm_project, tmp_path):
    """tiny-qwen2-w8a16 built and published from empty caches in two folders (the second's
    path has a space), each in its own processes, gives the same bundle by sha256, every file: the weight-shared
    context binary, EPContext models, genai_config.json, manifest, model card and archive
    (issue 12; LLM graphs showed no racy padding run in 40 of 40 compiles, tasks/qnn/ep.py). The
    per-graph binaries verify runs stay in build/ (issue 48: a bundle ships what its runtimes load)."""
    import hashlib

    def sums(folder: Path) -> dict[str, str]:
        return {
            p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }

    recipe = "tiny-qwen2-w8a16"
    llm_project.doit("run", f"build:{recipe}", f"publish:{recipe}")
    dists = [llm_project.root / "dist"]
    for folder in (tmp_path / "x" / "second folder",):
        other = Project.__new__(Project)
        other.root = llm_project.root
        other.env = dict(
            llm_project.env,
            NPUBUILD_CACHE=str(folder / "cache"),
            NPUBUILD_BUILD=str(folder / "build"),
            NPUBUILD_HOME=str(folder / "home"),
            NPUBUILD_DIST=str(folder / "dist"),
        )
        run = other.doit("run", f"build:{recipe}", f"publish:{recipe}")
        assert f"compile.part0:{recipe}" in run.ran() and f"export.part0:{recipe}" in run.ran()
        dists.append(folder / "dist")
    first = sums(dists[0] / recipe)
    assert [k for k in first if k.endswith(".bin") or k.endswith("_ctx.onnx")] == [
        "shared/part0/decode_ctx.onnx",
        "shared/part0/prefill_ctx.onnx",
        "shared/part0/prefill_ctx_qnn.bin",
    ], sorted(first)
    assert (llm_project.root / "build" / recipe / "part0" / "decode_ctx_qnn.bin").is_file()  # verify's, not shipped
    for d in dists[1:]:
        other_sums = sums(d / recipe)
        assert sorted(k for k in set(first) | set(other_sums) if first.get(k) != other_sums.get(k)) == []
    archives = [next(d.glob(f"{recipe}-*.tar.gz")) for d in dists]
    assert len({a.name for a in archives}) == 1
    assert len({hashlib.sha256(a.read_bytes()).hexdigest() for a in archives}) == 1


def test_every_module_an_llm_stage_runs_is_in_its_key(llm_project, tmp_path):
    """Issue 24, through the doit CLI: an LLM build whose quantize children (GPTQ, with the
    decode graph's feeds handed over as FeedStores) and compile children (``tasks.llm.htp``)
    run named functions; every ``tasks`` module each stage process and child loads is in that
    stage's code digest."""
    from code_graph import traced_modules_outside_keys

    llm_project.recipe(
        "tiny-qwen2-trace",
        "extends: tiny-qwen2-w8a16\nexport: {sequence_length: 8}\n"
        "quantize: {precision: w4a16, block_size: 32, rounding: gptq, gptq_span: 256,\n"
        "  calibration: {samples: 4}}\n"
        "verify: {data: {samples: 2}, max_new_tokens: 4,\n"
        "  thresholds: {token_agreement: 0.0, logits_cosine_mean: 0.5, perplexity_ratio: 10.0}}\n",
    )
    trace = tmp_path / "trace"
    trace.mkdir()
    env = dict(llm_project.env)
    llm_project.env["NPUBUILD_TRACE_MODULES"] = str(trace)
    try:
        run = llm_project.doit("run", "build:tiny-qwen2-trace")
    finally:
        llm_project.env = env
    assert {f"{s}.part0:tiny-qwen2-trace" for s in ("export", "calibrate", "quantize", "compile")} <= set(run.ran())
    children = sorted(json.loads(f.read_text())["task"] for f in trace.glob("child-*.json"))
    assert children.count("quantize.part0:tiny-qwen2-trace") == 2, children
    assert children.count("compile.part0:tiny-qwen2-trace") == 3, children
    assert traced_modules_outside_keys(llm_project, ["tiny-qwen2-trace"], trace) == {}
    # the quantize child's GPTQ lines reach the entry's log: a line per MatMul input, in graph
    # order (4 a layer: q/k/v, o_proj, gate/up, down_proj; 4 layers) and the LM head
    stages = json.loads((llm_project.root / "build" / "tiny-qwen2-trace" / "stages.json").read_text())
    log = Path(stages["quantize.part0"]["entry"]) / "log.txt"
    lines = [ln for ln in log.read_text().splitlines() if ": GPTQ " in ln]
    groups = [ln.split(": GPTQ ")[1].split(":")[0] for ln in lines]
    per_layer = ["self_attn.k_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"]  # k < q < v
    assert groups == [f"model.layers.{i}.{w}.weight.T" for i in range(4) for w in per_layer] + ["lm_head.weight.T"]
    assert all(" rows; inputs " in ln for ln in lines), lines
    # the pieces after o_proj, gate/up and down_proj keep rows apart and run every feed's rows at
    # once, prefill and decode graphs alike; the attention's do not; nor layer 0's o_proj piece,
    # which recomputes the residual from the token ids (a Gather)
    wise = [ln.rsplit("(", 1)[1].split(" of 2 graphs row-wise")[0] for ln in lines]
    assert wise == ["0", "0", "2", "2"] + ["0", "2", "2", "2"] * 3 + ["0"], lines


def test_max_new_tokens_beyond_the_context_is_refused_at_load(llm_project):
    """verify.max_new_tokens with one prompt window beyond the context (issue 51: a ValueError
    after 84 s of stages): ``build:`` fails before any stage runs, in one line naming both keys
    and the figures."""
    llm_project.recipe("tiny-qwen2-long", "extends: tiny-qwen2-w8a16\nverify: {max_new_tokens: 48}\n")
    before = {k: llm_project.entries(k) for k in ("download", "export")}
    run = llm_project.doit("run", "build:tiny-qwen2-long", check=False)
    assert run.code != 0
    said = [ln for ln in run.log().splitlines() if "verify.max_new_tokens" in ln]
    assert (
        said
        and "expected verify.max_new_tokens + export.sequence_length (one padded prompt window) <= "
        "export.context_length - 1 = 63, found 48 + 16 = 64"
        in said[0]
    ), run.log()
    assert "Traceback" not in run.log()
    assert {k: llm_project.entries(k) for k in ("download", "export")} == before  # nothing built

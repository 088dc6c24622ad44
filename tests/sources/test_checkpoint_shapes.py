"""A checkpoint whose tensors disagree with its ``config.json`` (another model's weights, a
config edited after the fact) is one line at export naming the tensor, the shape the config
implies and the shape stored, or the tensor the config needs and the checkpoint lacks (issue 51
case 2): before, a wrong shape exported and failed at calibrate in a 42-line onnxruntime
traceback, and a missing tensor was a KeyError behind "drop the upstream entry" advice; an
encoder's was a 40-line RuntimeError traceback. Through the real doit CLI, on the tiny trained
Qwen2 (tests/llm_fixtures.py) and the tiny BERT (tests/conftest.py)."""

from __future__ import annotations

import json

import pytest
from console_cli import doit as console
from conftest import Project
from llm_projects import parts_project_at


def _edit_config(p, **changes):
    f = p.root / ".fixtures" / "tiny-qwen2" / "config.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), **changes}, indent=1))


@pytest.mark.parametrize(
    "changes, want",
    [
        (
            {"intermediate_size": 512},  # the checkpoint's MLP is 768 wide
            "model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight': expected shape (512, 192) "
            "(transformers' Qwen2ForCausalLM for config.json), found (768, 192); 11 more tensors differ",
        ),
        (
            {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": 32},  # Qwen3 has q_norm/k_norm
            "model.safetensors: tensor 'model.layers.0.self_attn.q_norm.weight': expected shape (32,) "
            "(transformers' Qwen3ForCausalLM for config.json), found no such tensor; 7 more tensors differ",
        ),
    ],
)
def test_tensors_that_disagree_with_the_config_are_one_line_at_export(tmp_path, tiny_bert, changes, want):
    p = parts_project_at(tmp_path / "proj", tiny_bert, "tiny1", parts=1)
    _edit_config(p, **changes)
    run = console(p, "run", "export.part0:tiny1")
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "Traceback" not in out, out
    assert [ln for ln in out.splitlines() if ln.startswith("export.part0:tiny1  ") and " FAILED " not in ln] == [
        f"export.part0:tiny1  SourceError: {want}"
    ], out
    assert p.entries("export") == []


def test_an_encoder_tensor_of_another_shape_is_one_line_at_export(tmp_path, tiny_bert):
    p = Project(tmp_path / "proj", tiny_bert)
    f = p.root / "models" / "tiny-bert" / "config.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), "intermediate_size": 128}))  # the checkpoint's FFN: 64
    p.recipe("r")
    run = console(p, "run", "export:r")
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "Traceback" not in out, out
    assert [ln for ln in out.splitlines() if ln.startswith("export:r  ") and " FAILED " not in ln] == [
        "export:r  SourceError: model.safetensors: tensor 'encoder.layer.0.intermediate.dense.weight': expected "
        "shape (128, 32) (transformers' BertModel for config.json), found (64, 32); 5 more tensors differ"
    ], out
    assert p.entries("export") == []

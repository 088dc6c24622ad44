"""Shape builds (tasks/sources/shape.py) through the doit CLI: a recipe whose source is random
weights in a Hub model's kept configuration builds every stage with no Hub, the same bytes in
two caches, the checkpoint holds every parameter transformers makes for that config in bf16, and
the catalog marks the build as a shape build."""

from __future__ import annotations

import json

from safetensors import safe_open

from conftest import Project
from llm_projects import assert_within_estimates, parts_project_at, stage_manifests

COMMIT = "f" * 40
FACTS = {
    "repo": "acme/tiny-llama-shape",
    "revision": COMMIT,
    "revision_source": "a test",
    "config_source": "a test",
    "config": {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1024,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "max_position_embeddings": 256,
    },
}
RECIPE = f"""\
extends: tiny-qwen2-w8a16
description: random weights in the shape of acme/tiny-llama-shape
source: {{path: null, hf: acme/tiny-llama-shape, revision: {COMMIT}, shape: true, tokenizer: .fixtures/tiny-qwen2}}
verify: {{backend: cpu-qdq, runtime: runner, data: {{samples: 1}}, max_new_tokens: 2,
         thresholds: {{token_agreement: 0.0, logits_cosine_mean: 0.01, perplexity_ratio: 10.0, genai_runner_agreement:
         null}}}}
"""


def _project(root, tiny_bert) -> Project:
    """The tiny-Qwen2 project of tests/llm/test_llm_parts.py with kept facts of acme/tiny-llama-shape
    and recipe ``shape``."""
    proj = parts_project_at(root, tiny_bert, name="tiny1", parts=1)
    (proj.root / "recipes" / "models").mkdir()
    (proj.root / "recipes" / "models" / "tiny-llama-shape.json").write_text(json.dumps(FACTS))
    proj.recipe("shape", RECIPE)
    return proj


def test_a_shape_build_builds_offline_reproducibly_and_is_marked(tmp_path, tiny_bert):
    a, b = _project(tmp_path / "a", tiny_bert), _project(tmp_path / "b", tiny_bert)
    a.doit("run", "build:shape")
    b.doit("run", "download:shape")
    (da,), (db,) = a.entries("download"), b.entries("download")
    ma = json.loads((a.cache / "download" / da / "manifest.json").read_text())
    mb = json.loads((b.cache / "download" / db / "manifest.json").read_text())
    assert da == db and ma["output_digest"] == mb["output_digest"]  # same key, same bytes
    out = a.cache / "download" / da / "out"
    cfg = json.loads((out / "config.json").read_text())
    assert all(cfg[k] == v for k, v in FACTS["config"].items()), cfg
    from transformers import AutoConfig, AutoModelForCausalLM

    want = {
        n: tuple(t.shape)
        for n, t in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out)).state_dict().items()
    }
    got = {}
    for f in out.glob("model-*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            for n in st.keys():
                t = st.get_tensor(n)
                assert str(t.dtype) == "torch.bfloat16", n
                got[n] = tuple(t.shape)
    assert got == want and ma["info"]["parameters"] == sum(__import__("math").prod(s) for s in want.values())
    r = json.loads((a.root / "build" / "shape" / "verify.json").read_text())
    assert r["binaries"] and all(b["soc_model"] == 60 for b in r["binaries"].values())
    assert_within_estimates(stage_manifests(a, "shape"))  # the shape download's estimate among them
    a.doit("run", "catalog")
    (row,) = [
        x for x in json.loads((a.root / "catalog" / "catalog.json").read_text())["recipes"] if x["name"] == "shape"
    ]
    assert row["shape_build"] is True and row["source"]["kind"] == "shape" and row["state"] == "shape-built"
    run = a.doit("run", "publish:shape", check=False)  # random weights are never shipped
    assert run.code != 0 and "refusing to publish shape: it is a shape build" in run.log()


def test_a_tokenizer_folder_without_a_tokenizer_is_a_load_error(tmp_path, tiny_bert):
    """A ``source.tokenizer`` folder with only ``tokenizer_config.json`` (issue 51 case 3; was a
    44-line TypeError out of transformers at download) is a load error naming the key, the
    folder and what it lacks, before any stage; tokenizer files transformers cannot load are one
    line at download with its reason."""
    import shutil

    from console_cli import doit as console

    p = _project(tmp_path / "proj", tiny_bert)
    tok = p.root / "tok"
    tok.mkdir()
    shutil.copyfile(p.root / ".fixtures" / "tiny-qwen2" / "tokenizer_config.json", tok / "tokenizer_config.json")
    recipe = p.root / "recipes" / "shape.yaml"
    recipe.write_text(recipe.read_text().replace("tokenizer: .fixtures/tiny-qwen2", "tokenizer: tok"))
    run = console(p, "run", "build:shape")
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "Traceback" not in out, out
    assert p.entries("download") == []
    want = (
        "source.tokenizer: expected a folder of tokenizer files with tokenizer.json (or tokenizer.model, "
        "vocab.txt, or vocab.json and merges.txt), found only tokenizer_config.json in tok"
    )
    assert any(ln.rstrip().endswith(want) for ln in out.splitlines()), out
    (tok / "tokenizer.json").write_text("{not json")  # the files are there and transformers cannot load them
    run = console(p, "run", "download:shape")
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "Traceback" not in out, out
    assert [ln for ln in out.splitlines() if ln.startswith("download:shape  SourceError")] == [
        "download:shape  SourceError: source.tokenizer 'tok': expected a tokenizer transformers loads, found "
        "Exception: key must be a string at line 1 column 2"
    ], out

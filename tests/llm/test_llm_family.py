"""The LLM family's declaration (``tasks/llm/family.py``): what a published LLM bundle ships
beyond its runtime configs (``Family.shipped``), through publish's one rule
(:func:`tasks.commands.publish.contents.shipped_files`), on a bundle folder LLMRunner alone can
run (``embedding: host``: no ``genai_config.json``)."""

import json

import onnx
import pytest
from onnx import TensorProto, helper

from tasks.commands.publish.contents import shipped_files
from tasks.commands.publish.errors import PublishError
from tasks.contract import family

RUNNER = "npubuild LLMRunner"


def _ep_model(path, binary: str) -> None:
    """An EPContext model (as compile writes one) whose EPContext node names ``binary``
    (``embed_mode`` 0: the binary is a file beside the model)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    node = helper.make_node(
        "EPContext",
        ["x"],
        ["y"],
        domain="com.microsoft",
        embed_mode=0,
        ep_cache_context=binary,
        main_context=1,
        source="QNN",
    )
    model = helper.make_model(
        helper.make_graph([node], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _bundle(root, shared: bool) -> dict:
    """{bundle path: file} of a one-part LLM build with its embedding on the host: export.json,
    the table, per-graph EPContext models and binaries (``part0/``) and, ``shared``, the
    weight-shared ones (``shared/part0/``), a tokenizer and config.json."""
    desc = {
        "parts": [{"index": 0, "prefill": {"path": "part0/prefill.onnx"}, "decode": {"path": "part0/decode.onnx"}}],
        "embed_file": "embed_tokens.npy",
    }
    (root / "export.json").write_text(json.dumps(desc))
    for name in ("embed_tokens.npy", "tokenizer.json", "config.json"):
        (root / name).write_text("{}")
    for folder in ("part0", "shared/part0") if shared else ("part0",):
        for g in ("prefill", "decode"):
            _ep_model(root / folder / f"{g}_ctx.onnx", f"{g}_qnn.bin")
            (root / folder / f"{g}_qnn.bin").write_bytes(b"\0" * 8)
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("shared", [False, True])
def test_an_llm_bundle_without_genai_config_ships_what_llmrunner_loads(tmp_path, shared):
    sources = _bundle(tmp_path, shared)
    graphs = "shared/part0" if shared else "part0"
    want = {
        "export.json": [f"{RUNNER} and the catalog (every graph's inputs and outputs)"],
        "embed_tokens.npy": [f"{RUNNER} (export.json embed_file: the host-side embedding table)"],
        "tokenizer.json": ["tokenizer: transformers"],
        "config.json": ["metadata: the source model's configuration (transformers)"],
    }
    for g in ("prefill", "decode"):
        want[f"{graphs}/{g}_ctx.onnx"] = [f"{RUNNER} (export.json)"]
        want[f"{graphs}/{g}_qnn.bin"] = [f"{RUNNER} (context binary of an EPContext model)"]
    assert shipped_files(sources, family("llm")) == dict(sorted(want.items()))
    # without the LLM family's rule, nothing claims the folder: every EPContext model would ship
    # as an encoder's, the per-graph ones beside the weight-shared ones, and export.json would not
    bare = shipped_files(sources)
    assert "export.json" not in bare and bare["part0/prefill_ctx.onnx"] == ["onnxruntime QNN EP (the EPContext model)"]
    assert shipped_files(sources, family("encoder")) == bare  # the encoder family has no rule of its own


def test_an_llm_bundle_naming_a_file_the_build_lacks_is_refused(tmp_path):
    sources = _bundle(tmp_path, shared=False)
    del sources["embed_tokens.npy"]
    with pytest.raises(PublishError, match="refusing to publish: export.json names embed_tokens.npy, which the build"):
        shipped_files(sources, family("llm"))

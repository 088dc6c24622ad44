"""Every context binary read back (tasks/qnn/context_binary.py, its checks
tasks/qnn/context_binary_checks.py): the reader against the binaries the build makes, and, through the doit CLI, a built
LLM whose shipped files are tampered with as a faulty compile, bundle or cache would leave them (the entry re-sealed, so
the cache's own integrity check passes): each fault fails verify with one line naming binary, graph, tensor,
expected and found."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from conftest import Project
from tasks.qnn import context_binary
from tasks.qnn import context_binary_checks
from tasks.store import digest
from llm_projects import parts_project_at

TAMPER_RECIPE = """\
extends: tiny-qwen2-w8a16
description: tiny trained Qwen2 in 2 parts for two SoCs, verified on the CPU (read back only)
export: {parts: 2}
compile: {targets: [x-elite, 8gen2]}
verify: {backend: cpu-qdq, runtime: runner, data: {samples: 1}, max_new_tokens: 2,
         thresholds: {token_agreement: 0.0, logits_cosine_mean: 0.9, perplexity_ratio: 2.0,
                      genai_runner_agreement: null}}
"""


def test_struct_layouts_match_the_qnn_headers():
    """The sizes and offsets the reader assumes are the public headers' (x86_64 offsetof):
    ``Qnn_Tensor_t`` 144 bytes with rank at 8 + 72, ``QnnSystemContext_GraphInfo_t`` 88,
    socModel at byte 128 of the V3 binary info, the interface's functions at 32."""
    assert ctypes.sizeof(context_binary._Tensor) == 144
    assert context_binary._Tensor.v1.offset + context_binary._TensorV1.rank.offset == 8 + 72
    assert ctypes.sizeof(context_binary._GraphInfo) == 88
    assert context_binary._BinaryInfoV3.socModel.offset == 128
    assert context_binary._SystemInterface.fns.offset == 32


def test_a_file_that_is_no_context_binary_is_one_error(tmp_path):
    bad = tmp_path / "model_ctx_qnn.bin"
    bad.write_bytes(b"\x00" * 4096)
    with pytest.raises(context_binary.ReadError, match="model_ctx_qnn.bin: not a QNN context binary"):
        context_binary.read(bad)


def _reseal(entry: Path, change) -> None:
    """Apply ``change(out_folder)`` to a committed cache entry and rewrite its manifest as a
    build would have (sizes, mtimes, xxh3, output digest): the entry is then whole to the cache,
    as one a faulty stage committed."""
    out = entry / "out"
    for p in [out, *out.rglob("*")]:
        os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR)
    change(out)
    m = json.loads((entry / "manifest.json").read_text())
    listing = {}
    for f in digest.list_files(out):
        st = f.stat()
        listing[f.relative_to(out).as_posix()] = {
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "xxh3": digest.hash_file_uncached(f),
        }
    m.update(outputs=listing, output_digest=digest.listing_digest(listing))
    (entry / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")


def _entry(proj: Project, recipe: str, stage: str) -> Path:
    st = json.loads((proj.root / "build" / recipe / "stages.json").read_text())
    kind = stage.split(".")[0].split("@")[0]
    return proj.cache / kind / st[stage]["key"]


def _failure(proj: Project, recipe: str) -> list[str]:
    """Build ``recipe``; it must fail in verify@x-elite; return the error lines of that task."""
    run = proj.doit("run", f"build:{recipe}", check=False)
    assert run.code != 0, run.log()
    lines = [ln for ln in run.log().splitlines() if ln.startswith("Mismatch:")]
    assert lines, run.log()
    return lines


def test_tampered_bundles_fail_verify_with_one_line_each(tmp_path, tiny_bert):
    """A two-part tiny Qwen2 for x-elite and 8gen2 builds and reads back every binary (graphs,
    I/O against export.json / the QDQ graphs / genai_config.json, SoC 60 and 43). Then, one at
    a time, each restored after: part 1's weight-shared binary replaced by part 0's, a
    weight-shared binary holding only the prefill graph, genai_config.json naming KV tensors the
    binaries lack, and x-elite's part 0 binary replaced by 8gen2's. Each fails verify with one
    ``Mismatch`` line naming the binary, the graph, the tensor, expected and found."""
    proj = parts_project_at(tmp_path / "proj", tiny_bert, name="tiny2", parts=2)
    proj.recipe("tampered", TAMPER_RECIPE.replace("extends: tiny-qwen2-w8a16", "extends: tiny2"))
    proj.doit("run", "build:tampered")
    b = proj.root / "build" / "tampered"
    for target, soc in (("x-elite", 60), ("8gen2", 43)):
        r = json.loads((b / target / "verify.json").read_text())
        assert sorted(r["binaries"]) == ["shared/part0/prefill_ctx_qnn.bin", "shared/part1/prefill_ctx_qnn.bin"], r
        for fig in r["binaries"].values():
            assert fig["soc_model"] == soc and len(fig["graphs"]) == 2, fig
            assert all(g["shared_weight_bytes"] > 0 and g["io_bytes"] > 0 for g in fig["graphs"].values()), fig
    # the compile stage read them back first, into its manifest
    m = json.loads((_entry(proj, "tampered", "compile.part1@x-elite") / "manifest.json").read_text())
    assert list(m["info"]["binaries"]) == ["shared/part1/prefill_ctx_qnn.bin"]

    c0, c1 = (_entry(proj, "tampered", f"compile.part{k}@x-elite") for k in (0, 1))
    bin0, bin1 = c0 / "out/shared/part0/prefill_ctx_qnn.bin", c1 / "out/shared/part1/prefill_ctx_qnn.bin"
    keep0, keep1 = bin0.read_bytes(), bin1.read_bytes()

    def put(entry, rel, data):
        def change(out):
            (out / rel).write_bytes(data)

        _reseal(entry, change)

    # 1. part 1's binary swapped for part 0's: part 1's graphs take hidden states, part 0's token ids
    put(c1, "shared/part1/prefill_ctx_qnn.bin", keep0)
    (line,) = _failure(proj, "tampered")
    assert (
        "shared/part1/prefill_ctx_qnn.bin, graph " in line
        and "expected FLOAT" in line
        and "found no such tensor" in line
    ), line
    put(c1, "shared/part1/prefill_ctx_qnn.bin", keep1)
    proj.doit("run", "build:tampered")  # restored: every stage a cache hit again (stages.json too)

    # 2. a weight-shared binary that lost its decode graph: the prefill graph compiled alone
    from tasks.llm.htp import compile_single
    from tasks.proc.child import run_function

    qdq = _entry(proj, "tampered", "quantize.part0") / "out" / "part0"
    alone = tmp_path / "alone"
    r = run_function(compile_single, str(qdq / "prefill.onnx"), str(alone), cwd=qdq, name="prefill", target="x-elite")
    assert r.returncode == 0, r.tail(2000)
    put(c0, "shared/part0/prefill_ctx_qnn.bin", (alone / "prefill_ctx_qnn.bin").read_bytes())
    (line,) = _failure(proj, "tampered")
    assert (
        "shared/part0/prefill_ctx_qnn.bin, graph " in line
        and "(from shared/part0/decode_ctx.onnx): expected in the binary, found graphs" in line
    ), line
    put(c0, "shared/part0/prefill_ctx_qnn.bin", keep0)
    proj.doit("run", "build:tampered")

    # 3. genai_config.json naming KV tensors that no binary has
    bundle = _entry(proj, "tampered", "bundle@x-elite")
    cfg = (bundle / "out" / "genai_config.json").read_text()

    def rename(out):
        (out / "genai_config.json").write_text(cfg.replace('"past_key_%d"', '"past_keys_%d"'))

    _reseal(bundle, rename)
    (line,) = _failure(proj, "tampered")
    assert line.startswith(
        "Mismatch: input past_keys_0: expected (named by genai_config.json (KV cache names)), "
        "found in none of the graphs of shared/part0/prefill_ctx_qnn.bin, "
        "shared/part1/prefill_ctx_qnn.bin"
    ), line
    _reseal(bundle, lambda out: (out / "genai_config.json").write_text(cfg))
    proj.doit("run", "build:tampered")

    # 4. x-elite's part 0 binary replaced by the same part's binary for 8gen2
    other = _entry(proj, "tampered", "compile.part0@8gen2") / "out/shared/part0/prefill_ctx_qnn.bin"
    put(c0, "shared/part0/prefill_ctx_qnn.bin", other.read_bytes())
    (line,) = _failure(proj, "tampered")
    assert "shared/part0/prefill_ctx_qnn.bin: SoC model expected 60 (x-elite), found 43" in line, line
    put(c0, "shared/part0/prefill_ctx_qnn.bin", keep0)

    # restored: every stage is whole again and the build passes
    proj.doit("run", "build:tampered")


def test_compile_refuses_a_binary_missing_from_the_plan(tmp_path, tiny_bert):
    """The read-back compile runs: a planned model whose binary holds another graph, and a
    planned model that is missing, are lines of one Mismatch (checked on an encoder's real
    compile output)."""
    proj = Project(tmp_path / "proj", tiny_bert)
    proj.recipe("enc")
    proj.doit("run", "build:enc")
    compiled = _entry(proj, "enc", "compile") / "out"
    qdq = _entry(proj, "enc", "quantize") / "out"
    from tasks.encoder.binaries import compiled_models, read_back

    figs = read_back(compiled, "x-elite", qdq)
    (fig,) = figs.values()
    (g,) = fig["graphs"].values()
    assert fig["soc_model"] == 60 and 0 < g["weight_bytes"] < fig["bytes"] and g["shared_weight_bytes"] == 0, fig
    copy = tmp_path / "copy"
    shutil.copytree(compiled, copy)
    models = sorted(compiled_models(qdq))
    with pytest.raises(context_binary_checks.Mismatch) as e:
        context_binary_checks.check_models(copy, models + ["other_ctx.onnx"], "8gen2", qdq=compiled_models(qdq))
    assert e.value.lines[0] == "other_ctx.onnx: expected (the plan compiles it), found no such file"
    assert e.value.lines[1].endswith(
        "SoC model expected 43 (8gen2), found 60 (the binary was prepared for another SoC)"
    )
    assert len(e.value.lines) == 2


def test_an_encoder_compile_reads_its_binary_back(tmp_path, tiny_bert):
    """The encoder's compile stage reads its context binary back (issue 51: removing the
    read-back from the encoder compile passed every test): through the doit CLI, the compile
    entry's manifest lists the binary with the figures libQnnSystem reports, equal to a read of
    the file itself: one graph, x-elite's SoC model, the QNN SDK build, and the graph's inputs
    (int32 [1, 16] ids and mask) as the QDQ model declares them."""
    from tasks.qnn.targets import get

    proj = Project(tmp_path / "proj", tiny_bert)
    proj.recipe("enc")
    proj.doit("run", "build:enc")
    state = json.loads((proj.root / "build" / "enc" / "stages.json").read_text())
    entry = Path(next(v["entry"] for k, v in state.items() if k.startswith("compile")))
    info = json.loads((entry / "manifest.json").read_text())["info"]
    assert len(info["binaries"]) == 1, info
    rel, fig = next(iter(info["binaries"].items()))
    assert fig == context_binary.read(entry / "out" / rel).figures()  # what the file holds, read again
    assert fig["soc_model"] == get("x-elite").soc_model and fig["sdk_build_id"].startswith("v2.")
    (graph,) = fig["graphs"].values()
    ins = {t[0]: (t[1], t[2]) for t in graph["inputs"]}
    assert ins["input_ids"][1] == [1, 16] and ins["attention_mask"][1] == [1, 16], ins
    assert graph["weight_bytes"] > 0

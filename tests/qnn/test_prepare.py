"""The rewrites that make a finished ONNX graph static and quantizable (tasks/qnn/prepare.py),
on the real graphs the wheels ship: each kind applied when the graph calls for it, outputs the
same as the source's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tasks.qnn.prepare import OPSET, PrepareError, prepare


def _file(package: str, rel: str) -> Path:
    return Path(importlib.util.find_spec(package).submodule_search_locations[0]) / rel


REC = ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx")
CLS = ("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx")
VAD = ("silero_vad", "data/silero_vad.onnx")


def test_rec_metadata_aside_dims_from_the_recipe_outputs_from_a_run_opset_raised(tmp_path):
    rep = prepare(_file(*REC), tmp_path / "rec.onnx", {"x": [1, 3, 48, 320]}, {})
    assert [s["kind"] for s in rep["steps"]] == ["metadata", "static-dims", "opset"]
    assert len(rep["metadata"]["character"].splitlines()) == 6623  # + blank and space: 6625 classes
    assert rep["io"]["outputs"][0]["shape"] == [1, 40, 6625]  # ONNX shape inference stops at a Reshape: one run
    m = onnx.load(str(tmp_path / "rec.onnx"))
    assert not m.metadata_props and max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) == OPSET
    x = np.random.default_rng(0).standard_normal((1, 3, 48, 320)).astype(np.float32)
    a = ort.InferenceSession(str(_file(*REC)), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    b = ort.InferenceSession(str(tmp_path / "rec.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert a.shape == b.shape and np.abs(a - b).max() < 1e-4


def test_cls_mixed_fixed_and_dynamic_dims_are_set_directly(tmp_path):
    rep = prepare(_file(*CLS), tmp_path / "cls.onnx", {"x": [1, 3, 48, 192]}, {})  # [-1, 3, '?', '?']
    assert rep["io"]["inputs"][0]["shape"] == [1, 3, 48, 192] and rep["io"]["outputs"][0]["shape"] == [1, 2]
    with pytest.raises(PrepareError, match="dim 1 is fixed at 3 in the graph, found 4"):
        prepare(_file(*CLS), tmp_path / "bad.onnx", {"x": [1, 4, 48, 192]}, {})
    with pytest.raises(PrepareError, match="found dynamic dims in x"):
        prepare(_file(*CLS), tmp_path / "bad.onnx", {}, {})
    with pytest.raises(PrepareError, match=r"found \['y'\]"):
        prepare(_file(*CLS), tmp_path / "bad.onnx", {"y": [1]}, {})


def test_silero_if_on_the_sample_rate_is_folded_and_computes_what_the_source_does(tmp_path):
    rep = prepare(_file(*VAD), tmp_path / "vad.onnx", {"input": [1, 576], "state": [2, 1, 128]}, {"sr": 16000})
    kinds = [s["kind"] for s in rep["steps"]]
    assert kinds == ["constant-inputs", "static-dims", "fold-if", "opset"]
    m = onnx.load(str(tmp_path / "vad.onnx"))
    assert not any(n.op_type == "If" for n in m.graph.node) and "sr" not in [i.name for i in m.graph.input]
    a = ort.InferenceSession(str(_file(*VAD)), providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(tmp_path / "vad.onnx"), providers=["CPUExecutionProvider"])
    rng, sa, sb = np.random.default_rng(0), np.zeros((2, 1, 128), np.float32), np.zeros((2, 1, 128), np.float32)
    for _ in range(8):  # the state carried call to call, as a stream does
        x = (0.1 * rng.standard_normal((1, 576))).astype(np.float32)
        pa, sa = a.run(None, {"input": x, "state": sa, "sr": np.array(16000, np.int64)})
        pb, sb = b.run(None, {"input": x, "state": sb})
        assert np.abs(pa - pb).max() < 1e-6 and np.abs(sa - sb).max() < 1e-6
    with pytest.raises(PrepareError, match="constant_inputs"):
        prepare(_file(*VAD), tmp_path / "bad.onnx", {}, {"rate": 16000})

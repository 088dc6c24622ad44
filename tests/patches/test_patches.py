"""Tests for tasks/patches/*: small graphs built with onnx.helper, checked on onnxruntime CPU."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from tasks import patches
from tasks.patches import fold_constants as fold_mod

F32_MIN = float(np.finfo(np.float32).min)


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def make(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset), *extra_opsets], ir_version=10)
    if not any(n.op_type == "SimplifiedLayerNormalization" for n in nodes):  # ORT-only op
        onnx.checker.check_model(m)
    return m


def apply(name, model, **params):
    before = model.SerializeToString()
    res = patches.get(name).fn(model, **params)
    return before, res


def test_registry_lists_all_four():
    assert {"mask-range", "rmsnorm-decompose", "int64-to-int32", "fold-constants"} <= set(patches.known())
    for n in ("mask-range", "rmsnorm-decompose", "int64-to-int32", "fold-constants"):
        p = patches.get(n)
        assert p.version >= 1 and "Source" in p.doc and "Params" in p.doc


# ----------------------------------------------------------------------------- mask-range


def bert_mask_graph(fill_value=F32_MIN, shared_big=False):
    """scores[1,2,4,4] + Where(bool(1 - mask), fill, 1 - mask) -> Softmax, as in
    transformers' _expand_mask exported by optimum (BERT/MiniLM)."""
    nodes = [
        h.make_node("Constant", [], ["axes"], value=nh.from_array(np.array([1, 2], np.int64))),
        h.make_node("Unsqueeze", ["attention_mask", "axes"], ["m4"]),
        h.make_node("Cast", ["m4"], ["mf"], to=TP.FLOAT),
        h.make_node("Constant", [], ["one"], value=nh.from_array(np.array(1.0, np.float32))),
        h.make_node("Sub", ["one", "mf"], ["inv"]),
        h.make_node("Cast", ["inv"], ["invb"], to=TP.BOOL),
        h.make_node("Constant", [], ["fill"], value=nh.from_array(np.array(fill_value, np.float32))),
        h.make_node("Where", ["invb", "fill", "inv"], ["bias"]),
        h.make_node("Add", ["scores", "bias"], ["masked"]),
        h.make_node("Softmax", ["masked"], ["probs"], axis=-1),
    ]
    outputs = [h.make_tensor_value_info("probs", TP.FLOAT, [1, 2, 4, 4])]
    inits = []
    if shared_big:
        # an extreme initializer used on the mask path and off it (Max in the model proper)
        inits.append(nh.from_array(np.array(-1e30, np.float32), "big"))
        del nodes[6]
        nodes[6] = h.make_node("Where", ["invb", "big", "inv"], ["bias"])
        nodes.append(h.make_node("Max", ["scores", "big"], ["clipped"]))
        outputs.append(h.make_tensor_value_info("clipped", TP.FLOAT, [1, 2, 4, 4]))
    return make(
        nodes,
        [
            h.make_tensor_value_info("scores", TP.FLOAT, [1, 2, 4, 4]),
            h.make_tensor_value_info("attention_mask", TP.INT64, [1, 4]),
        ],
        outputs,
        inits,
    )


MASK_FEEDS = {
    "scores": np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32),
    "attention_mask": np.array([[1, 1, 1, 0]], np.int64),
}


def test_mask_range_replaces_finfo_min_and_keeps_outputs():
    m = bert_mask_graph()
    ref = run(m, MASK_FEEDS)
    n_nodes = len(m.graph.node)
    _, res = apply("mask-range", copy.deepcopy(m), fill=-100.0)
    assert res.changed and res.counts == {"constants": 1, "elements": 1}
    out = res.model
    assert len(out.graph.node) == n_nodes and ops(out) == ops(m)
    fill = next(n for n in out.graph.node if n.output[0] == "fill")
    assert nh.to_array(fill.attribute[0].t) == np.float32(-100.0)
    # other constants are untouched
    one = next(n for n in out.graph.node if n.output[0] == "one")
    assert nh.to_array(one.attribute[0].t) == np.float32(1.0)
    got = run(out, MASK_FEEDS)
    np.testing.assert_allclose(got[0], ref[0], atol=1e-6)
    assert np.all(got[0][..., 3] < 1e-30)  # masked column still gets no weight
    # the bias range an activation quantizer sees is now finite and small
    bias_model = copy.deepcopy(out)
    bias_model.graph.output.append(h.make_tensor_value_info("bias", TP.FLOAT, [1, 1, 1, 4]))
    bias = run(bias_model, MASK_FEEDS)[1]
    assert bias.min() == -100.0 and bias.max() == 0.0


def test_mask_range_shared_initializer_is_copied_not_edited():
    m = bert_mask_graph(shared_big=True)
    ref = run(m, MASK_FEEDS)
    _, res = apply("mask-range", copy.deepcopy(m), fill=-50.0)
    assert res.changed
    inits = {t.name: nh.to_array(t) for t in res.model.graph.initializer}
    assert inits["big"] == np.float32(-1e30)  # off-path user (Max) keeps the original
    assert inits["big_maskrange"] == np.float32(-50.0)
    where = next(n for n in res.model.graph.node if n.op_type == "Where")
    assert where.input[1] == "big_maskrange"
    assert next(n for n in res.model.graph.node if n.op_type == "Max").input[1] == "big"
    got = run(res.model, MASK_FEEDS)
    np.testing.assert_allclose(got[0], ref[0], atol=1e-6)
    np.testing.assert_array_equal(got[1], ref[1])


def test_mask_range_constant_of_shape_fill_and_inf():
    # causal-style: ConstantOfShape(-inf) feeding Where on the mask path
    nodes = [
        h.make_node("Constant", [], ["shape"], value=nh.from_array(np.array([1, 1, 1, 4], np.int64))),
        h.make_node("ConstantOfShape", ["shape"], ["neg"], value=nh.from_array(np.array([-np.inf], np.float32))),
        h.make_node("Constant", [], ["axes"], value=nh.from_array(np.array([1, 2], np.int64))),
        h.make_node("Unsqueeze", ["attention_mask", "axes"], ["m4"]),
        h.make_node("Cast", ["m4"], ["mb"], to=TP.BOOL),
        h.make_node("Constant", [], ["zero"], value=nh.from_array(np.array(0.0, np.float32))),
        h.make_node("Where", ["mb", "zero", "neg"], ["bias"]),
        h.make_node("Add", ["scores", "bias"], ["masked"]),
        h.make_node("Softmax", ["masked"], ["probs"], axis=-1),
    ]
    m = make(
        nodes,
        [
            h.make_tensor_value_info("scores", TP.FLOAT, [1, 2, 4, 4]),
            h.make_tensor_value_info("attention_mask", TP.INT64, [1, 4]),
        ],
        [h.make_tensor_value_info("probs", TP.FLOAT, [1, 2, 4, 4])],
    )
    ref = run(m, MASK_FEEDS)
    _, res = apply("mask-range", copy.deepcopy(m))
    assert res.changed and res.counts["elements"] == 1
    cos = next(n for n in res.model.graph.node if n.op_type == "ConstantOfShape")
    assert nh.to_array(cos.attribute[0].t)[0] == np.float32(-100.0)
    np.testing.assert_allclose(run(res.model, MASK_FEEDS)[0], ref[0], atol=1e-6)


def test_mask_range_not_applicable_is_byte_identical():
    for m in (bert_mask_graph(fill_value=-100.0), bert_mask_graph(fill_value=-9000.0)):
        before, res = apply("mask-range", m)
        assert not res.changed and res.note
        assert res.model.SerializeToString() == before
    # extreme constant off the mask path (no mask input reaches it): untouched
    m = make(
        [h.make_node("Max", ["x", "c"], ["y"])],
        [h.make_tensor_value_info("x", TP.FLOAT, [4])],
        [h.make_tensor_value_info("y", TP.FLOAT, [4])],
        [nh.from_array(np.array(F32_MIN, np.float32), "c")],
    )
    before, res = apply("mask-range", m)
    assert not res.changed and res.model.SerializeToString() == before


def test_mask_range_bad_params():
    with pytest.raises(ValueError):
        patches.get("mask-range").fn(bert_mask_graph(), fill=-1e5, threshold=1e4)
    with pytest.raises(ValueError):
        patches.get("mask-range").fn(bert_mask_graph(), scope="everything")


# ----------------------------------------------------------------------------- rmsnorm-decompose


def rms_ref(x, scale, eps, axes):
    return x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps) * scale


def rms_graph(op, domain, opset, axis, shape=(2, 3, 8), extra=()):
    scale_shape = shape[axis:]
    scale = np.linspace(0.5, 1.5, int(np.prod(scale_shape)), dtype=np.float32).reshape(scale_shape)
    node = h.make_node(op, ["x", "scale"], ["y"], domain=domain, axis=axis, epsilon=1e-3)
    m = make(
        [node],
        [h.make_tensor_value_info("x", TP.FLOAT, list(shape))],
        [h.make_tensor_value_info("y", TP.FLOAT, list(shape))],
        [nh.from_array(scale, "scale")],
        opset=opset,
        extra_opsets=extra,
    )
    return m, scale


@pytest.mark.parametrize(
    "op,opset,axis",
    [("SimplifiedLayerNormalization", 18, -1), ("RMSNormalization", 23, -1), ("RMSNormalization", 23, 1)],
)
def test_rmsnorm_decompose_numeric(op, opset, axis):
    m, scale = rms_graph(op, "", opset, axis)
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32) * 3
    ref = run(m, {"x": x})[0]
    axes = tuple(range(axis, 3)) if axis >= 0 else (-1,)
    np.testing.assert_allclose(ref, rms_ref(x, scale, 1e-3, axes), rtol=1e-5, atol=1e-5)
    _, res = apply("rmsnorm-decompose", copy.deepcopy(m))
    assert res.changed and res.counts == {"decomposed": 1}
    assert ops(res.model) == ["Mul", "ReduceMean", "Add", "Sqrt", "Div", "Mul"]
    rm = next(n for n in res.model.graph.node if n.op_type == "ReduceMean")
    # opset >= 18: axes is an input
    assert len(rm.input) == 2 and not any(a.name == "axes" for a in rm.attribute)
    axes_t = next(t for t in res.model.graph.initializer if t.name == rm.input[1])
    assert list(nh.to_array(axes_t)) == ([-2, -1] if axis == 1 else [-1])
    onnx.checker.check_model(res.model, full_check=True)
    np.testing.assert_allclose(run(res.model, {"x": x})[0], ref, rtol=1e-5, atol=1e-5)


def test_rmsnorm_decompose_opset13_axes_attribute_and_pow():
    m, _ = rms_graph("SimplifiedLayerNormalization", "", 13, -1)
    x = np.random.default_rng(2).standard_normal((2, 3, 8)).astype(np.float32)
    ref = run(m, {"x": x})[0]
    _, res = apply("rmsnorm-decompose", copy.deepcopy(m), square="pow")
    assert ops(res.model) == ["Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul"]
    rm = next(n for n in res.model.graph.node if n.op_type == "ReduceMean")
    assert len(rm.input) == 1
    assert {a.name: h.get_attribute_value(a) for a in rm.attribute}["axes"] == [-1]
    np.testing.assert_allclose(run(res.model, {"x": x})[0], ref, rtol=1e-5, atol=1e-5)


def test_rmsnorm_decompose_com_microsoft_domain():
    # ORT's CPU EP has no com.microsoft SimplifiedLayerNormalization: check against numpy
    m, scale = rms_graph(
        "SimplifiedLayerNormalization", "com.microsoft", 17, -1, extra=[h.make_opsetid("com.microsoft", 1)]
    )
    _, res = apply("rmsnorm-decompose", m)
    assert res.changed and all(n.domain == "" for n in res.model.graph.node)
    assert [o.domain for o in res.model.opset_import] == [""]
    x = np.random.default_rng(3).standard_normal((2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(run(res.model, {"x": x})[0], rms_ref(x, scale, 1e-3, (-1,)), rtol=1e-5, atol=1e-5)


def test_rmsnorm_decompose_not_applicable_and_errors():
    m = make(
        [h.make_node("Relu", ["x"], ["y"])],
        [h.make_tensor_value_info("x", TP.FLOAT, [2])],
        [h.make_tensor_value_info("y", TP.FLOAT, [2])],
    )
    before, res = apply("rmsnorm-decompose", m)
    assert not res.changed and res.model.SerializeToString() == before
    with pytest.raises(ValueError):
        patches.get("rmsnorm-decompose").fn(m, square="cube")
    # positive axis with an unknown rank cannot be turned into axes
    node = h.make_node("SimplifiedLayerNormalization", ["x", "s"], ["y"], axis=1)
    g = h.make_graph(
        [node],
        "g",
        [h.make_tensor_value_info("x", TP.FLOAT, None)],
        [h.make_tensor_value_info("y", TP.FLOAT, None)],
        [nh.from_array(np.ones(8, np.float32), "s")],
    )
    with pytest.raises(ValueError, match="rank"):
        patches.get("rmsnorm-decompose").fn(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))


# ----------------------------------------------------------------------------- int64-to-int32


def ids_graph():
    """input_ids -> Gather(emb); position_ids + 1 -> Gather(pos); attention_mask == 0 -> Where;
    input_ids -> Unsqueeze -> GatherND (needs int64 indices); input_ids + 7 as an int64 output."""
    emb = np.arange(50 * 4, dtype=np.float32).reshape(50, 4) / 100
    nodes = [
        h.make_node("Gather", ["emb", "input_ids"], ["tok"]),
        h.make_node("Constant", [], ["one"], value=nh.from_array(np.array(1, np.int64))),
        h.make_node("Add", ["position_ids", "one"], ["pos1"]),
        h.make_node("Gather", ["emb", "pos1"], ["pos"]),
        h.make_node("Add", ["tok", "pos"], ["h"]),
        h.make_node("Equal", ["attention_mask", "zero"], ["pad"]),
        h.make_node("Unsqueeze", ["pad", "axm1"], ["pad3"]),
        h.make_node("Where", ["pad3", "fzero", "h"], ["hm"]),
        h.make_node("Unsqueeze", ["input_ids", "axm1"], ["idx"]),
        h.make_node("GatherND", ["emb", "idx"], ["tok2"]),
        h.make_node("Add", ["hm", "tok2"], ["out"]),
        h.make_node("Add", ["input_ids", "seven"], ["ids7"]),
    ]
    inits = [
        nh.from_array(emb, "emb"),
        nh.from_array(np.array(0, np.int64), "zero"),
        nh.from_array(np.array([-1], np.int64), "axm1"),
        nh.from_array(np.array(0.0, np.float32), "fzero"),
        nh.from_array(np.array(7, np.int64), "seven"),
    ]
    ins = [h.make_tensor_value_info(n, TP.INT64, [1, 6]) for n in ("input_ids", "position_ids", "attention_mask")]
    outs = [h.make_tensor_value_info("out", TP.FLOAT, [1, 6, 4]), h.make_tensor_value_info("ids7", TP.INT64, [1, 6])]
    return make(nodes, ins, outs, inits)


IDS_FEEDS = {
    "input_ids": np.array([[3, 9, 41, 0, 0, 0]], np.int64),
    "position_ids": np.arange(6, dtype=np.int64)[None],
    "attention_mask": np.array([[1, 1, 1, 0, 0, 0]], np.int64),
}


def test_int64_to_int32_casts_only_where_needed():
    m = ids_graph()
    ref = run(m, IDS_FEEDS)
    _, res = apply("int64-to-int32", copy.deepcopy(m))
    out = res.model
    assert res.changed
    assert [i.type.tensor_type.elem_type for i in out.graph.input] == [TP.INT32] * 3
    assert out.graph.output[1].type.tensor_type.elem_type == TP.INT64  # output keeps its type
    casts = [n for n in out.graph.node if n.op_type == "Cast"]
    # one for GatherND's indices (int64-only), one for the int64 graph output; none for the Gathers
    assert len(casts) == 2 and all(h.get_attribute_value(c.attribute[0]) == TP.INT64 for c in casts)
    gnd = next(n for n in out.graph.node if n.op_type == "GatherND")
    assert gnd.input[1] in {c.output[0] for c in casts}
    gathers = [n for n in out.graph.node if n.op_type == "Gather"]
    assert gathers[0].input[1] == "input_ids"  # int32 indices fed directly
    # int64 constants on int32 paths got int32 copies
    i32_inits = {t.name for t in out.graph.initializer if t.data_type == TP.INT32}
    assert {"zero_i32", "seven_i32"} <= i32_inits
    assert len(out.graph.node) == len(m.graph.node) + 2
    onnx.checker.check_model(out, full_check=True)
    onnx.shape_inference.infer_shapes(out, check_type=True, strict_mode=True)
    got = run(out, {k: v.astype(np.int32) for k, v in IDS_FEEDS.items()})
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    assert got[1].dtype == np.int64


def test_int64_to_int32_input_filter_and_not_applicable():
    m = ids_graph()
    _, res = apply("int64-to-int32", copy.deepcopy(m), inputs=r"^attention_mask$")
    types = {i.name: i.type.tensor_type.elem_type for i in res.model.graph.input}
    assert types == {"input_ids": TP.INT64, "position_ids": TP.INT64, "attention_mask": TP.INT32}
    feeds = dict(IDS_FEEDS, attention_mask=IDS_FEEDS["attention_mask"].astype(np.int32))
    np.testing.assert_array_equal(run(res.model, feeds)[0], run(m, IDS_FEEDS)[0])
    before, res = apply("int64-to-int32", m, inputs=r"^nothing$")
    assert not res.changed and res.model.SerializeToString() == before
    f = make(
        [h.make_node("Relu", ["x"], ["y"])],
        [h.make_tensor_value_info("x", TP.FLOAT, [2])],
        [h.make_tensor_value_info("y", TP.FLOAT, [2])],
    )
    before, res = apply("int64-to-int32", f)
    assert not res.changed and res.model.SerializeToString() == before


# ----------------------------------------------------------------------------- fold-constants


def foldable_graph():
    """Shape-of-fixed-input plumbing + a constant subgraph + an Identity: all foldable."""
    w = np.random.default_rng(4).standard_normal((4, 3)).astype(np.float32)
    nodes = [
        h.make_node("Shape", ["x"], ["shp"]),
        h.make_node("Gather", ["shp", "i0"], ["b"]),
        h.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        h.make_node("Concat", ["b1", "m1"], ["newshape"], axis=0),
        h.make_node("Reshape", ["x", "newshape"], ["x2"]),
        h.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        h.make_node("Mul", ["wt", "two"], ["wt2"]),
        h.make_node("Identity", ["wt2"], ["wt3"]),
        h.make_node("MatMul", ["x2", "wt3"], ["y0"]),
        h.make_node("Relu", ["y0"], ["y"]),
    ]
    inits = [
        nh.from_array(w, "w"),
        nh.from_array(np.array(0, np.int64), "i0"),
        nh.from_array(np.array([0], np.int64), "ax0"),
        nh.from_array(np.array([-1], np.int64), "m1"),
        nh.from_array(np.array(2.0, np.float32), "two"),
    ]
    return make(
        nodes,
        [h.make_tensor_value_info("x", TP.FLOAT, [2, 1, 3])],
        [h.make_tensor_value_info("y", TP.FLOAT, [2, 4])],
        inits,
    )


def test_fold_constants_folds_and_keeps_outputs():
    m = foldable_graph()
    x = np.random.default_rng(5).standard_normal((2, 1, 3)).astype(np.float32)
    ref = run(m, {"x": x})[0]
    _, res = apply("fold-constants", copy.deepcopy(m))
    assert res.changed
    kinds = ops(res.model)
    assert len(kinds) < len(m.graph.node)
    assert not {"Shape", "Gather", "Concat", "Transpose", "Identity", "Unsqueeze"} & set(kinds)
    assert "MatMul" in kinds or "Gemm" in kinds
    np.testing.assert_allclose(run(res.model, {"x": x})[0], ref, rtol=1e-6, atol=1e-6)


def test_fold_constants_deterministic_and_idempotent():
    a = patches.get("fold-constants").fn(foldable_graph()).model.SerializeToString()
    b = patches.get("fold-constants").fn(foldable_graph()).model.SerializeToString()
    assert a == b
    again = onnx.load_from_string(a)
    before = again.SerializeToString()
    res = patches.get("fold-constants").fn(again)
    assert not res.changed and res.model.SerializeToString() == before


def test_fold_constants_not_applicable_is_byte_identical():
    m = make(
        [h.make_node("Relu", ["x"], ["y"])],
        [h.make_tensor_value_info("x", TP.FLOAT, [2])],
        [h.make_tensor_value_info("y", TP.FLOAT, [2])],
    )
    before, res = apply("fold-constants", m)
    assert not res.changed and res.model.SerializeToString() == before
    with pytest.raises(ValueError):
        patches.get("fold-constants").fn(m, level="all")


def test_fold_constants_external_data_path(monkeypatch):
    # the > 2 GB route (external data in and out), forced on a small model
    monkeypatch.setattr(fold_mod, "_LARGE", 0)
    small = patches.get("fold-constants").fn(foldable_graph(), external_min_bytes=16).model
    monkeypatch.setattr(fold_mod, "_LARGE", 1 << 62)
    inline = patches.get("fold-constants").fn(foldable_graph()).model
    for t in small.graph.initializer:
        assert t.data_location == TP.DEFAULT and not t.external_data
    x = np.random.default_rng(6).standard_normal((2, 1, 3)).astype(np.float32)
    np.testing.assert_array_equal(run(small, {"x": x})[0], run(inline, {"x": x})[0])
    assert ops(small) == ops(inline)

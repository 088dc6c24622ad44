"""Patch ``rmsnorm-decompose``: SimplifiedLayerNormalization / RMSNormalization -> standard ops."""

from __future__ import annotations

from tasks.proc import lazy
from tasks.patches import PatchResult, register

np = lazy.module("numpy")
onnx = lazy.module("onnx")

MATCH = {
    ("", "SimplifiedLayerNormalization"),
    ("ai.onnx", "SimplifiedLayerNormalization"),
    ("com.microsoft", "SimplifiedLayerNormalization"),
    ("", "RMSNormalization"),
    ("ai.onnx", "RMSNormalization"),
}


def _opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    raise ValueError("model has no default-domain opset import")


def _types_and_ranks(model: onnx.ModelProto) -> dict[str, tuple[int, int | None]]:
    """name -> (elem_type, rank or None) from graph inputs/outputs/value_info and, if that is
    not enough, from onnx shape inference (on a copy; the model is not changed)."""
    out: dict[str, tuple[int, int | None]] = {}

    def add(vis):
        for vi in vis:
            tt = vi.type.tensor_type
            if tt.elem_type:
                out[vi.name] = (tt.elem_type, len(tt.shape.dim) if tt.HasField("shape") else None)

    g = model.graph
    add(g.input)
    add(g.output)
    add(g.value_info)
    for t in g.initializer:
        out[t.name] = (t.data_type, len(t.dims))
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
        add(inferred.graph.value_info)
    except Exception:  # contrib ops etc.; fall back to what is declared
        pass
    return out


@register("rmsnorm-decompose", 1)
def rmsnorm_decompose(model: onnx.ModelProto, square: str = "mul") -> PatchResult:
    """Decompose RMS norms into standard ONNX ops QNN HTP supports.

    Matches: ``SimplifiedLayerNormalization`` (onnxruntime's op, registered in the default
    domain; also accepted in ``com.microsoft``) and ONNX ``RMSNormalization`` (opset 23), with
    inputs (X, scale) and attributes axis (default -1), epsilon (default 1e-5), stash_type
    (default 1 = compute in float32). Each becomes
    ``Y = Mul(Div(X, Sqrt(Add(ReduceMean(X*X, axes=[axis..-1], keepdims=1), eps))), scale)``;
    for a fp16/bf16 X with stash_type=1 the computation is wrapped in Cast to float32 and back.
    A used second output (SimplifiedLayerNormalization's inv_std_var) becomes
    ``Reciprocal(Sqrt(...))``. ReduceMean takes ``axes`` as an attribute for opset < 18 and as
    an int64 input for opset >= 18.

    Params:
      square: "mul" (default; X*X, which HTP runs as an elementwise multiply) or "pow"
        (Pow(X, 2.0)).

    Not applicable (changed=False, graph untouched): no such node.
    Errors: ValueError for an unknown ``square``; ValueError when ``axis`` is non-negative and
    the rank of X cannot be found (declared or by shape inference); ValueError when a third
    output is used.

    Source: QNN HTP's known failure kinds (SimplifiedLayerNormalization / RMSNorm not
    supported, or only in recent QNN versions: rewrite into standard ops); operator
    definitions: onnx/docs/Operators.md#RMSNormalization, onnxruntime
    docs/ContribOperators.md (SimplifiedLayerNormalization, ORT's LayerNormalization family).
    """
    if square not in ("mul", "pow"):
        raise ValueError(f"square must be 'mul' or 'pow', got {square!r}")
    g = model.graph
    targets = [n for n in g.node if (n.domain, n.op_type) in MATCH]
    if not targets:
        return PatchResult(model, changed=False, note="no SimplifiedLayerNormalization/RMSNormalization node")
    opset = _opset(model)
    info = _types_and_ranks(model)
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}

    new_nodes: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    done = 0
    for node in g.node:
        if (node.domain, node.op_type) not in MATCH:
            new_nodes.append(node)
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        axis = int(attrs.get("axis", -1))
        eps = float(attrs.get("epsilon", 1e-5))
        stash = int(attrs.get("stash_type", 1))
        x, scale = node.input[0], node.input[1]
        etype, rank = info.get(x, (onnx.TensorProto.FLOAT, None))
        if axis < 0:
            axes = list(range(axis, 0))
        else:
            if rank is None:
                raise ValueError(f"{node.name}: axis={axis} needs the rank of {x!r}, unknown")
            axes = list(range(axis - rank, 0))
        if len(node.output) > 2 and node.output[2] and node.output[2] in used:
            raise ValueError(f"{node.name}: third output {node.output[2]!r} is used")
        p = (node.name or node.output[0]).replace("/", "_") + "_rms"
        compute_type = (
            onnx.TensorProto.FLOAT
            if (stash == 1 and etype in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16))
            else etype
        )
        np_type = onnx.helper.tensor_dtype_to_np_dtype(compute_type)
        nn: list[onnx.NodeProto] = []
        xin = x
        if compute_type != etype:
            nn.append(onnx.helper.make_node("Cast", [x], [p + "_xf"], to=compute_type, name=p + "_castin"))
            xin = p + "_xf"
        if square == "mul":
            nn.append(onnx.helper.make_node("Mul", [xin, xin], [p + "_sq"], name=p + "_sq"))
        else:
            two = onnx.numpy_helper.from_array(np.array(2.0, np_type), p + "_two")
            new_inits.append(two)
            nn.append(onnx.helper.make_node("Pow", [xin, two.name], [p + "_sq"], name=p + "_sq"))
        if opset >= 18:
            ax = onnx.numpy_helper.from_array(np.array(axes, np.int64), p + "_axes")
            new_inits.append(ax)
            nn.append(
                onnx.helper.make_node("ReduceMean", [p + "_sq", ax.name], [p + "_ms"], keepdims=1, name=p + "_mean")
            )
        else:
            nn.append(
                onnx.helper.make_node("ReduceMean", [p + "_sq"], [p + "_ms"], axes=axes, keepdims=1, name=p + "_mean")
            )
        e = onnx.numpy_helper.from_array(np.array(eps, np_type), p + "_eps")
        new_inits.append(e)
        nn.append(onnx.helper.make_node("Add", [p + "_ms", e.name], [p + "_mse"], name=p + "_addeps"))
        nn.append(onnx.helper.make_node("Sqrt", [p + "_mse"], [p + "_rms"], name=p + "_sqrt"))
        nn.append(onnx.helper.make_node("Div", [xin, p + "_rms"], [p + "_xn"], name=p + "_div"))
        y = node.output[0]
        if compute_type != etype:
            nn.append(onnx.helper.make_node("Cast", [p + "_xn"], [p + "_xnc"], to=etype, name=p + "_castout"))
            nn.append(onnx.helper.make_node("Mul", [p + "_xnc", scale], [y], name=p + "_scale"))
        else:
            nn.append(onnx.helper.make_node("Mul", [p + "_xn", scale], [y], name=p + "_scale"))
        if len(node.output) > 1 and node.output[1] and node.output[1] in used:
            nn.append(onnx.helper.make_node("Reciprocal", [p + "_rms"], [node.output[1]], name=p + "_inv"))
        new_nodes.extend(nn)
        done += 1

    del g.node[:]
    g.node.extend(new_nodes)
    g.initializer.extend(new_inits)
    # drop now-unused com.microsoft import only if nothing else uses that domain
    doms = {n.domain for n in g.node}
    if "com.microsoft" not in doms:
        keep = [o for o in model.opset_import if o.domain != "com.microsoft"]
        if len(keep) != len(model.opset_import):
            del model.opset_import[:]
            model.opset_import.extend(keep)
    return PatchResult(
        model,
        changed=True,
        note=f"decomposed {done} RMS norm node(s) (opset {opset}, square={square})",
        counts={"decomposed": done},
    )

"""Patch ``int64-to-int32``: int64 graph inputs become int32, with casts only where needed."""

from __future__ import annotations

import re

from tasks.proc import lazy
from tasks.patches import PatchResult, register

np = lazy.module("numpy")
onnx = lazy.module("onnx")

I32_MIN, I32_MAX = -(2**31), 2**31 - 1  # np.iinfo(np.int32)

# (op, input slot) pairs whose type is independent of the other inputs and accepts int32
# as well as int64; the output type does not depend on it.
SLOT_OK = {
    ("Gather", 1),
    ("GatherElements", 1),
    ("Cast", 0),
    ("Shape", 0),
    ("Size", 0),
    ("OneHot", 0),
    ("OneHot", 1),
    ("CumSum", 1),
    ("Trilu", 1),
    ("CastLike", 0),
}
# ops whose "T" inputs (slots below, None = all) and outputs share one type: if every T input
# is int32 or an int64 constant that fits int32, the node runs in int32 and its T outputs
# become int32 (and are followed further).
SAME_T: dict[str, tuple[tuple[int, ...] | None, tuple[int, ...]]] = {
    # op: (T input slots or None for all, T output slots)
    "Identity": ((0,), (0,)),
    "Unsqueeze": ((0,), (0,)),
    "Squeeze": ((0,), (0,)),
    "Reshape": ((0,), (0,)),
    "Expand": ((0,), (0,)),
    "Flatten": ((0,), (0,)),
    "Transpose": ((0,), (0,)),
    "Slice": ((0,), (0,)),
    "Tile": ((0,), (0,)),
    "Gather": ((0,), (0,)),
    "GatherElements": ((0,), (0,)),
    "CumSum": ((0,), (0,)),
    "Trilu": ((0,), (0,)),
    "Neg": ((0,), (0,)),
    "Abs": ((0,), (0,)),
    "Add": (None, (0,)),
    "Sub": (None, (0,)),
    "Mul": (None, (0,)),
    "Max": (None, (0,)),
    "Min": (None, (0,)),
    "Concat": (None, (0,)),
    "Where": ((1, 2), (0,)),
    "Equal": (None, ()),
    "Less": (None, ()),
    "Greater": (None, ()),
    "LessOrEqual": (None, ()),
    "GreaterOrEqual": (None, ()),
}


@register("int64-to-int32", 1)
def int64_to_int32(model: onnx.ModelProto, inputs: str = r".*") -> PatchResult:
    """Turn int64 graph inputs into int32 and feed int32 on as far as the ops allow.

    Matches: graph inputs of type int64 whose name matches the regex ``inputs`` (default: all;
    e.g. ``input_ids|attention_mask|token_type_ids|position_ids``) and are not initializers.
    From each, int32 is propagated through ops that take int32 as well (``SLOT_OK``: Gather /
    GatherElements indices, Cast, Shape, Size, OneHot, CumSum axis...) and through same-type
    ops (``SAME_T``: Unsqueeze, Reshape/Expand/Slice data, Add/Sub/Mul/Min/Max, Equal/Less/...,
    Where, Concat, ...) when every other operand of that type is either int32 already or an int64
    constant (initializer or Constant node) whose values fit int32 -- such a constant gets an
    int32 copy. Every other consumer (e.g. Reshape's shape input, ConstantOfShape, ScatterND /
    GatherND indices, contrib ops) and every int64 graph output reached gets one shared
    ``Cast(to=INT64)``. value_info entries of values that became int32 are updated.

    Params:
      inputs: regex (re.search) on graph input names; default ".*".

    Not applicable (changed=False, graph untouched): no matching int64 graph input.
    Errors: onnx.checker.ValidationError / onnx.shape_inference.InferenceError if the result
    does not pass ``onnx.checker.check_model`` and strict shape inference (not expected; it
    means an op in ``SAME_T``/``SLOT_OK`` was misclassified). The caller must feed int32.
    Values are not range-checked at run time: ids/masks/positions are assumed < 2**31.

    Source: QNN HTP's known failure kinds (int64 tensors: cast or export as int32); a Qwen2
    fixture compiled with int32 input_ids/position_ids. Type
    constraints from onnx/docs/Operators.md (Gather Tind, Cast T1, ...).
    """
    g = model.graph
    init_names = {t.name for t in g.initializer}
    pat = re.compile(inputs)
    targets = [
        i
        for i in g.input
        if i.type.tensor_type.elem_type == onnx.TensorProto.INT64 and i.name not in init_names and pat.search(i.name)
    ]
    if not targets:
        return PatchResult(model, changed=False, note="no int64 graph input matched")

    inits = {t.name: t for t in g.initializer}
    const_nodes = {n.output[0]: n for n in g.node if n.op_type == "Constant" and n.output}

    def const_fits(name: str) -> bool:
        arr = None
        if name in inits:
            if inits[name].data_type != onnx.TensorProto.INT64:
                return False
            arr = onnx.numpy_helper.to_array(inits[name])
        elif name in const_nodes:
            for a in const_nodes[name].attribute:
                if a.name == "value" and a.t.data_type == onnx.TensorProto.INT64:
                    arr = onnx.numpy_helper.to_array(a.t)
        if arr is None:
            return False
        return bool(arr.size == 0 or (arr.min() >= I32_MIN and arr.max() <= I32_MAX))

    # fixpoint: which values are int32 and which nodes run in int32
    i32: set[str] = {t.name for t in targets}
    converted: set[int] = set()  # indices of nodes running in int32
    changed = True
    while changed:
        changed = False
        for k, node in enumerate(g.node):
            if k in converted or node.domain not in ("", "ai.onnx") or node.op_type not in SAME_T:
                continue
            slots, outs = SAME_T[node.op_type]
            tin = [
                i
                for i in (slots if slots is not None else range(len(node.input)))
                if i < len(node.input) and node.input[i]
            ]
            if not tin or not any(node.input[i] in i32 for i in tin):
                continue
            if all(node.input[i] in i32 or const_fits(node.input[i]) for i in tin):
                converted.add(k)
                for o in outs:
                    if o < len(node.output) and node.output[o]:
                        i32.add(node.output[o])
                changed = True

    # rewrite
    new_inits: list[onnx.TensorProto] = []
    const_copies: dict[str, str] = {}
    casts: dict[str, str] = {}  # int32 value -> its int64 cast
    cast_nodes: list[tuple[int, onnx.NodeProto]] = []  # insert before node index
    taken = set(init_names) | {o for n in g.node for o in n.output} | {i.name for i in g.input}

    def fresh(base: str) -> str:
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}{k}"
        taken.add(name)
        return name

    def cast_of(v: str, before: int) -> str:
        if v not in casts:
            out = fresh(f"{v}_i64")
            casts[v] = out
            cast_nodes.append(
                (
                    before,
                    onnx.helper.make_node("Cast", [v], [out], to=onnx.TensorProto.INT64, name=fresh(f"{v}_cast_i64")),
                )
            )
        return casts[v]

    first_use: dict[str, int] = {}
    for k, node in enumerate(g.node):
        for v in node.input:
            first_use.setdefault(v, k)

    n_direct = 0
    for k, node in enumerate(g.node):
        tslots: set[int] = set()
        if k in converted:
            slots, _ = SAME_T[node.op_type]
            tslots = set(slots if slots is not None else range(len(node.input)))
            for i in sorted(tslots):
                if i >= len(node.input) or not node.input[i] or node.input[i] in i32:
                    continue
                src = node.input[i]
                if src not in const_copies:
                    if src in inits:
                        arr = onnx.numpy_helper.to_array(inits[src])
                    else:
                        arr = next(
                            onnx.numpy_helper.to_array(a.t) for a in const_nodes[src].attribute if a.name == "value"
                        )
                    const_copies[src] = fresh(f"{src}_i32")
                    new_inits.append(onnx.numpy_helper.from_array(arr.astype(np.int32), const_copies[src]))
                node.input[i] = const_copies[src]
            n_direct += 1
        for i, v in enumerate(node.input):
            if v not in i32 or i in tslots:
                continue
            if node.domain in ("", "ai.onnx") and (node.op_type, i) in SLOT_OK:
                n_direct += 1
                continue
            node.input[i] = cast_of(v, first_use.get(v, k))

    # graph outputs that became int32 keep their int64 type through a Cast
    for out in g.output:
        if out.name in i32 and out.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            internal = fresh(f"{out.name}_i32")
            for node in g.node:
                for j, o in enumerate(node.output):
                    if o == out.name:
                        node.output[j] = internal
                for j, v in enumerate(node.input):
                    if v == out.name:
                        node.input[j] = internal
            i32.discard(out.name)
            i32.add(internal)
            for c in cast_nodes:
                if c[1].input[0] == out.name:
                    c[1].input[0] = internal
            cast_nodes.append(
                (
                    len(g.node),
                    onnx.helper.make_node(
                        "Cast", [internal], [out.name], to=onnx.TensorProto.INT64, name=fresh(f"{out.name}_cast_i64")
                    ),
                )
            )

    for t in targets:
        t.type.tensor_type.elem_type = onnx.TensorProto.INT32
    for vi in g.value_info:
        if vi.name in i32 and vi.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            vi.type.tensor_type.elem_type = onnx.TensorProto.INT32
    g.initializer.extend(new_inits)
    # insert casts right after their producer position (before first use), keeping topo order
    nodes = list(g.node)
    for before, cnode in sorted(cast_nodes, key=lambda c: -c[0]):
        nodes.insert(before, cnode)
    # a cast inserted before the first user but after its int32 producer: ensure topo order
    nodes = _toposort(nodes, {i.name for i in g.input} | set(init_names) | {t.name for t in new_inits})
    del g.node[:]
    g.node.extend(nodes)
    # drop int64 constants that lost all users
    still = {v for n in g.node for v in n.input} | {o.name for o in g.output}
    for src in const_copies:
        if src not in still and src in inits:
            g.initializer.remove(inits[src])
    onnx.checker.check_model(model)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    return PatchResult(
        model,
        changed=True,
        note=f"int32 inputs: {', '.join(t.name for t in targets)}; "
        f"{n_direct} int32 use(s), {len(cast_nodes)} Cast-to-int64 inserted, "
        f"{len(const_copies)} constant(s) copied to int32",
        counts={
            "inputs": len(targets),
            "casts": len(cast_nodes),
            "int32_nodes": len(converted),
            "const_copies": len(const_copies),
        },
    )


def _toposort(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Stable topological order: keeps the given order wherever it is already valid."""
    avail = set(available) | {""}
    out: list[onnx.NodeProto] = []
    pending = list(nodes)
    while pending:
        rest = []
        for n in pending:
            if all(i in avail for i in n.input):
                out.append(n)
                avail.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):  # names from an outer scope etc.: keep the order
            out.extend(rest)
            break
        pending = rest
    return out

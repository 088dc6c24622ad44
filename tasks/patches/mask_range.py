"""Patch ``mask-range``: replace extreme float fill constants on the attention-mask path."""

from __future__ import annotations

import re

from tasks.proc import lazy
from tasks.patches import PatchResult, register

np = lazy.module("numpy")
onnx = lazy.module("onnx")

# Ops through which "mask arithmetic" flows: shape plumbing, casts, comparisons, and the
# elementwise ops that turn a 0/1 mask into an additive bias and add it to the scores.
# The walk stops at anything else (Softmax, MatMul, Gather, Pow, LayerNormalization, ...),
# so constants in the model proper are never touched.
MASK_OPS = frozenset(
    {
        "Identity",
        "Cast",
        "CastLike",
        "Unsqueeze",
        "Squeeze",
        "Reshape",
        "Expand",
        "Flatten",
        "Transpose",
        "Slice",
        "Concat",
        "Tile",
        "Trilu",
        "Where",
        "Not",
        "And",
        "Or",
        "Xor",
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "Sub",
        "Add",
        "Mul",
        "Neg",
        "Min",
        "Max",
        "Clip",
        "ConstantOfShape",
    }
)
# onnx.TensorProto.FLOAT, FLOAT16, BFLOAT16, DOUBLE (the onnx.proto enum numbers; spelled out so
# that importing this module does not import onnx)
FLOAT_TYPES = {1, 10, 16, 11}


def _replace(arr: np.ndarray, threshold: float, fill: float) -> tuple[np.ndarray, int]:
    bad = np.abs(arr.astype(np.float64)) >= threshold  # also catches +-inf; NaN is left alone
    n = int(bad.sum())
    if not n:
        return arr, 0
    out = arr.copy()
    out[bad] = np.where(arr[bad] < 0, -abs(fill), abs(fill)).astype(arr.dtype)
    return out, n


@register("mask-range", 1)
def mask_range(
    model: onnx.ModelProto,
    fill: float = -100.0,
    threshold: float = 1e4,
    mask_inputs: str = r"mask",
    scope: str = "mask",
) -> PatchResult:
    """Replace extreme float constants (|x| >= ``threshold``, incl. +-inf) on the attention-mask
    path with a finite fill value.

    Matches: float initializers, ``Constant`` node values and ``ConstantOfShape`` ``value``
    attributes whose consumer is a "mask arithmetic" node (Where/Add/Sub/Mul/Min/Max/Expand/
    Cast/Reshape/... see ``MASK_OPS``) in the forward cone of a graph input whose name matches
    the regex ``mask_inputs`` (the walk follows only ``MASK_OPS`` and stops at Softmax, MatMul,
    Gather, etc.). ``ConstantOfShape`` fills are matched when the node's output feeds such a
    node. BERT-like exports (transformers' ``_expand_mask``) build the additive mask as
    ``Where(1 - mask, finfo(float32).min = -3.4028235e38, 0)``; fp16 exports use -65504.
    Each matching element becomes ``-|fill|`` (negative x) or ``+|fill|`` (positive x); other
    elements keep their value. A constant also used off the mask path is copied, not edited.

    Params:
      fill: float, default -100.0 (logit units; a masked score of scores-100 gives
        exp(-100) ~ 4e-44 weight after Softmax, i.e. zero, while a u16 activation range of
        ~[-100, 10] keeps a step of ~0.002).
      threshold: float, default 1e4 (absolute value; catches -3.4e38, -1e9, -65504, -1e4, inf).
        Measured on all-MiniLM-L6-v2 w8a16 (u16 activations, per-channel u8 weights, 32
        calibration sentences, mean-pooled cosine vs fp32 over 28 sentences, CPU EP): fill
        -20 / -100 / -1000 / -9000 -> avg 0.9991, worst 0.9971-0.9974; -65504 -> 0.9957 /
        0.9901; -1e9 -> 0.428 / 0.190; unpatched -3.4e38 (per-tensor weights) -> 0.426 / 0.173.
      mask_inputs: regex on graph input names, default "mask" (matches "attention_mask").
      scope: "mask" (default, only the mask path) or "all" (every float constant consumed by a
        ``MASK_OPS`` node anywhere; for graphs that build a causal mask internally with no
        mask input).

    Not applicable (changed=False, graph untouched): no extreme constant on the path.
    Errors: ValueError for scope not in {"mask", "all"}, a non-finite fill, or
    |fill| >= threshold.

    Source: all-MiniLM-L6-v2 at w8a16 through the naive pipeline gave cosine 0.30-0.57 until
    the mask fill was fixed (masks filled with the float minimum ruin 16-bit activation ranges;
    tests/contract/test_contract.py); a Qwen2 fixture compiled and matched with a 0/-1e4 mask.
    """
    if scope not in ("mask", "all"):
        raise ValueError(f"scope must be 'mask' or 'all', got {scope!r}")
    if not np.isfinite(fill) or abs(fill) >= threshold:
        raise ValueError(f"fill {fill} must be finite and smaller than threshold {threshold}")
    g = model.graph
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in g.node:
        for i, name in enumerate(node.input):
            if name:
                consumers.setdefault(name, []).append((node, i))

    # forward cone of the mask inputs through mask ops
    on_path: set[int] = set()  # id(node)
    if scope == "all":
        on_path = {id(n) for n in g.node if n.op_type in MASK_OPS}
    else:
        pat = re.compile(mask_inputs)
        frontier = [i.name for i in g.input if pat.search(i.name)]
        seen = set(frontier)
        while frontier:
            v = frontier.pop()
            for node, _ in consumers.get(v, []):
                if node.op_type not in MASK_OPS or id(node) in on_path:
                    continue
                on_path.add(id(node))
                for o in node.output:
                    if o and o not in seen:
                        seen.add(o)
                        frontier.append(o)
        # ConstantOfShape / Constant producers feeding the path count as on it too
        for node in g.node:
            if node.op_type == "ConstantOfShape" and any(
                id(c) in on_path for o in node.output for c, _ in consumers.get(o, [])
            ):
                on_path.add(id(node))

    inits = {t.name: t for t in g.initializer}
    const_nodes = {n.output[0]: n for n in g.node if n.op_type == "Constant" and n.output}

    def const_array(name):
        if name in inits and inits[name].data_type in FLOAT_TYPES:
            return onnx.numpy_helper.to_array(inits[name])
        n = const_nodes.get(name)
        if n is not None:
            for a in n.attribute:
                if a.name == "value" and a.t.data_type in FLOAT_TYPES:
                    return onnx.numpy_helper.to_array(a.t)
        return None

    # plan: constant name -> (new array, n_replaced)
    plan: dict[str, tuple[np.ndarray, int]] = {}
    cos_plan: list[tuple[onnx.NodeProto, np.ndarray, int]] = []
    for node in g.node:
        if id(node) not in on_path:
            continue
        if node.op_type == "ConstantOfShape":
            for a in node.attribute:
                if a.name == "value" and a.t.data_type in FLOAT_TYPES:
                    new, n = _replace(onnx.numpy_helper.to_array(a.t), threshold, fill)
                    if n:
                        cos_plan.append((node, new, n))
            continue
        for name in node.input:
            if not name or name in plan:
                continue
            arr = const_array(name)
            if arr is None:
                continue
            new, n = _replace(arr, threshold, fill)
            if n:
                plan[name] = (new, n)

    if not plan and not cos_plan:
        return PatchResult(model, changed=False, note=f"no float constant with |x| >= {threshold:g} on the mask path")

    replaced = 0
    used_names = {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    for name, (new, n) in plan.items():
        replaced += n
        users = consumers.get(name, [])
        shared = any(id(c) not in on_path for c, _ in users) or any(o.name == name for o in g.output)
        target = name
        if shared:  # keep the original for off-path users; path users get a copy
            k = 0
            target = f"{name}_maskrange"
            while target in used_names:
                k += 1
                target = f"{name}_maskrange{k}"
            used_names.add(target)
            for c, i in users:
                if id(c) in on_path:
                    c.input[i] = target
        if name in inits:
            t = onnx.numpy_helper.from_array(new, target)
            if shared:
                g.initializer.append(t)
            else:
                inits[name].CopyFrom(t)
        else:
            node = const_nodes[name]
            t = onnx.numpy_helper.from_array(new)
            if shared:
                new_node = onnx.helper.make_node(
                    "Constant", [], [target], value=t, name=f"{node.name or name}_maskrange"
                )
                idx = list(g.node).index(node)
                g.node.insert(idx + 1, new_node)
            else:
                for a in node.attribute:
                    if a.name == "value":
                        a.t.CopyFrom(t)
    for node, new, n in cos_plan:
        replaced += n
        for a in node.attribute:
            if a.name == "value":
                a.t.CopyFrom(onnx.numpy_helper.from_array(new, a.t.name))
    names = sorted(plan) + sorted(n.name or n.output[0] for n, _, _ in cos_plan)
    return PatchResult(
        model,
        changed=True,
        note=f"replaced {replaced} extreme value(s) in {len(names)} constant(s) with {fill:g}: {', '.join(names)}",
        counts={"constants": len(names), "elements": replaced},
    )

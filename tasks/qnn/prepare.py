"""A finished ONNX graph made into one the quantizer and QNN HTP take: the rewrites, each a
kind applied when the graph calls for it (not one per model), in this order:

1. ``metadata``: ``metadata_props`` kept aside (returned, and written beside the graph by the
   export stage) and removed from the graph: onnxruntime 1.32's ``qnn_preprocess_model``
   raises TypeError on any model that has them, and a decoder may need them (PP-OCR rec's
   character list is its ``character`` entry).
2. ``constant-inputs``: graph inputs the recipe fixes to a value become initializers, and
   onnxruntime's basic graph optimizations fold what they decide: an ``If`` on such an input
   is inlined (Silero VAD's ``If`` on its sample rate ``sr``). Before the dims are fixed:
   fixing them first fails inside the branch ("LSTM first input must have rank 3").
3. ``static-dims``: every dynamic input dim set from the recipe (QNN HTP has no dynamic
   shapes), then the output shapes inferred and fixed (``onnxruntime.tools.onnx_model_utils.
   fix_output_shapes``). onnxruntime's ``make_input_shape_fixed`` refuses an input mixing a
   fixed and a symbolic dim the recipe also names (``[-1, 3, '?', '?']``: "Can't replace
   existing fixed size"), so the dims are set directly; a fixed dim the recipe contradicts is
   an error.
4. ``fold-if``: ``If`` nodes left (an inlined branch testing its input's rank or length) are
   folded by the same optimizations once the dims are static (QNN HTP has no ``If``).
5. ``opset``: a graph below opset 21 is converted to 21 (``onnx.version_converter``): at 8-bit
   activations on opset 12, onnxruntime's quantizer writes per-channel ``DequantizeLinear``
   nodes with an ``axis`` that opset does not have ("Unrecognized attribute: axis"); its
   16-bit path upgrades by itself, so both precisions start from one graph.

Measured on PP-OCRv4 det/rec, PP-OCR cls (rapidocr-onnxruntime 1.4.4) and Silero VAD 6.2.3
(the vision and audio recipes' builds, tests/vision/ and tests/audio/). Shapes, dtypes: as the
graph declares them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tasks.errors import UserError
from tasks.proc import lazy

onnx = lazy.module("onnx")

#: the opset the quantizer's QDQ graphs are written in (its 16-bit path upgrades to it itself)
OPSET = 21


class PrepareError(UserError):
    """The graph cannot be made static as the recipe says (a dim left dynamic, a fixed dim the
    recipe contradicts, an unknown input named)."""


def _dims(vi) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in vi.type.tensor_type.shape.dim]


def graph_io(model) -> dict:
    """{"inputs": [{name, dtype, shape}], "outputs": [...]} of ``model`` (initializers that are
    also inputs left out)."""
    init = {i.name for i in model.graph.initializer}

    def desc(vi):
        return {
            "name": vi.name,
            "dtype": onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type).lower(),
            "shape": _dims(vi),
        }

    return {
        "inputs": [desc(i) for i in model.graph.input if i.name not in init],
        "outputs": [desc(o) for o in model.graph.output],
    }


def metadata_aside(model) -> dict[str, str]:
    """Remove ``model``'s ``metadata_props`` (in place); returns them {key: value}."""
    out = {p.key: p.value for p in model.metadata_props}
    del model.metadata_props[:]
    return out


def fold_constant_inputs(model, constants: dict, work: Path):
    """``model`` with each input named in ``constants`` ({name: number}) made an initializer of
    the input's dtype and shape, and onnxruntime's basic optimizations run over it (constant
    folding; an ``If`` whose condition is now constant is inlined). Returns the new model.
    Raises PrepareError naming an input the graph does not have."""
    import numpy as np
    from onnx import numpy_helper

    by_name = {i.name: i for i in model.graph.input}
    unknown = sorted(set(constants) - set(by_name))
    if unknown:
        raise PrepareError(
            f"export.constant_inputs: expected inputs of the graph ({', '.join(sorted(by_name))}), found {unknown}"
        )
    for name, value in constants.items():
        vi = by_name[name]
        dt = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        shape = [d if isinstance(d, int) else 1 for d in _dims(vi)]
        model.graph.initializer.append(numpy_helper.from_array(np.full(shape, value, dtype=dt), name))
        model.graph.input.remove(vi)
    return ort_fold(model, work)


def ort_fold(model, work: Path):
    """``model`` after onnxruntime's basic graph optimizations (constant folding, an ``If``
    whose condition is constant inlined, redundant nodes removed: standard ONNX ops only), run
    on the CPU EP and saved by it (``optimized_model_filepath``)."""
    import onnxruntime as ort

    src, dst = work / "fold_in.onnx", work / "fold_out.onnx"
    onnx.save(model, str(src))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(dst)
    so.log_severity_level = 3
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return onnx.load(str(dst))


def _ifs(model) -> int:
    return sum(n.op_type == "If" for n in model.graph.node)


def set_static_dims(model, shapes: dict[str, list[int]]) -> list[str]:
    """Set the dims of ``model``'s inputs (in place) from ``shapes`` ({input: dims}), then infer
    and fix the output shapes. Returns the inputs changed. Raises PrepareError for an unknown
    input, another rank, a fixed dim the recipe contradicts, or a dim of an input or output
    still dynamic after (naming ``export.input_shapes``)."""
    from onnxruntime.tools.onnx_model_utils import fix_output_shapes

    init = {i.name for i in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in init}
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise PrepareError(f"export.input_shapes: expected inputs of the graph ({', '.join(inputs)}), found {unknown}")
    changed = []
    for name, want in shapes.items():
        dims = inputs[name].type.tensor_type.shape.dim
        have = _dims(inputs[name])
        if len(have) != len(want):
            raise PrepareError(
                f"export.input_shapes.{name}: expected {len(have)} dims (the graph's {have}), "
                f"found {len(want)} ({want})"
            )
        for i, (h, w) in enumerate(zip(have, want)):
            if isinstance(h, int) and h > 0 and h != w:
                raise PrepareError(f"export.input_shapes.{name}: dim {i} is fixed at {h} in the graph, found {w}")
        if have != want:
            changed.append(name)
        for d, w in zip(dims, want):
            d.Clear()
            d.dim_value = w
    dynamic = [f"{n} {_dims(i)}" for n, i in inputs.items() if any(not isinstance(d, int) or d <= 0 for d in _dims(i))]
    if dynamic:
        raise PrepareError(
            f"export.input_shapes: expected every input dim static (QNN HTP has no dynamic shapes), "
            f"found dynamic dims in {'; '.join(dynamic)}: set them in the recipe"
        )
    if changed or _dynamic_outputs(model):
        fix_output_shapes(model)
    if _dynamic_outputs(model):  # ONNX shape inference stops at a computed Reshape (PP-OCR rec): ask one run
        _outputs_from_a_run(model)
    if left := _dynamic_outputs(model):
        raise PrepareError(f"expected static output shapes once the inputs are, found {'; '.join(left)}")
    return changed


def _dynamic_outputs(model) -> list[str]:
    return [
        f"{o.name} {_dims(o)}" for o in model.graph.output if not all(isinstance(d, int) and d > 0 for d in _dims(o))
    ]


def _outputs_from_a_run(model) -> None:
    """Set ``model``'s output dims (in place) to what one CPU run on zero inputs gives: with
    every input dim static, a graph's output shapes are fixed too, even where ONNX's shape
    inference cannot follow a computed shape."""
    import numpy as np
    import onnxruntime as ort

    init = {i.name for i in model.graph.initializer}
    feeds = {
        i.name: np.zeros(_dims(i), onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
        for i in model.graph.input
        if i.name not in init
    }
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for o, got in zip(model.graph.output, sess.run([o.name for o in model.graph.output], feeds)):
        dims = o.type.tensor_type.shape.dim
        del dims[:]
        for v in got.shape:
            dims.add().dim_value = int(v)


def raise_opset(model):
    """``model`` converted to opset :data:`OPSET` when its default-domain opset is below it
    (returns the same model otherwise)."""
    from onnx import version_converter

    have = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=OPSET)
    return model if have >= OPSET else version_converter.convert_version(model, OPSET)


def prepare(src: Path, dst: Path, shapes: dict[str, list[int]], constants: dict) -> dict:
    """Apply the rewrites of this module to graph ``src`` and save it as ``dst``. Returns
    {"steps": [{"kind", "note"}] (the kinds that changed something, in order), "metadata":
    {key: value} kept aside, "opset": {"from", "to"}, "io": :func:`graph_io` of the result}.
    Raises PrepareError (the recipe and the graph disagree) or what onnx raises for a graph
    it cannot read."""
    model = onnx.load(str(src))
    steps = []
    meta = metadata_aside(model)
    if meta:
        steps.append({"kind": "metadata", "note": f"kept aside: {', '.join(sorted(meta))}"})
    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        if constants:
            ifs = _ifs(model)
            model = fold_constant_inputs(model, constants, Path(tmp))
            steps.append(
                {
                    "kind": "constant-inputs",
                    "note": f"{', '.join(f'{k}={v}' for k, v in sorted(constants.items()))}"
                    f"; If nodes {ifs} -> {_ifs(model)}",
                }
            )
        if changed := set_static_dims(model, shapes):
            steps.append({"kind": "static-dims", "note": "; ".join(f"{n}: {shapes[n]}" for n in changed)})
        if ifs := _ifs(model):  # an If on a shape (Silero's inlined branch tests its input's rank): static now
            model = ort_fold(model, Path(tmp))
            steps.append({"kind": "fold-if", "note": f"If nodes on static shapes folded: {ifs} -> {_ifs(model)}"})
    before = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=OPSET)
    model = raise_opset(model)
    if before < OPSET:
        steps.append({"kind": "opset", "note": f"{before} -> {OPSET}"})
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    return {
        "steps": steps,
        "metadata": meta,
        "opset": {"from": before, "to": max(before, OPSET)},
        "io": graph_io(model),
    }

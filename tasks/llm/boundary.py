"""Quantized tensors at a QDQ graph's boundary: the KV cache in 8 bits and the other float
inputs and outputs at their 16-bit encoding, as the field's on-device LLM graphs take them.

onnxruntime's quantizer leaves a QDQ graph's inputs and outputs float32: an input ``X`` is
followed by ``QuantizeLinear(X, X_scale, X_zero_point)`` and its ``DequantizeLinear``, an output
``Y`` is the ``DequantizeLinear`` of ``QuantizeLinear(Y_QuantizeLinear_Input, Y_scale,
Y_zero_point)``. Compiled with onnxruntime-qnn (``offload_graph_io_quantization=0``) those
float tensors are the context binary's I/O: 4 bytes per element moved in and out of every
call. :func:`narrow_io` drops that input ``QuantizeLinear`` / output ``DequantizeLinear``, so
the graph takes and gives the quantized integers themselves; compiled, the binary's tensor is
``UFIXED_POINT_8`` / ``_16`` with the scale and offset in the binary (read back as ``UINT8`` /
``UINT16``: :mod:`tasks.qnn.context_binary`). Checked here: a uint8 input into ``DequantizeLinear``
and a ``QuantizeLinear`` to a uint8 output compile with every node on HTP (onnxruntime-qnn
2.7.0) and the simulator returns the CPU EP's bytes.

The KV cache (Qualcomm AI Hub Models, ``qai_hub_models/models/_shared/llm/model.py``:
``_set_tensors_to_output_8b_sym``, ``_tie_quantizers_for_kv_cache``): 8 bits, symmetric
(uint8 with zero point 128, the value Genie clears an 8-bit cache to: ``KVCache/smart-mask.cpp``),
one scale per layer and K/V shared by every boundary tensor of that layer's K (or V) cache and
by the part's prefill (prompt) and decode (token) graphs, from ``max |x|`` over every
calibration call of both graphs, inputs and outputs (:func:`encodings`): the bytes a graph
writes are the bytes the next call reads, so they must mean the same values. Which tensors
those are (:func:`kv_cache`), by layout: Genie's ``past_{key,value}_{l}_in`` and ``_out``
(:mod:`tasks.llm.genie.graphs`: the runtime copies the new entries' bytes into the cache), genai's
``past_{key,value}_{l}`` and ``present_{key,value}_{l}`` (:mod:`tasks.llm.pipeline_graphs`:
onnxruntime-genai binds both to one buffer). Every other float tensor crosses at 16 bits, one
encoding per name across the graphs.
"""

from __future__ import annotations

import re
from pathlib import Path

from tasks.proc import lazy

np = lazy.module("numpy")

#: a layer's KV boundary tensors, by layout: Genie's (tasks/llm/genie/graphs.py's graph contract) and
#: genai's (tasks/llm/pipeline_graphs.py's); groups: "key" or "value", then the layer
KV_TENSORS = (re.compile(r"past_(key|value)_(\d+)_(?:in|out)"), re.compile(r"(?:past|present)_(key|value)_(\d+)"))


def kv_cache(name: str) -> str | None:
    """The KV cache buffer a boundary tensor ``name`` reads or writes, as ``"key_{l}"`` /
    ``"value_{l}"`` (one layer's K or V: :data:`KV_TENSORS`), or None for a tensor that is not
    the KV cache. ``past_key_3_in``, ``past_key_3_out`` (Genie), ``past_key_3`` and
    ``present_key_3`` (genai) are all ``"key_3"``."""
    for pattern in KV_TENSORS:
        m = pattern.fullmatch(name)
        if m:
            return f"{m.group(1)}_{m.group(2)}"
    return None


def encodings(ranges: list[dict[str, list[float]]], names, kv_bits: int = 8) -> dict[str, dict]:
    """{tensor: {"dtype", "scale", "zero_point"}} for each float boundary tensor in ``names``, from
    ``ranges`` (MinMax files of a part's graphs, {tensor: [lowest, highest]}:
    :func:`tasks.llm.calibration_feeds.save_ranges`): one encoding per tensor name over every
    file (Genie refuses a tensor whose name recurs across graphs with other parameters: "Non-
    identical quantization parameters found for the same tensor", seen on the simulator for
    ``position_ids_cos``), computed by onnxruntime's ``compute_scale_zp`` as its quantizer does.

    - KV tensors (:func:`kv_cache`: Genie's ``past_{key,value}_{l}_{in,out}``, genai's
      ``past_{key,value}_{l}`` / ``present_{key,value}_{l}``): one range per layer and K/V, over
      every tensor of that cache in every file (module docstring); ``kv_bits`` 8: uint8
      symmetric (zero point 128); 16: uint16 over that range (0 included); 32: left out
      (float32 at the boundary).
    - every other tensor: uint16 over its range (0 included), the activations' encoding.

    Raises ValueError naming a tensor no file has a range for, or a ``kv_bits`` not 8, 16 or 32."""
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType

    if kv_bits not in (8, 16, 32):
        raise ValueError(f"expected kv_bits 8, 16 or 32, found {kv_bits!r}")
    span: dict[str, list[float]] = {}
    for r in ranges:
        for name, (lo, hi) in r.items():
            key = kv_cache(name) or name
            old = span.get(key, [0.0, 0.0])
            span[key] = [min(old[0], float(lo)), max(old[1], float(hi))]
    out = {}
    for name in names:
        cache = kv_cache(name)
        if cache and kv_bits == 32:
            continue
        sym = bool(cache) and kv_bits == 8
        key = cache or name
        if key not in span:
            raise ValueError(f"{name}: expected a calibration range, found none")
        lo, hi = span[key]
        if sym:
            lo, hi = -max(abs(lo), abs(hi)), max(abs(lo), abs(hi))
        qtype = TensorProto.UINT8 if sym else TensorProto.UINT16
        qmin, qmax = get_qmin_qmax_for_qType(qtype)
        zp, scale = compute_scale_zp(np.float32(lo), np.float32(hi), qmin, qmax, symmetric=sym)
        out[name] = {"dtype": np.dtype(zp.dtype).name, "scale": float(scale), "zero_point": int(zp)}
    return out


def declare(desc: dict, k: int, encoded: dict[str, dict[str, dict]]) -> dict:
    """``desc`` (an export description: genai's ``export.json`` or Genie's ``genie_export.json``;
    changed in place) with part ``k``'s quantized boundary tensors declared: ``encoded`` is
    {graph kind of the part row ("prefill" / "decode", "prompt" / "token"): {tensor: encoding}}
    (:func:`encodings`), each tensor of that graph's inputs and outputs in it gains ``dtype``,
    ``scale`` and ``zero_point`` (dequantized value = (integer - zero_point) x scale). What the
    compile stage's read-back expects of the binaries and what the bundle ships. Returns ``desc``."""
    for kind, tensors in encoded.items():
        for t in desc["parts"][k][kind]["inputs"] + desc["parts"][k][kind]["outputs"]:
            if t["name"] in tensors:
                t.update(tensors[t["name"]])
    return desc


def narrow_io(path, narrow: dict[str, dict]) -> None:
    """Rewrite the QDQ graph at ``path`` (in place; external weight data untouched) so each
    input or output named in ``narrow`` crosses the boundary quantized (module docstring), with
    the encoding given ({"dtype": "uint8" | "uint16", "scale": float, "zero_point": int}:
    :func:`encodings`) written into that tensor's QuantizeLinear and DequantizeLinear alike.
    Raises ValueError naming the tensor when it is not a float input followed by one
    QuantizeLinear and its DequantizeLinears, or a float output made by a DequantizeLinear of
    a QuantizeLinear."""
    import onnx
    from onnx import TensorProto, numpy_helper

    path = Path(path)
    m = onnx.load(str(path), load_external_data=False)
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}

    def consumers(name):
        return [n for n in g.node if name in n.input]

    def encoding(node, name, enc):
        """Point ``node`` (a Q or DQ) at ``enc``'s scale and zero point; returns its dtype."""
        dt = np.dtype(enc["dtype"])
        for i, (suffix, value) in enumerate(
            (("scale", np.float32(enc["scale"])), ("zero_point", np.asarray(enc["zero_point"], dt)))
        ):
            new = f"{name}_boundary_{suffix}"
            if new not in inits:
                inits[new] = numpy_helper.from_array(np.asarray(value), new)
                g.initializer.append(inits[new])
            node.input[i + 1] = new
        return dt

    dtypes = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.uint16): TensorProto.UINT16}
    graph_in = {i.name: i for i in g.input}
    graph_out = {o.name: o for o in g.output}
    drop = []
    for name, enc in narrow.items():
        if name in graph_in:
            qs = consumers(name)
            if not qs or any(n.op_type != "QuantizeLinear" for n in qs) or len(qs) != 1:
                raise ValueError(
                    f"{path.name}: input {name}: expected one QuantizeLinear after it, found {[n.op_type for n in qs]}"
                )
            q = qs[0]
            dq = consumers(q.output[0])
            if not dq or any(n.op_type != "DequantizeLinear" for n in dq):
                raise ValueError(
                    f"{path.name}: input {name}: expected DequantizeLinear after its QuantizeLinear, "
                    f"found {[n.op_type for n in dq]}"
                )
            for n in dq:
                dt = encoding(n, name, enc)
                n.input[0] = name
            drop.append(q)
            graph_in[name].type.tensor_type.elem_type = dtypes[dt]
        elif name in graph_out:
            dq = producer.get(name)
            q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is None or q.op_type != "QuantizeLinear":
                raise ValueError(
                    f"{path.name}: output {name}: expected DequantizeLinear(QuantizeLinear(...)), "
                    f"found {dq.op_type if dq is not None else 'no producer'}"
                )
            inner = f"{name}_boundary_dequantized"
            for n in consumers(name):  # the graph's own users read the dequantized value, as before
                n.input[:] = [inner if t == name else t for t in n.input]
            dt = encoding(q, name, enc)
            old = q.output[0]
            q.output[0] = name
            for n in consumers(old):
                n.input[:] = [name if t == old else t for t in n.input]
            if consumers(inner):
                encoding(dq, name, enc)
                dq.output[0] = inner
            else:
                drop.append(dq)
            graph_out[name].type.tensor_type.elem_type = dtypes[dt]
        else:
            raise ValueError(f"{path.name}: expected {name} among the graph's inputs and outputs")
    for n in drop:
        g.node.remove(n)
    used = {t for n in g.node for t in n.input}
    for i in [i for i in g.initializer if i.name not in used]:
        g.initializer.remove(i)
    onnx.save(m, str(path))

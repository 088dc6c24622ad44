"""The Gather tables of a QDQ model at 8 bits, applied to onnxruntime's QNN quantizer output.

A Gather's constant data input (the token embedding) is an activation to the QNN QDQ config, so
it is stored at 16 bits. :func:`narrow_gather_tables` stores it at uint8 per-tensor and keeps
the Gather's output at the table's type and parameters; HTP runs that and keeps the table at 8
bits (a uint8 table whose Gather output is requantized to 16 bits is widened back to 16 bits in
the binary; per-channel tables fall back to the CPU: measured, onnxruntime-qnn 2.7.0).
"""

from __future__ import annotations

from tasks.proc import lazy

np = lazy.module("numpy")
onnx = lazy.module("onnx")


def gather_tables_8bit(qdq) -> list[str]:
    """Names of the 8-bit tables (``uint8`` initializers) a Gather reads through a
    DequantizeLinear: what :func:`narrow_gather_tables` wrote (a split table counts each part)."""
    inits = {i.name: i for i in qdq.graph.initializer}
    dq = {n.output[0]: n.input[0] for n in qdq.graph.node if n.op_type == "DequantizeLinear"}
    return sorted(
        {
            dq[g.input[0]]
            for g in qdq.graph.node
            if g.op_type == "Gather"
            and g.input[0] in dq
            and dq[g.input[0]] in inits
            and inits[dq[g.input[0]]].data_type == onnx.TensorProto.UINT8
        }
    )


#: elements of a table narrowed at a time (:func:`narrow_gather_tables`): float64 temporaries
#: of 16 MiB each instead of the table's size (a 0.86 B Qwen2's 78 M-element chunk took the
#: quantize child to 2.67 GiB with whole-table float64 temporaries, benchmarks/README.md)
NARROW_BLOCK = 1 << 21


def narrow_gather_tables(qdq, min_rows: int = 1024, block: int = NARROW_BLOCK) -> list[str]:
    """Store each Gather's constant table of at least ``min_rows`` rows (the token embedding)
    at uint8 per-tensor (asymmetric, min/max of the table) instead of 16 bits, in place, and
    give the Gather's output Q/DQ pair the table's type, scale and zero point (so HTP gathers
    8-bit rows; the next op reads them through its own DequantizeLinear). Returns the tables'
    names. Tables onnxruntime did not quantize (no DequantizeLinear in front) are left.

    The table's real values ``(q16 - zp) * scale`` (the DequantizeLinear's: per tensor, per
    axis or blocked, :func:`_dq_param`) are computed in float64 on about ``block`` elements at a
    time (whole rows, at least one), twice: once for the min/max, once for the uint8 codes
    ``clip(round(real / s8) + z8, 0, 255)``; every element gets the same arithmetic as on the
    whole table, so the bytes do not depend on ``block`` (tests/qnn/test_int4.py). Raises
    ValueError naming the table when its scale or zero point does not fit its shape."""
    from onnx import numpy_helper

    inits = {i.name: i for i in qdq.graph.initializer}
    producer = {o: n for n in qdq.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in qdq.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    done = []
    for g in [n for n in qdq.graph.node if n.op_type == "Gather"]:
        dq = producer.get(g.input[0])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue
        table = inits[dq.input[0]]
        if len(table.dims) != 2 or table.dims[0] < min_rows:
            continue
        q16 = numpy_helper.to_array(table)
        scale, zp = (
            _dq_param(dq, numpy_helper.to_array(inits[n]).astype(np.float64), q16.shape, table.name)
            for n in dq.input[1:3]
        )
        step = max(1, block // max(1, q16.shape[1]))
        rows = [slice(r, r + step) for r in range(0, q16.shape[0], step)]

        def real(r, q16=q16, zp=zp, scale=scale):  # this table's, bound now
            return (q16[r].astype(np.float64) - zp(r)) * scale(r)

        lo = hi = np.float64(0.0)
        for r in rows:  # each block's real values once for both extremes (NaN carried, as by min())
            x = real(r)
            lo, hi = np.minimum(lo, x.min()), np.maximum(hi, x.max())
        del x
        s8 = np.float32((hi - lo) / 255 or 1.0)
        z8 = np.uint8(np.clip(np.round(-lo / s8), 0, 255))
        q8 = np.empty(q16.shape, np.uint8)
        for r in rows:
            q8[r] = np.clip(np.round(real(r) / s8) + z8, 0, 255)
        del q16, real
        for name, arr in ((dq.input[0], q8), (dq.input[1], np.asarray(s8)), (dq.input[2], np.asarray(z8))):
            inits[name].CopyFrom(numpy_helper.from_array(arr, name))
        qs = [c for c in consumers.get(g.output[0], []) if c.op_type == "QuantizeLinear"]
        for qn in qs:  # the Gather output's own Q/DQ pair: the table's params
            for name, arr in ((qn.input[1], np.asarray(s8)), (qn.input[2], np.asarray(z8))):
                if name in inits:
                    inits[name].CopyFrom(numpy_helper.from_array(arr, name))
        done.append(table.name)
    return done


def _dq_param(dq, v, shape: tuple, name: str):
    """A function of a row slice giving the DequantizeLinear ``dq``'s scale or zero point ``v``
    (float64) for those rows of a 2-D table of ``shape``, broadcastable to them: one value,
    per axis (``axis``, default 1: a value per column; 0: per row) or blocked (opset 21
    ``block_size`` along ``axis``). Raises ValueError naming ``name`` when ``v``'s shape fits
    none of these."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in dq.attribute}
    axis, bs = attrs.get("axis", 1) % 2, attrs.get("block_size", 0)
    if v.size == 1:
        one = v.reshape(())
        return lambda r: one
    want = ((shape[0], -(-shape[1] // bs)) if axis == 1 else (-(-shape[0] // bs), shape[1])) if bs else (shape[axis],)
    if v.shape != want:
        raise ValueError(
            f"{name}: expected its DequantizeLinear's scale and zero point of shape {want} or one value "
            f"(axis {axis}, block_size {bs}, table {list(shape)}), found {list(v.shape)}"
        )
    if not bs:
        return (lambda r: v) if axis == 1 else (lambda r: v[r, None])
    if axis == 1:
        return lambda r: np.repeat(v[r], bs, axis=1)[:, : shape[1]]
    return lambda r: v[np.arange(shape[0])[r] // bs]

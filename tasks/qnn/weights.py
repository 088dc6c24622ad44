"""Weight encodings onnxruntime's QNN quantizer does not write, applied to its QDQ output:
block-wise int4 in the LPBQ form QNN HTP runs, GPTQ rounding; :func:`reencode` applies them and
the 8-bit embedding tables of :mod:`tasks.qnn.gather_tables`.

Everything here rewrites initializers and DequantizeLinear nodes of a QDQ model that
``onnxruntime.quantization.quantize`` made; activation quantization is left as it chose it.

**LPBQ** (low-power block quantization; onnxruntime-qnn ``qnn_node_group/lpbqmatmul_fusion.cc``,
"Case 2"): a MatMul weight W [K, N] is stored as int4 codes [K, N] with one scale per block of
``block`` rows of K per output channel, and each block scale is a 4-bit integer (1..16, uint8
storage) times one float scale per output channel::

    bint uint8 [K/block, N] --DequantizeLinear(pc float [N], zp 0, axis 1)--> block scales [K/block, N]
    Wq int4 [K, N] --DequantizeLinear(block scales, zp int4 0 [K/block, N], axis 0, block_size)--> MatMul

The EP fuses this into one MatMul with a ``BLOCKWISE_EXPANSION`` encoding whose block-scale
bit width is 4: integer block scales above 16 compile but compute garbage on the HTP simulator
(measured: ints up to 255 gave cosine -0.09 against the reference, 1..16 gave 1.000000, on
v73/v75/v79; that was the first try's bug: cosine 0.004 on the simulator, 0.99997 on the CPU
EP). The per-channel scale and the integer block scales are chosen by a squared-error search (:func:`lpbq_scales`;
onnxruntime-qnn's ``ConvertBlockQuantScalesToLpbq`` takes the largest block scale / 16 and
rounds, the rule this module used first). HTP stores these weights at 4 bits plus about a byte per block (384 x 1536 at
block 64: 405,504-byte binary, int8 per-channel 675,840).

**GPTQ** (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers", 2022, Algorithm 1): codes chosen row by row of K, each row's
rounding error spread over the rows not yet quantized through the inverse of the layer's
input Hessian H = X^T X / n (X: the MatMul's inputs on the calibration set, real tokens only,
computed with the weights before it already quantized: sequential GPTQ, :mod:`tasks.qnn.seqgptq`;
the arithmetic, float32 in torch: :mod:`tasks.qnn.gptq`). Scales are fixed before (per-channel or
LPBQ from the fp32 weights), so the result is an encoding of the same form as
round-to-nearest. Damping: ``damp`` x mean(diag H) added to the diagonal; 0.1 measured best on
all-MiniLM-L6-v2 block 32 (held-out pooled cosine 0.9808 at 0.1 and 0.3, 0.9758 at 0.01;
README table).
"""

from __future__ import annotations

from tasks.qnn.gptq import GPTQ_DAMP, gptq  # noqa: F401  (what callers and tests use)
from tasks.proc import lazy
from tasks.errors import InputError

np = lazy.module("numpy")
onnx = lazy.module("onnx")

#: QNN LPBQ: the integer block scale is 4 bits wide (``blockScaleBitwidth = 4``); 1..16.
LPBQ_SCALE_MAX = 16
INT4_MIN, INT4_MAX = -8, 7


def simulator_crashes(in_features: int, block: int) -> bool:
    """True when onnxruntime-qnn 2.7.0's HTP simulator (x86_64) crashes running an LPBQ MatMul
    of ``in_features`` rows in blocks of ``block``: 7 to 9 blocks of 64 rows or more (SIGSEGV at
    the first run, any runtime; 3-6, 10-12, 16 and 38 blocks run, as do 7-8 blocks of 32;
    measured with ``benchmarks/lpbq_sim_crash.py``, 2026-12-07). Only the simulator is known to
    crash: whether a device does is not measured here."""
    return block >= 64 and in_features % block == 0 and 7 <= in_features // block <= 9


def int4_tensor(name: str, codes):
    """An ONNX INT4 TensorProto of int codes (any shape, values in -8..7), packed two per byte
    with the first element in the low nibble (the ONNX spec's INT4 layout), from numpy."""
    from onnx import TensorProto

    flat = np.asarray(codes, np.int8).ravel()
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.int8)])
    u = flat.astype(np.uint8) & 0x0F
    t = TensorProto(name=name, data_type=TensorProto.INT4, dims=list(np.shape(codes)))
    t.raw_data = (u[0::2] | (u[1::2] << 4)).astype(np.uint8).tobytes()
    return t


def unfuse_gemm(model) -> int:
    """Rewrite ``Gemm(A, B, C)`` with a constant 2-D B, no transposes and alpha = beta = 1 into
    ``MatMul(A, B)`` + ``Add(C)``, in place; returns how many. onnxruntime's optimizer fuses
    MatMul + Add into Gemm (``MatMulAddFusion``, run by ``qnn_preprocess_model``), and QNN HTP
    leaves a Gemm with int4 weights on the CPU (measured, onnxruntime-qnn 2.7.0, either channel
    axis) while MatMul takes them."""
    from onnx import helper

    inits = {i.name for i in model.graph.initializer}
    new, n = [], 0
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (
            node.op_type == "Gemm"
            and len(node.input) == 3
            and node.input[1] in inits
            and not attrs.get("transA", 0)
            and not attrs.get("transB", 0)
            and attrs.get("alpha", 1.0) == 1.0
            and attrs.get("beta", 1.0) == 1.0
        ):
            mid = node.output[0] + "_matmul"
            new.append(helper.make_node("MatMul", node.input[:2], [mid], name=node.name + "/MatMul"))
            new.append(helper.make_node("Add", [mid, node.input[2]], list(node.output), name=node.name + "/Add"))
            n += 1
        else:
            new.append(node)
    del model.graph.node[:]
    model.graph.node.extend(new)
    return n


#: LPBQ scale search grid: shrink ratios of the per-channel scale, and integer block-scale offsets
#: around ``ceil(block absmax / 7 / pc)``; 6 x 4 measured best per second (README "int4").
LPBQ_RATIOS = (0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
LPBQ_OFFSETS = (-2, -1, 0, 1)


def lpbq_scales(W, block: int, cols: int = 512):
    """LPBQ scales for W [K, N] float (K % block == 0) that minimize the squared rounding
    error: ``(bint uint8 [K/block, N] in 1..16, pc float32 [N])``, block scale = bint * pc.

    A grid search, as the GPTQ reference code's ``Quantizer.find_params(mse=True)`` searches
    a shrink factor of the min-max range (Frantar et al. 2022, github.com/IST-DASLab/gptq), here
    under LPBQ's constraint that block scales are 4-bit integers times one float per channel:
    for each ratio r in :data:`LPBQ_RATIOS`, pc = r x (largest block absmax / 7 / 16); each
    block takes the bint among ``ceil(absmax / 7 / pc) + offset`` (:data:`LPBQ_OFFSETS`,
    clipped to 1..16) with the least squared error of its round-to-nearest codes in -8..7;
    each channel keeps the r with the least total. Against the plain rule pc = largest absmax
    / 7 / 16 and bint = round(absmax / 7 / pc) (a block whose ideal bint is 1.5 takes 2, a third
    coarser), measured (README "int4"): all-MiniLM-L6-v2 w4a16 pooled
    cosine 0.9933 -> 0.9941 (HTP simulator), tiny-qwen2's int4 lm_head alone 0.99877 -> 0.99895.
    float32 in torch on the machine's threads (elementwise, and sums over a block's rows: the
    same results on 1 or 2 threads, and as the numpy version this replaced on 3584 x 4096 and
    18944 x 3584 random weights): ~0.18 s per 3584 x 4096 weight on 2 cores, numpy took 0.34
    (a Qwen2.5-7B part's prefill graph: 52 s of its quantize). Works on ``cols`` output
    channels at a time (memory ~ 3 x K x cols x 4 bytes)."""
    import torch

    K, N = W.shape
    nb = K // block
    bint = np.empty((nb, N), np.uint8)
    pc = np.empty(N, np.float32)
    for c0 in range(0, N, cols):
        c1 = min(N, c0 + cols)
        Wc = torch.from_numpy(np.ascontiguousarray(W[:, c0:c1], np.float32)).reshape(nb, block, c1 - c0)
        amax = Wc.abs().amax(1)
        pc0 = amax.amax(0) / (INT4_MAX * LPBQ_SCALE_MAX)
        pc0[pc0 == 0] = 1e-12
        best = torch.full((c1 - c0,), float("inf"))
        best_pc, best_b = pc0.clone(), torch.ones((nb, c1 - c0))
        q = torch.empty_like(Wc)
        for r in LPBQ_RATIOS:
            p = pc0 * np.float32(r)
            top = torch.ceil(amax / (INT4_MAX * p))
            err = b_err = None
            for off in LPBQ_OFFSETS:
                b = torch.clamp(top + off, 1, LPBQ_SCALE_MAX)
                s = (b * p)[:, None, :]
                torch.div(Wc, s, out=q)
                q.round_().clamp_(INT4_MIN, INT4_MAX).mul_(s)
                torch.sub(Wc, q, out=q)
                q.mul_(q)
                e = q.sum(1)
                if err is None:
                    err, b_err = e, b
                else:
                    m = e < err
                    err, b_err = torch.where(m, e, err), torch.where(m, b, b_err)
            tot = err.sum(0)
            m = tot < best
            best[m], best_pc[m], best_b[:, m] = tot[m], p[m], b_err[:, m]
        bint[:, c0:c1], pc[c0:c1] = best_b.numpy(), best_pc.numpy()
    return bint, pc


def _weight_dq(model, qname: str):
    return next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == qname)


def encode_int4(model, wname: str, W, block: int | None, codes=None) -> dict:
    """Re-encode MatMul weight ``wname`` (fp32 W [K, N]) of the QDQ ``model`` in place as
    symmetric int4: per-channel (``block`` None; scale absmax / 7.5 per output channel, as
    onnxruntime's symmetric int4) or LPBQ with ``block`` rows per block. ``codes``: int codes
    [K, N] chosen by :func:`gptq` (default: round to nearest). The weight's initializers are
    onnxruntime's ``<w>_quantized`` / ``_scale`` / ``_zero_point``. Returns {"scales": S [K, N]
    broadcastable} for callers that choose codes. Raises ValueError when K % block != 0."""
    from onnx import numpy_helper

    K, N = W.shape
    s, z = wname + "_scale", wname + "_zero_point"
    if block is None:
        S = (np.abs(W).max(0) / (INT4_MAX + 0.5)).astype(np.float32)
        S[S == 0] = 1e-12
        if codes is None:
            codes = np.clip(np.round(W / S), INT4_MIN, INT4_MAX)
        _set_encoding(
            model,
            wname,
            None,
            [
                numpy_helper.from_array(S, s),
                int4_tensor(wname + "_quantized", codes),
                int4_tensor(z, np.zeros(N, np.int8)),
            ],
        )
        return {"scales": S}
    if K % block:
        raise InputError(f"{wname}: expected in-features divisible by quantize.block_size {block}, found {K}")
    bint, pc = lpbq_scales(W, block)
    S = np.repeat(bint.astype(np.float32) * pc, block, axis=0)
    if codes is None:
        codes = np.clip(np.round(W / S), INT4_MIN, INT4_MAX)
    _set_encoding(
        model,
        wname,
        block,
        [
            int4_tensor(wname + "_quantized", codes),
            numpy_helper.from_array(bint, wname + "_bint"),
            numpy_helper.from_array(pc, wname + "_pc"),
            numpy_helper.from_array(np.zeros(N, np.uint8), wname + "_pc_zero_point"),
            int4_tensor(z, np.zeros((K // block, N), np.int8)),
        ],
    )
    return {"scales": S}


def _encoding_names(wname: str, block: int | None) -> list[str]:
    """The initializers of weight ``wname``'s int4 encoding, in the order :func:`_set_encoding` takes them."""
    if block is None:
        return [wname + "_scale", wname + "_quantized", wname + "_zero_point"]
    return [wname + t for t in ("_quantized", "_bint", "_pc", "_pc_zero_point", "_zero_point")]


def _set_encoding(model, wname: str, block: int | None, tensors: list) -> None:
    """Give weight ``wname`` of the QDQ ``model`` (onnxruntime's ``<w>_quantized`` / ``_scale``
    / ``_zero_point`` and their DequantizeLinear) the int4 encoding ``tensors`` (TensorProtos
    named by :func:`_encoding_names`), in place: per-channel (``block`` None; the three
    initializers replaced where they are) or LPBQ (the codes replaced, the scale and zero
    point removed, the block-scale tensors appended and their DequantizeLinear inserted)."""
    from onnx import helper

    inits = {i.name: i for i in model.graph.initializer}
    q, s, z = wname + "_quantized", wname + "_scale", wname + "_zero_point"
    dq = _weight_dq(model, q)
    if block is None:
        for t in tensors:
            inits[t.name].CopyFrom(t)
        del dq.attribute[:]
        dq.attribute.append(helper.make_attribute("axis", 1))
        return
    inits[q].CopyFrom(tensors[0])
    model.graph.initializer.remove(inits[s])
    model.graph.initializer.remove(inits[z])
    model.graph.initializer.extend(tensors[1:])
    nodes = list(model.graph.node)
    model.graph.node.insert(
        nodes.index(dq),
        helper.make_node(
            "DequantizeLinear",
            [wname + "_bint", wname + "_pc", wname + "_pc_zero_point"],
            [s],
            axis=1,
            name=wname + "_block_scales",
        ),
    )
    dq.domain = ""  # onnx's own DequantizeLinear (opset 21) has block_size
    del dq.attribute[:]
    dq.attribute.extend([helper.make_attribute("axis", 0), helper.make_attribute("block_size", block)])


def set_codes(model, wname: str, codes) -> None:
    """Replace the int4 codes [K, N] of weight ``wname`` (``<w>_quantized``) in place."""
    t = next(i for i in model.graph.initializer if i.name == wname + "_quantized")
    t.CopyFrom(int4_tensor(t.name, codes))


def int4_weights(qdq, fp32_inits: dict) -> list[str]:
    """Names of the MatMul weights ``qdq`` holds as int4 (onnxruntime's ``<w>_quantized``
    initializers feeding a MatMul through their DequantizeLinear; not Gather tables an
    override made int4) whose fp32 values are in ``fp32_inits``, in graph order."""
    inits = {i.name: i for i in qdq.graph.initializer}
    matmul_in = {n.input[1] for n in qdq.graph.node if n.op_type == "MatMul" and len(n.input) > 1}
    out = []
    for n in qdq.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0].endswith("_quantized") and n.output[0] in matmul_in:
            t = inits.get(n.input[0])
            w = n.input[0][: -len("_quantized")]
            if t is not None and t.data_type == onnx.TensorProto.INT4 and len(t.dims) == 2 and w in fp32_inits:
                out.append(w)
    return out


def replaces_int4(block: int | None, rounding: str) -> bool:
    """True when :func:`reencode` replaces every int4 MatMul weight's encoding whole (LPBQ
    ``block``, or codes by a ``rounding`` other than ``nearest``), so what onnxruntime's
    quantizer wrote for them is not kept (:func:`tasks.qnn.quantconfig.per_tensor_4bit`)."""
    return bool(block) or rounding != "nearest"


def reencode(
    fp32_path,
    qdq_path,
    feeds,
    block: int | None,
    rounding: str,
    tables: bool,
    more=(),
    same_as=None,
    span: int | None = None,
) -> dict:
    """Re-encode the int4 MatMul weights of the QDQ model at ``qdq_path`` in place: LPBQ blocks
    of ``block`` rows (None: per-channel), codes by ``rounding`` (``nearest`` | ``gptq`` on
    ``feeds``, the calibration feed dicts of the fp32 graph, iterated once more); with
    ``tables`` the Gather tables go to 8 bits (:func:`tasks.qnn.gather_tables.narrow_gather_tables`). ``fp32_path``: the
    fp32 graph the QDQ model was quantized from; its weights are read one at a time (external
    data included); GPTQ is sequential (:mod:`tasks.qnn.seqgptq`: one MatMul input's Hessian at a time,
    each input computed with the weights before it already quantized). Saved with external data
    above 2 GB. ``more``: (fp32 graph path, feeds) of other graphs that use the same weights (an
    LLM part's decode graph): their inputs join the Hessians, rows weighted equally.
    ``same_as``: (fp32 path, re-encoded QDQ path) of a graph with the same weights (an LLM
    part's prefill graph, for its decode graph): each weight's encoding is taken from it as it
    is (no fp32 read, no scale search, no GPTQ), so the two graphs hold the same bytes, which
    the weight-shared binary stores once; raises ValueError when a weight's fp32 data is not
    the same (file, offset, length) in both fp32 graphs. ``span``: GPTQ's widest whole Hessian
    (``quantize.gptq_span``: :func:`tasks.qnn.gptq.spans`; None: every Hessian whole).
    Returns {"int4_weights": n, "block_size", "rounding", "tables_8bit": [names]}; {} without
    reading anything when nothing is asked (no block, round to nearest, no tables)."""
    from pathlib import Path

    from onnx import numpy_helper

    from tasks.qnn.gather_tables import narrow_gather_tables
    from tasks.qnn.graphs import save_model

    if not (replaces_int4(block, rounding) or tables):
        return {}
    fp32_path, qdq_path = Path(fp32_path), Path(qdq_path)
    old_data = {
        e.value
        for t in onnx.load(str(qdq_path), load_external_data=False).graph.initializer
        for e in t.external_data
        if e.key == "location"
    }
    q = onnx.load(str(qdq_path))
    fp32 = onnx.load(str(fp32_path), load_external_data=False)
    fp = {i.name: i for i in fp32.graph.initializer}
    names = int4_weights(q, fp) if replaces_int4(block, rounding) else []
    if block:
        bad = [f"{w} ({fp[w].dims[0]})" for w in names if fp[w].dims[0] % block]
        if bad:
            raise InputError(
                f"{fp32_path.name}: expected MatMul in-features divisible by quantize.block_size {block}, "
                f"found {len(bad)} weights that are not: {', '.join(bad[:6])}" + (" ..." if len(bad) > 6 else "")
            )
    own = names  # the weights encoded here; with same_as, none: each takes the other graph's
    if same_as is not None and names:
        _take_encodings(q, fp, names, block, *same_as)
        own = []
    todo = {w for w in own if rounding == "gptq"}

    def read(w):
        return numpy_helper.to_array(fp[w], base_dir=str(fp32_path.parent)).astype(np.float32)

    def quantize(ws, U, dead, last):  # GPTQ codes of the weights reading one input, scales fixed first
        from tasks.qnn.gptq import codes

        out = {}
        for w in ws:
            W = read(w)
            S = encode_int4(q, w, W, block)["scales"]
            c = codes(W, U, dead, S)
            set_codes(q, w, c)
            if not last:  # the values the later layers' inputs are computed with
                out[w] = np.multiply(c, S, dtype=np.float32)
        return out

    if todo:  # input by input, each computed with the weights before it already quantized
        from tasks.qnn.seqgptq import sequential

        sequential(
            [(fp32_path, feeds), *more],
            todo,
            quantize,
            GPTQ_DAMP,
            span=span,
            log=lambda line: print(f"{fp32_path.name}: {line}", flush=True),
        )  # into the stage's log
    for w in own:
        if w not in todo:
            encode_int4(q, w, read(w), block)  # scales fixed, codes rounded to nearest
    narrowed = narrow_gather_tables(q) if tables else []
    for loc in old_data:  # every weight is in memory now; the re-encoded model may fit inline
        (qdq_path.parent / loc).unlink(missing_ok=True)
    save_model(q, qdq_path)
    return {"int4_weights": len(names), "block_size": block, "rounding": rounding, "tables_8bit": narrowed}


def _take_encodings(q, fp: dict, names: list[str], block: int | None, other_fp32, other_qdq) -> None:
    """Give the weights ``names`` of the QDQ model ``q`` the encodings the re-encoded QDQ model
    at ``other_qdq`` holds for them (:func:`reencode` ``same_as``), after checking that each
    weight's fp32 data in ``fp`` (``q``'s fp32 graph's initializers) is the same file range as in
    ``other_fp32``. Raises ValueError naming the first weight that differs or is missing."""

    def where(t):
        return (
            sorted((e.key, e.value) for e in t.external_data if e.key in ("location", "offset", "length")) or t.raw_data
        )

    ofp = {i.name: i for i in onnx.load(str(other_fp32), load_external_data=False).graph.initializer}
    for w in names:
        if w not in ofp or where(ofp[w]) != where(fp[w]):
            raise ValueError(
                f"{other_fp32}: expected the same fp32 data for weight {w} as the graph being "
                f"re-encoded, found {'none' if w not in ofp else 'other data'}"
            )
    other = {i.name: i for i in onnx.load(str(other_qdq)).graph.initializer}
    for w in names:
        _set_encoding(q, w, block, [other[n] for n in _encoding_names(w, block)])

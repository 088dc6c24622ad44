"""QDQ quantization of the exported LLM graphs for QNN HTP (onnxruntime.quantization, QNN config);
the ``quantize`` and ``genie_quantize`` stages (:mod:`tasks.llm.quantize`, :mod:`tasks.llm.genie.quantize`)
run :func:`quantize_part` on one part.

w8a16: uint16 activations, uint8 per-channel weights; w4a16: uint16 activations, int4 per-channel
MatMul weights (``QuantType.QInt4``) except ``lm_head`` (uint8, see :func:`quantize_qdq`). The RoPE tables (``rope_cos``
/ ``rope_sin``, [C, d]) are forced to uint16 so the rotary angles keep 16-bit precision. onnxruntime upgrades the opset
to 21 for 16-bit / 4-bit types (it logs a warning).
"""

from __future__ import annotations

from pathlib import Path

from tasks.qnn.precisions import Precision
from tasks.qnn.quantconfig import fast_int4_packing, matmul_weight_overrides, per_tensor_4bit, qtype
from tasks.qnn.weights import replaces_int4
from tasks.llm.layout import ROPE_TABLES


def stage_part(export_dir, part: dict, work) -> Path:
    """Copy one part's graphs and weight file from ``export_dir`` into the writable folder
    ``work`` and return it: onnxruntime's quantizer writes ``<graph>-inferred.onnx`` beside the
    graph, cache entries are read-only, and onnx refuses external data reached through a hard
    or symbolic link ("potential hardlink attack"), so it is a copy, made once per part."""
    import shutil

    export_dir, work = Path(export_dir), Path(work)
    work.mkdir(parents=True, exist_ok=True)
    for rel in (part["prefill"]["path"], part["decode"]["path"], part["weights"]):
        shutil.copyfile(export_dir / rel, work / Path(rel).name)
    return work


def quantize_qdq(
    fp32_path,
    out_path,
    feeds,
    *,
    weight_type: str = "uint8",
    activation_type: str = "uint16",
    per_channel: bool = True,
    matmul_per_channel: bool = True,
    keep_8bit: tuple = (),
    work=None,
    block_size: int | None = None,
    rounding: str = "nearest",
    gptq_span: int | None = None,
    embedding_bits: int = 16,
    more=(),
    same_as=None,
    ranges=None,
    boundary=None,
) -> Path:
    """Quantize ``fp32_path`` (one exported graph) to a QDQ model at ``out_path``.

    Args:
        fp32_path: the graph, in a writable folder (see :func:`stage_part`).
        feeds: calibration feed dicts for this graph, any iterable (a list, or a
            :class:`tasks.llm.feed_store.FeedStore` reading them from disk one at a time).
        weight_type: one of ``tasks.qnn.quantconfig.WEIGHT_TYPES`` (``"uint8"`` for w8a16, ``"int4"`` for w4a16).
        activation_type: ``"uint16"`` (default) or ``"uint8"``.
        per_channel: ORT's QNN per-channel switch (Conv/ConvTranspose/Gemm weights).
        matmul_per_channel: also make MatMul weights per-channel (axis 1, symmetric) via
            :func:`matmul_weight_overrides`; our graphs have only MatMul weights.
        keep_8bit: regular expressions (recipe ``overrides`` with ``weight_bits: 8``) of MatMul
            weights kept at uint8 when ``weight_type`` is 4-bit; per-channel int4 also keeps
            ``lm_head`` at 8 bits, overrides or not; with ``block_size`` it is int4 too
            (block-wise int4 lm_head measured at logits cosine 0.99+ on the simulator). Measured on the HTP simulator
            (tiny Llama prefill, logits cosine HTP vs the same QDQ model on CPU): any single group of int4 MatMuls
            0.999+, all int4 except lm_head 0.99997, all int4 *including* lm_head 0.62 (and -0.03 with per-tensor int4):
            an HTP-side problem, not quantization loss (the QDQ model on CPU is fine).
            Non-MatMul weights (norm scales, biases) then use uint8 as the default type.
        work: scratch folder (default: a temporary one beside ``out_path``).
        block_size, rounding, gptq_span, embedding_bits: the recipe's ``quantize`` params for 4-bit
            weights, applied after onnxruntime's quantizer by :func:`tasks.qnn.weights.reencode`
            (LPBQ blocks, GPTQ codes on ``feeds``, an 8-bit embedding table).
        more, same_as: the other graph's (path, feeds) whose inputs join the GPTQ Hessians,
            and (fp32 path, re-encoded QDQ path) of a graph with the same weights whose
            encodings this one takes (an LLM part's decode graph takes its prefill's:
            :func:`tasks.qnn.weights.reencode`).
        boundary: {input or output name: {"dtype", "scale", "zero_point"}}
            (:func:`tasks.llm.boundary.encodings`): those tensors cross the graph's boundary
            quantized (:func:`tasks.llm.boundary.narrow_io`, last), the others stay float32.

    Calibration: MinMax ranges, ``ranges`` (the file the calibrate stage wrote while it ran the
    graph over ``feeds``: :func:`tasks.llm.calibration_feeds.save_ranges`) or, without it,
    streamed over ``feeds`` (:func:`tasks.llm.calibration_feeds.collect_ranges`, memory
    independent of the number of feeds), handed to onnxruntime's ``quantize_static`` as its
    calibration cache. Memory: onnxruntime's quantizer holds the fp32 graph's weights once.
    Graphs whose weights exceed 2 GB are written with external data (``<out>.data``).
    Returns ``Path(out_path)``. Raises KeyError on an unknown type name.
    """
    import shutil
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_static
    from onnxruntime.quantization.calibrate import save_tensors_data
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from tasks.llm.calibration_feeds import collect_ranges, load_ranges

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(work) if work else Path(tempfile.mkdtemp(prefix=".quant-", dir=out_path.parent))
    try:
        src = Path(fp32_path)
        ranges_path = tmp / "ranges.json"
        save_tensors_data(load_ranges(ranges) if ranges else collect_ranges(src, feeds), ranges_path)
        model = onnx.load(str(src), load_external_data=False)
        names = {i.name for i in model.graph.initializer}
        overrides = {n: [{"quant_type": QuantType.QUInt16}] for n in ROPE_TABLES if n in names}
        four_bit = weight_type in ("int4", "uint4")
        if four_bit and not block_size:
            keep_8bit = ("lm_head", *keep_8bit)
        if matmul_per_channel or four_bit:
            mm = matmul_weight_overrides(model, weight_type, keep_8bit=keep_8bit)
            # reencode replaces every int4 MatMul weight's encoding whole (LPBQ blocks, GPTQ codes):
            # what onnxruntime computes for them is thrown away, so it takes its cheap path
            overrides.update(per_tensor_4bit(mm) if four_bit and replaces_int4(block_size, rounding) else mm)
        weight_bytes = sum(
            i.ByteSize() if not i.external_data else int(next(e.value for e in i.external_data if e.key == "length"))
            for i in model.graph.initializer
        )
        default_wt = "uint8" if four_bit else weight_type
        cfg = get_qnn_qdq_config(
            model,
            None,
            activation_type=qtype(activation_type),
            weight_type=qtype(default_wt),
            per_channel=per_channel,
            init_overrides=overrides or None,
        )
        del model
        with fast_int4_packing():
            quantize_static(
                str(src),
                str(out_path),
                None,
                quant_format=cfg.quant_format,
                op_types_to_quantize=cfg.op_types_to_quantize,
                per_channel=cfg.per_channel,
                reduce_range=cfg.reduce_range,
                activation_type=cfg.activation_type,
                weight_type=cfg.weight_type,
                nodes_to_quantize=cfg.nodes_to_quantize,
                nodes_to_exclude=cfg.nodes_to_exclude,
                calibrate_method=cfg.calibrate_method,
                use_external_data_format=weight_bytes > 2 * 1024**3,
                extra_options=cfg.extra_options,
                calibration_cache_path=str(ranges_path),
            )
        if four_bit:
            from tasks.qnn.weights import reencode

            reencode(src, out_path, feeds, block_size, rounding, embedding_bits == 8, more, same_as, span=gptq_span)
        if boundary:
            from tasks.llm.boundary import narrow_io

            narrow_io(out_path, boundary)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_path


def quantize_part(
    src, p: dict, feeds, params: dict, out, work, ranges=None, boundary: dict | None = None, *, precision: Precision
) -> tuple[dict, int]:
    """Quantize part ``p`` (an ``export.json`` part row) of the fp32 export in ``src`` into
    ``out`` (same relative paths): its prefill then its decode graph, each in a child process
    (so each graph's memory is returned and measured). ``feeds``: the folder of the part's
    calibration feeds (``prefill/``, ``decode/``: :class:`tasks.llm.feed_store.FeedStore`), read
    only. ``ranges``: the folder of the graphs' MinMax ranges (``prefill.json``, ``decode.json``:
    the calibrate stage's), or None to stream them over the feeds. ``params``: the quantize
    stage params (precision, per_channel, block_size, rounding, embedding_bits, overrides
    with weight_bits 8 = MatMul name patterns kept at uint8). ``boundary``: {"prefill" /
    "decode": {tensor: encoding}}, the graph's I/O to leave quantized (:func:`quantize_qdq`).
    ``work``: a scratch folder (the part's fp32 copy in it is removed; the caller owns the
    folder). ``precision``: the :class:`tasks.qnn.precisions.Precision` of ``params["precision"]``,
    resolved once by the stage. Returns ({graph path: {"quantize_linear",
    "dequantize_linear", "calibration_feeds", and for 4-bit weights "block_wise_weights",
    "int4_weights", "tables_8bit"}}, the largest child's peak RSS in bytes). Raises
    RuntimeError with the child's output when a graph fails to quantize."""
    import shutil

    import onnx

    from tasks.qnn.graphs import load_structure
    from tasks.proc.child import run_function
    from tasks.llm.feed_store import FeedStore

    src, out, work, feeds = Path(src), Path(out), Path(work), Path(feeds)
    weight, act = precision.weight_type, precision.activation_type
    keep = tuple(o["pattern"] for o in params.get("overrides", []) if o["weight_bits"] == 8)
    report, peaks = {}, []
    staged = stage_part(src, p, work / "fp32")
    try:
        for g in ("prefill", "decode"):
            rel = p[g]["path"]
            # prefill first; with GPTQ the decode graph's inputs join its Hessians. The decode
            # graph then takes the prefill's int4 encodings as they are (the same weights: one
            # set of weights for the shared binary, and no second scale search)
            pre = p["prefill"]["path"]
            more = (
                [(str(staged / Path(p["decode"]["path"]).name), FeedStore(feeds / "decode"))]
                if g == "prefill" and params.get("rounding") == "gptq"
                else ()
            )
            same_as = (str(staged / Path(pre).name), str(out / pre)) if g == "decode" else None
            store = FeedStore(feeds / g)
            r = run_function(
                quantize_qdq,
                str(staged / Path(rel).name),
                str(out / rel),
                store,
                weight_type=weight,
                activation_type=act,
                per_channel=params["per_channel"],
                keep_8bit=keep,
                work=str(work / "q" / g),
                block_size=params.get("block_size"),
                rounding=params.get("rounding", "nearest"),
                gptq_span=params.get("gptq_span"),
                embedding_bits=params.get("embedding_bits", 16),
                more=more,
                same_as=same_as,
                ranges=str(Path(ranges) / f"{g}.json") if ranges else None,
                boundary=(boundary or {}).get(g),
                timeout=24 * 3600,
                forward=True,
            )
            if r.returncode != 0:
                raise RuntimeError(f"quantizing {rel} failed (exit {r.returncode}):\n{r.tail(2000)}")
            peaks.append(r.peak_rss or 0)
            qm = load_structure(out / rel)  # counts and types: its ~1 GB of inline weights stay unread
            ops = [n.op_type for n in qm.graph.node]
            report[rel] = {
                "quantize_linear": ops.count("QuantizeLinear"),
                "dequantize_linear": ops.count("DequantizeLinear"),
                "calibration_feeds": len(store),
            }
            if weight == "int4":  # what tasks.qnn.weights.reencode wrote: LPBQ weights, 8-bit tables
                from tasks.qnn.gather_tables import gather_tables_8bit

                inits = {t.name: t.data_type for t in qm.graph.initializer}
                report[rel].update(
                    block_wise_weights=sum(n.endswith("_bint") for n in inits),
                    int4_weights=sum(t == onnx.TensorProto.INT4 and n.endswith("_quantized") for n, t in inits.items()),
                    tables_8bit=gather_tables_8bit(qm),
                )
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return report, max(peaks)

"""The genie_quantize stage, the LLM implementation (the contract: tasks/contract/__init__.py):
part k of the model in Genie's graph layout (:mod:`tasks.llm.genie.graphs`), exported, calibrated and
quantized to QDQ at the recipe's precision. Planned only for a recipe whose
``bundle.runtimes`` holds ``genie`` (``tasks/recipe/plan.py``).

Output: ``part{k}/prompt_ar{S}_cl{C}_{k+1}_of_{N}.onnx`` and ``part{k}/token_ar1_cl{C}_{k+1}_of_{N}.onnx``
(QDQ), ``genie_export.json`` (every part's graph names and I/O, :func:`tasks.llm.genie.graphs.export_genie`,
with this part's quantized boundary tensors: dtype, scale, zero point) and the tokenizer files.

What crosses the graphs' boundary (:mod:`tasks.llm.boundary`): with ``quantize.kv_bits: 8``
(default) each layer's ``past_*_in`` / ``past_*_out`` are uint8, symmetric (zero point 128), one
scale per layer and K/V for both graphs and both directions, as AI Hub's graphs and Genie's
8-bit cache take them; ``16``: uint16 over the layer's range, also one encoding per layer and
K/V; ``32``: float32 (the layout before 8-bit KV). The quantize stage reads the same key for the
genai graphs' ``past_*`` / ``present_*`` (:mod:`tasks.llm.quantize`). ``input_ids`` is int32;
every other input and output (mask, RoPE cos/sin, hidden states, logits) crosses at uint16, one
encoding per tensor name across every part's graphs (:func:`boundary_plan`), which Genie reads
from the binary and quantizes / dequantizes on the host.

How the graphs are calibrated: the Genie graphs get ranges of their own, from a calibration
run in their own layout, not the genai graphs' ranges. The fp32 Genie graphs of parts 0..k
run (onnxruntime CPU EP) over the schedule ``calibrate.part0`` drew from the recipe's
calibration text (its ``schedule.json``: the same prompts, teacher-forced continuations and
kept decode steps the genai graphs calibrate on), fed as Genie feeds them
(:meth:`tasks.llm.genie.host_loop.GenieHostLoop.teacher_forced`: prompt chunks of S padded at the end,
additive 0/-1000 mask, cos/sin rows, a host KV cache sliced to C-S); every prompt-graph call
and the kept token-graph calls of part k are recorded (``.npz``, :class:`tasks.llm.feed_store.FeedStore`)
and their MinMax ranges, taken while part k's graphs run (``RangeTaps``, as the calibrate stage
takes the genai graphs'), go to onnxruntime's ``quantize_static`` through
:func:`tasks.llm.qdq.quantize_part`, the genai graphs' quantizer (same weight types,
per-channel MatMul weights, int4 re-encoding for w4a16). Why not reuse the genai graphs'
ranges by naming tensors alike: the graphs differ where it matters for ranges: Genie's mask
is an additive [1, 1, S, C] input at -1000 (genai's is an int64 0/1 mask turned into a bias
inside the graph), its KV inputs are transposed and sliced to C-S slots with the new entries
as separate outputs, RoPE comes in as [1, 1, S, d/2] cos/sin inputs instead of gathered
tables, and the masked past slots are zeroed by an extra ``Mul``: those tensors have no genai
counterpart, so a reused range would be a guess for them. Measured on the tiny Qwen2 (w8a16
recipe, 8 calibration prompts; both sides' MinMax over their own feeds, fp32): of the Genie
prompt graph's 282 calibrated tensors 36 have no genai name (the mask slicing, the sanitizing
``Mul``, ``lm_head``), and of the 246 that share a name 26 have a range more than 1 % of its
span away from the genai graph's, 17 more than 10 % (the token graph: 9 and 9): the mask
(genai [-100, 0], Genie [-1000, 0]) and every layer's masked scores (e.g. [-106.5, 14.9] vs
[-1010.9, 14.9]). Borrowed ranges would clip Genie's -1000 mask to -100. Cost: part k's stage runs parts
0..k in fp32 (the hidden states of part k-1 in Genie's call pattern), so a P-part model runs
P(P+1)/2 fp32 parts over the schedule; on the tiny Qwen2 (1 part, 8 prompts) the whole stage
takes seconds.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from tasks.contract.stage import Stage
from tasks.contract.params import KV_BITS, LLM_QUANT_PARAMS
from tasks.llm.memory import plan_estimate

#: the calibration schedule calibrate.part0 drew (tasks/llm/calibrate.py SCHEDULE)
SCHEDULE = "schedule.json"


def boundary_plan(desc_part: dict, ranges_dir: Path, kv_bits: int, earlier: dict | None = None) -> dict[str, dict]:
    """{"prefill" / "decode": {tensor: encoding}} of one part (a ``genie_export.json`` part row):
    every float input and output of its two graphs, quantized at the boundary
    (:func:`tasks.llm.boundary.encodings` over both graphs' ranges in ``ranges_dir``: one
    encoding per name; the KV cache at ``kv_bits``). A name in ``earlier`` ({tensor: encoding}
    the parts before this one declared: the hidden states part k-1 gives, the mask and RoPE
    inputs every part takes) keeps that encoding: Genie refuses one tensor name with two
    encodings across its graphs, and the two parts' ranges of one tensor, each taken in its own
    session, differed in the last bits (hidden_states_0 of the tiny Qwen2 in 2 parts:
    scale 2.7046440e-4 vs 2.7046443e-4)."""
    from tasks.llm.boundary import encodings

    files = [json.loads((Path(ranges_dir) / f"{g}.json").read_text()) for g in ("prefill", "decode")]
    out = {}
    for g, kind in (("prefill", "prompt"), ("decode", "token")):
        io = [t["name"] for t in desc_part[kind]["inputs"] + desc_part[kind]["outputs"] if t["dtype"] == "float32"]
        out[g] = {
            **encodings(files, [n for n in io if n not in (earlier or {})], kv_bits),
            **{n: (earlier or {})[n] for n in io if n in (earlier or {})},
        }
    return out


def _earlier(previous) -> dict[str, dict]:
    """{tensor: encoding} that the ``genie_quantize`` entry ``previous`` (part k-1's, None for
    part 0) declared for its parts, which took theirs from the parts before them."""
    if previous is None:
        return {}
    desc = json.loads((Path(previous) / "genie_export.json").read_text())
    return {
        t["name"]: {f: t[f] for f in ("dtype", "scale", "zero_point")}
        for p in desc["parts"]
        for kind in ("prompt", "token")
        for t in p[kind]["inputs"] + p[kind]["outputs"]
        if "scale" in t
    }


def record_feeds(export_dir: Path, k: int, sched: list[dict], feeds: Path, ranges: Path) -> dict[str, int]:
    """Run the fp32 Genie graphs of parts 0..``k`` in ``export_dir`` over ``sched`` (the
    calibration schedule: [{"prompt": ids, "decode": ids, "keep": [steps]}]) and store part
    ``k``'s feeds in ``feeds/prefill`` (every prompt-graph call) and ``feeds/decode`` (the
    token-graph calls at the ``keep`` steps), the layout :func:`tasks.llm.qdq.quantize_part`
    reads, and the MinMax ranges of part ``k``'s graphs over those calls, taken while they run
    (:class:`tasks.llm.calibration_feeds.RangeTaps`), in ``ranges/{prefill,decode}.json``.
    Returns {"prefill": n, "decode": n} feeds."""
    from tasks.llm.calibration_feeds import RangeTaps, save_ranges
    from tasks.llm.feed_store import FeedStore
    from tasks.llm.genie.host_loop import GenieHostLoop
    from tasks.llm.sessions import cpu_session

    stores = {"prompt": FeedStore(feeds / "prefill"), "token": FeedStore(feeds / "decode")}
    desc = json.loads((Path(export_dir) / "genie_export.json").read_text())
    mine = {str(Path(export_dir) / desc["parts"][k][g]["path"]): g for g in ("prompt", "token")}
    taps = {}

    def make(path):
        if str(path) not in mine:
            return cpu_session(path)
        taps[mine[str(path)]] = RangeTaps(path)
        return taps[mine[str(path)]].session

    loop = GenieHostLoop(export_dir, make, upto=k + 1)
    for pr in sched:
        keep = set(pr["keep"])

        def on_feed(kind, part, call, f, keep=keep):
            if part == k:
                taps[kind].armed = kind == "prompt" or call in keep
                if taps[kind].armed:
                    stores[kind].add(f)

        loop.teacher_forced(pr["prompt"], pr["decode"], on_feed)
    del loop
    for kind, g in (("prompt", "prefill"), ("token", "decode")):
        save_ranges(taps[kind].ranges(), Path(ranges) / f"{g}.json")
    return {"prefill": len(stores["prompt"]), "decode": len(stores["token"])}


def _prepare(source: str, exp: str, e: dict, k: int, sched: list[dict], feeds: str, ranges: str) -> None:
    """The first child of :func:`run`: the Genie export of parts 0..``k`` into ``exp`` and part
    ``k``'s feeds and ranges (:func:`record_feeds`), their counts in ``feeds/counts.json``."""
    from tasks.llm.genie.graphs import export_genie

    export_genie(
        source,
        exp,
        seq_len=e["sequence_length"],
        context_len=e["context_length"],
        parts=e["parts"],
        only_parts=set(range(k + 1)),
    )
    counts = record_feeds(Path(exp), k, sched, Path(feeds), Path(ranges))
    (Path(feeds) / "counts.json").write_text(json.dumps(counts))


def run(inputs, files, params, out: Path) -> dict:
    """Export part ``params["part"]`` (and, for its calibration, the parts before it) of the
    checkpoint ``inputs["source"]`` in Genie's layout, calibrate it on
    ``inputs["calibration"]``'s schedule (``calibrate.part0``) and quantize it into ``out``,
    the boundary encodings of tensors shared with part k-1 taken from ``inputs["previous"]``
    (module docstring). Returns {"graphs": per-graph QuantizeLinear / DequantizeLinear /
    feed counts, "feeds": {"prefill", "decode"}, "quantize_peak_rss": bytes}. Checks the
    memory budget before work (:func:`tasks.llm.memory.check_genie_stage`); the export and
    calibration run in a child, the quantize in another. Raises
    ValueError for a model the Genie export does not write (``rope_scaling``), RuntimeError
    with the child's output when a graph fails to quantize."""
    from tasks.contract.common import copy_tokenizer
    from tasks.llm.memory import QUANTIZED_AS, check_genie_stage
    from tasks.proc.child import run_function
    from tasks.qnn.precisions import get as get_precision
    from tasks.llm.boundary import declare

    from tasks.llm.qdq import quantize_part

    k, e = params["part"], params["export"]
    sched = json.loads((Path(inputs["calibration"]) / SCHEDULE).read_text())["calls"]
    config = json.loads((Path(inputs["source"]) / "config.json").read_text(encoding="utf-8"))
    precision = get_precision(params["precision"])  # resolved once: the helpers take the object
    check_genie_stage(
        "genie_quantize",
        config,
        parts=e["parts"],
        seq_len=e["sequence_length"],
        context_len=e["context_length"],
        part=k,
        weight_bits=precision.weight_bits,
        gptq_samples=len(sched) if params.get("rounding") == "gptq" else None,
    )
    work = Path(tempfile.mkdtemp(prefix="genie-quantize-"))
    try:
        exp = work / "fp32"
        # in a child: the fp32 graphs of parts 0..k are open at once there, and what they held
        # goes back before the quantize child starts (the stage's process holds none of it)
        r = run_function(
            _prepare,
            str(inputs["source"]),
            str(exp),
            e,
            k,
            sched,
            str(work / "feeds"),
            str(work / "ranges"),
            forward=True,
        )
        if r.returncode != 0:
            raise RuntimeError(
                f"genie_quantize.part{k}: the Genie export and calibration child failed "
                f"(exit {r.returncode}): {r.tail(3000)}"
            )
        desc = json.loads((exp / "genie_export.json").read_text())
        counts = json.loads((work / "feeds" / "counts.json").read_text())
        p = desc["parts"][k]
        row = {"prefill": p["prompt"], "decode": p["token"], "weights": p["weights"]}
        plan = boundary_plan(p, work / "ranges", params.get("kv_bits", 8), _earlier(inputs.get("previous")))
        graphs, peak = quantize_part(
            exp,
            row,
            work / "feeds",
            params,
            out,
            work / "q",
            ranges=work / "ranges",
            boundary=plan,
            precision=precision,
        )
        encoded = {"prompt": plan["prefill"], "token": plan["decode"]}  # the Genie row's graph kinds
        (out / "genie_export.json").write_text(json.dumps(declare(desc, k, encoded), indent=1))
        copy_tokenizer(Path(inputs["source"]), out)
        # the weight bits genie_compile's memory check counts
        bits = {"precision": params["precision"], "weight_bits": precision.weight_bits}
        (out / QUANTIZED_AS).write_text(json.dumps(bits, sort_keys=True) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"graphs": graphs, "feeds": counts, "quantize_peak_rss": peak}


STAGE = Stage(
    kind="genie_quantize",
    module=__name__,
    version=4,  # 4: quantize.json beside the graphs
    tools=("onnxruntime", "onnx", "numpy", "transformers", "tokenizers"),
    run=run,
    params=(*LLM_QUANT_PARAMS, KV_BITS),  # as tasks/llm/quantize.py reads them, and the KV cache's bits
    wired=("part", "export"),  # export: sequence_length, context_length, parts
    memory_estimate=plan_estimate,
)

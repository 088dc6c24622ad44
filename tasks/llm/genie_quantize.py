"""The genie_quantize stage, the LLM implementation (the contract: tasks/stages/__init__.py):
part k of the model in Genie's graph layout (:mod:`tasks.llm.genie`), exported, calibrated and
quantized to QDQ at the recipe's precision. Planned only for a recipe whose
``bundle.runtimes`` holds ``genie`` (``tasks/plan.py``).

Output: ``part{k}/prompt_ar{S}_cl{C}_{k+1}_of_{N}.onnx`` and ``part{k}/token_ar1_cl{C}_{k+1}_of_{N}.onnx``
(QDQ; float32 graph inputs and outputs, ``input_ids`` int32: the first node after an input is
its QuantizeLinear, which compile keeps inside QNN, ``offload_graph_io_quantization=0``),
``genie_export.json`` (every part's graph names and I/O, :func:`tasks.llm.genie.export_genie`)
and the tokenizer files.

How the graphs are calibrated: the Genie graphs get ranges of their own, from a calibration
run in their own layout, not the genai graphs' ranges. The fp32 Genie graphs of parts 0..k
run (onnxruntime CPU EP) over the schedule ``calibrate.part0`` drew from the recipe's
calibration text (its ``schedule.json``: the same prompts, teacher-forced continuations and
kept decode steps the genai graphs calibrate on), fed as Genie feeds them
(:meth:`tasks.llm.genie_host_loop.GenieHostLoop.teacher_forced`: prompt chunks of S padded at the end,
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

from ..stages.contract import Stage
from ..stages.params import LLM_QUANT_PARAMS
from .memory import plan_estimate
#: the calibration schedule calibrate.part0 drew (tasks/llm/calibrate.py SCHEDULE)
SCHEDULE = "schedule.json"


def record_feeds(export_dir: Path, k: int, sched: list[dict], feeds: Path, ranges: Path) -> dict[str, int]:
    """Run the fp32 Genie graphs of parts 0..``k`` in ``export_dir`` over ``sched`` (the
    calibration schedule: [{"prompt": ids, "decode": ids, "keep": [steps]}]) and store part
    ``k``'s feeds in ``feeds/prefill`` (every prompt-graph call) and ``feeds/decode`` (the
    token-graph calls at the ``keep`` steps), the layout :func:`tasks.llm.qdq.quantize_part`
    reads, and the MinMax ranges of part ``k``'s graphs over those calls, taken while they run
    (:class:`tasks.llm.calibration_feeds.RangeTaps`), in ``ranges/{prefill,decode}.json``.
    Returns {"prefill": n, "decode": n} feeds."""
    from .calibration_feeds import RangeTaps, save_ranges
    from .feed_store import FeedStore
    from .genie_host_loop import GenieHostLoop
    from .sessions import cpu_session

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

        def on_feed(kind, part, call, f):
            if part == k:
                taps[kind].armed = kind == "prompt" or call in keep
                if taps[kind].armed:
                    stores[kind].add(f)

        loop.teacher_forced(pr["prompt"], pr["decode"], on_feed)
    del loop
    for kind, g in (("prompt", "prefill"), ("token", "decode")):
        save_ranges(taps[kind].ranges(), Path(ranges) / f"{g}.json")
    return {"prefill": len(stores["prompt"]), "decode": len(stores["token"])}


def run(inputs, files, params, out: Path) -> dict:
    """Export part ``params["part"]`` (and, for its calibration, the parts before it) of the
    checkpoint ``inputs["source"]`` in Genie's layout, calibrate it on
    ``inputs["calibration"]``'s schedule (``calibrate.part0``) and quantize it into ``out``
    (module docstring). Returns {"graphs": per-graph QuantizeLinear / DequantizeLinear /
    feed counts, "feeds": {"prefill", "decode"}, "quantize_peak_rss": bytes}. Raises
    ValueError for a model the Genie export does not write (``rope_scaling``), RuntimeError
    with the child's output when a graph fails to quantize."""
    from ..stages.common import copy_tokenizer
    from .genie import export_genie
    from .qdq import quantize_part

    k, e = params["part"], params["export"]
    sched = json.loads((Path(inputs["calibration"]) / SCHEDULE).read_text())["calls"]
    work = Path(tempfile.mkdtemp(prefix="genie-quantize-"))
    try:
        exp = work / "fp32"
        desc = export_genie(inputs["source"], exp, seq_len=e["sequence_length"], context_len=e["context_length"],
                            parts=e["parts"], only_parts=set(range(k + 1)))
        counts = record_feeds(exp, k, sched, work / "feeds", work / "ranges")
        p = desc["parts"][k]
        row = {"prefill": p["prompt"], "decode": p["token"], "weights": p["weights"]}
        graphs, peak = quantize_part(exp, row, work / "feeds", params, out, work / "q", ranges=work / "ranges")
        shutil.copyfile(exp / "genie_export.json", out / "genie_export.json")
        copy_tokenizer(Path(inputs["source"]), out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"graphs": graphs, "feeds": counts, "quantize_peak_rss": peak}


STAGE = Stage(
    kind="genie_quantize", family="llm", module=__name__, version=2,  # 2: ranges taken in the recording run
    tools=("onnxruntime", "onnx", "numpy", "transformers", "tokenizers"), run=run,
    params=LLM_QUANT_PARAMS,  # as tasks/llm/quantize.py reads them
    wired=("part", "export"),  # export: sequence_length, context_length, parts
    memory_estimate=plan_estimate,
)

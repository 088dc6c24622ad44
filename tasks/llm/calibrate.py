"""The calibrate stage, the LLM implementation (the contract: tasks/contract/__init__.py).

Part k's fp32 graphs run over the teacher-forced calibration schedule
(:func:`tasks.llm.calibration_feeds.schedule`), reading part k-1's hidden states from
``calibrate.part{k-1}``'s entry. Only part 0 reads the recipe's ``quantize.calibration`` file
(and the tokenizer): it writes the schedule it drew (``schedule.json``) and every later part
takes it from its ``previous`` entry, so the parts of one chain share one schedule even when
the file is edited while the build runs (the plan gives parts > 0 neither the file nor the
source). Writes the feeds that ``quantize.part{k}`` calibrates on
(``feeds/{prefill,decode}/NNNNNN.npz``) and this part's hidden states for part k+1
(``hidden/{prefill,decode}_{prompt}_{call}.npy``, not for the last part), and the MinMax
ranges of the graphs' tensors over the recorded calls, taken while the graphs run
(``ranges/{prefill,decode}.json``: :class:`tasks.llm.calibration_feeds.RangeTaps`), which
quantize reads instead of running the graphs over the feeds again. Same inputs, same bytes
(:func:`tasks.llm.feed_store.save_npz`, :func:`~tasks.llm.calibration_feeds.save_ranges`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tasks.contract.stage import Stage
from tasks.contract.params import CALIBRATION_FILE, CALIBRATION_SAMPLES
from tasks.llm.layout import RANGES
from tasks.llm.memory import plan_estimate
from tasks.errors import InputError

#: part 0's schedule, carried along the chain: {"eos": int, "calls": [{"prompt", "decode", "keep"}]}
SCHEDULE = "schedule.json"


def run(inputs, files, params, out: Path) -> dict:
    """Calibrate part ``params["part"]`` of the LLM export in ``inputs["model"]`` (see above).
    Part 0: ``inputs["source"]``, the HF folder (tokenizer), and ``files["calibration"]``;
    part k > 0: ``inputs["previous"]``, ``calibrate.part{k-1}``'s output. Returns
    {"feeds": {"prefill": n, "decode": n}, "prompts": n} (the engine records the stage's time
    and peak RSS). Raises ValueError when the text is too short for the schedule, the memory
    check's error before work, :class:`tasks.store.entries.DiskFull` before work when this part's
    calibration cannot fit on the cache's disk (:func:`check_disk`)."""
    import tempfile

    import numpy as np

    from tasks import progress
    from tasks.store.digest import canonical_json
    from tasks.llm.calibration_feeds import run_part, schedule, text_ids
    from tasks.llm.memory import check_export_stage
    from tasks.llm.sessions import cpu_session

    src, k = Path(inputs["model"]), params["part"]
    check_export_stage("calibrate", src, part=k)
    desc = json.loads((src / "export.json").read_text())
    if k == 0:
        ids, eos = text_ids(inputs["source"], files["calibration"])
        try:
            sched = schedule(ids, desc["seq_len"], desc["context_len"], n_prompts=params["calibration"]["samples"])
        except ValueError as e:  # name the recipe key and the file, not the bare reason
            raise InputError(f"quantize.calibration.file ({files['calibration']}): {e}") from None
    else:
        drawn = json.loads((Path(inputs["previous"]) / SCHEDULE).read_text())
        eos, sched = drawn["eos"], drawn["calls"]
    check_disk(desc, sched, k, out)
    (out / SCHEDULE).write_text(canonical_json({"eos": eos, "calls": sched}))
    embed = np.load(src / desc["embed_file"], mmap_mode="r") if desc.get("embed_file") and k == 0 else None
    bar = progress.bar(what=f"calibration part {k} (graph x prompt)", total=2 * len(sched), unit="prompt")
    work = Path(tempfile.mkdtemp(prefix="calib-"))
    try:
        stores = run_part(
            desc,
            src,
            desc["parts"][k],
            sched,
            work,
            cpu_session,
            True,
            eos,
            embed,
            bar,
            prev=Path(inputs["previous"]) / "hidden" if k else work / "none",
            here=out / "hidden",
            feeds=out / "feeds",
            ranges=out / RANGES,
        )
    finally:
        bar.close()
        shutil.rmtree(work, ignore_errors=True)
    return {"feeds": {g: len(st) for g, st in stores.items()}, "prompts": len(sched)}


def check_disk(desc: dict, sched: list[dict], k: int, out: Path) -> int:
    """Refuse, before work, a calibration of part ``k`` that cannot fit on the disk of ``out``
    (the stage's folder in the cache), estimated from the schedule by
    :func:`tasks.llm.calibration_feeds.disk_bytes`. This part only: the later parts' entries may be in the
    cache already (rebuilding part 0 alone must not be refused for the later parts' bytes).
    Returns the estimate in bytes. Raises :class:`tasks.store.entries.DiskFull` naming the part, both
    figures and ``quantize.calibration.samples``, before work rather than minutes in, as a
    failed write."""
    from tasks.store.entries import DiskFull
    from tasks.errors import apart
    from tasks.llm.calibration_feeds import disk_bytes

    need = disk_bytes(desc, sched, k)
    free = shutil.disk_usage(out).free
    if need > free:
        disk = out.resolve()
        while not os.path.ismount(disk) and disk != disk.parent:
            disk = disk.parent
        n, f = apart(need / 1e9, free / 1e9, 2)
        raise DiskFull(
            f"the calibration of part {k} writes about {n} GB ({len(sched)} prompts: "
            f"quantize.calibration.samples) to the cache's disk ({disk}), which has {f} GB free; "
            f"lower quantize.calibration.samples, free space or set NPUBUILD_CACHE to a larger disk"
        )
    return need


def file_check(role: str, f: Path, rel: str) -> str | None:
    """The first problem of a chat calibration file (``.jsonl``, read by
    :func:`tasks.llm.calibration_feeds.samples_of`), as a message naming the line; None for
    any other file."""
    from tasks.llm.calibration_feeds import conversations

    if role != "calibration" or not rel.endswith(".jsonl"):
        return None
    try:
        conversations(f)
    except ValueError as e:
        return str(e)
    return None


STAGE = Stage(
    kind="calibrate",
    module=__name__,
    version=4,  # 4: every decode step recorded (4 of 4, was 4 of 24)
    tools=("onnxruntime", "onnx", "transformers", "tokenizers", "numpy"),
    run=run,
    params=(CALIBRATION_SAMPLES,),
    files={CALIBRATION_FILE: "calibration"},  # the file: part 0 only
    wired=("part",),
    memory_estimate=plan_estimate,
    file_check=file_check,
)

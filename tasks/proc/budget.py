"""The memory budget every stage is checked against, whatever its family: the user's
``NPUBUILD_MEMORY_GB`` or, unset, ``MemAvailable``; :func:`check` stops a stage whose estimated
peak exceeds it (:class:`NotEnoughMemory`, naming what lowers it); :func:`budget_line` is how
``doit explain`` states it. The estimates are the families' (the ``memory_estimate`` hook of
:class:`tasks.contract.stage.Stage`; LLMs: :mod:`tasks.llm.memory`, the LLM verify's phases:
:func:`tasks.llm.verify_memory.memory_plan`); :data:`DEFAULT_STAGE_BYTES` stands in for a stage without one.

The promise: a stage's estimate bounds the peak of its whole process tree (the stage's process
and its children, :mod:`tasks.proc.tree`), so a stage that passes the check stays within the
budget. Every stage is checked before its work (:func:`tasks.core.run.build_spec` with the plan's
figure; a stage may check a finer one of its own once its inputs are read), and its manifest
records the last figure checked beside the measured peak (``info["memory"]``); a peak over its
estimate is a defect the tests catch (``tests/llm/test_budget_edge.py``).
"""

from __future__ import annotations

import os
import re

from tasks.errors import InputError, UserError
from tasks.proc.rss import proc_bytes as _proc_bytes

GiB = 1 << 30
BASE = int(0.8 * GiB)  # Python + torch/onnxruntime/transformers imports, measured: 0.6-0.8 GiB


class NotEnoughMemory(UserError, RuntimeError):
    """A stage's estimated peak exceeds the memory available; the message says what to change."""


#: the largest budget taken (GiB): a larger one, e.g. 1e300, would overflow every stage's sums
MAX_BUDGET_GIB = 1 << 20


def budget_gib() -> float | None:
    """The user's memory budget, ``NPUBUILD_MEMORY_GB`` (GiB), or None when unset. Raises
    ValueError naming the variable for a value that is not a finite number > 0, or that is
    more than the machine has (:func:`machine_bytes`); checked when doit starts
    (:func:`tasks.commands.builder.startup.environment_problems`)."""
    import math

    env = os.environ.get("NPUBUILD_MEMORY_GB", "").strip()
    if not env:
        return None
    # ASCII digits only: Python's float() also reads "1_0" as 10 and "٤" (Arabic-Indic) as 4
    v = float(env) if re.fullmatch(r"[0-9]+(\.[0-9]*)?|\.[0-9]+|[0-9]+(\.[0-9]*)?[eE][+-]?[0-9]+", env) else math.nan
    if not (math.isfinite(v) and 0 < v <= MAX_BUDGET_GIB):
        raise InputError(
            f"NPUBUILD_MEMORY_GB: expected a number of GiB > 0 and at most {MAX_BUDGET_GIB}, found {env!r}"
        )
    machine = machine_bytes()
    if machine is not None and v * GiB > machine:
        raise InputError(
            f"NPUBUILD_MEMORY_GB: {env} GiB is more than this machine has, {machine / GiB:.2f} GiB "
            "(MemTotal + SwapTotal, /proc/meminfo): a stage within it could still be killed for memory; "
            f"set at most {math.floor(machine / GiB * 100) / 100:g}"
        )
    return v


def machine_bytes() -> int | None:
    """The memory this machine has for processes: Linux's ``MemTotal`` + ``SwapTotal``
    (/proc/meminfo), bytes; None where /proc is absent. A budget above it is a promise the
    machine cannot keep (issue 51: ``NPUBUILD_MEMORY_GB=64`` on a 24 GiB machine was taken)."""
    total = _proc_bytes("/proc/meminfo", "MemTotal")
    return None if total is None else total + (_proc_bytes("/proc/meminfo", "SwapTotal") or 0)


def available_bytes() -> int | None:
    """Memory a stage may use: ``NPUBUILD_MEMORY_GB`` (GiB, float) if set, else Linux's
    ``MemAvailable``; None when neither is known (then nothing is checked). Raises ValueError
    for a budget that is not a number > 0 (:func:`budget_gib`)."""
    gib = budget_gib()
    if gib is not None:
        return int(gib * GiB)
    return _proc_bytes("/proc/meminfo", "MemAvailable")


def budget_line() -> str:
    """How ``doit explain`` states the memory budget: the user's ``NPUBUILD_MEMORY_GB``, which
    every stage's estimate (its whole process tree's peak, with what the doit process holds) is
    checked against before its work, and within which the LLM verify chooses how many compiled
    parts it keeps open (:func:`tasks.llm.verify_memory.memory_plan`), else that there is none and what
    stands in for it (``MemAvailable``, which varies with what else runs)."""
    gib = budget_gib()
    if gib is not None:
        return (
            f"{gib:g} GiB (NPUBUILD_MEMORY_GB): a stage whose estimated process tree peak exceeds it stops "
            f"before work; LLM verify keeps open the compiled parts that fit in it"
        )
    avail = available_bytes()
    now = f", {avail / GiB:.1f} GiB now" if avail is not None else ""
    return (
        f"none set (NPUBUILD_MEMORY_GB): stages are checked against the memory available{now}, "
        "which changes with what else runs; set NPUBUILD_MEMORY_GB for a peak you can plan for"
    )


#: what a stage without a ``memory_estimate`` hook asks of a cluster worker: the encoders built
#: here (MiniLM-sized) peak well under 1 GiB above the imports (BASE); 2 GiB leaves room for a
#: BERT-large
DEFAULT_STAGE_BYTES = 2 * GiB


def held_bytes(in_child: bool) -> int:
    """Bytes this process holds now that a stage's estimate (which counts one fresh process's
    :data:`BASE`) leaves out, when ``NPUBUILD_MEMORY_GB`` is set (0 otherwise: ``MemAvailable``
    already leaves out what this process holds): its whole resident set when the stage's work
    runs in a child process (this one waits, holding it), else its resident set above BASE
    (what earlier stages of the same doit process left: 2.97 GiB while a Llama-3.2-1B shape's
    quantize child ran, benchmarks/README.md). 0 where ``/proc`` is absent."""
    if budget_gib() is None:
        return 0
    rss = _proc_bytes("/proc/self/status", "VmRSS") or 0
    return rss if in_child else max(0, rss - BASE)


#: the last :func:`check` of the stage running in this process (:func:`checked`), for its manifest
_CHECKED: dict | None = None


def checked_reset() -> None:
    """Forget the last check: a stage is about to run (:func:`tasks.core.run.build_spec`)."""
    global _CHECKED
    _CHECKED = None


def checked() -> dict | None:
    """The last :func:`check` since :func:`checked_reset`: {"estimate": bytes checked (the
    stage's own estimate plus what was held), "held": bytes, "budget": bytes or None (none
    known), "part": int}, or None when the stage checked nothing."""
    return _CHECKED


def check(
    stage: str, estimate: int, part: int | None, *, recipe_keys: str | None, held: int = 0, log: bool = True
) -> None:
    """Raise :class:`NotEnoughMemory` when ``estimate`` + ``held`` (what the process running
    the stage holds already: :func:`held_bytes`) exceeds :func:`available_bytes`, naming the
    stage, the part (None: a whole-model stage), both figures (with the decimals that tell them
    apart), the held share and
    ``recipe_keys`` (what to change; None: no recipe key lowers it, so more memory is the fix);
    when the stage alone would fit, the message says to run the command again (a new doit
    process holds nothing of the earlier stages': the 7B's compile.part0 was refused at 17.0
    GiB with 2.6 GiB held, and built in a new process, benchmarks/README.md). Records the
    check for the stage's manifest (:func:`checked`) and prints it (the stage's log; ``log``
    False: not, for a check outside a stage)."""
    global _CHECKED
    from tasks.errors import apart

    avail = available_bytes()
    estimate += held
    _CHECKED = {"estimate": estimate, "held": held, "budget": avail, "part": part}
    if log:
        print(
            f"memory: {stage} estimate {estimate / GiB:.2f} GiB"
            + (f" ({held / GiB:.2f} held)" if held else "")
            + (f", {avail / GiB:.2f} GiB available" if avail is not None else ", no budget known"),
            flush=True,
        )
    if avail is not None and estimate > avail:
        src = "NPUBUILD_MEMORY_GB" if budget_gib() is not None else "MemAvailable now"
        more = "raise NPUBUILD_MEMORY_GB" if src == "NPUBUILD_MEMORY_GB" else "free memory or use a larger machine"
        if avail <= BASE:
            fix = f"the budget is below the {BASE / GiB:.1f} GiB any stage takes (Python and its libraries): {more}"
        elif recipe_keys is None:
            fix = f"no recipe key lowers it: {more}"
        else:
            fix = f"to lower it change {recipe_keys}"
        need, have = apart(estimate / GiB, avail / GiB)
        of = f" ({held / GiB:.1f} GiB of it held already by the process that runs it)" if held >= GiB // 10 else ""
        if of and estimate - held <= avail:  # a new process starts without what earlier stages left
            fix = (
                "it fits in a new process: run the same command again (the stages built so far are cache hits), "
                f"or {fix}"
            )
        who = stage if part is None else f"{stage}: part {part}"
        raise NotEnoughMemory(f"{who} needs about {need} GiB{of}, {have} GiB is available ({src}); {fix}")


def manifest_memory(figures: dict) -> dict:
    """What a built stage's manifest ``info`` records of its memory, and prints to its log, from
    its process tree's ``figures`` (:meth:`tasks.proc.tree.TreeMeter.figures`) and the last
    :func:`check` (:func:`checked`):
    ``stage_peak_rss`` (this process's peak, bytes) and ``memory``: {"estimate": the last
    figure checked against the budget (the stage's estimate plus ``held``, bytes; None when the
    stage was built without a check), "held": what the stage's process held already when it
    was checked, "budget": the budget (bytes; None when none is known), "peak": the process
    tree's measured peak (:class:`tasks.proc.tree.TreeMeter`), "children_peak": the largest
    child's}. A peak above the estimate is a defect (tests/llm/test_budget_edge.py)."""
    c = _CHECKED or {}
    mem = {
        "estimate": c.get("estimate"),
        "held": c.get("held"),
        "budget": c.get("budget"),
        "peak": figures["tree_peak"],
        "children_peak": figures["children_peak"],
    }

    def gib(b):
        return "unknown" if b is None else f"{b / GiB:.2f} GiB"

    print(
        f"memory: process tree peak {gib(mem['peak'])}, estimate {gib(mem['estimate'])}"
        + (f", budget {gib(mem['budget'])}" if mem["budget"] is not None else ""),
        flush=True,
    )
    out = {"memory": mem}
    if figures["stage_peak"] is not None:
        out["stage_peak_rss"] = figures["stage_peak"]
    return out

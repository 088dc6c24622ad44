"""The lines ``build:<recipe>`` ends with (:func:`verify_lines`): per verify stage, its verdict and
the figures it measured, each bar beside its metric, so a build says how good the result is
without opening ``verify.json``."""

from __future__ import annotations

import json
import math

from tasks.core import recipeset
from tasks.core.session import Session
from tasks.store import paths

#: metrics shown when a verify has no bars: the first of these it measured, in this order
PRIMARY = ("pooled_cosine_mean", "cosine_mean", "token_agreement", "logits_cosine_mean", "perplexity_ratio")


def figure(v) -> str:
    """A metric as the line shows it: 5 decimals (a metric near 1 never shown as 1 unless it
    is: 0.999998 is ``0.999998``), 5 significant digits from 100 up; other values as they are."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return str(v)
    if abs(v) >= 100:
        return f"{v:.5g}"
    digits = 5
    while abs(float(f"{v:.{digits}f}")) == 1 != abs(v) and digits < 15:  # rounded up to 1: more digits
        digits += 1
    return f"{v:.{digits}f}"


def verify_lines(session: Session, recipe: str, width: int = 0) -> list[str]:
    """One line per verify stage of ``recipe`` whose ``verify.json`` is in ``build/<recipe>/``
    (``<target>/verify.json`` with several targets: what ``build:<recipe>`` just linked):
    ``<task>  <verdict>: <metric> <value> (>= <bar>), ...; runs on <where>``. The verdict is
    ``verified`` (every bar met), ``FAILED`` (a bar missed: the metric says ``missed``) or
    ``measured, no bars`` (then the first three :data:`PRIMARY` metrics it measured); the bars
    and their directions are the recipe's (``verify.thresholds``) and the verify
    implementation's (``Stage.thresholds``); where the graphs run is ``npu``, or what runs on the
    CPU. [] when nothing is linked. ``width``: the task column's width."""
    from tasks.contract.report import runs_on

    specs = [s for s in recipeset.plan(session, recipe).values() if s.kind == "verify"]
    out = []
    for s in specs:
        f = paths.build_dir() / recipe / (f"{s.params['target']}/" if len(specs) > 1 else "") / "verify.json"
        try:
            report = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        metrics = report.get("metrics", {})
        table = {t.name: t for t in s.impl.thresholds}
        bars = {n: b for n, b in sorted((s.params.get("thresholds") or {}).items()) if b is not None}
        parts, failed = [], False
        for name, bar in bars.items():
            v, low = metrics.get(name), name not in table or table[name].direction == "min"
            missed = not isinstance(v, (int, float)) or not math.isfinite(v) or (v < bar if low else v > bar)
            failed |= missed
            parts.append(f"{name} {figure(v)} ({'>=' if low else '<='} {bar}{', missed' if missed else ''})")
        if not bars:
            parts = [f"{m} {figure(metrics[m])}" for m in PRIMARY if m in metrics][:3]
        verdict = "FAILED" if failed else "verified" if bars else "measured, no bars"
        out.append(f"{s.task:<{width}}  {verdict}: {', '.join(parts)}; runs on {runs_on(report.get('cpu_nodes', {}))}")
    return out

"""The catalog's table as data: the columns (header, cell text, sort value, numeric) of the
Markdown table (:mod:`.write`) and of the page's details rows (:mod:`.page`); the states and
number formats are :mod:`.formats`."""

from __future__ import annotations

from tasks.core.row import arch
from tasks.commands.catalog.formats import STATES, human_bytes, human_count, state_order  # noqa: F401  (STATES: the catalog's states)


def metrics_summary(row: dict) -> str:
    """Thresholded metrics (else pooled_cosine_mean/cosine_mean), per target."""
    if not row["verify"]:
        return ""
    parts = []
    for target, v in sorted(row["verify"].items()):
        names = (
            sorted(v["thresholds"])
            or [n for n in ("pooled_cosine_mean", "cosine_mean", "token_agreement") if n in v["metrics"]][:1]
        )
        vals = ", ".join(f"{n}={v['metrics'][n]:.4f}" for n in names if isinstance(v["metrics"].get(n), (int, float)))
        if v.get("runtime"):
            vals += f" ({v['runtime']})"
        parts.append(f"{target}: {vals}" if len(row["verify"]) > 1 else vals)
    return "; ".join(parts)


def source(row: dict) -> str:
    s = row["source"]
    if s["kind"] in ("hf", "shape"):
        at = f"{s['repo']}@{(s.get('commit') or s.get('revision') or '')[:12]}"
        return at if s["kind"] == "hf" else f"random weights in the shape of {at}"
    if s["kind"] == "package":
        return (
            f"{s['package']}"
            + (f"=={s['package_version']}" if s.get("package_version") else "")
            + (f": {s['file']}" if s.get("file") else "")
        )
    return s.get("path", "")


COLUMNS = [  # (header, cell text, sort value, numeric)
    ("Recipe", lambda r: r["name"], lambda r: r["name"], False),
    ("State", lambda r: r["state"], lambda r: state_order(r["state"]), True),
    ("Source", source, source, False),
    ("Architecture", arch, arch, False),
    ("Parameters", lambda r: human_count(r["parameters"]), lambda r: r["parameters"] or 0, True),
    ("Precision", lambda r: r["precision"], lambda r: r["precision"], False),
    ("Targets", lambda r: ", ".join(r["targets"]), lambda r: ", ".join(r["targets"]), False),
    ("Runs on", lambda r: r["runs_on"] or "", lambda r: r["runs_on"] or "", False),
    ("Seq len", lambda r: str(r["sequence_length"] or ""), lambda r: r["sequence_length"] or 0, True),
    ("Context", lambda r: str(r["context_length"] or ""), lambda r: r["context_length"] or 0, True),
    ("Parts", lambda r: str(r["parts"] or ""), lambda r: r["parts"] or 0, True),
    ("Artifacts", lambda r: human_bytes(r["artifact_bytes"]), lambda r: r["artifact_bytes"] or 0, True),
    ("Bundle", lambda r: per_target(r, "bundle_bytes", human_bytes), lambda r: first(r, "bundle_bytes"), True),
    ("KV cache", lambda r: per_target(r, "kv_cache_bytes", human_bytes), lambda r: first(r, "kv_cache_bytes"), True),
    (
        "Memory on device",
        lambda r: per_target(r, "memory_bytes", human_bytes),
        lambda r: first(r, "memory_bytes"),
        True,
    ),
    (
        "Decode ceiling",
        lambda r: per_target(r, "decode_tokens_per_s_ceiling", tps),
        lambda r: first(r, "decode_tokens_per_s_ceiling"),
        True,
    ),
    (
        "First token >=",
        lambda r: per_target(r, "first_token_s_lower_bound", ms),
        lambda r: first(r, "first_token_s_lower_bound"),
        True,
    ),
    ("Verify", metrics_summary, metrics_summary, False),
    ("Task", lambda r: r["task"], lambda r: r["task"], False),
    ("License", lambda r: r["license"], lambda r: r["license"], False),
    (
        "QNN SDK",
        lambda r: (r["tools"] or {}).get("qnn-sdk", ""),
        lambda r: (r["tools"] or {}).get("qnn-sdk", ""),
        False,
    ),
    (
        "onnxruntime / -qnn",
        lambda r: (
            " / ".join((r["tools"] or {}).get(t, "") for t in ("onnxruntime", "onnxruntime-qnn")) if r["tools"] else ""
        ),
        lambda r: (r["tools"] or {}).get("onnxruntime", ""),
        False,
    ),
    (
        "optimum / transformers",
        lambda r: " / ".join((r["tools"] or {}).get(t, "") for t in ("optimum", "transformers")) if r["tools"] else "",
        lambda r: (r["tools"] or {}).get("transformers", ""),
        False,
    ),
    ("Verify key", lambda r: verify_key(r), lambda r: verify_key(r), False),
]


def tps(v) -> str:
    return "unknown" if v is None else f"{v:.1f} tok/s"


def ms(v) -> str:
    return "unknown" if v is None else f"{v * 1000:.0f} ms"


def per_target(row: dict, key: str, fmt) -> str:
    """``key`` of the row's on-device figures, formatted, per target when there are several."""
    dev = row.get("device") or {}
    vals = {t: fmt(f.get(key)) for t, f in sorted(dev.items())}
    if not vals:
        return ""
    if len(set(vals.values())) == 1 and len(vals) > 1 or len(vals) == 1:
        return next(iter(vals.values())) if len(vals) == 1 else "; ".join(f"{t}: {v}" for t, v in vals.items())
    return "; ".join(f"{t}: {v}" for t, v in vals.items())


def first(row: dict, key: str) -> float:
    dev = row.get("device") or {}
    vals = [f.get(key) for _, f in sorted(dev.items()) if f.get(key) is not None]
    return vals[0] if vals else 0


def verify_key(row: dict) -> str:
    keys = [k for s, k in sorted(row["stage_keys"].items()) if s.startswith("verify") and k]
    return ", ".join(k[:12] for k in keys)

"""An LLM part's prefill (AR-N) and decode (AR-1) QDQ graphs compiled into QNN context binaries
(the ``compile`` stage, :mod:`tasks.llm.compile`, compiles one part), and the binaries read back.

Per part ``i`` the stage writes:

- ``shared/part{i}/{prefill,decode}_ctx.onnx`` + one context binary holding both graphs with
  HTP weight sharing (``enable_htp_weight_sharing=1``, ``ep.share_ep_contexts=1``, the last
  with ``ep.stop_share_ep_contexts=1``): the artifact to ship (``weight_sharing: true``);
- ``part{i}/{prefill,decode}_ctx.onnx`` + one binary per graph: what ships without weight
  sharing, and what verify runs on the x86_64 HTP simulator, which crashes loading a two-graph
  binary (a segfault, reproduced by :func:`tasks.llm.htp.load_shared_probe`); made only when
  one of the two needs them (``per_graph``, set by the plan: ``tasks/recipe/plan.py``), so a
  weight-shared LLM verified on ``cpu-qdq`` (the 7B) compiles one binary per part, not three.

Every compile runs in a fresh process (a second compile in one process writes other tensor ids
into the binary; see tasks/qnn/ep.py ``compile_in_subprocess``). What belongs to the whole
model (``export.json``, ``genai_config.json``) is the ``bundle`` stage's (:mod:`tasks.llm.bundle`).
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.qnn.targets import get as get_target


def run_child(fn, *args, cwd=None, **kwargs) -> int:
    """``fn(*args, **kwargs)`` in a fresh process (in ``cwd``); returns its peak RSS in bytes (0 if unknown)."""
    from tasks.proc.child import run_function

    r = run_function(fn, *args, cwd=cwd, timeout=24 * 3600, forward=True, **kwargs)
    if r.returncode != 0:
        raise RuntimeError(f"LLM compile failed (exit {r.returncode}):\n{r.tail(2000)}")
    return r.peak_rss or 0


def compile_part(src: Path, out: Path, params: dict, k: int) -> dict:
    """Compile part ``k`` of the QDQ export in ``src`` into ``out`` for ``params["target"]``,
    one graph per child process (one part's QDQ graph in memory at a time): with
    ``params["per_graph"]`` (default True) one binary per graph (``out/part{k}/``, always
    without ``weight_sharing``) and with ``params["weight_sharing"]`` (default True) both
    graphs in one weight-shared binary (``out/shared/part{k}/``). Returns {"parts": [the
    part's row: binary sizes (bytes; ``single_bytes`` only with per-graph binaries), the
    shared/single size ratio (with both), ``seconds`` and ``peak_rss`` (bytes, the largest
    compile process)], "qnn_sdk"}. Raises RuntimeError with the child's output when a compile
    fails (e.g. a node not on HTP)."""
    import time

    from tasks import progress
    from tasks.llm import htp

    target = get_target(params["target"]).name  # a KeyError listing the targets, before any child starts
    desc = json.loads((src / "export.json").read_text())
    p = desc["parts"][k]
    sharing = params.get("weight_sharing", True)
    per_graph = params.get("per_graph", True) or not sharing
    bar = progress.bar(what="graphs", total=2 * per_graph + sharing, unit="graph")
    t0, peaks = time.perf_counter(), []
    pre, dec = (str(src / p[g]["path"]) for g in ("prefill", "decode"))
    here = Path(pre).parent  # the child's working folder: graph names from relative paths
    single = out / f"part{k}"
    row = {"part": k}
    if per_graph:
        for g, path in (("prefill", pre), ("decode", dec)):
            peaks.append(run_child(htp.compile_single, path, str(single), cwd=here, name=g, target=target))
            bar.update()
        row["single_bytes"] = {
            g: sum(b.stat().st_size for b in single.glob(f"{g}_ctx*.bin")) for g in ("prefill", "decode")
        }
    if sharing:
        shared = out / "shared" / f"part{k}"
        peaks.append(run_child(htp.compile_shared, pre, dec, str(shared), target, cwd=here))
        bar.update()
        row["shared_bytes"] = sum(b.stat().st_size for b in shared.glob("*.bin"))
        if per_graph:
            row["shared_ratio"] = row["shared_bytes"] / sum(row["single_bytes"].values())
    row.update(seconds=time.perf_counter() - t0, peak_rss=max(peaks))
    bar.close()
    return {"parts": [row], "qnn_sdk": sorted({_sdk(c) for c in out.rglob("*_ctx.onnx")})}


def _sdk(ctx: Path) -> str:
    from tasks.qnn.ep import ep_context_info

    return next((n.get("ep_sdk_version", "?") for n in ep_context_info(ctx)), "?")


def planned_models(k: int, per_graph: bool, sharing: bool) -> list[str]:
    """The EPContext models compile makes for part ``k`` (paths relative to its output): the
    prefill and decode graphs each in a binary of its own (``part{k}/``, with ``per_graph``)
    and both in one weight-shared binary (``shared/part{k}/``, with ``sharing``)."""
    folders = ([f"part{k}"] if per_graph or not sharing else []) + ([f"shared/part{k}"] if sharing else [])
    return [f"{d}/{g}_ctx.onnx" for d in folders for g in ("prefill", "decode")]


def read_back(
    compiled: Path,
    desc: dict,
    parts: list[int],
    params: dict,
    qdq_dir: Path | None = None,
    declared: dict | None = None,
    somewhere: list | None = None,
) -> dict:
    """Read back the context binaries of ``parts`` under ``compiled`` and check them
    (:func:`tasks.qnn.context_binary_checks.check_models`): every planned model (:func:`planned_models`)
    and its binary, each binary holding exactly its models' graphs, every input and output as
    the export declared it (``desc``, ``export.json``: name, shape and dtype: the quantize
    stage's declares its quantized KV cache, e.g. ``uint8``) and, with ``qdq_dir``, as the QDQ
    graph had it (name, dtype, shape); the SoC model of ``params["target"]``;
    ``declared`` adds a runtime config's tensors ({model: Declared}), ``somewhere`` tensors it
    looks for in any graph ([Declared]). Returns {binary: figures}.
    Raises context_binary_checks.Mismatch, one line per difference."""
    from tasks.qnn import context_binary_checks

    sharing = params.get("weight_sharing", True)
    per_graph = params.get("per_graph", True)
    models, qdq, said = [], {}, {}
    for k in parts:
        row = desc["parts"][k]
        for rel in planned_models(k, per_graph, sharing):
            g = "prefill" if rel.endswith("prefill_ctx.onnx") else "decode"
            models.append(rel)
            if qdq_dir is not None:
                qdq[rel] = Path(qdq_dir) / row[g]["path"]
            exported = context_binary_checks.Declared(
                {t["name"]: tuple(t["shape"]) for t in row[g]["inputs"]},
                {t["name"]: tuple(t["shape"]) for t in row[g]["outputs"]},
                "export.json",
                {
                    t["name"]: context_binary_checks.onnx_dtype_name(t["dtype"])
                    for t in row[g]["inputs"] + row[g]["outputs"]
                },
            )
            said[rel] = [exported, *([declared[rel]] if declared and rel in declared else [])]
    for rel, d in (declared or {}).items():  # a model the runtime config names that the plan did not make
        said.setdefault(rel, [d])
    found = context_binary_checks.check_models(
        compiled, models, params["target"], qdq=qdq or None, declared=said, somewhere=somewhere
    )
    return {rel: b.figures() for rel, b in sorted(found.items())}

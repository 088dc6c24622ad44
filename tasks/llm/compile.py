"""compile for decoder LLMs: each part's prefill (AR-N) and decode (AR-1) QDQ graphs.

Per part ``i`` the stage writes:

- ``shared/part{i}/{prefill,decode}_ctx.onnx`` + one context binary holding both graphs with
  HTP weight sharing (``enable_htp_weight_sharing=1``, ``ep.share_ep_contexts=1``, the last
  with ``ep.stop_share_ep_contexts=1``): the artifact to ship (``weight_sharing: true``);
- ``part{i}/{prefill,decode}_ctx.onnx`` + one binary per graph: what ships without weight
  sharing, and what verify runs on the x86_64 HTP simulator, which crashes loading a two-graph
  binary (NOTES-qnn.md, reproduced); made only when one of the two needs them (``per_graph``,
  set by the plan: ``tasks/plan.py``), so a weight-shared LLM verified on ``cpu-qdq`` (the 7B)
  compiles one binary per part, not three.

Every compile runs in a fresh process (a second compile in one process writes other tensor ids
into the binary; see tasks/qnn.py ``compile_in_subprocess``). Also ``export.json`` (the graphs'
I/O, used by the runner) and ``genai_config.json`` for onnxruntime-genai (tasks/llm/genai.py),
naming the weight-shared binaries when there are some (what ships), else the per-graph ones.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..stages.common import COMPILE_ARTIFACTS, target_key_extra
from ..stages.contract import Param, Stage
from ..qnn import provider_options
from ..targets import get as get_target


def _run(fn, *args, cwd=None, **kwargs) -> int:
    """``fn(*args, **kwargs)`` in a fresh process (in ``cwd``); returns its peak RSS in bytes (0 if unknown)."""
    from ..proc.child import run_function

    r = run_function(fn, *args, cwd=cwd, timeout=24 * 3600, forward=True, **kwargs)
    if r.returncode != 0:
        raise RuntimeError(f"LLM compile failed (exit {r.returncode}):\n{r.tail(2000)}")
    return r.peak_rss or 0


def compile_llm(src: Path, out: Path, params: dict, parts=None, bundle: bool = True) -> dict:
    """Compile every part of the QDQ export in ``src`` into ``out`` for ``params["target"]``,
    one graph per child process (one part's QDQ graph in memory at a time).
    ``parts``: indices to compile (default all; the ``compile.part{k}`` stage compiles one).
    ``bundle``: also write ``export.json``, the embedding file and ``genai_config.json``
    (:func:`write_bundle`; the build's ``bundle`` stage does it once for every part).
    ``params["per_graph"]`` (default True): also one binary per graph beside the weight-shared
    one (always without ``weight_sharing``).
    Returns per part: binary sizes (bytes; ``single_bytes`` only with per-graph binaries), the
    shared/single size ratio (with both), ``seconds`` and
    ``peak_rss`` (bytes, the largest compile process of the part). Raises RuntimeError with
    the child's output when a compile fails (e.g. a node not on HTP)."""
    from . import qnn as llm_qnn
    import time

    target = get_target(params["target"]).name  # a KeyError listing the targets, before any child starts
    desc = json.loads((src / "export.json").read_text())
    if bundle:
        write_bundle(desc, src, out, params)
    from .. import progress

    todo = [p for p in desc["parts"] if parts is None or p["index"] in parts]
    sharing = params.get("weight_sharing", True)
    per_graph = params.get("per_graph", True) or not sharing
    bar = progress.bar(what="graphs", total=len(todo) * (2 * per_graph + sharing), unit="graph")
    sizes = []
    for p in todo:
        i = p["index"]
        t0, peaks = time.perf_counter(), []
        pre, dec = (str(src / p[g]["path"]) for g in ("prefill", "decode"))
        here = Path(pre).parent  # the child's working folder: graph names from relative paths
        single = out / f"part{i}"
        row = {"part": i}
        if per_graph:
            for g, path in (("prefill", pre), ("decode", dec)):
                peaks.append(_run(llm_qnn.compile_single, path, str(single), cwd=here, name=g, target=target))
                bar.update()
            row["single_bytes"] = {g: sum(b.stat().st_size for b in single.glob(f"{g}_ctx*.bin"))
                                   for g in ("prefill", "decode")}
        if sharing:
            shared = out / "shared" / f"part{i}"
            peaks.append(_run(llm_qnn.compile_shared, pre, dec, str(shared), target, cwd=here))
            bar.update()
            row["shared_bytes"] = sum(b.stat().st_size for b in shared.glob("*.bin"))
            if per_graph:
                row["shared_ratio"] = row["shared_bytes"] / sum(row["single_bytes"].values())
        row.update(seconds=time.perf_counter() - t0, peak_rss=max(peaks))
        sizes.append(row)
    bar.close()
    return {"parts": sizes, "qnn_sdk": sorted({_sdk(c) for c in out.rglob("*_ctx.onnx")})}


def write_bundle(desc: dict, embed_dir: Path, out: Path, params: dict) -> None:
    """What a bundle holds beside the parts' binaries: ``export.json`` (``desc``, every part's
    graph I/O, what LLMRunner reads), the host-side embedding table (``embed: separate``,
    copied from ``embed_dir``) and ``genai_config.json`` for onnxruntime-genai (only when
    part 0 takes ``input_ids``: genai's pipeline starts from them), naming the weight-shared
    binaries when ``params["weight_sharing"]``, else the per-graph ones."""
    from .genai import bundle_files, write_genai_config

    (out / "export.json").write_text(json.dumps(desc, indent=1))
    if desc.get("embed_file"):
        shutil.copyfile(Path(embed_dir) / desc["embed_file"], out / desc["embed_file"])
    shared = params.get("weight_sharing", True)
    if desc["embed"] == "part0":
        write_genai_config(desc, out / "genai_config.json", bundle_files(desc, "shared" if shared else ""),
                           provider_options=provider_options(params["target"]))


def _sdk(ctx: Path) -> str:
    from ..qnn import ep_context_info

    return next((n.get("ep_sdk_version", "?") for n in ep_context_info(ctx)), "?")


# ---- the compile stage, the LLM implementation (the contract: tasks/stages/__init__.py)
#
# compile, the LLM implementation (encoders: ``tasks/encoder/compile.py``): per part, the
# prefill and decode graphs each into their own context binary and, with ``weight_sharing``,
# both into one weight-shared binary, each compile in its own process (``tasks/llm/compile.py``);
# ``genai_config.json`` for onnxruntime-genai (``tasks/llm/genai.py``).

WEIGHT_SHARING = Param("compile", "weight_sharing", bool, True, "compile prefill+decode of a part into one binary")


def run(inputs, files, params, out: Path) -> dict:
    """Compile part ``params["part"]`` of ``inputs["model"]`` for ``params["target"]`` into
    ``out/part{k}/`` (per-graph binaries) and ``out/shared/part{k}/`` (weight-shared). Returns
    the part's row (wall time, peak RSS, binary sizes, shared/single ratio) and ``binaries``
    ({binary: figures}, :func:`read_back`). Raises the memory check's error before work,
    RuntimeError with the compile child's output, context_binary.Mismatch when a binary is not
    what was planned."""
    from .memory import check_export_stage, weight_bits_of

    # the recipe's own bits (a w8a16 LLM was counted at 4 before: issue 22)
    check_export_stage("compile", inputs["model"], weight_bits_of(inputs["model"]), part=params["part"])
    info = compile_llm(inputs["model"], out, params, parts={params["part"]}, bundle=False)
    desc = json.loads((Path(inputs["model"]) / "export.json").read_text())
    return {**info, "binaries": read_back(out, desc, [params["part"]], params, qdq_dir=inputs["model"])}


def planned_models(k: int, per_graph: bool, sharing: bool) -> list[str]:
    """The EPContext models compile makes for part ``k`` (paths relative to its output): the
    prefill and decode graphs each in a binary of its own (``part{k}/``, with ``per_graph``)
    and both in one weight-shared binary (``shared/part{k}/``, with ``sharing``)."""
    folders = ([f"part{k}"] if per_graph or not sharing else []) + ([f"shared/part{k}"] if sharing else [])
    return [f"{d}/{g}_ctx.onnx" for d in folders for g in ("prefill", "decode")]


def read_back(compiled: Path, desc: dict, parts: list[int], params: dict, qdq_dir: Path | None = None,
              declared: dict | None = None, somewhere: list | None = None) -> dict:
    """Read back the context binaries of ``parts`` under ``compiled`` and check them
    (:func:`tasks.context_binary.check_models`): every planned model (:func:`planned_models`)
    and its binary, each binary holding exactly its models' graphs, every input and output as
    the export declared it (``desc``, ``export.json``: name and shape) and, with ``qdq_dir``, as
    the QDQ graph had it (name, dtype, shape); the SoC model of ``params["target"]``;
    ``declared`` adds a runtime config's tensors ({model: Declared}), ``somewhere`` tensors it
    looks for in any graph ([Declared]). Returns {binary: figures}.
    Raises context_binary.Mismatch, one line per difference."""
    from .. import context_binary

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
            exported = context_binary.Declared({t["name"]: tuple(t["shape"]) for t in row[g]["inputs"]},
                                               {t["name"]: tuple(t["shape"]) for t in row[g]["outputs"]}, "export.json")
            said[rel] = [exported, *([declared[rel]] if declared and rel in declared else [])]
    for rel, d in (declared or {}).items():  # a model the runtime config names that the plan did not make
        said.setdefault(rel, [d])
    found = context_binary.check_models(compiled, models, params["target"],
                                        qdq=qdq or None, declared=said, somewhere=somewhere)
    return {rel: b.figures() for rel, b in sorted(found.items())}


STAGE = Stage(
    kind="compile", family="llm", module=__name__, version=3,  # 3: every binary read back
    tools=("onnxruntime", "onnxruntime-qnn", "qnn-sdk", "onnx"), run=run,
    params=(WEIGHT_SHARING,), wired=("target", "part", "per_graph"),
    key_exclude=("target",),  # the name; the key holds what it resolves to (key_extra)
    key_extra=target_key_extra, artifacts=COMPILE_ARTIFACTS,
)

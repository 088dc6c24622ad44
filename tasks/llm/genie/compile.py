"""The genie_compile stage, the LLM implementation (the contract: tasks/contract/__init__.py): part
k's Genie-layout QDQ graphs (``genie_quantize.part{k}``, :mod:`tasks.llm.genie.quantize`) into QNN
context binaries for ``params["target"]``, named as Genie and AI Hub name them. Writes

- ``genie/part{k}/prompt_ar{S}_cl{C}_{k+1}_of_{N}.bin`` and ``.../token_ar1_cl{C}_{k+1}_of_{N}.bin``:
  one graph per binary (with ``per_graph``: what the x86_64 HTP simulator can run, so what
  verify runs through Genie; and what ships without ``weight_sharing``);
- ``genie/{model_type}_part_{k+1}_of_{N}.bin``: both graphs in one weight-shared binary (with
  ``weight_sharing``), AI Hub's per-part file, what ``genie_config.json`` names.

Graph I/O stays float32 (``input_ids`` int32): onnxruntime-qnn's ``offload_graph_io_quantization=0``
keeps each input's QuantizeLinear and each output's DequantizeLinear inside the QNN graph, as
for the genai graphs (tasks/llm/htp.py).

Graph names: onnxruntime names a compiled graph ``QNNExecutionProvider_QNNExecutionProvider_<hash>_1_0``
(the hash is of the model path, onnxruntime's ``ModelMetadefIdGenerator``). Routes tried for
a real name, onnxruntime 1.32.0 + onnxruntime-qnn 2.7.0: ``ep.context_node_name_prefix``
(accepted, the binary's graph name unchanged: measured here on the token graph), the ONNX
graph's name (already ``token_ar1_...``; not used), ``onnxruntime.ModelCompiler`` (options:
embed mode, external initializers, flags, optimization level, binary information: no name).
So the binary is patched (:func:`tasks.llm.genie.binaries.rename_graphs`: the old name's bytes replaced
by the new name ``_``-padded to the same length), and its ``_ctx.onnx`` is dropped (it names
the old graph; Genie reads the binaries only). Every binary is then read back through
libQnnSystem (:func:`tasks.llm.genie.binaries.check_binaries`): the patched names, the I/O the Genie
export declared, the target's SoC; and these are the bytes the bundle ships and verify runs.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from tasks.contract.common import target_key_extra
from tasks.contract.stage import Stage
from tasks.contract.params import WEIGHT_SHARING
from tasks.llm.genie.names import planned_binaries
from tasks.llm.memory import plan_estimate


def _ort_names(ctx_models: list[Path]) -> list[str]:
    """The graph names onnxruntime gave, from each EPContext model's node names (in order)."""
    import onnx

    return [
        n.name
        for m in ctx_models
        for n in onnx.load(str(m), load_external_data=False).graph.node
        if n.op_type == "EPContext"
    ]


def run(inputs, files, params, out: Path) -> dict:
    """Compile part ``params["part"]`` of the Genie QDQ graphs in ``inputs["model"]`` into
    ``out/genie/`` (module docstring), each compile in its own process. Returns {"binaries":
    {binary: figures} (:func:`tasks.llm.genie.binaries.check_binaries`), "renamed": {binary: {onnxruntime
    name: name as written}}, "seconds"}. Raises RuntimeError with the compile child's output,
    context_binary_checks.Mismatch when a binary is not what was planned, the memory check's
    error before work (:func:`tasks.llm.memory.check_genie_stage`)."""
    import time

    from tasks.qnn.targets import get as get_target
    from tasks.llm import htp
    from tasks.llm.part_binaries import run_child
    from tasks.llm.genie.binaries import check_binaries, rename_graphs
    from tasks.llm.memory import check_genie_stage, weight_bits_of

    src, k = Path(inputs["model"]), params["part"]
    target = get_target(params["target"]).name
    desc = json.loads((src / "genie_export.json").read_text())
    check_genie_stage(
        "genie_compile",
        json.loads((src / "config.json").read_text(encoding="utf-8")),
        parts=len(desc["parts"]),
        seq_len=desc["seq_len"],
        context_len=desc["context_len"],
        part=k,
        weight_bits=weight_bits_of(src),
    )
    p = desc["parts"][k]
    sharing, per_graph = params.get("weight_sharing", True), params.get("per_graph", True)
    plan = planned_binaries(desc, k, per_graph, sharing)
    here = (src / p["prompt"]["path"]).parent  # the child's working folder: graph names from relative paths
    paths = {kind: str(src / p[kind]["path"]) for kind in ("prompt", "token")}
    renamed, t0 = {}, time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="genie-compile-") as tmp:
        for rel, graphs in plan.items():
            dest = out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            work = Path(tmp) / rel.replace("/", "_")
            if len(graphs) == 1:
                kind = "prompt" if graphs[0] == p["prompt"]["graph"] else "token"
                run_child(htp.compile_single, paths[kind], str(work), cwd=here, name=graphs[0], target=target)
            else:
                run_child(
                    htp.compile_shared,
                    paths["prompt"],
                    paths["token"],
                    str(work),
                    target,
                    cwd=here,
                    names=tuple(graphs),
                )
            bins = sorted(work.glob("*.bin"))
            if len(bins) != 1:
                raise RuntimeError(f"compiling {rel}: expected one context binary, found {[b.name for b in bins]}")
            old = _ort_names([work / f"{g}_ctx.onnx" for g in graphs])
            shutil.move(str(bins[0]), dest)
            renamed[rel] = rename_graphs(dest, dict(zip(old, graphs)))
    shutil.copyfile(src / "genie_export.json", out / "genie_export.json")  # every part's I/O, for bundle and verify
    found = check_binaries(out, plan, desc, target)
    return {"binaries": found, "renamed": renamed, "seconds": time.perf_counter() - t0}


STAGE = Stage(
    kind="genie_compile",
    module=__name__,
    version=1,
    tools=("onnxruntime", "onnxruntime-qnn", "qnn-sdk", "onnx"),
    run=run,
    params=(WEIGHT_SHARING,),
    wired=("target", "part", "per_graph"),
    key_exclude=("target",),  # the name; the key holds what it resolves to (key_extra)
    key_extra=target_key_extra,
    artifacts=("*.bin",),
    memory_estimate=plan_estimate,
)

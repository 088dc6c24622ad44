"""The file names of a model's Genie context binaries, relative to a ``genie_compile.part{k}``
entry or the bundle: AI Hub's per-part weight-shared ``genie/{model_type}_part_{i}_of_{N}.bin``
and the per-graph ``genie/part{k}/{graph}.bin`` (``desc``: ``genie_export.json``,
:func:`tasks.llm.genie.graphs.export_genie`).
"""

from __future__ import annotations


def shared_name(desc: dict, k: int) -> str:
    """AI Hub's file name of part ``k``'s weight-shared binary: ``{model_type}_part_{k+1}_of_{N}.bin``."""
    return f"{desc['model_type']}_part_{k + 1}_of_{len(desc['parts'])}.bin"


def planned_binaries(desc: dict, k: int, per_graph: bool, sharing: bool) -> dict[str, list[str]]:
    """{binary path relative to the stage's output: the graph names it holds} for part ``k``."""
    p, out = desc["parts"][k], {}
    if per_graph or not sharing:
        for kind in ("prompt", "token"):
            out[f"genie/part{k}/{p[kind]['graph']}.bin"] = [p[kind]["graph"]]
    if sharing:
        out[f"genie/{shared_name(desc, k)}"] = [p["prompt"]["graph"], p["token"]["graph"]]
    return out


def genie_files(desc: dict, weight_sharing: bool) -> list[str]:
    """The ``ctx-bins`` of ``genie_config.json``, relative to the bundle: the parts' weight-shared
    binaries in part order, else every part's prompt graph then every part's token graph (Genie
    groups graphs by AR and orders a group's splits by ``_{i}_of_{N}``)."""
    if weight_sharing:
        return [f"genie/{shared_name(desc, k)}" for k in range(len(desc["parts"]))]
    return [f"genie/part{p['index']}/{p[kind]['graph']}.bin" for kind in ("prompt", "token") for p in desc["parts"]]


def joined_genie_description(entries) -> dict:
    """The whole model's ``genie_export.json`` from the parts' ``genie_compile`` (or
    ``genie_quantize``) entries, in part order: entry 0's description with part k's row taken
    from entry k, whose quantize stage declared that part's quantized boundary tensors (dtype,
    scale, zero point: :mod:`tasks.llm.boundary`); the other rows of an entry are as exported.
    Raises ValueError when the entries describe different models (graph names differ)."""
    import json
    from pathlib import Path

    descs = [json.loads((Path(e) / "genie_export.json").read_text()) for e in entries]
    out = descs[0]
    for k, d in enumerate(descs):
        names = [(p["prompt"]["graph"], p["token"]["graph"]) for p in d["parts"]]
        if names != [(p["prompt"]["graph"], p["token"]["graph"]) for p in out["parts"]]:
            raise ValueError(f"{entries[k]}/genie_export.json: expected the graphs of {entries[0]}, found {names}")
        out["parts"][k] = d["parts"][k]
    return out

"""What a recipe's catalog row (:mod:`tasks.core.row`) says of the model itself, read from the
recipe and its download and export entries: the source (:func:`source_info`: where from, the
resolved commit, a package's version and licence), the licence shown (:func:`licence`), the
architecture from config.json (:func:`architecture`) and the parameter count
(:func:`parameter_count`).
"""

from __future__ import annotations

import json
import math

from tasks.store.entry import Entry

_FLOAT_TYPES = frozenset({1, 10, 11, 16})  # onnx.TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


def source_info(recipe, download: Entry | None) -> dict:
    """The recipe's source (kind, repo/revision/path/package) plus, from the download
    entry's manifest when given, ``commit``, ``package_version`` and ``content_digest``."""
    s = recipe.source
    out = {
        "kind": s.kind,
        "repo": s.hf,
        "revision": s.revision,
        "path": s.path,
        "package": s.package,
        "subdir": s.subdir or None,
        "file": s.file,
    }
    if download is not None:
        info, extra = download.manifest.get("info", {}), download.manifest.get("extra", {})
        out.update(
            commit=info.get("commit") or extra.get("commit"),
            package_version=info.get("package_version"),
            content_digest=extra.get("content"),
            license=(info.get("license") or {}).get("summary"),
        )
    elif s.file is not None:  # what the installed package declares, before a build (its metadata, read)
        from tasks.sources import SourceError
        from tasks.sources.licence import package_licence

        try:
            out["license"] = package_licence(s.package)["summary"]
        except SourceError:
            pass
    return {k: v for k, v in out.items() if v is not None}


def licence(recipe, source: dict) -> str:
    """The row's ``license``: the recipe's ``license``, and for a package file source what the
    package declares (``source["license"]``: metadata and licence files, both when they
    disagree), with the recipe's when it says something else."""
    found = source.get("license")
    if not found:
        return recipe.license
    if recipe.license == "unknown" or found.lower().startswith(recipe.license.lower()):
        return found
    return f"{found}; the recipe says {recipe.license}"


def architecture(download: Entry) -> dict | None:
    """{"model_type", "architectures"} from the source's config.json, or None if absent."""
    p = download.out / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {"model_type": cfg.get("model_type"), "architectures": cfg.get("architectures") or []}


def parameter_count(download: Entry, *exports: Entry) -> int | None:
    """The model's parameters: the elements of the tensors in the source's ``*.safetensors``
    files (headers only, through ``safetensors.safe_open``), what the model card of a Hugging
    Face model counts; a tied LM head is counted once. Without safetensors, the elements of the
    floating-point initializers and ``Constant`` nodes (paddle2onnx writes PP-OCR's weights as
    Constant nodes) of the exports' fp32 ONNX graphs, unique by name across graphs
    (an LLM's graphs also hold constant rotary and mask tables and a tied head's copy: the tiny
    Qwen2 counts 2.57 M there, 2.36 M in its checkpoint). None when neither exists."""
    shards = sorted(download.out.rglob("*.safetensors"))
    if shards:
        from safetensors import safe_open

        total = 0
        for f in shards:
            with safe_open(str(f), framework="numpy") as st:
                total += sum(math.prod(st.get_slice(name).get_shape()) for name in st.keys())
        return total
    import onnx

    seen: dict[str, int] = {}
    graphs = sorted(p for export in exports for p in export.out.rglob("*.onnx"))
    for g in graphs:
        m = onnx.load(str(g), load_external_data=False)
        consts = [
            (n.output[0], a.t)
            for n in m.graph.node
            if n.op_type == "Constant"
            for a in n.attribute
            if a.name == "value"
        ]
        for name, t in [(t.name, t) for t in m.graph.initializer] + consts:
            if t.data_type in _FLOAT_TYPES and name not in seen:
                seen[name] = math.prod(t.dims)
    return sum(seen.values()) if graphs else None

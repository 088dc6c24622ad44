"""A recipe's catalog row (:func:`catalog_row`): what the catalog lists of a recipe and what
publish's model card and manifest quote. A row is plain data (JSON), from the recipe and its
state (a :class:`tasks.core.status.RecipeStatus`, called ``status`` or ``st`` below); it reads the
local cache alone. Its fields:

  ==================  =======================================================================
  ``name``            recipe name (str)
  ``state``           one of the states of :mod:`tasks.core.status` (str)
  ``reason``          why not built / stale: the first missing stage and why; built-no-bars: that
                      no bar judged it (str or null)
  ``failures``        verify failures, one line each (list of str; empty unless verify-failed)
  ``description``,    from the recipe (str)
  ``task``, ``family``
  ``license``         the recipe's; for a package file source what the package declares in its
                      metadata and licence files, both when they disagree (:func:`tasks.core.model_info.licence`)
  ``precision``       quantization, e.g. ``w8a16`` (str)
  ``targets``         SoC targets, e.g. ``["x-elite"]`` (list of str)
  ``batch_size``      export batch size (int)
  ``sequence_length`` tokens per call: encoder input length, or LLM prefill length (int)
  ``context_length``  LLM KV-cache length (int); null for encoders
  ``parts``           LLM parts (int: each built by stages of its own, ``quantize.part{k}``...;
                      their keys are in ``stage_keys``); null for encoders
  ``shape_build``     true for a shape build (random weights of the model's exact config:
                      ``tasks/sources/shape.py``): its verify figures are not the model's quality
  ``source``          ``kind`` (hf/shape/path/package) and ``repo``/``revision``/``path``/``package``/
                      ``file`` from the recipe; ``license`` (a package file source: the package's
                      declared licence, :func:`tasks.sources.licence.package_licence`'s summary); once built also
                      ``commit`` (hf: the resolved 40-hex commit), ``package_version`` and ``content_digest`` (xxh3 of a
                      local folder) from the download entry's manifest
  ``stage_keys``      {stage name: 32-hex key, or null when it cannot be computed now}
  ``architecture``    built only: {``model_type``, ``architectures``} from the source's
                      config.json (else null)
  ``parameters``      built only: the model's parameters (int) = elements of the source's
                      safetensors tensors, else of the export's fp32 ONNX initializers,
                      unique by name across its graphs (:func:`tasks.core.model_info.parameter_count`)
  ``artifacts``       built only: {target: {file: bytes}} of the compile entries' artifact
                      files (the compile implementations' ``artifacts``: ``*_ctx.onnx``, ``*.bin``,
                      ``genai_config.json``, ``export.json``)
  ``artifact_bytes``  built only: their total size in bytes (int)
  ``verify``          built only: {target: {``backend``, ``runtime`` (LLMs: "runner" or
                      "genai", what generated on the compiled graphs; else None), ``metrics``
                      {name: float}, ``thresholds`` {name: float}, ``failures`` [str],
                      ``cpu_nodes`` {op type: count} left on the CPU, ``runs_on`` (str)}}
  ``runs_on``         built only: ``npu`` when every node of the compiled graphs is on QNN HTP,
                      else ``npu+cpu (<op type> x<count>, ...)`` (:func:`tasks.contract.report.runs_on`)
  ``tools``           built only: {``qnn-sdk``, ``onnxruntime``, ``onnxruntime-qnn``,
                      ``optimum``, ``transformers``: version str} as recorded in the entries'
                      manifests (several values joined by ", " if targets differ)
  ``qnn_context_sdk`` built only: SDK versions written into the EPContext nodes (list of str)
  ``io``              built only: the export's ``io.json`` when it wrote one (a graph from an ONNX
                      file: its inputs, outputs, preprocessing or stream, decoding), else null
  ``parameters_estimate``  LLMs: parameters from the model's config (int; a tied head once), known
                      before a build (the download's config.json, a local source's, or the
                      facts kept in ``recipes/models/``); null when none is readable
  ``device``          LLMs: {target: on-device figures}: ``bundle_bytes`` (read back from
                      verify.json once built, else estimated) and ``bundle_bytes_from``,
                      ``kv_cache_bytes``, ``memory_bytes`` (+ ``memory_includes``, ``memory_note``:
                      the runtime's own is not included), ``bytes_per_token``,
                      ``dram_gbps`` + ``dram_source``, ``decode_tokens_per_s_ceiling``,
                      ``npu_tops`` + ``npu_source``, ``prefill_ops``,
                      ``first_token_s_lower_bound``, ``note`` (they are ceilings);
                      formulas: :mod:`tasks.llm.figures`. null for encoders
  ==================  =======================================================================

Built-only fields are null for ``stale`` and ``not-built`` rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType

from tasks.contract.report import runs_on as where_runs, runtimes_checked
from tasks.core.model_info import architecture, licence, parameter_count, source_info
from tasks.core.state import artifacts

#: tool -> the stage kind whose entries record its version
CATALOG_TOOLS = MappingProxyType(
    {
        "qnn-sdk": "compile",
        "onnxruntime": "compile",
        "onnxruntime-qnn": "compile",
        "optimum": "export",
        "transformers": "export",
    }
)
BUILT = ("verified", "verify-failed", "built-no-bars")  # the states whose every stage has an entry
LABELS = MappingProxyType({"built-no-bars": "built (no bars)"})  # a state as people read it (:func:`label`)


def _recipe_fields(recipe) -> dict:
    """The row's fields that the recipe alone says, in the row's order (a built row and an
    unsupported one alike)."""
    ex = recipe.export
    return {
        "description": recipe.description,
        "license": recipe.license,
        "task": recipe.task,
        "family": ex.family,
        "precision": recipe.quantize.precision,
        "targets": list(recipe.compile.targets),
        "batch_size": ex.batch_size if _export_reads(ex.family, "export.batch_size") else None,
        "sequence_length": ex.sequence_length if _export_reads(ex.family, "export.sequence_length") else None,
    }


def _export_reads(family_name: str, key: str) -> bool:
    """Whether the family's export stage reads recipe key ``key`` (its declared params): a row
    states ``sequence_length`` or ``batch_size`` only for a family whose graph they shape
    (an image or audio graph's dims come from its own keys)."""
    from tasks.contract import implementation

    return any(p.key == key for p in implementation("export", family_name).params)


def label(state: str) -> str:
    """``state`` as a person reads it: ``built (no bars)`` for ``built-no-bars``, else the name."""
    return LABELS.get(state, state)


def artifact_sizes(status) -> dict:
    """{target: {file: bytes}} of the compile entries' artifact files (:func:`tasks.core.state.artifacts`)."""
    out: dict = {}
    for a in artifacts(status.build).values():
        if a.kind in ("compile", "bundle"):
            out.setdefault(a.target, {})[a.rel] = a.size
    return out


def verify_results(status) -> dict:
    """{target: {"backend", "runtime", "metrics", "thresholds", "failures", "cpu_nodes", "runs_on",
    "binaries" (each context binary read back: bytes, SDK build id, SoC, per graph weight /
    shared weight / spill-fill / I/O bytes), "runtimes" (how each runtime served was checked:
    :func:`tasks.contract.report.runtimes_checked`), "boundary" (LLMs: float32 tensors left at the
    shipped graphs' boundary, traffic: ``tasks.llm.verify.boundary_report``)}} from each verify
    entry; ``runtime`` (LLMs) is what generated on the compiled graphs: "runner" (LLMRunner) or
    "genai" (onnxruntime-genai), None for encoders."""
    out = {}
    for s in status.build.of_kind("verify"):
        report = json.loads((s.entry.out / "verify.json").read_text(encoding="utf-8"))
        cpu = report.get("cpu_nodes", {})
        out[s.target] = {
            "backend": report.get("backend"),
            "runtime": report.get("runtime"),
            "metrics": report.get("metrics", {}),
            "thresholds": s.spec.params.get("thresholds", {}),
            "failures": list(s.failures),
            "cpu_nodes": cpu,
            "runs_on": where_runs(cpu),
            "binaries": report.get("binaries", {}),
            "runtimes": runtimes_checked(report),
            "boundary": report.get("boundary"),
        }
    return out


def runs_on(row: dict) -> str | None:
    """``npu`` when every target's compiled graphs run all on HTP, else what runs on the CPU
    (:func:`tasks.contract.report.runs_on`, per target when they differ); None before a build."""
    if not row["verify"]:
        return None
    said = {t: v["runs_on"] for t, v in sorted(row["verify"].items())}
    if len(set(said.values())) == 1:
        return next(iter(said.values()))
    return "; ".join(f"{t}: {v}" for t, v in said.items())


def arch(row: dict) -> str:
    """A row's ``architecture`` as one line: ``model_type (Architectures, ...)``; "" before a build."""
    a = row["architecture"]
    if not a:
        return ""
    return (a.get("model_type") or "") + (f" ({', '.join(a['architectures'])})" if a.get("architectures") else "")


def tool_versions(status, names=CATALOG_TOOLS) -> dict:
    """{tool: version} for ``names`` ({tool: stage kind}) as recorded in the manifests of the
    entries of that kind; several distinct versions are joined with ", "; "not used" when
    entries of that kind exist and none records the tool (an LLM's export runs no optimum),
    "unknown" when there is no such entry (not built)."""
    out = {}
    for tool, kind in names.items():
        ents = [e for e in status.entries.values() if e.kind == kind]
        vals = sorted({e.manifest.get("tools", {}).get(tool) for e in ents} - {None})
        out[tool] = ", ".join(vals) if vals else "not used" if ents else "unknown"
    return out


def catalog_row(name: str, recipe, st) -> dict:
    """One catalog row (schema in the module docstring) for recipe ``name``: ``recipe`` its
    Recipe, ``st`` its state (:func:`tasks.core.status.recipe_status`)."""
    row = {
        "name": name,
        "reason": st.reason,
        "failures": st.failures,
        # a shape build is never a verified model, whatever its (random) verify measured
        "state": "shape-built" if recipe.source.shape and st.state in BUILT else st.state,
        **_recipe_fields(recipe),
        "context_length": None,
        "parts": None,  # the family's (_family_fields)
        "stage_keys": st.stage_keys,
        "source": source_info(recipe, st.entries.get("download")),
        # random weights of the model's exact config (tasks/sources/shape.py): its figures are time,
        # memory and the cost of quantizing a random network, never the model's quality
        "shape_build": recipe.source.shape,
        "architecture": None,
        "parameters": None,
        "artifacts": None,
        "artifact_bytes": None,
        "verify": None,
        "tools": None,
        "qnn_context_sdk": None,
        "runs_on": None,
        "io": None,
    }
    row["license"] = licence(recipe, row["source"])
    if st.state in BUILT:
        ents = st.entries
        arts = artifact_sizes(st)
        sdks = sorted(
            {v for s, e in ents.items() if e.kind == "compile" for v in e.manifest.get("info", {}).get("qnn_sdk", [])}
        )
        io = [e.out / "io.json" for e in ents.values() if e.kind == "export" and (e.out / "io.json").is_file()]
        row["io"] = json.loads(io[0].read_text(encoding="utf-8")) if io else None
        row.update(
            architecture=architecture(ents["download"]),
            parameters=parameter_count(ents["download"], *[e for e in ents.values() if e.kind == "export"]),
            artifacts=arts,
            artifact_bytes=sum(sum(f.values()) for f in arts.values()),
            verify=verify_results(st),
            tools=tool_versions(st),
            qnn_context_sdk=sdks,
        )
        row["runs_on"] = runs_on(row)
    row.update(_family_fields(recipe, st, row))
    return row


def _family_fields(recipe, st, row: dict) -> dict:
    """The row's fields the recipe's family states (``context_length``, ``parts``,
    ``parameters_estimate``, ``device`` per target: :data:`tasks.contract.model_family.CATALOG_FIELDS`),
    from its ``catalog_fields`` hook (:class:`tasks.contract.model_family.Family`); null where
    it states none (encoders: all). Raises ValueError when the hook returns another field."""
    from tasks.contract import family
    from tasks.contract.model_family import CATALOG_FIELDS

    out = dict.fromkeys(CATALOG_FIELDS)
    hook = family(recipe.export.family).catalog_fields
    if hook is None:
        return out
    dl = st.entries.get("download") if st is not None else None
    verify = row.get("verify") or {}
    said = hook(
        recipe,
        dl.out if dl is not None else None,
        {t: (verify.get(t) or {}).get("binaries") for t in recipe.compile.targets},
    )
    if set(said) - set(CATALOG_FIELDS):
        raise ValueError(
            f"family {recipe.export.family}: catalog_fields gave "
            f"{sorted(set(said) - set(CATALOG_FIELDS))}, expected fields of {', '.join(CATALOG_FIELDS)}"
        )
    return {**out, **said}


def unsupported_row(stem: str, err) -> dict:
    """The row of a recipe file whose model is unsupported (:class:`tasks.recipe.load.UnsupportedModel`):
    state ``unsupported``, ``reason`` its one line, the recipe's own fields, the rest null."""
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(Path(err.file))
    row = {
        "name": recipe.name,
        "state": "unsupported",
        "reason": err.problems[0][1],
        "failures": [],
        **_recipe_fields(recipe),
        "context_length": None,
        "parts": None,
        "stage_keys": {},
        "source": source_info(recipe, None),
        "architecture": None,
        "parameters": None,
        "artifacts": None,
        "artifact_bytes": None,
        "verify": None,
        "tools": None,
        "qnn_context_sdk": None,
        "runs_on": None,
        "io": None,
    }
    row.update(_family_fields(recipe, None, row))
    return row

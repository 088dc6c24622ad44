"""The catalog: every recipe, its state and, once built, what came out (``doit catalog``).

Reads recipes, ``build/<recipe>/stages.json`` and cache manifests only: it never builds,
never fetches (a Hub source that is offline shows as ``not-built``) and never moves a damaged
cache entry (it reads entries with :meth:`Cache.problems`, not :meth:`Cache.lookup`).

States (:func:`recipe_status`):

=================  ==========================================================================
``verified``       every stage has an intact cache entry and every verify passes its thresholds
``verify-failed``  every stage has an entry, and some verify is below (or above) a threshold
``stale``          some stage has no entry for its current key, but ``build/<recipe>/stages.json``
                   records a complete earlier build (every verify stage recorded)
``not-built``      some stage has no entry and no complete build was ever recorded here
``shape-built``    a shape build (random weights of the model's exact config) whose every stage
                   has an entry: its verify figures are measured, never judged as quality
``unsupported``    a valid recipe of a model the LLM export does not implement
                   (:class:`tasks.recipe.UnsupportedModel`); ``reason`` says what
=================  ==========================================================================

Abstract recipes (templates, ``abstract: true``) are left out, as from the doit tasks.

Output (:func:`write_catalog`, in :func:`tasks.paths.catalog_dir`):

- ``catalog.json``: ``{"schema_version": 1, "recipes": [row, ...]}``, rows sorted by recipe
  name, keys sorted, 2-space indent, no timestamps (same inputs, same bytes). A row:

  ==================  =======================================================================
  ``name``            recipe name (str)
  ``state``           one of the four states above (str)
  ``reason``          why not built / stale: the first missing stage and why (str or null)
  ``failures``        verify failures, one line each (list of str; empty unless verify-failed)
  ``description``,    from the recipe (str)
  ``license``,
  ``task``, ``family``
  ``precision``       quantization, e.g. ``w8a16`` (str)
  ``targets``         SoC targets, e.g. ``["x-elite"]`` (list of str)
  ``batch_size``      export batch size (int)
  ``sequence_length`` tokens per call: encoder input length, or LLM prefill length (int)
  ``context_length``  LLM KV-cache length (int); null for encoders
  ``parts``           LLM parts (int: each built by stages of its own, ``quantize.part{k}``...;
                      their keys are in ``stage_keys``); null for encoders
  ``shape_build``     true for a shape build (random weights of the model's exact config:
                      ``tasks/sources/shape.py``): its verify figures are not the model's quality
  ``source``          ``kind`` (hf/shape/path/package) and ``repo``/``revision``/``path``/``package``
                      from the recipe; once built also ``commit`` (hf: the resolved 40-hex
                      commit), ``package_version`` and ``content_digest`` (xxh3 of a local
                      folder) from the download entry's manifest
  ``stage_keys``      {stage name: 32-hex key, or null when it cannot be computed now}
  ``architecture``    built only: {``model_type``, ``architectures``} from the source's
                      config.json (else null)
  ``parameters``      built only: the model's parameters (int) = elements of the source's
                      safetensors tensors, else of the export's fp32 ONNX initializers,
                      unique by name across its graphs (:func:`parameter_count`)
  ``artifacts``       built only: {target: {file: bytes}} of the compile entries' artifact
                      files (the compile implementations' ``artifacts``: ``*_ctx.onnx``, ``*.bin``,
                      ``genai_config.json``, ``export.json``)
  ``artifact_bytes``  built only: their total size in bytes (int)
  ``verify``          built only: {target: {``backend``, ``runtime`` (LLMs: "runner" or
                      "genai", what generated on the compiled graphs; else None), ``metrics``
                      {name: float}, ``thresholds`` {name: float}, ``failures`` [str],
                      ``cpu_nodes`` {op type: count} left on the CPU, ``runs_on`` (str)}}
  ``runs_on``         built only: ``npu`` when every node of the compiled graphs is on QNN HTP,
                      else ``npu+cpu (<op type> x<count>, ...)`` (``tasks.qnn.runs_on``)
  ``tools``           built only: {``qnn-sdk``, ``onnxruntime``, ``onnxruntime-qnn``,
                      ``optimum``, ``transformers``: version str} as recorded in the entries'
                      manifests (several values joined by ", " if targets differ)
  ``qnn_context_sdk`` built only: SDK versions written into the EPContext nodes (list of str)
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
- ``README.md``: the same as a Markdown table, for reading on a code host.
- ``index.html``: the page to choose models with (:mod:`tasks.catalog_page`): filters kept in
  the URL fragment, a quality-versus-size chart, the on-device ceilings, sortable tables and
  links to published bundles; one self-contained file, nothing fetched from the network.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from . import paths, qnn
from .cache import Entry
from .core import recipeset
from .core.keys import NotReady
from .core.resolve import Resolver
from .core.session import Session
from .core.record import read_state
from .core.state import BuildState, artifacts, build_state
from .catalog_table import COLUMNS, human_bytes, human_count, per_target, tps
from .stages.common import runtimes_checked

SCHEMA_VERSION = 1
CATALOG_TOOLS = {"qnn-sdk": "compile", "onnxruntime": "compile", "onnxruntime-qnn": "compile",
                 "optimum": "export", "transformers": "export"}  # tool -> stage kind that records it
_FLOAT_TYPES = {1, 10, 11, 16}  # onnx.TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


class _ReadOnlyResolver(Resolver):
    """A Resolver that never quarantines: a damaged entry counts as missing and stays put."""

    def entry(self, stage: str) -> Entry:
        spec = self.specs[stage]
        key = self.key(stage)
        probs = self.cache.problems(spec.kind, key)
        if probs is None:
            raise NotReady(f"{spec.task} has no cache entry for key {key[:12]}")
        if probs:
            raise NotReady(f"{spec.task}: cache entry {spec.kind}/{key} is damaged ({probs[0]})")
        path = self.cache.entry_path(spec.kind, key)
        return Entry(spec.kind, key, path, json.loads((path / "manifest.json").read_text(encoding="utf-8")))


def catalog_recipes(session: Session | None = None) -> dict:
    """{name: Recipe} of every non-abstract recipe, sorted by name. ``session``: the command's
    (default: a new one). Raises RecipeError."""
    return {n: r for n, r in sorted(recipeset.recipes(session or Session()).items()) if not r.abstract}


@dataclass(frozen=True)
class RecipeStatus:
    """One recipe as the catalog and publish see it: ``state`` (one of :data:`tasks.catalog_table.STATES`), ``reason``
    (the first stage without an entry, and why), ``failures`` (verify's, as "<task>: ..."),
    and the typed build state it was judged from (tasks/core/state.py)."""

    state: str
    reason: str | None
    failures: list[str]
    build: BuildState

    @property
    def stage_keys(self) -> dict[str, str | None]:
        """{stage: key of its entry, None without one}"""
        return {n: s.entry.key if s.entry else None for n, s in self.build.stages.items()}

    @property
    def entries(self) -> dict[str, Entry]:
        return self.build.entries


def recipe_status(name: str, session: Session | None = None) -> RecipeStatus:
    """State of one recipe from the local cache alone (no building, no fetching, no
    quarantining). ``reason`` names the first stage without an entry and why (no entry for its
    key, an upstream missing, a Hub source unavailable offline...); "stale" when the last
    build recorded every verify stage, else "not-built". ``session``: the command's (default: a
    new one). Raises KeyError for an unknown recipe."""
    from .proc.scrubbing import scrub

    session = session or Session()
    last = read_state(session, name)
    b = build_state(_ReadOnlyResolver(session, name), last)
    reasons = [s.problem if s.status != "unknown" else f"{s.task}: {scrub(s.problem)}"
               for s in b.stages.values() if s.entry is None]
    failures = []
    if not reasons:
        failures = [f"{s.task}: {f}" for s in b.of_kind("verify") for f in s.failures]
        state = "verify-failed" if failures else "verified"
    else:
        verifies = [s.name for s in b.of_kind("verify")]
        state = "stale" if verifies and all(v in last for v in verifies) else "not-built"
    return RecipeStatus(state, reasons[0] if reasons else None, failures, b)


# ------------------------------------------------------------ details of a built recipe


def source_info(recipe, download: Entry | None) -> dict:
    """The recipe's source (kind, repo/revision/path/package) plus, from the download
    entry's manifest when given, ``commit``, ``package_version`` and ``content_digest``."""
    s = recipe.source
    out = {"kind": s.kind, "repo": s.hf, "revision": s.revision, "path": s.path, "package": s.package,
           "subdir": s.subdir or None}
    if download is not None:
        info, extra = download.manifest.get("info", {}), download.manifest.get("extra", {})
        out.update(commit=info.get("commit") or extra.get("commit"), package_version=info.get("package_version"),
                   content_digest=extra.get("content"))
    return {k: v for k, v in out.items() if v is not None}


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
    floating-point initializers of the exports' fp32 ONNX graphs, unique by name across graphs
    (an LLM's graphs also hold constant rotary and mask tables and a tied head's copy: the tiny
    Qwen2 counted 2.57 M there, 2.36 M in its checkpoint; a tester). None when neither exists."""
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
        for t in m.graph.initializer:
            if t.data_type in _FLOAT_TYPES and t.name not in seen:
                seen[t.name] = math.prod(t.dims)
    return sum(seen.values()) if graphs else None


def artifact_sizes(status: RecipeStatus) -> dict:
    """{target: {file: bytes}} of the compile entries' artifact files (:func:`tasks.core.state.artifacts`)."""
    out: dict = {}
    for a in artifacts(status.build).values():
        if a.kind in ("compile", "bundle"):
            out.setdefault(a.target, {})[a.rel] = a.size
    return out


def verify_results(status: RecipeStatus) -> dict:
    """{target: {"backend", "runtime", "metrics", "thresholds", "failures", "cpu_nodes", "runs_on",
    "binaries" (each context binary read back: bytes, SDK build id, SoC, per graph weight /
    shared weight / spill-fill / I/O bytes), "runtimes" (how each runtime served was checked:
    :func:`tasks.stages.common.runtimes_checked`)}} from each verify entry; ``runtime`` (LLMs) is what generated on the compiled graphs: "runner" (LLMRunner) or
    "genai" (onnxruntime-genai), None for encoders."""
    out = {}
    for s in status.build.of_kind("verify"):
        report = json.loads((s.entry.out / "verify.json").read_text(encoding="utf-8"))
        cpu = report.get("cpu_nodes", {})
        out[s.target] = {"backend": report.get("backend"), "runtime": report.get("runtime"),
                         "metrics": report.get("metrics", {}), "thresholds": s.spec.params.get("thresholds", {}),
                         "failures": list(s.failures), "cpu_nodes": cpu, "runs_on": qnn.runs_on(cpu),
                         "binaries": report.get("binaries", {}), "runtimes": runtimes_checked(report)}
    return out


def runs_on(row: dict) -> str | None:
    """``npu`` when every target's compiled graphs run all on HTP, else what runs on the CPU
    (``tasks.qnn.runs_on``, per target when they differ); None before a build."""
    if not row["verify"]:
        return None
    said = {t: v["runs_on"] for t, v in sorted(row["verify"].items())}
    if len(set(said.values())) == 1:
        return next(iter(said.values()))
    return "; ".join(f"{t}: {v}" for t, v in said.items())


def tool_versions(status: RecipeStatus, names=CATALOG_TOOLS) -> dict:
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


def catalog_row(name: str, recipe=None, session: Session | None = None) -> dict:
    """One catalog row (schema in the module docstring) for recipe ``name`` (``recipe``: its
    Recipe, default loaded). ``session``: the command's (default: a new one). Raises KeyError
    for an unknown recipe."""
    session = session or Session()
    recipe = recipe or recipeset.recipes(session)[name]
    st = recipe_status(name, session)
    ex = recipe.export
    row = {
        "name": name, "reason": st.reason, "failures": st.failures,
        # a shape build is never a verified model, whatever its (random) verify measured
        "state": "shape-built" if recipe.source.shape and st.state in ("verified", "verify-failed") else st.state,
        "description": recipe.description, "license": recipe.license, "task": recipe.task,
        "family": ex.family, "precision": recipe.quantize.precision, "targets": list(recipe.compile.targets),
        "batch_size": ex.batch_size, "sequence_length": ex.sequence_length,
        "context_length": ex.context_length if ex.family == "llm" else None,
        "parts": ex.parts if ex.family == "llm" else None,
        "stage_keys": st.stage_keys,
        "source": source_info(recipe, st.entries.get("download")),
        # random weights of the model's exact config (tasks/sources/shape.py): its figures are time,
        # memory and the cost of quantizing a random network, never the model's quality
        "shape_build": recipe.source.shape,
        "architecture": None, "parameters": None, "artifacts": None, "artifact_bytes": None,
        "verify": None, "tools": None, "qnn_context_sdk": None, "runs_on": None,
    }
    if st.state in ("verified", "verify-failed"):
        ents = st.entries
        arts = artifact_sizes(st)
        sdks = sorted({v for s, e in ents.items() if e.kind == "compile"
                       for v in e.manifest.get("info", {}).get("qnn_sdk", [])})
        row.update(architecture=architecture(ents["download"]), parameters=parameter_count(ents["download"], *[e for e in ents.values() if e.kind == "export"]),
                   artifacts=arts, artifact_bytes=sum(sum(f.values()) for f in arts.values()),
                   verify=verify_results(st), tools=tool_versions(st), qnn_context_sdk=sdks)
        row["runs_on"] = runs_on(row)
    row.update(_device(recipe, st, row))
    return row


def _device(recipe, st: RecipeStatus | None, row: dict) -> dict:
    """``parameters_estimate`` and ``device`` (per target, :func:`tasks.llm.figures.device_figures`)
    of an LLM row; nulls for an encoder or a model whose config cannot be read offline."""
    if recipe.export.family != "llm":
        return {"parameters_estimate": None, "device": None}
    from .llm.figures import device_figures, parameters, recipe_config

    dl = st.entries.get("download") if st is not None else None
    cfg, _ = recipe_config(recipe, dl.out if dl is not None else None)
    if cfg is None:
        return {"parameters_estimate": None, "device": None}
    verify = row.get("verify") or {}
    return {"parameters_estimate": parameters(cfg),
            "device": {t: device_figures(cfg, recipe, t, (verify.get(t) or {}).get("binaries"))
                       for t in recipe.compile.targets}}


def unsupported_row(stem: str, err) -> dict:
    """The row of a recipe file whose model is unsupported (:class:`tasks.recipe.UnsupportedModel`):
    state ``unsupported``, ``reason`` its one line, the recipe's own fields, the rest null."""
    from .recipe import load_recipe

    recipe = load_recipe(Path(err.file))
    ex = recipe.export
    row = {"name": recipe.name, "state": "unsupported", "reason": err.problems[0][1], "failures": [],
           "description": recipe.description, "license": recipe.license, "task": recipe.task, "family": ex.family,
           "precision": recipe.quantize.precision, "targets": list(recipe.compile.targets),
           "batch_size": ex.batch_size, "sequence_length": ex.sequence_length,
           "context_length": ex.context_length if ex.family == "llm" else None,
           "parts": ex.parts if ex.family == "llm" else None, "stage_keys": {},
           "source": source_info(recipe, None), "architecture": None, "parameters": None, "artifacts": None,
           "artifact_bytes": None, "verify": None, "tools": None, "qnn_context_sdk": None, "runs_on": None}
    row.update(_device(recipe, None, row))
    return row


def catalog_rows(session: Session | None = None) -> list[dict]:
    """Every non-abstract recipe's row, sorted by name. ``session``: the command's (default: a
    new one). Raises RecipeError for an invalid recipe file (the catalog is then not written)."""
    from .errors import UnsupportedModel

    session = session or Session()
    rows = [catalog_row(n, r, session) for n, r in catalog_recipes(session).items()]
    rows += [unsupported_row(stem, e) for stem, e in recipeset.recipe_errors(session).items()
             if isinstance(e, UnsupportedModel)]
    return sorted(rows, key=lambda r: r["name"])


# ------------------------------------------------------------ rendering


def render_markdown(rows: list[dict]) -> str:
    """The catalog as a Markdown document: one table row per recipe, then the reasons of the
    recipes that are not built, stale or failed."""
    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["# Model catalog", "", "Generated by `doit catalog` from recipes and the build cache "
             "(schema: `tasks/catalog.py`). States: verified, verify-failed, stale, not-built.", "",
             "| " + " | ".join(c[0] for c in COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(cell(c[1](r)) for c in COLUMNS) + " |")
    notes = [r for r in rows if r["reason"] or r["failures"]]
    if notes:
        lines += ["", "## Why not verified", ""]
        for r in notes:
            for why in r["failures"] or [r["reason"]]:
                lines.append(f"- **{r['name']}** ({r['state']}): {cell(why)}")
    return "\n".join(lines) + "\n"


#: the terminal table's columns (``doit catalog``, as ``ollama list`` prints): header, cell
TABLE = [("NAME", lambda r: r["name"]), ("STATE", lambda r: r["state"]),
         ("PARAMS", lambda r: human_count(r["parameters"] or r.get("parameters_estimate"))),
         ("PRECISION", lambda r: r["precision"]),
         ("BUNDLE", lambda r: per_target(r, "bundle_bytes", human_bytes) or human_bytes(r["artifact_bytes"])),
         ("MEMORY", lambda r: per_target(r, "memory_bytes", human_bytes)),
         ("DECODE CEILING", lambda r: "; ".join(f"{t} {tps(f.get('decode_tokens_per_s_ceiling'))}"
                                                for t, f in sorted((r.get("device") or {}).items())))]


def terminal_table(rows: list[dict]) -> str:
    """The catalog as a plain-text table, one row per recipe, columns padded to their widest
    cell (:data:`TABLE`: name, state, parameters (counted once built, else from the config),
    precision, bundle size, memory on the device, decode ceiling per target)."""
    cells = [[h for h, _ in TABLE]] + [[str(f(r)) for _, f in TABLE] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(TABLE))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(TABLE))).rstrip() for c in cells)


def write_catalog(out_dir: Path | None = None, session: Session | None = None) -> dict[str, Path]:
    """Write catalog.json, README.md and index.html into ``out_dir`` (default
    :func:`tasks.paths.catalog_dir`). Returns {file name: path}. The files are written under
    temp names and renamed once all three are, so a reader never sees half a file, and a full
    disk is one DiskFull error that leaves the previous files whole. ``session``: the
    command's (default: a new one)."""
    from . import outputs
    from .catalog_page import catalog_page

    out_dir = Path(out_dir or paths.catalog_dir())
    with outputs.full_disk_is(out_dir.parent, f"{out_dir.name}/", "NPUBUILD_CATALOG"):
        out_dir.mkdir(parents=True, exist_ok=True)
    rows = catalog_rows(session)
    docs = {"catalog.json": json.dumps({"schema_version": SCHEMA_VERSION, "recipes": rows}, indent=2,
                                       sort_keys=True) + "\n",
            "README.md": render_markdown(rows), "index.html": catalog_page(rows, out_dir)}
    written, tmps = {}, []
    # all three under temp names first, renamed only once all are written: a full disk leaves
    # the previous three as they were (one DiskFull line)
    with outputs.full_disk_is(out_dir, "the catalog", "NPUBUILD_CATALOG", tmps):
        for fname, text in docs.items():
            tmps.append(out_dir / f".{fname}.{os.getpid()}.tmp")
            tmps[-1].write_text(text, encoding="utf-8")
    for tmp, fname in zip(tmps, docs):
        tmp.replace(out_dir / fname)
        written[fname] = out_dir / fname
    print(terminal_table(rows))
    for r in rows:  # why a recipe is not usable as it stands; "not built" needs no reason
        if (r["reason"] or r["failures"]) and r["state"] != "not-built":
            print(f"{r['name']}: {r['reason'] or '; '.join(r['failures'])}")
    print(f"catalog: {len(rows)} recipes -> {out_dir} (decode and first-token figures are ceilings: catalog.json 'note')")
    return written

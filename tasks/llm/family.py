"""The LLM family's declaration (``export.family: llm``): decoder LLMs built part by part as
prefill + decode graphs. Its stages, the DAG a recipe of it expands into, the recipe keys that
DAG reads, and its family-wide hooks (:data:`FAMILY`, :class:`tasks.contract.model_family.Family`).

The DAG: an LLM recipe with P parts is built part by part (as AI Hub compiles each "split" as a
job of its own): per part k the stages ``export.part{k}``, [``prepatch.part{k}``],
``calibrate.part{k}`` (the fp32 part over the calibration schedule; part 0 reads the calibration
file, part k > 0 takes the schedule and the hidden states of ``calibrate.part{k-1}``),
``quantize.part{k}``, [``patch.part{k}``] and ``compile.part{k}[@target]``, each with its own key
and cache entry; then one ``bundle[@target]`` (``export.json`` of every part and
``genai_config.json``) and one ``verify[@target]`` that join the parts. ``build/<recipe>/`` is
the union of the parts' compile entries and the bundle's. With ``bundle.runtimes`` holding
``genie``, each part also gets ``genie_quantize.part{k}`` (its Genie-layout graphs, calibrated on
``calibrate.part0``'s schedule: tasks/llm/genie/quantize.py) and ``genie_compile.part{k}[@target]``,
and the bundle and verify read them (their params gain ``runtimes``); a recipe without genie
plans exactly the stages and params it had before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from tasks.contract.model_family import Family
from tasks.contract.stage import Param
from tasks.llm.figures import CEILING_NOTE, catalog_figures, plan_lines
from tasks.llm.memory import plan_estimate, plan_keys


def _runtimes(v, earlier):
    if "genai" not in v or len(set(v)) != len(v):
        raise ValueError(f"expected distinct runtimes including genai (its config is in every LLM bundle), found {v}")
    return v


RUNTIMES = Param(
    "bundle",
    "runtimes",
    list[Literal["genai", "genie"]],
    ["genai"],
    "the runtimes the bundle serves: genai (genai_config.json, always) and genie (Genie-layout "
    "binaries, genie_config.json, htp_backend_ext_config.json: tasks/llm/genie/graphs.py, "
    "genie_config.py)",
    check=_runtimes,
)
GENIE_CONFIG = Param(
    "bundle",
    "genie_config",
    dict[str, Any] | None,
    None,
    "runtime genie: merged over the generated genie_config.json (e.g. {dialog: {engine: "
    "{n-threads: 4}}}); Genie's parser checks the result at bundle time",
)


def part_name(stage: str, k: int, target_suffix: str = "") -> str:
    """The name of part ``k``'s ``stage``: ``quantize.part2``, ``compile.part2@x-elite``."""
    return f"{stage}.part{k}{target_suffix}"


def plan(p) -> list:
    """The per-part stage specs of an LLM recipe (module docstring), in build order: part by
    part (export, calibrate, quantize, each target's compile), then per target the bundle and
    the verify; ``p`` a :class:`tasks.recipe.plan.Planner`. doit runs them in this order, so a
    build stopped in part k leaves parts before k whole; a cluster runs every stage whose
    upstreams are there (exports of all parts at once)."""
    r = p.recipe
    P = r.export.parts
    pre, post = p.patch_steps("pre-quantize"), p.patch_steps("post-quantize")
    specs = [p.download()]
    calib_params, quant_params = p.params("quantize", "calibrate"), p.params("quantize")
    targets = p.targets()
    qdq = {}  # part -> the stage whose QDQ graphs the part's compile reads
    # one binary per graph too: what ships without weight sharing, and what verify runs on the
    # x86_64 HTP simulator, which crashes loading a weight-shared binary (tasks/llm/htp.py load_shared_probe); a
    # weight-shared recipe verified on cpu-qdq (the 7B) compiles only the binary it ships
    per_graph = not r.compile.weight_sharing or r.verify.backend == "htp"
    genie = "genie" in r.bundle.runtimes  # Genie-layout graphs per part too (tasks/llm/genie/quantize.py)
    for k in range(P):  # part by part, so a build stopped in part k has parts < k whole
        model = part_name("export", k)
        specs.append(p.spec(model, "export", {**p.params("export"), "part": k}, {"source": "download"}))
        if pre:
            specs.append(p.patch(part_name("prepatch", k), pre, model))
            model = part_name("prepatch", k)
        # part 0 draws the calibration schedule from the text (tokenizer + file); later parts
        # take it with part k-1's hidden states, so one chain has one schedule (tasks/llm/calibrate.py)
        ups = (
            {"model": model, "previous": part_name("calibrate", k - 1)} if k else {"model": model, "source": "download"}
        )
        specs.append(
            p.spec(
                part_name("calibrate", k),
                "calibrate",
                {**calib_params, "part": k},
                ups,
                {} if k else p.files("quantize", "calibrate"),
            )
        )
        specs.append(
            p.spec(
                part_name("quantize", k),
                "quantize",
                {**quant_params, "part": k},
                {"model": model, "calibration": part_name("calibrate", k)},
            )
        )
        qdq[k] = part_name("quantize", k)
        if post:
            specs.append(p.patch(part_name("patch", k), post, qdq[k]))
            qdq[k] = part_name("patch", k)
        for t, suffix in targets:
            specs.append(
                p.spec(
                    part_name("compile", k, suffix),
                    "compile",
                    {"target": t, **p.params("compile"), "part": k, "per_graph": per_graph},
                    {"model": qdq[k]},
                )
            )
        if genie:
            e = r.export
            specs.append(
                p.spec(
                    part_name("genie_quantize", k),
                    "genie_quantize",
                    {
                        **p.params("quantize", "genie_quantize"),
                        "part": k,
                        "export": {
                            "sequence_length": e.sequence_length,
                            "context_length": e.context_length,
                            "parts": P,
                        },
                    },
                    {
                        "source": "download",
                        "calibration": part_name("calibrate", 0),
                        # the encodings of the tensors it shares with the parts before it
                        **({"previous": part_name("genie_quantize", k - 1)} if k else {}),
                    },
                )
            )
            for t, suffix in targets:
                specs.append(
                    p.spec(
                        part_name("genie_compile", k, suffix),
                        "genie_compile",
                        {"target": t, **p.params("compile", "genie_compile"), "part": k, "per_graph": per_graph},
                        {"model": part_name("genie_quantize", k)},
                    )
                )
    runtimes = {"runtimes": list(r.bundle.runtimes)} if genie else {}
    overrides = {"genie_config": r.bundle.genie_config} if genie and r.bundle.genie_config else {}
    for t, suffix in targets:
        genie_ins = {f"genie.part{k}": part_name("genie_compile", k, suffix) for k in range(P)} if genie else {}
        # qdq: the quantized parts' export.json, which declares their quantized boundary (tasks/llm/quantize.py)
        joined = {
            f"{role}.part{k}": up
            for k in range(P)
            for role, up in (
                ("compiled", part_name("compile", k, suffix)),
                ("export", part_name("export", k)),
                ("qdq", qdq[k]),
            )
        }
        specs.append(
            p.spec(
                f"bundle{suffix}",
                "bundle",
                {"target": t, **p.params("compile", "bundle"), "parts": P, **runtimes, **overrides},
                {**joined, **genie_ins},
            )
        )
        ins = {"bundle": f"bundle{suffix}", "source": "download", **genie_ins}
        for k in range(P):
            ins.update(
                {
                    f"compiled.part{k}": part_name("compile", k, suffix),
                    f"qdq.part{k}": qdq[k],
                    f"reference.part{k}": part_name("export", k),
                }
            )
        specs.append(
            p.spec(
                f"verify{suffix}",
                "verify",
                {**p.params("verify"), "target": t, "task": r.task, **runtimes},
                ins,
                p.files("verify"),
            )
        )
    return specs


def source_check(recipe, cfg: dict, config_file: Path) -> list[tuple[str, str]]:
    """What the LLM export cannot write of the model whose ``config.json`` is ``cfg``: a
    ``model_type`` or feature it does not implement (:mod:`tasks.llm.architectures`; an
    :class:`tasks.errors.Unsupported` problem), an MLP activation it does not write, more
    ``export.parts`` than ``num_hidden_layers``, an ``export.context_length`` above
    ``max_position_embeddings``."""
    from tasks.errors import Unsupported
    from tasks.llm.architectures import ACTIVATIONS, SUPPORTED, unsupported

    problems, e, name = [], recipe.export, config_file.name
    mt = cfg.get("model_type")
    why = "; ".join(unsupported(cfg))
    if mt not in SUPPORTED or why:
        problems.append(
            Unsupported(
                "export.family",
                f"expected a model_type the LLM export supports "
                f"({', '.join(SUPPORTED)}), found {mt!r} in {name}"
                + (f" with {why} (not in tasks/llm/architectures.py)" if why else ""),
            )
        )
    act = cfg.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        problems.append(
            (
                "export.family",
                f"expected an MLP activation the LLM export writes "
                f"({', '.join(ACTIVATIONS)}), found hidden_act {act!r} in {name}",
            )
        )
    layers, limit = cfg.get("num_hidden_layers"), cfg.get("max_position_embeddings")
    if isinstance(layers, int) and e.parts > layers:
        problems.append(
            ("export.parts", f"expected at most the model's {layers} layers (num_hidden_layers), found {e.parts}")
        )
    if isinstance(limit, int) and e.context_length > limit:
        problems.append(
            (
                "export.context_length",
                f"expected at most the model's max_position_embeddings ({limit}), found {e.context_length}",
            )
        )
    return problems


#: who loads what an LLM bundle ships beyond its runtime configs (the model card's "Files")
RUNNER = "npubuild LLMRunner"


def shipped(sources: dict[str, Path]) -> tuple[list[str], list[tuple]]:
    """What an LLM bundle ships beyond what its runtime configs name
    (:func:`tasks.commands.publish.contents.shipped_files`, ``sources`` {bundle path: file}): in
    each folder holding an ``export.json``, that file (every graph's I/O, for LLMRunner and the
    catalog), the host-side embedding table it names (``embed_file``) and, without a
    ``genai_config.json`` beside it (``embedding: host``: genai cannot feed it), the graphs
    LLMRunner loads, as genai would name them (:func:`tasks.llm.genai.bundle_files`,
    weight-shared when compiled so). Returns (those folders, [(bundle path, who, named by,
    runtime)]): ``runtime`` set for an EPContext model that runtime loads (``who`` None: the
    model and the binaries it names ship as that runtime's)."""
    import json
    import posixpath

    from tasks.llm.genai import bundle_files

    folders = sorted({posixpath.dirname(r) for r in sources if posixpath.basename(r) == "export.json"})
    out: list[tuple] = []
    for d in folders:
        desc_rel = posixpath.join(d, "export.json")
        desc = json.loads(sources[desc_rel].read_text())
        out.append((desc_rel, f"{RUNNER} and the catalog (every graph's inputs and outputs)", "the bundle", None))
        if desc.get("embed_file"):
            out.append(
                (
                    posixpath.join(d, desc["embed_file"]),
                    f"{RUNNER} (export.json embed_file: the host-side embedding table)",
                    desc_rel,
                    None,
                )
            )
        if posixpath.join(d, "genai_config.json") not in sources:
            shared = any(r.startswith(posixpath.join(d, "shared/")) for r in sources)
            out += [
                (posixpath.normpath(posixpath.join(d, f)), None, desc_rel, RUNNER)
                for f in bundle_files(desc, "shared" if shared else "").values()
            ]
    return folders, out


#: what a served runtime is called in the catalog: ``bundle.runtimes`` value -> name
RUNTIME_NAMES = {"genai": "onnxruntime-genai", "genie": "genie"}


def runtimes(recipe) -> list[str]:
    """The runtimes an LLM bundle serves, as the recipe states them: ``bundle.runtimes``
    (``onnxruntime-genai`` always, ``genie`` when asked), by their catalog names, sorted."""
    return sorted(RUNTIME_NAMES.get(r, r) for r in recipe.bundle.runtimes)


def catalog_fields(recipe, download_out: Path | None, binaries: dict) -> dict:
    """The catalog row's ``context_length`` and ``parts`` (the recipe's), ``parameters_estimate``
    and ``device`` (:func:`tasks.llm.figures.catalog_figures`)."""
    ex = recipe.export
    return {"context_length": ex.context_length, "parts": ex.parts, **catalog_figures(recipe, download_out, binaries)}


#: the quality bars an LLM recipe that sets no ``verify.thresholds`` is judged by: those every
#: real LLM recipe here ships with (``recipes/qwen7b-int4.yaml``, the template the others extend;
#: ``perplexity_ratio`` only with ``verify.perplexity_text``, which measures it). Names:
#: ``tasks/llm/verify.py`` ``THRESHOLDS``.
DEFAULT_THRESHOLDS = {"token_agreement": 0.7, "logits_cosine_mean": 0.98, "perplexity_ratio": 1.3}
#: the bar each runtime verify runs brings, whatever the recipe sets (it may set another value):
#: that runtime's tokens equal LLMRunner's on every prompt (``verify.runtime: genai`` runs
#: onnxruntime-genai; ``bundle.runtimes`` with ``genie`` runs Genie)
RUNTIME_THRESHOLDS = {"genai": ("genai_runner_agreement", 1.0), "genie": ("genie_runner_agreement", 1.0)}


def default_thresholds(recipe) -> dict[str, float]:
    """The bars ``recipe`` gets for the names it does not set (``Family.default_thresholds``):
    :data:`DEFAULT_THRESHOLDS` when it sets no ``verify.thresholds`` (absent, or null through
    ``extends``), and :data:`RUNTIME_THRESHOLDS` of the runtimes verify runs; {} for a shape
    build, whose figures are never judged (``tasks/sources/shape.py``)."""
    if recipe.source.shape:
        return {}
    out = {}
    if "thresholds" not in recipe.verify.model_fields_set:
        out = {
            k: v
            for k, v in DEFAULT_THRESHOLDS.items()
            if k != "perplexity_ratio" or recipe.verify.perplexity_text is not None
        }
    ran = (["genai"] if recipe.verify.runtime == "genai" else []) + (
        ["genie"] if "genie" in recipe.bundle.runtimes else []
    )
    out.update(RUNTIME_THRESHOLDS[rt] for rt in ran)
    return out


FAMILY = Family(
    name="llm",
    title="an LLM",
    stages={
        "download": "tasks.sources.download",
        "export": "tasks.llm.export",
        "patch": "tasks.patches.stage",
        "calibrate": "tasks.llm.calibrate",  # the fp32 part over the calibration schedule
        "quantize": "tasks.llm.quantize",
        "compile": "tasks.llm.compile",
        "genie_quantize": "tasks.llm.genie.quantize",  # parts in Genie's layout, QDQ (bundle.runtimes: genie)
        "genie_compile": "tasks.llm.genie.compile",  # ... their context binaries, named for Genie
        "bundle": "tasks.llm.bundle",  # the parts joined: export.json, genai_config.json, genie_config.json
        "verify": "tasks.llm.verify",
    },
    plan=plan,
    params=(RUNTIMES, GENIE_CONFIG),
    source_check=source_check,
    plan_lines=plan_lines,
    catalog_fields=catalog_fields,
    memory_estimate=plan_estimate,
    memory_keys=plan_keys,
    default_thresholds=default_thresholds,
    shipped=shipped,
    runtimes=runtimes,
    catalog_note=CEILING_NOTE.removeprefix("ceilings, not measurements: "),  # the page says "ceilings" itself
    catalog_chart=("LLMs: quality versus size", "LLM", "token_agreement", "greedy token agreement vs fp32"),
)

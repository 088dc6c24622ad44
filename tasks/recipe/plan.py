"""Recipe -> plan: the ordered stage specs of one recipe.

A :class:`StageSpec` is plain data: the stage's name inside the recipe (``export``,
``compile``...), its kind (one of :data:`KINDS`), its resolved params, its upstream stages by
role, and the project files it reads (calibration and verify sets). No files are touched here.

Order: download -> export -> [prepatch] -> quantize -> [patch] -> compile -> verify. ``prepatch``
holds the patch steps marked ``when: pre-quantize`` (rewrites that must precede calibration);
either patch stage is left out when it has no steps. A recipe with several targets gets one
compile and one verify stage per target, named ``compile@<target>`` and ``verify@<target>``.

An LLM recipe (``export.family: llm``) with P parts is built part by part (as AI Hub
compiles each "split" as a job of its own): per part k the stages ``export.part{k}``,
[``prepatch.part{k}``], ``calibrate.part{k}`` (the fp32 part over the calibration schedule; part 0
reads the calibration file, part k > 0 takes the schedule and the hidden states of
``calibrate.part{k-1}``), ``quantize.part{k}``, [``patch.part{k}``] and
``compile.part{k}[@target]``, each with its own key and cache entry; then one ``bundle[@target]``
(``export.json`` of every part and ``genai_config.json``) and one ``verify[@target]`` that join
the parts. ``build/<recipe>/`` is the union of the parts' compile entries and the bundle's.
With ``bundle.runtimes`` holding ``genie``, each part also gets ``genie_quantize.part{k}`` (its
Genie-layout graphs, calibrated on ``calibrate.part0``'s schedule: tasks/llm/genie/quantize.py)
and ``genie_compile.part{k}[@target]``, and the bundle and verify read them (their params gain
``runtimes``); a recipe without genie plans exactly the stages and params it had before.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

KINDS = ("download", "export", "patch", "calibrate", "quantize", "compile", "genie_quantize", "genie_compile",
         "bundle", "verify")


@dataclass(frozen=True)
class StageSpec:
    recipe: str
    name: str
    kind: str
    params: dict
    inputs: dict[str, str] = field(default_factory=dict)  # role -> upstream stage name
    files: dict[str, str] = field(default_factory=dict)  # role -> project-relative path
    family: str = "encoder"  # the recipe's export.family: picks the implementation (tasks.contract)

    @property
    def impl(self):
        """The implementation that builds this spec (``tasks.contract.implementation(kind, family)``:
        a :class:`tasks.contract.stage.Stage`)."""
        from tasks.contract import implementation

        return implementation(self.kind, self.family)

    @property
    def task(self) -> str:
        """The doit task name, ``<stage>:<recipe>``."""
        return f"{self.name}:{self.recipe}"

    @property
    def part(self) -> int | None:
        """The LLM part this stage builds (``params["part"]``), None for a whole-model stage."""
        return self.params.get("part")


def _patch_params(steps) -> dict:
    from tasks import patches

    return {"steps": [{"name": s.name, "version": patches.get(s.name).version, "params": s.params} for s in steps]}


def expand(recipe) -> list[StageSpec]:
    """The stage specs of ``recipe`` (a :class:`tasks.recipe.load.Recipe`: read, never imported, so
    the plan stands below the recipe schema) in build order (upstream before downstream). Each stage's
    params and files are what its family's implementation declares it reads of its recipe
    section (its ``params`` and ``files``: :func:`tasks.contract.params_from`); this function only wires
    the stages together (roles, one compile and verify per target, the patch steps)."""
    from tasks.contract import files_from, params_from

    r = recipe
    fam = r.export.family
    sections: dict[str, dict] = {}  # recipe section name -> its model_dump(), made once

    def section(name: str) -> dict:
        if name not in sections:
            sections[name] = getattr(r, name).model_dump()
        return sections[name]

    def params(name: str, kind: str | None = None) -> dict:
        return params_from(section(name), kind or name, fam)

    def files(name: str, kind: str | None = None) -> dict:
        return files_from(section(name), kind or name, fam)

    if fam == "llm":
        return [replace(s, family=fam) for s in _expand_parts(r, params, files)]
    specs = [
        StageSpec(r.name, "download", "download", r.source.model_dump(exclude_none=True)),
        StageSpec(r.name, "export", "export", params("export"), {"source": "download"}),
    ]
    model = "export"
    pre = [s for s in r.patches if s.when == "pre-quantize"]
    post = [s for s in r.patches if s.when == "post-quantize"]
    if pre:
        specs.append(StageSpec(r.name, "prepatch", "patch", _patch_params(pre), {"model": model}))
        model = "prepatch"
    specs.append(StageSpec(r.name, "quantize", "quantize", params("quantize"), {"model": model, "source": "download"},
                           files("quantize")))
    model = "quantize"
    if post:
        specs.append(StageSpec(r.name, "patch", "patch", _patch_params(post), {"model": model}))
        model = "patch"
    many = len(r.compile.targets) > 1
    for t in r.compile.targets:
        suffix = f"@{t}" if many else ""
        specs.append(StageSpec(r.name, f"compile{suffix}", "compile", {"target": t, **params("compile")},
                               {"model": model}))
        specs.append(StageSpec(r.name, f"verify{suffix}", "verify", {**params("verify"), "target": t, "task": r.task},
                               {"compiled": f"compile{suffix}", "qdq": model, "reference": "export",
                                "source": "download"}, files("verify")))
    return [replace(s, family=fam) for s in specs]


def part_name(stage: str, k: int, target_suffix: str = "") -> str:
    """The name of part ``k``'s ``stage``: ``quantize.part2``, ``compile.part2@x-elite``."""
    return f"{stage}.part{k}{target_suffix}"


def _expand_parts(r, params, files) -> list[StageSpec]:
    """The per-part stage specs of an LLM recipe (module docstring), in build order: part by
    part (export, calibrate, quantize, each target's compile), then per target the bundle and
    the verify. doit runs them in this order, so a build stopped in part k leaves parts before
    k whole; a cluster runs every stage whose upstreams are there (exports of all parts at once)."""
    P = r.export.parts
    pre = [s for s in r.patches if s.when == "pre-quantize"]
    post = [s for s in r.patches if s.when == "post-quantize"]
    specs = [StageSpec(r.name, "download", "download", r.source.model_dump(exclude_none=True))]
    calib_params, quant_params = params("quantize", "calibrate"), params("quantize")
    many = len(r.compile.targets) > 1
    suffixes = [f"@{t}" if many else "" for t in r.compile.targets]
    qdq = {}  # part -> the stage whose QDQ graphs the part's compile reads
    # one binary per graph too: what ships without weight sharing, and what verify runs on the
    # x86_64 HTP simulator, which crashes loading a weight-shared binary (NOTES-qnn.md); a
    # weight-shared recipe verified on cpu-qdq (the 7B) compiles only the binary it ships
    per_graph = not r.compile.weight_sharing or r.verify.backend == "htp"
    genie = "genie" in r.bundle.runtimes  # Genie-layout graphs per part too (tasks/llm/genie/quantize.py)
    for k in range(P):  # part by part, so a build stopped in part k has parts < k whole
        model = part_name("export", k)
        specs.append(StageSpec(r.name, model, "export", {**params("export"), "part": k}, {"source": "download"}))
        if pre:
            specs.append(StageSpec(r.name, part_name("prepatch", k), "patch", _patch_params(pre), {"model": model}))
            model = part_name("prepatch", k)
        # part 0 draws the calibration schedule from the text (tokenizer + file); later parts
        # take it with part k-1's hidden states, so one chain has one schedule (tasks/llm/calibrate.py)
        ups = {"model": model, "previous": part_name("calibrate", k - 1)} if k else {"model": model, "source": "download"}
        specs.append(StageSpec(r.name, part_name("calibrate", k), "calibrate", {**calib_params, "part": k}, ups,
                               {} if k else files("quantize", "calibrate")))
        specs.append(StageSpec(r.name, part_name("quantize", k), "quantize", {**quant_params, "part": k},
                               {"model": model, "calibration": part_name("calibrate", k)}))
        qdq[k] = part_name("quantize", k)
        if post:
            specs.append(StageSpec(r.name, part_name("patch", k), "patch", _patch_params(post), {"model": qdq[k]}))
            qdq[k] = part_name("patch", k)
        for t, suffix in zip(r.compile.targets, suffixes):
            specs.append(StageSpec(r.name, part_name("compile", k, suffix), "compile",
                                   {"target": t, **params("compile"), "part": k, "per_graph": per_graph},
                                   {"model": qdq[k]}))
        if genie:
            e = r.export
            specs.append(StageSpec(r.name, part_name("genie_quantize", k), "genie_quantize",
                                   {**params("quantize", "genie_quantize"), "part": k, "export": {
                                       "sequence_length": e.sequence_length, "context_length": e.context_length,
                                       "parts": P}},
                                   {"source": "download", "calibration": part_name("calibrate", 0),
                                    # the encodings of the tensors it shares with the parts before it
                                    **({"previous": part_name("genie_quantize", k - 1)} if k else {})}))
            for t, suffix in zip(r.compile.targets, suffixes):
                specs.append(StageSpec(r.name, part_name("genie_compile", k, suffix), "genie_compile",
                                       {"target": t, **params("compile", "genie_compile"), "part": k,
                                        "per_graph": per_graph},
                                       {"model": part_name("genie_quantize", k)}))
    runtimes = {"runtimes": list(r.bundle.runtimes)} if genie else {}
    overrides = {"genie_config": r.bundle.genie_config} if genie and r.bundle.genie_config else {}
    for t, suffix in zip(r.compile.targets, suffixes):
        genie_ins = {f"genie.part{k}": part_name("genie_compile", k, suffix) for k in range(P)} if genie else {}
        # qdq: the quantized parts' export.json, which declares their quantized boundary (tasks/llm/quantize.py)
        joined = {f"{role}.part{k}": up for k in range(P)
                  for role, up in (("compiled", part_name("compile", k, suffix)), ("export", part_name("export", k)),
                                   ("qdq", qdq[k]))}
        specs.append(StageSpec(r.name, f"bundle{suffix}", "bundle",
                               {"target": t, **params("compile", "bundle"), "parts": P, **runtimes, **overrides},
                               {**joined, **genie_ins}))
        ins = {"bundle": f"bundle{suffix}", "source": "download", **genie_ins}
        for k in range(P):
            ins.update({f"compiled.part{k}": part_name("compile", k, suffix), f"qdq.part{k}": qdq[k],
                        f"reference.part{k}": part_name("export", k)})
        specs.append(StageSpec(r.name, f"verify{suffix}", "verify",
                               {**params("verify"), "target": t, "task": r.task, **runtimes}, ins, files("verify")))
    return specs

"""Recipe -> plan: the ordered stage specs of one recipe.

A :class:`StageSpec` is plain data: the stage's name inside the recipe (``export``,
``compile``...), its kind (one of :data:`KINDS`), its resolved params, its upstream stages by
role, and the project files it reads (calibration and verify sets). No files are touched here.

Order: download -> export -> [prepatch] -> quantize -> [patch] -> compile -> verify. ``prepatch``
holds the patch steps marked ``when: pre-quantize`` (rewrites that must precede calibration);
either patch stage is left out when it has no steps. A recipe with several targets gets one
compile and one verify stage per target, named ``compile@<target>`` and ``verify@<target>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .recipe import Recipe

KINDS = ("download", "export", "patch", "quantize", "compile", "verify")

# params that mean something for one model family only: left out of the other's stage params
# (and so of its keys), so that e.g. an encoder's key does not move with context_length
ONLY = {"llm": {"decode_length", "context_length", "parts", "embedding", "lm_head", "layout", "max_new_tokens",
                "weight_sharing", "runtime"},
        "encoder": {"task", "batch_size"}}


def _for_family(params: dict, family: str) -> dict:
    drop = set().union(*(keys for fam, keys in ONLY.items() if fam != family))
    return {k: v for k, v in params.items() if k not in drop}


@dataclass(frozen=True)
class StageSpec:
    recipe: str
    name: str
    kind: str
    params: dict
    inputs: dict[str, str] = field(default_factory=dict)  # role -> upstream stage name
    files: dict[str, str] = field(default_factory=dict)  # role -> project-relative path

    @property
    def task(self) -> str:
        """The doit task name, ``<stage>:<recipe>``."""
        return f"{self.name}:{self.recipe}"


def _patch_params(steps) -> dict:
    from . import patches

    return {"steps": [{"name": s.name, "version": patches.get(s.name).version, "params": s.params} for s in steps]}


def expand(recipe: Recipe) -> list[StageSpec]:
    """The stage specs of ``recipe`` in build order (upstream before downstream)."""
    r = recipe
    fam = r.export.family
    ex = _for_family(r.export.model_dump(), fam)
    specs = [
        StageSpec(r.name, "download", "download", r.source.model_dump(exclude_none=True)),
        StageSpec(r.name, "export", "export", ex, {"source": "download"}),
    ]
    model = "export"
    pre = [s for s in r.patches if s.when == "pre-quantize"]
    post = [s for s in r.patches if s.when == "post-quantize"]
    if pre:
        specs.append(StageSpec(r.name, "prepatch", "patch", _patch_params(pre), {"model": model}))
        model = "prepatch"
    q = r.quantize.model_dump()
    calib = q.pop("calibration")
    q.update(family=r.export.family, calibration={k: v for k, v in calib.items() if k != "file"})
    specs.append(StageSpec(r.name, "quantize", "quantize", q, {"model": model, "source": "download"},
                           {"calibration": calib["file"]}))
    model = "quantize"
    if post:
        specs.append(StageSpec(r.name, "patch", "patch", _patch_params(post), {"model": model}))
        model = "patch"
    many = len(r.compile.targets) > 1
    for t in r.compile.targets:
        suffix = f"@{t}" if many else ""
        cparams = _for_family({"target": t, "family": fam, "disable_cpu_ep_fallback": r.compile.disable_cpu_ep_fallback,
                               "weight_sharing": r.compile.weight_sharing}, fam)
        specs.append(StageSpec(r.name, f"compile{suffix}", "compile", cparams, {"model": model}))
        v = _for_family(r.verify.model_dump(), fam)
        data = v.pop("data")
        ppl = v.pop("perplexity_text")
        v.update(target=t, family=r.export.family, task=r.task,
                 data={k: val for k, val in data.items() if k != "file"})
        files = {"data": data["file"]}
        if ppl:
            files["perplexity_text"] = ppl
        specs.append(StageSpec(r.name, f"verify{suffix}", "verify", v,
                               {"compiled": f"compile{suffix}", "qdq": model, "reference": "export",
                                "source": "download"}, files))
    return specs

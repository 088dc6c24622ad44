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

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic and the schema are imported when a recipe is expanded, not for a
    from pydantic import BaseModel  # stored plan (tasks/plancache.py)

    from .recipe import Recipe

KINDS = ("download", "export", "patch", "quantize", "compile", "verify")


def params_for(cfg: BaseModel, family: str) -> dict:
    """``cfg.model_dump()`` without the fields only the other model family reads (declared on
    the schema: tasks/recipe.py ``field_family``), nested sections included; so e.g. an
    encoder's key does not move with context_length, nor an LLM's with export.opset."""
    from pydantic import BaseModel

    from .recipe import field_family

    out = {}
    for name in type(cfg).model_fields:
        owner, value = field_family(type(cfg), name), getattr(cfg, name)
        if owner and owner != family:
            continue
        out[name] = params_for(value, family) if isinstance(value, BaseModel) else cfg.model_dump(include={name})[name]
    return out


@dataclass(frozen=True)
class StageSpec:
    recipe: str
    name: str
    kind: str
    params: dict
    inputs: dict[str, str] = field(default_factory=dict)  # role -> upstream stage name
    files: dict[str, str] = field(default_factory=dict)  # role -> project-relative path
    family: str = "encoder"  # the recipe's export.family: picks the implementation (tasks.stages)

    @property
    def module(self):
        """The stage module that builds this spec (``tasks.stages.module_for(kind, family)``)."""
        from .stages import module_for

        return module_for(self.kind, self.family)

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
    ex = params_for(r.export, fam)
    ex.pop("family")  # it chose the implementation (StageSpec.family), whose code is in the key
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
    q = params_for(r.quantize, fam)
    calib = q.pop("calibration")
    q.update(calibration={k: v for k, v in calib.items() if k != "file"})
    specs.append(StageSpec(r.name, "quantize", "quantize", q, {"model": model, "source": "download"},
                           {"calibration": calib["file"]}))
    model = "quantize"
    if post:
        specs.append(StageSpec(r.name, "patch", "patch", _patch_params(post), {"model": model}))
        model = "patch"
    many = len(r.compile.targets) > 1
    for t in r.compile.targets:
        suffix = f"@{t}" if many else ""
        cparams = {"target": t,
                   **{k: v for k, v in params_for(r.compile, fam).items() if k != "targets"}}
        specs.append(StageSpec(r.name, f"compile{suffix}", "compile", cparams, {"model": model}))
        v = params_for(r.verify, fam)
        data = v.pop("data")
        ppl = v.pop("perplexity_text", None)
        v.update(target=t, task=r.task,
                 data={k: val for k, val in data.items() if k != "file"})
        files = {"data": data["file"]}
        if ppl:
            files["perplexity_text"] = ppl
        specs.append(StageSpec(r.name, f"verify{suffix}", "verify", v,
                               {"compiled": f"compile{suffix}", "qdq": model, "reference": "export",
                                "source": "download"}, files))
    return [replace(s, family=fam) for s in specs]

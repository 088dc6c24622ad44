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

if TYPE_CHECKING:  # the schema is imported when a recipe is expanded, not for a stored plan
    from .recipe import Recipe  # (tasks/plancache.py)

KINDS = ("download", "export", "patch", "quantize", "compile", "verify")


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
    """The stage specs of ``recipe`` in build order (upstream before downstream). Each stage's
    params and files are what its family's implementation declares it reads of its recipe
    section (``PARAMS``, ``FILES``: :func:`tasks.stages.params_from`); this function only wires
    the stages together (roles, one compile and verify per target, the patch steps)."""
    from .stages import SECTIONS, files_from, params_from

    r = recipe
    fam = r.export.family
    sections = {name: getattr(r, name).model_dump() for name in SECTIONS}

    def params(name: str) -> dict:
        return params_from(sections[name], SECTIONS[name], fam)

    def files(name: str) -> dict:
        return files_from(sections[name], SECTIONS[name], fam)

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

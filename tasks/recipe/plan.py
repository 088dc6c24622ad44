"""Recipe -> plan: the ordered stage specs of one recipe.

A :class:`StageSpec` is plain data: the stage's name inside the recipe (``export``,
``compile``...), its kind (one of :func:`tasks.contract.kinds`), its resolved params, its upstream
stages by role, the project files it reads (calibration and verify sets) and the recipe's family,
which picks the implementation. No files are touched here.

Which stages a recipe has, and how they are wired, is its family's plan
(:attr:`tasks.contract.model_family.Family.plan`: ``tasks/encoder/family.py``,
``tasks/llm/family.py``), built with a :class:`Planner`; :func:`expand` asks the family by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StageSpec:
    recipe: str
    name: str
    kind: str
    params: dict
    inputs: dict[str, str] = field(default_factory=dict)  # role -> upstream stage name
    files: dict[str, str] = field(default_factory=dict)  # role -> project-relative path
    family: str | None = None  # the recipe's export.family: picks the implementation (tasks.contract)

    @property
    def impl(self):
        """The implementation that builds this spec (``tasks.contract.implementation(kind, family)``:
        a :class:`tasks.contract.stage.Stage`; without a family, the kind's one shared module)."""
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


class Planner:
    """What a family's plan (:attr:`tasks.contract.model_family.Family.plan`) builds a recipe's
    stage specs with: the recipe (``recipe``, a :class:`tasks.recipe.load.Recipe`), its
    targets, and specs whose params and files are what the family's implementation of each kind
    declares it reads of its recipe section (:func:`tasks.contract.params_from`,
    :func:`tasks.contract.files_from`), so a plan only wires stages together. Each section is
    dumped once."""

    def __init__(self, recipe):
        self.recipe = recipe
        self.family = recipe.export.family
        self._sections: dict[str, dict] = {}

    def section(self, name: str) -> dict:
        """Recipe section ``name`` as a plain dict (its ``model_dump()``)."""
        if name not in self._sections:
            self._sections[name] = getattr(self.recipe, name).model_dump()
        return self._sections[name]

    def params(self, section: str, kind: str | None = None) -> dict:
        """The params stage kind ``kind`` (default: the section's name) reads of ``section``."""
        from tasks.contract import params_from

        return params_from(self.section(section), kind or section, self.family)

    def files(self, section: str, kind: str | None = None) -> dict[str, str]:
        """{role: project-relative path} of the files ``kind`` (default ``section``) reads of ``section``."""
        from tasks.contract import files_from

        return files_from(self.section(section), kind or section, self.family)

    def spec(
        self, name: str, kind: str, params: dict, inputs: dict | None = None, files: dict | None = None
    ) -> StageSpec:
        """Stage ``name`` of the recipe, of kind ``kind``, reading ``inputs`` ({role: upstream
        stage name}) and ``files`` ({role: path})."""
        return StageSpec(self.recipe.name, name, kind, params, dict(inputs or {}), dict(files or {}), self.family)

    def download(self) -> StageSpec:
        """The ``download`` stage: the recipe's ``source`` section, whole."""
        return self.spec("download", "download", self.recipe.source.model_dump(exclude_none=True))

    def patch_steps(self, when: str) -> list:
        """The recipe's patch steps marked ``when`` (``pre-quantize``, ``post-quantize``)."""
        return [s for s in self.recipe.patches if s.when == when]

    def patch(self, name: str, steps, model: str) -> StageSpec:
        """A ``patch`` stage ``name`` running ``steps`` on stage ``model``'s output."""
        return self.spec(name, "patch", _patch_params(steps), {"model": model})

    def targets(self) -> list[tuple[str, str]]:
        """[(target, stage-name suffix)]: ``@<target>`` when the recipe has several, else ""."""
        many = len(self.recipe.compile.targets) > 1
        return [(t, f"@{t}" if many else "") for t in self.recipe.compile.targets]


def _patch_params(steps) -> dict:
    from tasks import patches

    return {"steps": [{"name": s.name, "version": patches.get(s.name).version, "params": s.params} for s in steps]}


def expand(recipe) -> list[StageSpec]:
    """The stage specs of ``recipe`` (a :class:`tasks.recipe.load.Recipe`: read, never imported, so
    the plan stands below the recipe schema) in build order (upstream before downstream): what its
    family's plan makes of it (:attr:`tasks.contract.model_family.Family.plan`, given a
    :class:`Planner`). Raises KeyError for an unregistered family."""
    from tasks.contract import family

    return family(recipe.export.family).plan(Planner(recipe))

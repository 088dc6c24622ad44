"""A model family as data (:class:`Family`): what the engine, the plan and the recipe checks know
of a family, declared in the family's own folder (``tasks/<family>/family.py`` ends with one
``FAMILY = Family(...)``) and found by name (:func:`tasks.contract.family`), as a stage's
implementation is found by its module name. Olive's passes and AI Hub Models' per-model folders
are the pattern: the engine runs what a folder declares and names no family itself.

A family owns four things:

- its stage table: stage kind -> the module whose ``STAGE`` implements it for this family (the
  shared ``download`` and ``patch`` stages named like the family's own);
- its plan: the DAG of stage specs a recipe of it expands into (``plan(planner)``,
  :class:`tasks.recipe.plan.Planner` the helper it builds them with);
- the recipe keys that plan reads itself (not a stage implementation), ``params``;
- its family-wide hooks: what it cannot build of a model (``source_check``), what ``doit
  explain`` prints of a recipe (``plan_lines``), its catalog row's own fields (``catalog_fields``),
  what the catalog page says of them and plots (``catalog_note``, ``catalog_chart``), the runtimes
  its bundles serve (``runtimes``), the memory estimate of a stage without one of its own
  (``memory_estimate``), the verify bars a recipe that sets none gets (``default_thresholds``),
  what a published bundle ships beyond its runtime configs (``shipped``).

A :class:`tasks.contract.stage.Stage` keeps what is about one stage. Nothing here imports a family.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable, Mapping

from tasks.contract.stage import Param

#: the catalog row's fields a family fills (:attr:`Family.catalog_fields`), null when it does not
#: (:mod:`tasks.core.row` documents them)
CATALOG_FIELDS = ("context_length", "parts", "parameters_estimate", "device")


@dataclass(frozen=True)
class Family:
    """One model family (``export.family: <name>``).

    - ``name``: the value of ``export.family``; ``title``: a recipe of it in an error message
      (``"an LLM"``: "expected no such key in an LLM recipe").
    - ``stages``: {stage kind: dotted module name holding its ``STAGE``}, in build order; the
      implementations a recipe of this family runs (:func:`tasks.contract.implementation`).
    - ``plan(planner) -> list[StageSpec]``: the recipe's stage specs in build order (upstream
      before downstream); ``planner`` (:class:`tasks.recipe.plan.Planner`) holds the recipe and
      makes specs whose params and files are what the implementation declares it reads.
    - ``params``: the recipe keys the plan reads itself (LLMs: ``bundle.runtimes``), each a
      :class:`~tasks.contract.stage.Param` defined once; every family reads ``export.family``
      and ``compile.targets`` (:data:`tasks.contract.params.PLAN_PARAMS`).
    - ``source_kind``: what a recipe's ``source`` must name: ``"folder"`` (a model folder with
      its ``config.json``: a Hub snapshot, a ``path`` or ``package`` folder) or ``"onnx"`` (one
      ONNX graph: ``package`` + ``file``, or a ``path`` to an ``.onnx`` file); checked at load
      (:func:`tasks.recipe.checks.check_source_kind`).
    - ``source_check(recipe, config, config_file) -> [(key path, message)]``: what this family
      cannot build of the recipe's model, from its ``config.json`` (``config`` the parsed dict,
      ``config_file`` where it was read, beside the tokenizer files when the source is local),
      at load; a problem saying the model is not implemented is a :class:`tasks.errors.Unsupported`.
    - ``plan_lines(recipe) -> list[str]``: what ``doit explain`` prints of a recipe before any
      stage runs (LLMs: parts, estimated peak memory and disk per stage).
    - ``catalog_fields(recipe, download_out, binaries) -> dict``: the catalog row's fields of
      :data:`CATALOG_FIELDS` this family states (the rest null); ``download_out`` the download
      entry's folder or None (before a build), ``binaries`` {target: verify.json's read-back
      figures or None}. LLMs: :func:`tasks.llm.figures.catalog_figures`.
    - ``memory_estimate(specs, stage) -> int``: estimated peak bytes of stage ``stage`` of a
      recipe's plan (``specs``: {stage name: StageSpec}) whose implementation has no estimate
      of its own (the shared ``download`` and ``patch``); without it
      :data:`tasks.proc.budget.DEFAULT_STAGE_BYTES`.
    - ``default_thresholds(recipe) -> {name: bar}``: the verify bars a recipe gets for the
      threshold names it does not set (:func:`tasks.recipe.load.with_default_bars` merges them
      under ``verify.thresholds``, the recipe's own values winning): the family's quality bars
      when the recipe sets no ``verify.thresholds`` at all, and the bar each runtime its verify
      runs brings whatever the recipe sets; without it, none.
    - ``memory_keys(specs, stage) -> str | None``: the recipe keys that lower stage ``stage``'s
      estimate, with their values now (None: none does), named when a build is refused before
      any of its stages runs (:func:`tasks.core.admit.admit`).
    - ``catalog_note``: what the catalog page says of how this family's ``device`` figures are
      made (one sentence; "" for none).
    - ``catalog_chart``: the catalog page's quality chart of this family, (title, what one
      point is built from, the verify metric plotted against shipped bytes, its description);
      None: no chart.
    - ``runtimes(recipe) -> list[str]``: the runtimes a bundle of the recipe serves, as the
      recipe states them (known before a build), by the names the catalog shows; without it,
      onnxruntime's QNN EP, which loads an EPContext model.
    - ``shipped(sources) -> (folders, [(bundle path, who, named by, runtime)])``: what a
      published bundle of this family ships beyond what a runtime config names
      (:func:`tasks.commands.publish.contents.shipped_files`; ``sources`` {bundle path: file} of
      the build's artifacts): files its own runner or decoding loads, each with who loads it and
      what names it, or with ``runtime`` set for an EPContext model that runtime loads (its
      binaries ship with it); ``folders``: the folders whose EPContext models this rule decides."""

    name: str
    title: str
    stages: Mapping[str, str]
    plan: Callable[..., list]
    params: tuple[Param, ...] = ()
    source_kind: str = "folder"
    source_check: Callable[..., list] | None = None
    plan_lines: Callable[..., list] | None = None
    catalog_fields: Callable[..., dict] | None = None
    memory_estimate: Callable[[dict, str], int] | None = None
    default_thresholds: Callable[..., dict] | None = None
    memory_keys: Callable[[dict, str], str | None] | None = None
    catalog_note: str = ""
    catalog_chart: tuple[str, str, str, str] | None = None
    runtimes: Callable[..., list] | None = None
    shipped: Callable[..., tuple] | None = None

    def implementation_module(self, kind: str) -> str:
        """The dotted module name implementing stage ``kind`` for this family. Raises KeyError
        naming the family and the kinds it has."""
        if kind not in self.stages:
            raise KeyError(
                f"no {self.name} implementation of stage kind {kind!r}; {self.name} has {', '.join(self.stages)}"
            )
        return self.stages[kind]

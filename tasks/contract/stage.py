"""The stage contract as data: what a stage implementation declares (:class:`Stage`), the recipe
params it reads (:class:`Param`, each defined once) and the verify bars it can be judged by
(:class:`Threshold`).

Each implementation module (``tasks/encoder/quantize.py``, ``tasks/llm/quantize.py``, ...) ends
with one ``STAGE = Stage(...)``; :mod:`tasks.contract` finds it by the kind and the recipe's
family, :mod:`tasks.contract.schema` assembles the recipe's sections from the declared params,
the engine keys and runs a stage from its declaration alone. Nothing here imports a family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

#: ``Param.default`` of a key the recipe must set
REQUIRED = object()


def resolve(ref):
    """``ref`` itself, or for a ``"module:name"`` string that module's attribute (imported now):
    how a declaration names a pydantic model without importing pydantic where the stages run."""
    if isinstance(ref, str) and ":" in ref:
        from importlib import import_module

        module, _, name = ref.partition(":")
        return getattr(import_module(module), name)
    return ref


@dataclass(frozen=True, eq=False)
class Param:
    """One recipe key: ``<section>.<path>`` (``quantize.calibration.samples``). The object is
    the key's one definition (type, default, range, description); implementations that read
    the key list this object (``Stage.params``), so which families read it follows from them
    (:func:`tasks.contract.schema.readers`). Equality is identity: two Params of one key are a
    second definition, refused when the schema is assembled.

    ``type``: the annotation pydantic validates (strict: a string is no int; a ``"module:name"``
    string names it without importing it: :func:`resolve`); ``limits``:
    pydantic ``Field`` keywords (``ge``, ``le``, ``min_length``...); ``check(value, earlier)``:
    an after-validator given the section's earlier values by name, returns the value or raises
    ValueError (its message is the problem's text); ``before(value)``: the same, before type
    checks; ``after``: the section's keys ``check`` reads (the key is validated after them)."""

    section: str
    path: str
    type: Any
    default: Any = REQUIRED
    description: str = ""
    limits: dict = field(default_factory=dict)
    check: Callable[[Any, dict], Any] | None = None
    before: Callable[[Any], Any] | None = None
    after: tuple[str, ...] = ()

    @property
    def annotation(self):
        """``type``, with a ``"module:name"`` reference resolved (:func:`resolve`)."""
        return resolve(self.type)

    @property
    def key(self) -> str:
        """``section.path``, as the recipe writes it and error messages name it."""
        return f"{self.section}.{self.path}"

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Threshold:
    """A verify bar a recipe may set (``verify.thresholds.<name>``), declared by the verify
    implementation that measures it. ``direction``: ``min`` (the metric must be at least the
    bar) or ``max``; ``per_sample``: the per-sample metric that names the worst sample (None:
    none); ``what`` and the range ``[low, high]`` (``low_in``: low itself allowed; high None:
    ``verify.max_new_tokens``) are checked at load, so a bar that always passes or never can
    is an error before any build."""

    name: str
    direction: str
    per_sample: str | None
    description: str
    what: str
    low: float
    low_in: bool
    high: float | None


@dataclass(frozen=True)
class Stage:
    """One stage kind's implementation: what the engine, the plan and the recipe schema need of
    one stage, and nothing of the family it builds for.

    - ``version`` enters the stage key; bumped on any change of behaviour.
    - ``tools``: tools whose versions enter the key (:mod:`tasks.tools`).
    - ``params``: the recipe keys it reads (their :class:`Param` definitions); the stage's
      params, so its key, hold exactly these, nested as in the recipe (``calibration.samples``
      -> ``{"calibration": {"samples": ...}}``). ``files``: {Param of a file key: role}: project
      files it reads (digested into the key, passed as ``files[role]``).
    - ``whole``: the recipe section it takes whole instead (``source`` for download, ``patches``
      for patch), with its pydantic model.
    - ``wired``: params the plan sets (``target``, ``part``...), not recipe keys.
    - ``key_exclude``: params left out of the key (a target name, whose resolved options enter
      through ``key_extra``; verify thresholds, which judge a result and do not change it).
    - ``code_deps``: modules it reaches by name at run time (the patch registry), digested with
      the modules it imports.
    - ``artifacts``: fnmatch patterns of the outputs a user gets (linked into ``build/<recipe>/``,
      copied into published bundles).
    - ``thresholds``: the verify bars it measures (verify only).
    - ``run(inputs, files, params, out) -> dict``: reads upstream outputs (``inputs`` by role)
      and project files, writes into ``out``, returns extra manifest info (JSON-able).
    - ``key_extra(params) -> dict``: more key material; ``check(out, manifest, params) ->
      list[str]``: failures of a built entry (a failed check fails the stage; the entry stays);
      ``check_read(inputs, params, upstream) -> None``: raises when what it read is not what the
      key hashed (a source folder's copy); ``preflight(recipe) -> [(key path, message)]``: what
      this implementation cannot build in a valid recipe, found at load (before any stage runs).
    - ``memory_estimate(specs, stage) -> int``: the estimated peak bytes of stage ``stage`` of a
      recipe's plan (``specs``: {stage name: :class:`tasks.recipe.plan.StageSpec`}, as
      :func:`tasks.recipe.plan.expand` makes it), known before anything is built: what a cluster build
      asks of a worker (:func:`tasks.core.run.memory_estimate`). Without it, the family's
      (:attr:`tasks.contract.model_family.Family.memory_estimate`: how the shared download and
      patch are estimated), else :data:`tasks.proc.budget.DEFAULT_STAGE_BYTES`.
    - ``file_check(role, path, rel) -> str | None``: the problem of a project file it reads
      (``role`` as in ``files``; ``path`` the file, ``rel`` as the recipe names it), at load,
      after the loader's own checks (inside the project, UTF-8, sample lines).
    - ``line_samples``: the roles of ``files`` it reads one sample per non-empty line, so the
      recipe's ``samples`` beside the file key may not exceed the file's lines (checked at load).

    Which family a stage builds for is its family's stage table
    (:class:`tasks.contract.model_family.Family`), not the stage's: two families may name one
    implementation."""

    kind: str
    module: str
    version: int
    tools: tuple[str, ...]
    run: Callable[..., dict]
    params: tuple[Param, ...] = ()
    files: dict = field(default_factory=dict)
    whole: tuple[str, Any] | None = None
    wired: tuple[str, ...] = ()
    key_exclude: tuple[str, ...] = ()
    code_deps: tuple[str, ...] = ()
    artifacts: tuple[str, ...] = ()
    thresholds: tuple[Threshold, ...] = ()
    key_extra: Callable[[dict], dict] | None = None
    check: Callable[..., list] | None = None
    check_read: Callable[..., None] | None = None
    preflight: Callable[..., list] | None = None
    memory_estimate: Callable[[dict, str], int] | None = None
    file_check: Callable[..., str | None] | None = None
    line_samples: tuple[str, ...] = ()

    def whole_model(self):
        """The pydantic model of the section it takes whole (``whole[1]``, resolved), or None."""
        return resolve(self.whole[1]) if self.whole else None

    def reads(self) -> tuple[Param, ...]:
        """Every recipe key it reads: ``params`` and the keys of ``files``."""
        return (*self.params, *self.files)

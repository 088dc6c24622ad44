"""The recipe's stage sections (``export``, ``quantize``, ``compile``, ``bundle``, ``verify``)
assembled from what the families and their stage implementations declare: every
:class:`~tasks.contract.stage.Param` an implementation lists (and the plans' own:
:data:`tasks.contract.params.PLAN_PARAMS`, a family's ``params``) becomes one field of its
section's pydantic model, with its one type, default, range and description. Which families read
a key follows from which implementations list it and which families' tables name those
(:func:`readers`); a recipe that sets a key only other families read is a load error
(:func:`family_problems`).

Nothing here is cached: :mod:`tasks.recipe.load` builds its models once, at import.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from tasks.contract import families, implementations, readers_of
from tasks.contract.stage import Param, Threshold
from tasks.contract.params import PLAN_PARAMS

#: the recipe's stage sections, in recipe order
SECTIONS = ("export", "quantize", "compile", "bundle", "verify")


class Strict(BaseModel):
    """Base of every recipe model: unknown keys are errors, values are not coerced (a string is
    no int), and a loaded recipe is immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def found(value) -> str:
    """A value as the recipe writes it (YAML: ``true``, ``null``, ``{a: 1}``; a string quoted),
    cut to 80 characters."""
    import yaml

    if isinstance(value, str):
        text = repr(value)
    elif value is None or isinstance(value, (bool, dict, list)):
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()
    else:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def declared() -> dict[str, list[Param]]:
    """{section: its Params in field order}: the plans' (every family's, then each family's own),
    then each implementation's in registry order, a key whose ``check`` reads others
    (``Param.after``) placed after them. Raises ValueError when two Param objects define one key
    (a key has one definition)."""
    seen: dict[str, Param] = {}
    order: dict[str, list[Param]] = {s: [] for s in SECTIONS}
    impls = sorted(implementations(), key=lambda st: st.kind not in SECTIONS)  # a section's own kind first
    for p in (*plan_params(), *(p for st in impls for p in st.reads())):
        if p.section not in order:
            raise ValueError(f"{p.key}: expected a section from {', '.join(SECTIONS)}, found {p.section!r}")
        if p.key in seen:
            if seen[p.key] is not p:
                raise ValueError(
                    f"{p.key}: expected one definition, found two (a Param object defines a key once; "
                    f"implementations that read it list that object)"
                )
            continue
        seen[p.key] = p
        order[p.section].append(p)
    return {section: _after_first(params) for section, params in order.items()}


def _after_first(params: list[Param]) -> list[Param]:
    """``params`` in their order, except that a key comes after the keys its check reads."""
    names, pending, out = {p.path for p in params}, list(params), []
    while pending:
        done = {q.path for q in out}
        p = next((p for p in pending if all(d in done or d not in names for d in p.after)), pending[0])
        out.append(p)
        pending.remove(p)
    return out


def plan_params() -> tuple[Param, ...]:
    """The keys the plans read themselves: every family's (:data:`PLAN_PARAMS`), then each
    family's own (``Family.params``), each once."""
    return tuple(dict.fromkeys((*PLAN_PARAMS, *(p for f in families() for p in f.params))))


def readers(param: Param) -> tuple[str, ...]:
    """The names of the families that read ``param``, sorted: every family for a key of
    :data:`PLAN_PARAMS`; else the families whose plan reads it (``Family.params``) or whose
    stage table names an implementation listing it."""
    if any(param is p for p in PLAN_PARAMS):
        return tuple(sorted(f.name for f in families()))
    fams = {f.name for f in families() if any(param is p for p in f.params)}
    for st in implementations():
        if any(p is param for p in st.reads()):
            fams |= set(readers_of(st.module))
    return tuple(sorted(fams))


def thresholds() -> dict[str, Threshold]:
    """{name: Threshold} of every verify bar an implementation measures, sorted by name."""
    return dict(sorted((t.name, t) for st in implementations() for t in st.thresholds))


def threshold_families(name: str) -> tuple[str, ...]:
    """The names of the families whose verify measures threshold ``name`` (empty: unknown)."""
    return tuple(
        f
        for st in implementations("verify")
        if any(t.name == name for t in st.thresholds)
        for f in readers_of(st.module)
    )


def _field(p: Param):
    if p.required:
        return (p.annotation, Field(description=p.description, **p.limits))
    if isinstance(p.default, (list, dict)):
        d = p.default
        return (
            p.annotation,
            Field(default_factory=lambda d=d: copy.deepcopy(d), description=p.description, **p.limits),
        )
    return (p.annotation, Field(p.default, description=p.description, **p.limits))


def _validators(params: list[Param], leaf, names) -> dict:
    """The ``check`` and ``before`` validators of ``params`` (fields ``leaf(p)`` of a model
    whose fields are ``names``). An ``after`` key of the model that failed its own validation
    reaches the check as None ("unknown"; checks judge nothing by it): pydantic leaves a failed
    field out of the earlier values, and a check reading it with ``.get(key, default)`` judged
    the default instead of what the recipe says (a ``per_channel: false`` under ``rounding:
    gptq`` reported ``gptq_span`` as set "with rounding nearest"). The check's other problems
    are still reported, beside the failed key's own (``verify.thresholds`` out of range with a
    bad ``verify.max_new_tokens``)."""
    out = {}

    def checked(v, info, p):
        earlier = dict(info.data)
        earlier.update({d: None for d in p.after if d in names and d not in earlier})
        return p.check(v, earlier)

    for p in params:
        name = leaf(p)
        if p.check is not None:
            out[f"_check_{name}"] = field_validator(name, mode="after")(lambda cls, v, info, p=p: checked(v, info, p))
        if p.before is not None:
            out[f"_before_{name}"] = field_validator(name, mode="before")(lambda cls, v, p=p: p.before(v))
    return out


def _model(name: str, params: list[Param], depth: int) -> type[BaseModel]:
    """A strict model of ``params`` (paths split at ``.``; ``depth`` components already taken)."""
    fields: dict[str, Any] = {}
    groups: dict[str, list[Param]] = {}
    flat: list[Param] = []
    for p in params:
        parts = p.path.split(".")
        if len(parts) > depth + 1:
            groups.setdefault(parts[depth], []).append(p)
            fields.setdefault(parts[depth], None)  # keeps the group's place in field order
        else:
            flat.append(p)
            fields[parts[depth]] = _field(p)
    for g, members in groups.items():
        sub = _model(f"{name}.{g}", members, depth + 1)
        if any(p.required for p in members):
            fields[g] = (sub, Field(description=f"{name}.{g}"))
        else:
            fields[g] = (sub, Field(default_factory=sub, description=f"{name}.{g}"))
    leaf = lambda p: p.path.split(".")[depth]  # noqa: E731
    return create_model(name, __base__=Strict, __validators__=_validators(flat, leaf, set(fields)), **fields)


def section_models() -> dict[str, type[BaseModel]]:
    """{section: its pydantic model}, assembled from :func:`declared`. Raises ValueError as
    :func:`declared` does."""
    return {section: _model(section, params, 0) for section, params in declared().items()}


def _a(name: str) -> str:
    """A recipe of family ``name`` in a message: its declaration's ``title`` (``an LLM``)."""
    from tasks.contract import family

    return family(name).title


def family_problems(recipe) -> list[tuple[str, str]]:
    """``(key path, message)`` for each key ``recipe`` sets (explicitly, or through ``extends``)
    that no stage of its family reads: only other families' implementations or plans list it
    (or measure the threshold), so this recipe's stages would silently ignore it."""
    fam = recipe.export.family
    by_key = {p.key: p for params in declared().values() for p in params}
    out: list[tuple[str, str]] = []

    def walk(obj: BaseModel, prefix: str) -> None:
        for name in sorted(obj.model_fields_set):
            key, value = prefix + name, getattr(obj, name)
            p = by_key.get(key)
            who = (
                readers(p)
                if p
                else tuple(sorted({f for q in by_key.values() if q.key.startswith(key + ".") for f in readers(q)}))
            )
            if who and fam not in who:
                why = type(obj).model_fields[name].description if p else ""
                out.append(
                    (
                        key,
                        f"expected no such key in {_a(fam)} recipe (export.family: {fam}): only "
                        f"{' or '.join(map(_a, who))} recipe reads it"
                        + (f" ({why})" if why else "")
                        + "; remove it (or set it to null where it comes through extends)",
                    )
                )
            elif isinstance(value, BaseModel):
                walk(value, key + ".")

    for section in SECTIONS:
        walk(getattr(recipe, section), section + ".")
    mine = sorted(n for n in thresholds() if fam in threshold_families(n))
    for name in sorted(recipe.verify.thresholds):
        others = threshold_families(name)
        if others and fam not in others:
            out.append(
                (
                    f"verify.thresholds.{name}",
                    f"expected a threshold {_a(fam)} verify measures ({', '.join(mine)}), "
                    f"found {name!r}, which only {' or '.join(map(_a, others))} verify measures",
                )
            )
    return out

"""Recipes: YAML loading, ``extends``, schema validation and error messages.

A recipe is data (``recipes/<name>.yaml``, documented in ``recipes/README.md``). This module
turns the files into validated :class:`Recipe` objects with every default applied. It knows
nothing of doit or of what the stages do, and no model family: what a family cannot build is
its declaration's and its stage implementations' hooks (``source_check``:
:class:`tasks.contract.model_family.Family`; ``preflight``, ``file_check``:
:class:`tasks.contract.stage.Stage`). A recipe set (:func:`tasks.recipe.checks.load_all`) is
checked further against the project: data files, the source's ``config.json``, names.

Errors: :class:`RecipeError` names the file and lists every problem as
``<key.path>: expected <what>, found <what>``; all problems of one recipe are reported at once.
Files are parsed with YAML 1.2 core-schema scalars (:mod:`tasks.recipe.yaml_files`); one bad file
(any kind: :func:`load_all`) is that file's error and never stops the others.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, create_model, field_validator

from tasks.store import plancache
from tasks.errors import RecipeError, UnsupportedModel  # noqa: F401  (the loader's errors, importable from here)
from tasks.recipe.yaml_files import glob_hint, parse_cached, with_nul, yaml11_hint
from tasks.contract import implementation, schema
from tasks.contract.params import close
from tasks.contract.schema import Strict, found

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
MAX_NAME = 128  # characters of a recipe name: `.<name>-<key12>.tar.gz.<pid>.tmp` and the like stay under 255
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


# ---------------------------------------------------------------- YAML loading

MAX_RECIPE_BYTES = 1_000_000  # a recipe is a page of YAML; bigger files are refused unread


def read_yaml(path: Path) -> dict:
    """Parse one recipe file (YAML 1.2 core schema, safe). Raises RecipeError for a file that
    is not a readable regular file (missing, a dangling symlink, a directory, a FIFO), is
    larger than ``MAX_RECIPE_BYTES`` or not UTF-8, for a syntax error, a duplicate key, an
    anchor or alias, nesting deeper than ``MAX_DEPTH``, or a top level that is not a mapping."""
    path = Path(path)
    plancache.note(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a directory"
                if stat.S_ISDIR(st.st_mode)
                else "a FIFO"
                if stat.S_ISFIFO(st.st_mode)
                else "a special file"
            )
            raise RecipeError(path, [("", f"expected a regular file, found {kind}")])
        if st.st_size > MAX_RECIPE_BYTES:
            raise RecipeError(
                path,
                [
                    (
                        "",
                        f"expected at most {MAX_RECIPE_BYTES:,} bytes (recipes are small; "
                        f"the limit is tasks/recipe/load.py MAX_RECIPE_BYTES), found {st.st_size:,}",
                    )
                ],
            )
        with open(path, "rb") as fh:
            raw = fh.read(MAX_RECIPE_BYTES + 1)
        if len(raw) > MAX_RECIPE_BYTES:
            raise RecipeError(path, [("", f"expected at most {MAX_RECIPE_BYTES:,} bytes, found more")])
        text = raw.decode("utf-8")
    except OSError as e:
        what = "a dangling symlink" if path.is_symlink() and not path.exists() else e.strerror
        raise RecipeError(path, [("", f"expected a readable file, found {what}")]) from None
    except UnicodeDecodeError as e:
        raise RecipeError(
            path, [("", f"expected UTF-8 text, found byte {e.object[e.start]:#04x} at offset {e.start}")]
        ) from None
    try:
        data = parse_cached(raw, text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        hint = glob_hint(text, getattr(e, "context_mark", None)) if "alias" in str(getattr(e, "context", "")) else ""
        raise RecipeError(path, [("", f"invalid YAML: {where}{getattr(e, 'problem', None) or e}{hint}")]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(path, [("", f"expected a mapping at the top level, found {type(data).__name__}")])
    nul = with_nul(data)
    if nul:  # no path, pattern or name holds one; the OS refuses it, and every command would stop there
        raise RecipeError(path, [(k, f"expected text without NUL characters, found {v!r}") for k, v in nul])
    return data


def deep_merge(base: dict, over: dict) -> dict:
    """Merge ``over`` onto ``base``: mappings merge key by key, ``null`` removes the key (so
    the default applies), everything else (lists included) is replaced. Neither argument is
    modified."""
    out = dict(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


# ---------------------------------------------------------------- schema

# The stage sections are assembled from the stage implementations' declarations
# (tasks/contract/schema.py); the top keys and the patch steps are defined here.


class PatchStep(Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    when: Literal["pre-quantize", "post-quantize"] = "post-quantize"

    @field_validator("name")
    @classmethod
    def _known(cls, v):
        from tasks import patches

        if v not in patches.known():
            raise ValueError(f"expected a known patch ({', '.join(patches.known())}), found {v!r}")
        return v

    @field_validator("params")
    @classmethod
    def _params(cls, v, info):
        """Checked against the patch's signature; an int given for a float param becomes a
        float, so ``fill: -100`` and ``fill: -100.0`` are one patch (and one stage key)."""
        from tasks import patches

        name = info.data.get("name")
        if name not in patches.known():
            return v  # reported on name
        types = patches.param_types(name)
        try:
            patches.check_params(name, v)  # ValueError naming the param
        except ValueError as e:
            hints = "".join(
                yaml11_hint(x, "bool" if types.get(k) is bool else "number")
                for k, x in v.items()
                if f"{name}.{k} " in str(e)
            )
            raise ValueError(f"{e}{hints}") from None
        floats = {k for k, t in types.items() if t is float}
        return {k: float(x) if k in floats and type(x) is int else x for k, x in v.items()}


SECTION_MODELS = schema.section_models()  # the stage sections, from the implementations' declarations
Source = implementation("download").whole_model()  # the source section, which the download stage takes whole


def _section_field(name: str):
    """A recipe field holding section ``name``: required when a key in it is."""
    model = SECTION_MODELS[name]
    if any(f.is_required() for f in model.model_fields.values()):
        return (model, Field())
    return (model, Field(default_factory=model))


class _RecipeTop(Strict):
    name: str
    extends: str | None = None
    abstract: bool = Field(False, description="a template for other recipes; never built")
    description: str = ""
    license: str = "unknown"
    task: str = Field("feature-extraction", description="catalog task, e.g. feature-extraction, text-generation")
    source: Source
    patches: list[PatchStep] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if not NAME_RE.fullmatch(v):
            raise ValueError(f"expected lowercase letters, digits, '.' and '-', found {v!r}")
        if len(v) > MAX_NAME:
            raise ValueError(
                f"expected at most {MAX_NAME} characters (the name is part of file names under build/, "
                f"dist/ and the home's locks, which a file system caps at 255), found {len(v)}"
            )
        return v


#: a validated recipe: the top keys above and the stage sections (``export``, ``quantize``,
#: ``compile``, ``bundle``, ``verify``) assembled from the stage implementations' params
Recipe = create_model("Recipe", __base__=_RecipeTop, **{n: _section_field(n) for n in schema.SECTIONS})


# ---------------------------------------------------------------- loading


def _fmt_loc(loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _model_at(loc) -> type | None:
    """The section model that key path ``loc`` (pydantic's, without the last key) points into."""
    import typing

    cls = Recipe
    for part in loc:
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(part) if isinstance(cls, type) and issubclass(cls, BaseModel) else None
        if field is None:
            return None
        todo, cls = [field.annotation], None
        while todo:
            t = todo.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                cls = t
                break
            todo.extend(typing.get_args(t))
        if cls is None:
            return None
    return cls


def _pydantic_problems(err: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for e in err.errors():
        loc = _fmt_loc(e["loc"])
        if e["type"] == "missing":
            problems.append((loc, "expected a value, found nothing (required key)"))
        elif e["type"] == "extra_forbidden":
            parent = _model_at(e["loc"][:-1])
            hint = close(e["loc"][-1], parent.model_fields) if parent is not None else ""
            problems.append((loc, f"expected no such key (unknown), found {found(e['input'])}{hint}"))
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if "found" not in msg:
                msg = msg.removeprefix("Input should be ")
                msg = f"expected {msg[0].lower() + msg[1:]}; found {found(e['input'])}"
            if e["type"] in ("bool_type", "int_type", "float_type"):
                msg += yaml11_hint(e["input"], "bool" if e["type"] == "bool_type" else "number")
            problems.append((loc, msg))
    return problems


def _resolve_raw(path: Path, directory: Path, stack: tuple[Path, ...]) -> dict:
    data = read_yaml(path)
    parent = data.get("extends")
    if parent is None:
        return data
    if not isinstance(parent, str) or not NAME_RE.fullmatch(parent):
        raise RecipeError(path, [("extends", f"expected a recipe name, found {found(parent)}")])
    ppath = directory / f"{parent}.yaml"
    if ppath in stack or ppath == path:
        chain = " -> ".join(p.stem for p in (*stack, path, ppath))
        raise RecipeError(path, [("extends", f"expected no cycle, found {chain}")])
    if not ppath.exists():
        hint = close(parent, [p.stem for p in directory.glob("*.yaml")])
        raise RecipeError(path, [("extends", f"expected an existing recipe {ppath.name}, found none{hint}")])
    if len(stack) > 50:
        raise RecipeError(path, [("extends", f"expected at most 50 levels of extends, found more: {ppath.stem}")])
    base = _resolve_raw(ppath, directory, (*stack, path))
    base = {k: v for k, v in base.items() if k not in ("name", "abstract")}
    return deep_merge(base, data)


def load_recipe(path: Path) -> Recipe:
    """Load, merge (``extends``) and validate one recipe file. Raises RecipeError."""
    path = Path(path).absolute()
    raw = _resolve_raw(path, path.parent, ())
    raw.setdefault("name", path.stem)
    try:
        r = Recipe.model_validate(raw)
    except ValidationError as e:
        raise RecipeError(path, _pydantic_problems(e)) from None
    problems = schema.family_problems(r) + preflight(r)
    if problems:
        raise RecipeError(path, problems)
    return with_default_bars(r)


def with_default_bars(r: Recipe) -> Recipe:
    """``r`` with its family's default bars under ``verify.thresholds``: the family's
    ``default_thresholds`` hook (:class:`tasks.contract.model_family.Family`) gives the bars for
    names the recipe does not set; the recipe's own values win. So ``verify:
    {thresholds: null}`` (or none) is judged by the family's bars, ``verify: {thresholds: {}}``
    by none but those the runtimes verify runs bring, and a recipe whose thresholds end up
    empty builds as ``built-no-bars``, never ``verified`` (:mod:`tasks.core.status`)."""
    from tasks.contract import family

    hook = family(r.export.family).default_thresholds
    extra = {k: v for k, v in (hook(r) if hook else {}).items() if k not in r.verify.thresholds}
    if not extra:
        return r
    bars = dict(sorted({**extra, **r.verify.thresholds}.items()))
    return r.model_copy(update={"verify": r.verify.model_copy(update={"thresholds": bars})})


def family_implementations(name: str) -> list:
    """The stage implementations a recipe of model family ``name`` runs: its declaration's stage
    table (:class:`tasks.contract.model_family.Family`), in its order."""
    from tasks.contract import family

    return [implementation(kind, name) for kind in family(name).stages]


def preflight(r: Recipe) -> list[tuple[str, str]]:
    """``(key path, message)`` of what the recipe's stage implementations find they cannot build
    (their ``preflight`` hooks), before any stage runs."""
    return [p for st in family_implementations(r.export.family) for p in (st.preflight or (lambda _: []))(r)]

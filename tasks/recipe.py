"""Recipes: YAML loading, ``extends``, schema validation and error messages.

A recipe is data (``recipes/<name>.yaml``, documented in ``recipes/README.md``). This module
turns the files into validated :class:`Recipe` objects with every default applied. It knows
nothing of doit or of what the stages do.

Errors: :class:`RecipeError` names the file and lists every problem as
``<key.path>: expected <what>, found <what>``; all problems of one recipe are reported at once.
Files are parsed with YAML 1.2 core-schema scalars (:class:`_Core12Resolver`); one bad file
(any kind: :func:`load_all`) is that file's error and never stops the others.
"""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, Field, ValidationError, create_model, field_validator

from . import plancache
from .errors import RecipeError, UnsupportedModel  # noqa: F401  (the loader's errors, importable from here)
from .stages import implementation, schema
from .stages.params import close
from .stages.schema import Strict, found

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
MAX_NAME = 128  # characters of a recipe name: `.<name>-<key12>.tar.gz.<pid>.tmp` and the like stay under 255
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


# ---------------------------------------------------------------- YAML loading

MAX_RECIPE_BYTES = 1_000_000  # a recipe is a page of YAML; bigger files are refused unread
MAX_DEPTH = 32                # nesting levels of mappings and lists (recipes use about 5)


class _Core12Resolver(yaml.resolver.BaseResolver):
    """Plain scalars resolved by the YAML 1.2 core schema, not PyYAML's YAML 1.1 rules:
    ``0100`` is 100 (octal is ``0o100``), ``0x80`` is 128, ``1e9`` is a float, and ``yes``,
    ``no``, ``on``, ``off``, ``2:08``, ``1_000``, ``0b101`` and dates are text."""


for _tag, _re, _first in [
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    ("float", r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
              r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", list("-+.0123456789")),
]:
    _Core12Resolver.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(_re), _first)


class _RecipeLoader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer,
                    yaml.constructor.SafeConstructor, _Core12Resolver):
    """Safe loading with YAML 1.2 core-schema scalars (:class:`_Core12Resolver`) that rejects
    duplicate mapping keys (PyYAML silently keeps the last), nesting deeper than
    ``MAX_DEPTH`` and anchors/aliases (a recipe reuses another with ``extends``; aliases also
    allow self-references and exponential "billion laughs" expansions)."""

    def __init__(self, stream):
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        _Core12Resolver.__init__(self)
        self._depth = 0

    def compose_node(self, parent, index):
        ev = self.peek_event()
        if isinstance(ev, yaml.events.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, f"anchors and aliases (*name, <<: *name) are not supported in recipes; use extends "
                f"(a value starting with '*' is an alias: quote a glob pattern, \"*{ev.anchor}\")", ev.start_mark)
        if getattr(ev, "anchor", None):
            raise yaml.composer.ComposerError(None, None, "anchors and aliases (&name, *name) are not "
                                              "supported in recipes; use extends", ev.start_mark)
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"expected at most {MAX_DEPTH} levels of nested "
                                              "mappings and lists, found more", ev.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node):
        v = self.construct_scalar(node)
        return int(v[2:], 8) if v.startswith("0o") else int(v[2:], 16) if v.startswith("0x") else int(v, 10)


def _construct_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_RecipeLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_RecipeLoader.add_constructor("tag:yaml.org,2002:int", _RecipeLoader.construct_yaml_int)


def yaml11_hint(value, wanted: str = "number") -> str:
    """For text that YAML 1.1 (PyYAML, older tools) would have read as a ``wanted`` ("bool"
    or "number"), the note to add to a "found" message: what YAML 1.2 makes of it and what to
    write instead; "" for anything else."""
    if not isinstance(value, str):
        return ""
    v = value.strip()
    if wanted == "bool":
        return f" (YAML 1.2 reads {v} as text: write true or false)" if v.lower() in ("yes", "no", "on", "off") else ""
    if re.fullmatch(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?", v):
        return f" (YAML 1.2 reads {v} as text, not a base-60 number: write the number in decimal)"
    if re.fullmatch(r"[-+]?0b[01_]+|[-+]?[0-9][0-9_]*_[0-9_]*(\.[0-9_]*)?|[-+]0[ox][0-9a-fA-F_]+", v):
        return f" (YAML 1.2 reads {v} as text: write it in decimal without '_', or as 0o17 / 0x1f)"
    return ""


def _glob_hint(text: str, mark) -> str:
    """The quoting advice for a scanner error on a plain value that starts with '*'."""
    try:
        line = text.splitlines()[mark.line]
    except (IndexError, AttributeError):
        return ""
    word = re.match(r"[^\s,\]}]*", line[mark.column:]).group(0)
    if not word.startswith("*"):
        return ""
    return f"; a value starting with '*' is a YAML alias: quote a glob pattern, \"{word}\""


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
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a special file"
            raise RecipeError(path, [("", f"expected a regular file, found {kind}")])
        if st.st_size > MAX_RECIPE_BYTES:
            raise RecipeError(path, [("", f"expected at most {MAX_RECIPE_BYTES:,} bytes (recipes are small; "
                                          f"the limit is tasks/recipe.py MAX_RECIPE_BYTES), found {st.st_size:,}")])
        with open(path, "rb") as fh:
            raw = fh.read(MAX_RECIPE_BYTES + 1)
        if len(raw) > MAX_RECIPE_BYTES:
            raise RecipeError(path, [("", f"expected at most {MAX_RECIPE_BYTES:,} bytes, found more")])
        text = raw.decode("utf-8")
    except OSError as e:
        what = "a dangling symlink" if path.is_symlink() and not path.exists() else e.strerror
        raise RecipeError(path, [("", f"expected a readable file, found {what}")]) from None
    except UnicodeDecodeError as e:
        raise RecipeError(path, [("", f"expected UTF-8 text, found byte {e.object[e.start]:#04x} at offset {e.start}")]) from None
    try:
        data = _parse_cached(raw, text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        hint = _glob_hint(text, getattr(e, "context_mark", None)) if "alias" in str(getattr(e, "context", "")) else ""
        raise RecipeError(path, [("", f"invalid YAML: {where}{getattr(e, 'problem', None) or e}{hint}")]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(path, [("", f"expected a mapping at the top level, found {type(data).__name__}")])
    nul = _with_nul(data)
    if nul:  # no path, pattern or name holds one; the OS refuses it (a tester's "x\u0000" stopped every command)
        raise RecipeError(path, [(k, f"expected text without NUL characters, found {v!r}") for k, v in nul])
    return data


def _with_nul(value, prefix: str = "") -> list[tuple[str, str]]:
    """(key path, text) of every key or text value in ``value`` holding a NUL character."""
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(k, str) and "\0" in k:
                out.append((p, k))
            out += _with_nul(v, p)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _with_nul(v, f"{prefix}[{i}]")
    elif isinstance(value, str) and "\0" in value:
        out.append((prefix, value))
    return out


def _parse_cached(raw: bytes, text: str):
    """``yaml.load(text, Loader=_RecipeLoader)``, kept in the stat cache under the xxh3 of the
    file's bytes (:meth:`tasks.digest.StatCache.derived`): an unchanged recipe is parsed once,
    not by every command (PyYAML's pure-Python parser was a quarter of a no-op build over 50
    recipes: issue 11). A file that does not parse is never stored, so its error is raised
    each time. Parsed recipes are plain JSON values (mappings, lists, text, numbers, bools,
    null; JSON's Infinity/NaN for .inf/.nan)."""
    import json

    from . import digest

    parsed = []

    def parse():
        parsed.append(yaml.load(text, Loader=_RecipeLoader))
        return json.dumps(parsed[0]) if _json_exact(parsed[0]) else None  # e.g. `1: x` keys stay ints

    stored = digest.default_stat_cache().derived(f"recipe-yaml:{yaml.__version__}", digest.digest_bytes(raw),
                                                 parse, reader=Path(__file__))
    return json.loads(stored) if stored is not None else parsed[0]


def _json_exact(v) -> bool:
    """True when ``json.loads(json.dumps(v)) == v`` with the same types (text mapping keys,
    no tuples or other objects)."""
    if isinstance(v, dict):
        return all(isinstance(k, str) and _json_exact(x) for k, x in v.items())
    if isinstance(v, list):
        return all(_json_exact(x) for x in v)
    return v is None or isinstance(v, (str, bool, int, float))


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
# (tasks/stages/schema.py); the top keys and the patch steps are defined here.


class PatchStep(Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    when: Literal["pre-quantize", "post-quantize"] = "post-quantize"

    @field_validator("name")
    @classmethod
    def _known(cls, v):
        from . import patches

        if v not in patches.known():
            raise ValueError(f"expected a known patch ({', '.join(patches.known())}), found {v!r}")
        return v

    @field_validator("params")
    @classmethod
    def _params(cls, v, info):
        """Checked against the patch's signature; an int given for a float param becomes a
        float, so ``fill: -100`` and ``fill: -100.0`` are one patch (and one stage key)."""
        from . import patches

        name = info.data.get("name")
        if name not in patches.known():
            return v  # reported on name
        types = patches.param_types(name)
        try:
            patches.check_params(name, v)  # ValueError naming the param
        except ValueError as e:
            hints = "".join(yaml11_hint(x, "bool" if types.get(k) is bool else "number")
                            for k, x in v.items() if f"{name}.{k} " in str(e))
            raise ValueError(f"{e}{hints}") from None
        floats = {k for k, t in types.items() if t is float}
        return {k: float(x) if k in floats and type(x) is int else x for k, x in v.items()}


SECTION_MODELS = schema.section_models()  # the stage sections, from the implementations' declarations
Source = implementation("download").whole[1]  # the source section, which the download stage takes whole


def _section_field(name: str):
    """A recipe field holding section ``name``: required when a key in it is."""
    model = SECTION_MODELS[name]
    if any(f.is_required() for f in model.model_fields.values()):
        return (model, Field())
    return (model, Field(default_factory=model))


class _RecipeTop(Strict):
    name: str
    extends: Optional[str] = None
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
            raise ValueError(f"expected at most {MAX_NAME} characters (the name is part of file names under build/, "
                             f"dist/ and the home's locks, which a file system caps at 255), found {len(v)}")
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
    return r


def preflight(r: Recipe) -> list[tuple[str, str]]:
    """``(key path, message)`` of what the recipe's stage implementations find they cannot build
    (their ``preflight`` hooks), before any stage runs."""
    from .stages import IMPLEMENTATIONS

    fam = r.export.family
    return [p for kind in IMPLEMENTATIONS if set(IMPLEMENTATIONS[kind]) & {None, fam}
            for p in (implementation(kind, fam).preflight or (lambda _: []))(r)]


def load_all(directory: Path | None = None, collect_errors: bool = False):
    """All recipes in ``directory`` (default ``recipes/``), by name, sorted.

    Every ``*.yaml`` entry is loaded on its own: whatever is wrong with one (see
    :func:`read_yaml`, the schema, :func:`check_data_files`, even an unforeseen exception)
    is that file's RecipeError and never stops the others. A ``name:`` may not be another
    file's stem (that file owns it), and two files declaring the same name are both invalid
    (neither silently owns it), so build task names never collide.

    Raises RecipeError for the first invalid file (by file name); with
    ``collect_errors=True`` returns ``(recipes, {file stem: RecipeError})`` instead."""
    from .paths import recipes_dir

    directory = Path(directory or recipes_dir())
    # hidden files are an editor's or an OS's, not recipes: Emacs' `.#r.yaml` lock links, macOS' `._r.yaml`
    files = sorted(f for f in directory.glob("*.yaml") if not f.name.startswith("."))
    stems = {f.stem: f for f in files}
    errors: dict[str, RecipeError] = {}
    loaded: dict[Path, Recipe] = {}
    for f in files:
        try:
            if bad := _recipe_link_out(f, directory):
                raise RecipeError(f, [("", bad)])
            r = load_recipe(f)
            if r.name != f.stem and r.name in stems:
                raise RecipeError(f, [("name", f"expected a name that is not another file's stem, found {r.name!r}, "
                                               f"the recipe of {stems[r.name].name}")])
            loaded[f] = r
        except RecipeError as e:
            errors[f.stem] = e
        except Exception as e:  # a bug, or an input no check foresaw: still this file's problem alone
            errors[f.stem] = RecipeError(f, [("", f"cannot load: {type(e).__name__}: {e}")])
    out: dict[str, Recipe] = {}
    memo: dict = {}
    for f, r in loaded.items():
        others = [g.name for g, o in loaded.items() if o.name == r.name and g != f]
        try:
            if others:
                raise RecipeError(f, [("name", f"expected a unique name, found {r.name!r} also in {', '.join(others)}")])
            check_data_files(f, r, memo)
            check_source_config(f, r)
        except RecipeError as e:
            errors[f.stem] = e
            continue
        out[r.name] = r
    out = dict(sorted(out.items()))
    if collect_errors:
        return out, dict(sorted(errors.items()))
    if errors:
        raise errors[min(errors)]
    return out


#: longest sample line a calibration or verify file may hold (characters): far above any real
#: sample (the chat calibration set's longest line is ~2,000), far below what hurts (a 21.8 MB
#: line took 3.85 GB to tokenize: issue 23)
MAX_SAMPLE_CHARS = 100_000


def _recipe_link_out(f: Path, directory: Path) -> str:
    """"" unless recipe file ``f`` is a link that resolves outside the recipes folder, the
    project and ``NPUBUILD_ALLOW_PATHS`` (issue 23), else the message naming where it points."""
    from .paths import allowed_dirs

    if not f.is_symlink():
        return ""
    real = f.resolve()
    roots = [Path(directory).resolve(), *allowed_dirs()]
    if any(real.is_relative_to(d) for d in roots):
        return ""
    return (f"expected a recipe file inside {', '.join(str(d) for d in roots)} once links are followed, "
            f"found a link to {real}")


def _outside(rel: str) -> str:
    """"" if ``rel`` (relative to the project root, or absolute) lies inside the project root
    or a folder of ``NPUBUILD_ALLOW_PATHS`` once resolved (``..`` and symlinks followed), else
    the problem's message."""
    from .paths import allowed_dirs, root

    real = (root() / rel).resolve()
    if real.is_relative_to(root().resolve()):
        return ""
    want = f"expected a path inside the project {root()} (or in a folder of NPUBUILD_ALLOW_PATHS)"
    try:
        if any(real.is_relative_to(d) for d in allowed_dirs()):
            return ""
    except ValueError as e:
        return f"{want}, found {rel!r}, which is {real} ({e})"
    return f"{want}, found {rel!r}, which is {real}"


def read_data_text(f: Path, rel: str) -> str:
    """A data file's text, decoded as the stages decode it (UTF-8, strict). Raises ValueError
    naming the file, the line and the byte offset of the first byte that is not UTF-8, and
    OSError for a file it cannot read."""
    raw = Path(f).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(f"expected UTF-8 text, found byte {raw[e.start]:#04x} at line {line} "
                         f"(byte offset {e.start}) of {rel}") from None


def check_data_files(path: Path, r: Recipe, memo: dict | None = None) -> None:
    """The data files a recipe names lie inside the project (see :func:`_outside`), exist, are
    UTF-8 text as the stages read them, and a line-per-sample file has at least ``samples``
    non-empty lines; ``source.path`` lies inside the project too, and so does every file in it once
    links are followed. Raises RecipeError with the
    key paths. ``memo``: a dict shared by the calls of one :func:`load_all`, so a data file
    named by many recipes is resolved and read once."""
    from .paths import root

    memo = {} if memo is None else memo

    def outside(rel: str) -> str:
        if ("outside", rel) not in memo:
            memo["outside", rel] = _outside(rel)
        return memo["outside", rel]

    def lines(f: Path, rel: str) -> int | str:
        """non-empty lines of the file, or the problem's message"""
        if ("lines", rel) not in memo:
            try:
                text = read_data_text(f, rel)
                rows = text.splitlines()
                memo["lines", rel] = sum(1 for ln in rows if ln.strip())  # as tasks/datafiles.py read_lines
                longest = max(range(len(rows)), key=lambda i: len(rows[i]), default=None)
                memo["long", rel] = "" if longest is None or len(rows[longest]) <= MAX_SAMPLE_CHARS else (
                    f"expected at most {MAX_SAMPLE_CHARS:,} characters per sample line, found {len(rows[longest]):,} "
                    f"on line {longest + 1} of {rel} (each sample is tokenized whole before it is cut to its length)")
            except (OSError, ValueError) as e:
                memo["lines", rel] = str(e) if isinstance(e, ValueError) else f"expected a readable file, found {e.strerror}"
        return memo["lines", rel]

    problems = []
    if r.source.path is not None:
        plancache.note(root() / r.source.path)
        if bad := outside(r.source.path):
            problems.append(("source.path", bad))
        elif (root() / r.source.path).is_dir():
            from .paths import allowed_dirs
            from .sources import folder_problem

            if bad := folder_problem(root() / r.source.path, allowed_dirs(), f"source.path {r.source.path!r}"):
                problems.append(("source.path", bad))
    wanted = [("quantize.calibration.file", r.quantize.calibration, r.export.family == "encoder"),
              ("verify.data.file", r.verify.data, True)]
    if r.verify.perplexity_text:
        wanted.append(("verify.perplexity_text", None, False))
    for key, data, per_line in wanted:
        rel = data.file if data else r.verify.perplexity_text
        f = root() / rel
        plancache.note(f)
        if bad := outside(rel):
            problems.append((key, bad))
        elif not f.is_file():
            problems.append((key, f"expected an existing file under {root()}, found nothing at {rel!r}"))
        else:
            n = lines(f, rel)
            if isinstance(n, str):
                problems.append((key, n))
            elif key != "verify.perplexity_text" and memo.get(("long", rel)):  # issue 23: one 21.8 MB line took 3.85 GB to tokenize
                problems.append((key, memo["long", rel]))
            elif rel.endswith(".jsonl") and (bad := jsonl_problem(f, rel, memo)):
                problems.append((key, bad))
            elif per_line and n < data.samples:
                problems.append((key.removesuffix(".file") + ".samples",
                                 f"expected at most the {n} non-empty lines of {rel}, found {data.samples}"))
    if problems:
        raise RecipeError(path, problems)


def jsonl_problem(f: Path, rel: str, memo: dict) -> str | None:
    """The first problem of a chat calibration file (``tasks.llm.calib.samples_of`` reads it),
    as a message naming the line, or None."""
    if ("jsonl", rel) not in memo:
        from .llm.calib import conversations

        try:
            conversations(f)
            memo["jsonl", rel] = None
        except ValueError as e:
            memo["jsonl", rel] = str(e)
    return memo["jsonl", rel]


def source_config_path(src: Source) -> Path | None:
    """The ``config.json`` a source's model will have, when it can be read without building
    anything: a ``path`` folder, an installed ``package`` folder (found, not imported), or an
    ``hf`` snapshot already in the local Hugging Face cache at a 40-hex revision. None otherwise
    (the download stage reports a missing source)."""
    import importlib.util

    from .paths import root

    if src.path is not None:
        f = root() / src.path / "config.json"
    elif src.package is not None:
        plancache.note_sys_path()
        try:
            spec = importlib.util.find_spec(src.package)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            plancache.uncacheable(f"package {src.package} not found")  # may appear anywhere on the path
            return None
        folder = Path(list(spec.submodule_search_locations)[0])
        plancache.note(folder)
        f = folder / src.subdir / "config.json"
    elif src.revision and re.fullmatch(r"[0-9a-f]{40}", src.revision):
        from huggingface_hub import constants  # where huggingface_hub itself looks (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME)

        f = Path(constants.HF_HUB_CACHE) / f"models--{src.hf.replace('/', '--')}" / "snapshots" / src.revision / "config.json"
    else:
        return None
    plancache.note(f)
    return f if f.is_file() else None


def check_source_config(path: Path, r: Recipe) -> None:
    """What the source's ``config.json`` (:func:`source_config_path`) can tell before any stage
    runs: a custom-code model (``auto_map``) is refused; an LLM's ``model_type`` must be one the
    LLM export writes (``tasks.llm.families.SUPPORTED``) with an MLP activation it writes
    (``hidden_act``), ``export.parts`` at most its
    ``num_hidden_layers``; ``export.context_length`` (LLM) or ``export.sequence_length``
    (encoder) at most ``max_position_embeddings``. Raises RecipeError with the key paths."""
    from .llm.families import ACTIVATIONS, SUPPORTED, unsupported

    f = source_config_path(r.source)
    if f is None:  # not local: the facts kept in the repo (recipes/models/), when there are any
        from .sources.model_facts import facts_dir, find

        plancache.note(facts_dir())
        hit = find(r.source.hf, r.source.revision) if r.source.hf else None
        if hit is None:
            return
        f, cfg = hit[0], dict(hit[1]["config"])
        plancache.note(f)
    else:
        try:
            cfg = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise RecipeError(path, [("source", f"expected a readable JSON config.json, found {f} ({e})")]) from None
    problems = []
    unsupported_model = False
    if not isinstance(cfg, dict):
        raise RecipeError(path, [("source", f"expected a JSON object in {f}, found {type(cfg).__name__}")])
    if cfg.get("auto_map"):
        problems.append(("source", "expected a model transformers implements, found auto_map in its config.json "
                                   "(custom modelling code that runs only with trust_remote_code=True); npubuild "
                                   "refuses custom-code models: that code would run unreviewed and is not part "
                                   "of any stage key"))
    limit = cfg.get("max_position_embeddings")
    if r.export.family == "llm":
        mt = cfg.get("model_type")
        why = "; ".join(unsupported(cfg))
        if mt not in SUPPORTED or why:
            unsupported_model = True
            problems.append(("export.family", f"expected a model_type the LLM export supports "
                                              f"({', '.join(SUPPORTED)}), found {mt!r} in {f.name}"
                                              + (f" with {why} (not in tasks/llm/families.py)" if why else "")))
        act = cfg.get("hidden_act", "silu")
        if act not in ACTIVATIONS:
            problems.append(("export.family", f"expected an MLP activation the LLM export writes "
                                              f"({', '.join(ACTIVATIONS)}), found hidden_act {act!r} in {f.name}"))
        layers = cfg.get("num_hidden_layers")
        if isinstance(layers, int) and r.export.parts > layers:
            problems.append(("export.parts", f"expected at most the model's {layers} layers "
                                             f"(num_hidden_layers), found {r.export.parts}"))
        if isinstance(limit, int) and r.export.context_length > limit:
            problems.append(("export.context_length", f"expected at most the model's max_position_embeddings "
                                                      f"({limit}), found {r.export.context_length}"))
    elif isinstance(limit, int) and r.export.sequence_length > limit:
        problems.append(("export.sequence_length", f"expected at most the model's max_position_embeddings "
                                                   f"({limit}), found {r.export.sequence_length}"))
    if r.export.family == "encoder":
        problems += tokenizer_problems(f.parent)
    bs = r.quantize.block_size
    feats = {k: cfg.get(k) for k in ("hidden_size", "intermediate_size", "dim", "hidden_dim", "n_embd")}
    if isinstance(cfg.get("head_dim"), int) and isinstance(cfg.get("num_attention_heads"), int):
        feats["head_dim x num_attention_heads"] = cfg["head_dim"] * cfg["num_attention_heads"]
    for key, n in feats.items() if bs else ():
        if isinstance(n, int) and n % bs:
            problems.append(("quantize.block_size", f"expected a block size that divides the model's in-features, "
                                                    f"found {bs} with {key} {n} in {f.name}"))
    if problems:  # a model not implemented, and nothing else wrong: UnsupportedModel (the catalog lists it)
        raise (UnsupportedModel if unsupported_model and len(problems) == 1 else RecipeError)(path, problems)


def tokenizer_problems(folder: Path) -> list[tuple[str, str]]:
    """What the source's tokenizer files say against the exported encoder graph's inputs:
    ``tokenizer_config.json``'s ``model_input_names`` (when it has one) must hold every input of
    ``tasks.encoder.inputs.REQUIRED_INPUTS``; the ones in ``ZERO_WHEN_ABSENT``
    (``token_type_ids``) may be missing, they are fed as zeros. [(key path, message)]."""
    f = folder / "tokenizer_config.json"
    plancache.note(f)
    try:
        names = json.loads(f.read_text(encoding="utf-8")).get("model_input_names") if f.is_file() else None
    except (OSError, ValueError, AttributeError) as e:
        return [("source", f"expected a readable JSON tokenizer_config.json, found {f} ({e})")]
    if names is None:
        return []
    from .encoder.inputs import REQUIRED_INPUTS, ZERO_WHEN_ABSENT

    missing = [n for n in REQUIRED_INPUTS if not isinstance(names, list) or n not in names]
    if not missing:
        return []
    return [("source", f"expected a tokenizer whose model_input_names include {', '.join(REQUIRED_INPUTS)} (inputs "
                       f"every exported encoder graph requires; {', '.join(ZERO_WHEN_ABSENT)} may be absent: fed as "
                       f"zeros), found model_input_names {json.dumps(names)} in {f}")]

"""Recipe files as YAML: safe loading with YAML 1.2 core-schema scalars (:class:`_Core12Resolver`),
duplicate keys, anchors/aliases and deep nesting refused (:class:`_RecipeLoader`), parses kept
in the stat cache (:func:`parse_cached`), and the hints a "found" message gets for text that
YAML 1.1 would have read as a number or a bool (:func:`yaml11_hint`). :mod:`tasks.recipe.load`
reads the files and validates what they hold.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

MAX_DEPTH = 32  # nesting levels of mappings and lists (recipes use about 5)


class _Core12Resolver(yaml.resolver.BaseResolver):
    """Plain scalars resolved by the YAML 1.2 core schema, not PyYAML's YAML 1.1 rules:
    ``0100`` is 100 (octal is ``0o100``), ``0x80`` is 128, ``1e9`` is a float, and ``yes``,
    ``no``, ``on``, ``off``, ``2:08``, ``1_000``, ``0b101`` and dates are text."""


for _tag, _re, _first in [
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    (
        "float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        list("-+.0123456789"),
    ),
]:
    _Core12Resolver.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(_re), _first)


class _RecipeLoader(
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    yaml.composer.Composer,
    yaml.constructor.SafeConstructor,
    _Core12Resolver,
):
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
                None,
                None,
                f"anchors and aliases (*name, <<: *name) are not supported in recipes; use extends "
                f"(a value starting with '*' is an alias: quote a glob pattern, \"*{ev.anchor}\")",
                ev.start_mark,
            )
        if getattr(ev, "anchor", None):
            raise yaml.composer.ComposerError(
                None,
                None,
                "anchors and aliases (&name, *name) are not supported in recipes; use extends",
                ev.start_mark,
            )
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"expected at most {MAX_DEPTH} levels of nested mappings and lists, found more",
                ev.start_mark,
            )
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


def glob_hint(text: str, mark) -> str:
    """The quoting advice for a scanner error on a plain value that starts with '*'."""
    try:
        line = text.splitlines()[mark.line]
    except (IndexError, AttributeError):
        return ""
    word = re.match(r"[^\s,\]}]*", line[mark.column :]).group(0)
    if not word.startswith("*"):
        return ""
    return f"; a value starting with '*' is a YAML alias: quote a glob pattern, \"{word}\""


def with_nul(value, prefix: str = "") -> list[tuple[str, str]]:
    """(key path, text) of every key or text value in ``value`` holding a NUL character."""
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(k, str) and "\0" in k:
                out.append((p, k))
            out += with_nul(v, p)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += with_nul(v, f"{prefix}[{i}]")
    elif isinstance(value, str) and "\0" in value:
        out.append((prefix, value))
    return out


def parse_cached(raw: bytes, text: str):
    """``yaml.load(text, Loader=_RecipeLoader)``, kept in the stat cache under the xxh3 of the
    file's bytes (:meth:`tasks.store.digest.StatCache.derived`): an unchanged recipe is parsed once,
    not by every command (PyYAML's pure-Python parser was a quarter of a no-op build over 50
    recipes). A file that does not parse is never stored, so its error is raised
    each time. Parsed recipes are plain JSON values (mappings, lists, text, numbers, bools,
    null; JSON's Infinity/NaN for .inf/.nan)."""
    import json

    from tasks.store import digest

    parsed = []

    def parse():
        parsed.append(yaml.load(text, Loader=_RecipeLoader))
        return json.dumps(parsed[0]) if _json_exact(parsed[0]) else None  # e.g. `1: x` keys stay ints

    stored = digest.default_stat_cache().derived(
        f"recipe-yaml:{yaml.__version__}", digest.digest_bytes(raw), parse, reader=Path(__file__)
    )
    return json.loads(stored) if stored is not None else parsed[0]


def _json_exact(v) -> bool:
    """True when ``json.loads(json.dumps(v)) == v`` with the same types (text mapping keys,
    no tuples or other objects)."""
    if isinstance(v, dict):
        return all(isinstance(k, str) and _json_exact(x) for k, x in v.items())
    if isinstance(v, list):
        return all(_json_exact(x) for x in v)
    return v is None or isinstance(v, (str, bool, int, float))

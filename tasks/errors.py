"""The bases of every error npubuild raises on purpose, and the recipe loader's errors.

:class:`NpubuildError` is the base of each exception class the package defines;
:class:`UserError` (one of them) marks the errors whose cause the user can fix: a bad recipe
or source, too little memory, a full disk, a lock held too long, a refused publish, an
unreachable remote. The classes stay in the modules that raise them (a module's errors are
part of its stage code digest); each derives from one of these two.

This module imports nothing of the package, so any module can import it. The recipe errors
live here so that the engine rebuilds an unsupported recipe's error from the plan cache
(``tasks/store/plancache.py``) without importing the recipe schema (and pydantic with it)."""

from __future__ import annotations

from pathlib import Path


class NpubuildError(Exception):
    """An error npubuild raises on purpose: its message says what went wrong, naming the
    recipe, stage, file or entry concerned. Not a bug report: a bug is any other exception."""


class UserError(NpubuildError):
    """An error whose cause the user can fix: bad input (a recipe, a source, a data file, a
    publish that is refused) or the environment (memory, disk space, permissions, the network,
    a key lock held too long). The message says what to change."""


class RecipeError(UserError):
    """A recipe (or a set of recipes) is invalid. ``problems`` is a list of
    ``(key_path, message)`` tuples; ``file`` the recipe file."""

    def __init__(self, file: Path | str, problems: list[tuple[str, str]]):
        self.file = str(file)
        self.problems = problems
        lines = [f"{self.file}: {len(problems)} problem(s)"]
        lines += [f"  {path or '<top>'}: {msg}" for path, msg in problems]
        super().__init__("\n".join(lines))


class UnsupportedModel(RecipeError):
    """A valid recipe whose model the LLM export does not implement (its ``model_type`` or a
    feature of it, :func:`tasks.llm.architectures.unsupported`): the recipe is skipped with this
    one-line reason, the catalog lists it as ``unsupported``, and ``doit list`` still exits 0."""


class Unsupported(tuple):
    """A ``(key path, message)`` problem that says the model is not implemented (a
    ``source_check`` hook's, :class:`tasks.contract.stage.Stage`): a recipe with this one
    problem and no other is an :class:`UnsupportedModel`."""

    def __new__(cls, key: str, message: str):
        return super().__new__(cls, (key, message))


def apart(a: float, b: float, decimals: int = 1, most: int = 6) -> tuple[str, str]:
    """``a`` and ``b`` printed with the fewest decimals (at least ``decimals``, at most
    ``most``) at which the two strings differ, so a message comparing them never shows two
    equal figures for unequal values ("needs 0.8 GiB, 0.8 GiB is available"). Equal values
    print equal."""
    d = decimals
    while d < most and a != b and f"{a:.{d}f}" == f"{b:.{d}f}":
        d += 1
    return f"{a:.{d}f}", f"{b:.{d}f}"

"""The recipe loader's errors, in a module of their own: the engine rebuilds an unsupported
recipe's error from the plan cache (``tasks/plancache.py``) without importing the recipe schema
(and pydantic with it)."""

from __future__ import annotations

from pathlib import Path


class RecipeError(Exception):
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
    ``source_check`` hook's, :class:`tasks.stages.contract.Stage`): a recipe with this one
    problem and no other is an :class:`UnsupportedModel`."""

    def __new__(cls, key: str, message: str):
        return super().__new__(cls, (key, message))

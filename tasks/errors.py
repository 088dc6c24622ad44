"""The bases of every error npubuild raises on purpose, how a command shows an error, and the
recipe loader's errors.

:class:`NpubuildError` is the base of each exception class the package defines;
:class:`UserError` (one of them) marks the errors that explain themselves: a bad recipe, source
or data file, too little memory, a full disk, a lock held too long, a refused publish, an
unreachable remote, a stage whose result fails its recipe's check. A command shows such an
error as its message alone (:func:`shown`); any other exception (a bug, a tool's failure, an
internal signal that escaped its catcher) keeps its traceback. So the class hierarchy alone
decides how an error is shown: no command lists error types. The classes stay in the modules
that raise them (a module's errors are part of its stage code digest); each derives from one of
these two.

This module imports nothing of the package, so any module can import it. The recipe errors
live here so that the engine rebuilds an unsupported recipe's error from the plan cache
(``tasks/store/plancache.py``) without importing the recipe schema (and pydantic with it)."""

from __future__ import annotations

from pathlib import Path


class NpubuildError(Exception):
    """An error npubuild raises on purpose: its message says what went wrong, naming the
    recipe, stage, file or entry concerned. One that is not a :class:`UserError` is an internal
    signal its callers catch (a key that cannot be computed yet, a remote entry that fails its
    check) or a tool's failure (a Genie C API status): should it reach a command, it shows with
    its traceback, as a bug does (a bug is any other exception)."""


class UserError(NpubuildError):
    """An error that explains itself: its cause is the user's input (a recipe, a source, a data
    file, a publish that is refused), the environment (memory, disk space, permissions, the
    network, a key lock held too long) or a result that fails the recipe's own check (a verify
    threshold, nodes left off the NPU, a bundle that differs from what it declares). The message
    says what to change; a command shows it alone (:func:`shown`), without a traceback."""


class InputError(UserError, ValueError):
    """A value given to a stage that it finds unusable only when it runs: a data file's content,
    a recipe value against the model it is applied to, an ``NPUBUILD_*`` variable. The message
    names the file, key or variable, what was expected and what was found. A ``ValueError`` too,
    for the callers that catch one."""


class InputMissing(UserError, FileNotFoundError):
    """A file the recipe, the model or the installation names is not there (a data file, a
    checkpoint's weights, a library of the QNN SDK); the message names it and where it was looked
    for. A ``FileNotFoundError`` too, for the callers that catch one."""


def shown(err: BaseException) -> str | None:
    """How a command shows ``err``: for an error that explains itself (a :class:`UserError`),
    ``<class name>: <message>`` followed by its notes (e.g. the stage's kept log), one per line;
    None for any other exception, which the command lets go so that its traceback shows. The one
    place that decides it, from the class hierarchy alone."""
    if not isinstance(err, UserError):
        return None
    return "\n".join([f"{type(err).__name__}: {err}", *getattr(err, "__notes__", ())])


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

"""The error of a model source (``tasks/sources/``): a module of its own, imported by the recipe
loader's checks without the rest of the package."""

from tasks.errors import UserError


class SourceError(UserError):
    """The recipe's source cannot be found or fetched."""

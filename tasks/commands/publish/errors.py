"""The publish command's error."""

from tasks.errors import UserError


class PublishError(UserError):
    """The recipe cannot be published (not verified, stale, not built) or a target failed."""

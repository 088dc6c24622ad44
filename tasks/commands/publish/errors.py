"""The publish command's error."""


class PublishError(Exception):
    """The recipe cannot be published (not verified, stale, not built) or a target failed."""

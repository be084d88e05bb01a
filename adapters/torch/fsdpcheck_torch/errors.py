"""The adapter's one error type, a leaf every module may import."""


class UsageError(Exception):
    """Bad input: printed as one line on stderr, exit code 2."""

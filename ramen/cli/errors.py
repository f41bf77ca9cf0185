"""The error type the CLI turns into a one-line message."""


class UserError(Exception):
    """Something the user can fix: bad input, a missing file. The message names it."""

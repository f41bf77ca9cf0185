"""The error type the CLI turns into a one-line message, and the quiet end of an output nobody
reads any more."""

import os
import sys


class UserError(Exception):
    """Something the user can fix: bad input, a missing file. The message names it."""


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush finds no broken pipe (as
    Python's documentation of SIGPIPE advises), nor a full disk it would print a traceback for."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)

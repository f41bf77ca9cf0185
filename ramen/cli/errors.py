"""The error types the CLI turns into a one-line message, and the quiet end of an output nobody
reads any more."""

import contextlib
import os
import sys


class UserError(Exception):
    """Something the user can fix: bad input, a missing file. The message names it."""


class OutputError(UserError):
    """The output does not take the rows (a full disk, a quota, a device gone): the command ends with
    this one line, not a traceback. A reader that went away (BrokenPipeError) is not one."""


@contextlib.contextmanager
def writing(what: str = "the output"):
    """Around what writes to a sink: its OSError becomes an OutputError naming `what`."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as e:
        raise OutputError(f"cannot write {what}: {e.strerror or e}") from None


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush finds no broken pipe (as
    Python's documentation of SIGPIPE advises), nor a full disk it would print a traceback for."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)

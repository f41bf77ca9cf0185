"""The worker's one error root: raised where the worker cannot run, caught by `serve` as a one-line
exit (its message names what is wrong)."""


class WorkerError(Exception):
    """The worker cannot run; the message is one line for the supervisor's log."""

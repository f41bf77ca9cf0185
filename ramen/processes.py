"""Facts about other processes on this host."""

import os


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists here. An unknown pid (<= 0), or one we may not
    signal, counts as alive: callers use this to take over what a dead process held, so doubt
    must keep things as they are."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

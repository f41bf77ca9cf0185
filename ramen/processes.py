"""Facts about other processes on this host, and stopping those of one ramen instance."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

INSTANCE_ENV = "RAMEN_INSTANCE"
"""Set by `ramen start` in its environment, so every process it starts, and every process those
start (workers, replayers, Spark's JVM), carries it: how `ramen stop` finds all of them, orphans of
a dead supervisor included, without any of them having to be remembered anywhere."""
PROC = Path("/proc")
KILL_WAIT_S = 5.0
"""How long stop_processes waits for the processes it SIGKILLed to be gone."""
_START_TIME_FIELD = 19
"""starttime (field 22 of /proc/<pid>/stat, in clock ticks since boot), counted from the state (field 3)."""


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


def running(pid: int) -> bool:
    """Alive and not a zombie (a process whose parent died may wait a while to be reaped)."""
    if not pid_alive(pid):
        return False
    try:
        return (PROC / str(pid) / "stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def start_lower_bound_ms(pid: int) -> int | None:
    """The earliest the process holding `pid` now can have started, on the CLOCK_MONOTONIC scale in
    ms (None: no such process, or /proc does not say). Whatever left a sign of life before it was
    another process: the pid was reused. /proc gives the start on the boot-time clock, ahead of the
    monotonic clock by the time the host spent suspended; taking all of that off (and a clock tick
    more) errs towards earlier, so a live owner is never judged a newcomer."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rpartition(")")[2].split()
        start_ticks = int(fields[_START_TIME_FIELD])
    except (OSError, IndexError, ValueError):
        return None
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    suspended_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.monotonic_ns()
    return start_ticks * 1000 // ticks_per_s - (suspended_ns + 999_999) // 1_000_000 - 1000 // ticks_per_s


def instance_processes(token: str) -> list[int]:
    """The live processes, other than this one, whose environment says they belong to the ramen
    instance `token` (INSTANCE_ENV), oldest pid first."""
    wanted = f"{INSTANCE_ENV}={token}".encode()
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if wanted in environ.split(b"\0") and running(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def stop_processes(pids: Iterable[int], grace_s: float, *, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> list[int]:
    """SIGTERM each process, then SIGKILL those still running after grace_s; returns the pids that
    had to be killed."""
    pids = list(pids)
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = clock() + grace_s
    while any(map(running, pids)) and clock() < deadline:
        sleep(0.05)
    killed = [pid for pid in pids if running(pid)]
    for pid in killed:
        _signal(pid, signal.SIGKILL)
    # SIGKILL is delivered, not done: wait (bounded) until they are gone, so that the caller's
    # "stopped" is true when it says it.
    deadline = clock() + KILL_WAIT_S
    while any(map(running, killed)) and clock() < deadline:
        sleep(0.05)
    return killed


def command_line(pid: int) -> str:
    """The process's command line, for messages ("" once it is gone)."""
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass

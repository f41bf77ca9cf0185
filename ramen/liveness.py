"""Heartbeats: how a service under `ramen start` shows that it is not only alive but not stuck.

`ramen start` names a file for each service in $RAMEN_HEARTBEAT_FILE (under `$RAMEN_DIR/run/`).
The service's duty-cycle loop calls `beat()` on every turn; at most once per BEAT_INTERVAL_S it
writes the monotonic clock and its pid there. `ramen start` reads it with `last_beat()`: a loop
that stopped turning (a deadlock, an endless call) stops beating, and is killed and restarted.

The stamp is CLOCK_MONOTONIC, one clock for every process of the host, immune to wall-clock
steps. It carries the writer's pid, so a beat from anyone else (a child that inherited the
variable, the previous instance of the service) never counts for the process being watched.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ramen.key_value import KeyValue

log = logging.getLogger(__name__)

HEARTBEAT_FILE_ENV = "RAMEN_HEARTBEAT_FILE"
#: How often a service writes its heartbeat; a turn of its loop in between costs one clock read.
BEAT_INTERVAL_S = 1.0
_BEAT_INTERVAL_NS = int(BEAT_INTERVAL_S * 1e9)

#: The file's layout: monotonic time in ns @0, the writer's pid @8.
STAMP = struct.Struct("<qq")
_NEVER = 2 ** 63

_next_beat_ns = 0
_fd = -1


def beat() -> None:
    """Renew this process's heartbeat if ramen start asked for one (a no-op otherwise): cheap
    enough to call on every turn of a duty cycle."""
    global _next_beat_ns
    now = time.monotonic_ns()
    if now < _next_beat_ns:
        return
    _next_beat_ns = now + _BEAT_INTERVAL_NS
    if _fd < 0 and not _open():
        _next_beat_ns = _NEVER
        return
    try:
        os.pwrite(_fd, STAMP.pack(now, os.getpid()), 0)
    except OSError as e:  # a heartbeat is not worth stopping the service for: ramen start will judge
        log.warning("cannot write the heartbeat: %s", e)


def _open() -> bool:
    global _fd
    path = os.environ.get(HEARTBEAT_FILE_ENV)
    if not path:
        return False
    try:
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    except OSError as e:
        log.warning("cannot open the heartbeat file %s: %s; not beating", path, e)
        return False
    return True


def last_beat(path: str | os.PathLike, pid: int) -> float | None:
    """When process `pid` last beat into path, in seconds on time.monotonic's scale; None if it
    has not (yet), or the file holds someone else's beat."""
    try:
        with open(path, "rb") as f:
            data = f.read(STAMP.size)
    except OSError:
        return None
    if len(data) < STAMP.size:
        return None
    stamp_ns, writer = STAMP.unpack(data)
    return stamp_ns / 1e9 if writer == pid else None


class HeartbeatFile:
    """A service's heartbeat as its keeper sees it (see ramen.cli.keeper's Liveness)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def last_sign_of_life(self, pid: int) -> float | None:
        return last_beat(self.path, pid)


@dataclass(frozen=True)
class SupervisorAlive(KeyValue):
    """The value of the ephemeral `sites/<site>/supervisor/alive` key: the supervisor of the site
    runs (its session lives). Written by the supervisor as it starts, gone when it stops or its
    session expires; a replay client that sees none for a while tells its user at once rather
    than wait out its timeout for replayers nobody will start."""

    KEY: ClassVar[str] = "sites/<site>/supervisor/alive"
    pid: int
    started_us: int

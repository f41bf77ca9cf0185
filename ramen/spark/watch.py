"""Whether a running Spark job still moves: a Spark Connect progress handler with a clock.

A job can wait for ever without an error: its only worker is gone (standalone Spark keeps the
tasks pending until an executor comes), or the driver's scheduler died of an OutOfMemoryError.
Spark reports each operation's progress (per stage: tasks, tasks done, bytes read; tasks in
flight); a job whose progress has not changed for STALL_S is declared stalled, and its caller
interrupts it and fails in one line rather than waiting out a replay's timeout.
"""

from __future__ import annotations

import os
import threading

from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.spark.defaults import STALL_ENV, STALL_S


def configured_stall_s() -> float:
    return float(os.environ.get(STALL_ENV) or STALL_S)


class JobWatch:
    """Register on a session (`registerProgressHandler`); `begin()` before each call, `stalled()`
    from another thread while it runs."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK, stall_s: float | None = None) -> None:
        self.clock = clock
        self.stall_s = configured_stall_s() if stall_s is None else stall_s
        self._lock = threading.Lock()
        self._progress: tuple = ()
        self._moved_s: float | None = None

    def begin(self) -> None:
        with self._lock:
            self._progress, self._moved_s = (), self.clock.seconds()

    def end(self) -> None:
        with self._lock:
            self._moved_s = None

    def __call__(self, stages, inflight_tasks: int, operation_id, done: bool) -> None:
        progress = (tuple((s.stage_id, s.num_tasks, s.num_completed_tasks, s.num_bytes_read, s.done)
                          for s in stages or ()), inflight_tasks, operation_id, done)
        with self._lock:
            if progress != self._progress and self._moved_s is not None:
                self._progress, self._moved_s = progress, self.clock.seconds()

    def stalled(self) -> float | None:
        """Seconds without progress, once more than stall_s; else None (or when no call runs)."""
        with self._lock:
            if self._moved_s is None:
                return None
            still = self.clock.seconds() - self._moved_s
            return still if still > self.stall_s else None

"""Idle strategies for duty-cycle loops: what an agent does when a cycle found no work.

With two cores, a reader that spins holds one of them; so the backoff strategy sleeps (by default
at once, without Aeron's spins and yields first: defaults.IDLE_MAX_SPINS says why), doubling the
sleep up to a cap, and snaps back on the first work found.
"""

import os
import time

from ramen.transport.defaults import IDLE_MAX_PARK_S, IDLE_MAX_SPINS, IDLE_MAX_YIELDS, IDLE_MIN_PARK_S


class BackoffIdleStrategy:
    """Spin, then yield, then sleep with exponential backoff (Aeron's BackoffIdleStrategy)."""

    __slots__ = ("max_spins", "max_yields", "min_park_s", "max_park_s", "_spins", "_yields", "_park_s")

    def __init__(self, max_spins: int = IDLE_MAX_SPINS, max_yields: int = IDLE_MAX_YIELDS,
                 min_park_s: float = IDLE_MIN_PARK_S, max_park_s: float = IDLE_MAX_PARK_S) -> None:
        self.max_spins = max_spins
        self.max_yields = max_yields
        self.min_park_s = min_park_s
        self.max_park_s = max_park_s
        self.reset()

    def reset(self) -> None:
        self._spins = 0
        self._yields = 0
        self._park_s = self.min_park_s

    def idle(self, work_count: int = 0) -> None:
        if work_count > 0:
            if self._spins or self._yields or self._park_s != self.min_park_s:
                self.reset()
            return
        if self._spins < self.max_spins:
            self._spins += 1
        elif self._yields < self.max_yields:
            self._yields += 1
            os.sched_yield()
        else:
            time.sleep(self._park_s)
            self._park_s = min(self._park_s * 2, self.max_park_s)


class BusySpinIdleStrategy:
    """Never sleep: for benchmarks that measure latency with a core to spare."""

    def reset(self) -> None:
        pass

    def idle(self, work_count: int = 0) -> None:
        pass

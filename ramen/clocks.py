"""Clocks, injected (Aeron's EpochClock and NanoClock): code that waits, times out or stamps asks
the clock it was given, so a test drives time forward instead of sleeping and hoping.

Two clocks, because they answer two questions: `nanos()` is CLOCK_MONOTONIC, for durations and
deadlines (immune to wall-clock steps, one clock for every process of the host); `epoch_us()` is
the wall clock, for event times and stamps other processes read.
"""

from __future__ import annotations

import time
from typing import Protocol

NANOS_PER_SECOND = 1_000_000_000
NANOS_PER_MICRO = 1_000


class Clock(Protocol):
    def nanos(self) -> int:
        """CLOCK_MONOTONIC in ns."""

    def epoch_us(self) -> int:
        """Wall-clock time in µs since the Unix epoch."""

    def seconds(self) -> float:
        """`nanos()` in s, for deadlines counted in seconds."""


class SystemClock:
    """The host's clocks."""

    nanos = staticmethod(time.monotonic_ns)
    """The C function itself, not a method around it: a writer asks it on every offer (a Python
    frame there cost 30 ns an offer, 3-5% of a 32-byte one)."""

    def epoch_us(self) -> int:
        return time.time_ns() // NANOS_PER_MICRO

    def seconds(self) -> float:
        return time.monotonic()


#: The clock of code that was not given one.
SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """A clock that moves only when told: for tests, and for simulations that replay time.

    Both readings move together, so a deadline and a stamp taken from the same clock agree.
    """

    def __init__(self, epoch_us: int = 1_700_000_000_000_000, nanos: int = 1_000 * NANOS_PER_SECOND) -> None:
        self._epoch_us = epoch_us
        self._nanos = nanos

    def nanos(self) -> int:
        return self._nanos

    def epoch_us(self) -> int:
        return self._epoch_us

    def seconds(self) -> float:
        return self._nanos / NANOS_PER_SECOND

    def advance(self, seconds: float) -> None:
        """Move both readings forward by `seconds` (never backwards: neither clock does)."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        step_ns = round(seconds * NANOS_PER_SECOND)
        self._nanos += step_ns
        self._epoch_us += step_ns // NANOS_PER_MICRO

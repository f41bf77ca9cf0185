"""Waiting in tests for what another process or thread does: a deadline that fails the test when it
passes, never an assertion on how long it took."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

WAIT_S = 30.0
"""Generous on purpose: a condition not met by then is a failure, not a slow machine."""
POLL_S = 0.02


def wait_for(condition: Callable[[], T], what: str = "condition", *, timeout_s: float = WAIT_S,
             poll_s: float = POLL_S) -> T:
    """The first truthy value of condition(), asked every poll_s; fails naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not met within {timeout_s:g} s")
        time.sleep(poll_s)


def quiet_supervisor_stats(client, site: str):
    """The site supervisor's stats key as written after this call and with no replay running: its
    counters then hold every spawn before (the key is rewritten every second, so the one read at once
    may predate the last replays of an earlier test)."""
    from ramen import supervisor_stats

    asked_us = time.time_ns() // 1000
    return wait_for(lambda: (found := supervisor_stats.read(client, site)) is not None
                    and found.updated_us > asked_us and not found.replays and found,
                    what=f"site {site}'s supervisor stats of a moment without replays")

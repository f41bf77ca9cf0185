"""The backoff idle strategy: what an idle duty cycle does, cycle after cycle (its sleeps and yields
recorded instead of taken)."""

import pytest

from ramen.transport import BackoffIdleStrategy
from ramen.transport import idle as idle_module
from ramen.transport.defaults import IDLE_MAX_PARK_S, IDLE_MIN_PARK_S


@pytest.fixture
def actions(monkeypatch) -> list:
    done: list = []
    monkeypatch.setattr(idle_module.time, "sleep", lambda s: done.append(("sleep", s)))
    monkeypatch.setattr(idle_module.os, "sched_yield", lambda: done.append(("yield",)))
    return done


def test_by_default_an_idle_cycle_sleeps_at_once_and_backs_off_to_the_cap(actions):
    idle = BackoffIdleStrategy()
    for _ in range(12):
        idle.idle(0)
    parks = [a[1] for a in actions]
    assert all(a[0] == "sleep" for a in actions) and len(actions) == 12  # no spin, no yield
    assert parks[0] == IDLE_MIN_PARK_S
    assert parks[1] == 2 * IDLE_MIN_PARK_S
    assert parks == sorted(parks) and parks[-1] == IDLE_MAX_PARK_S


def test_work_snaps_the_backoff_back_to_the_shortest_sleep(actions):
    idle = BackoffIdleStrategy()
    for _ in range(5):
        idle.idle(0)
    idle.idle(3)  # a cycle that did work does not sleep
    idle.idle(0)
    assert len(actions) == 6
    assert actions[-1] == ("sleep", IDLE_MIN_PARK_S)


def test_spins_and_yields_come_first_when_asked_for(actions):
    idle = BackoffIdleStrategy(max_spins=2, max_yields=3, min_park_s=0.001, max_park_s=0.004)
    for _ in range(9):
        idle.idle(0)
    # two spins do nothing at all, then three yields, then sleeps doubling up to the cap
    assert actions == [("yield",)] * 3 + [("sleep", 0.001), ("sleep", 0.002), ("sleep", 0.004), ("sleep", 0.004)]

"""ComputeThread: a light function's calls off the duty cycle, their results back in call order."""

from __future__ import annotations

import threading

import pytest

from tests.waiting import wait_for
from workers.compute_thread import ComputeThread

WAIT_S = 10.0


@pytest.fixture
def compute():
    thread = ComputeThread("test", max_in_flight=3)
    yield thread
    thread.close()


def gated(gate: threading.Event, value):
    assert gate.wait(WAIT_S), "the test never opened the gate"
    return value


def test_results_come_back_in_call_order_and_none_before_the_oldest_returns(compute):
    gate = threading.Event()
    compute.submit("a", gated, gate, 1)
    compute.submit("b", lambda: 2)
    assert compute.completed() == []  # "b" may be done: it waits behind "a"
    assert len(compute) == 2
    gate.set()
    results = []
    wait_for(lambda: results.extend(compute.completed()) or len(results) == 2, "both results")
    assert results == [("a", 1), ("b", 2)] and len(compute) == 0


def test_full_at_max_in_flight_and_free_again_once_a_result_is_taken(compute):
    gate = threading.Event()
    for i in range(3):
        assert not compute.full
        compute.submit(i, gated, gate, i)
    assert compute.full
    gate.set()
    compute.wait(WAIT_S)
    wait_for(lambda: compute.completed() or not compute.full, "a result")
    assert not compute.full


def test_wait_returns_when_the_oldest_call_does_not_after_its_timeout(compute):
    gate = threading.Event()
    compute.submit("a", gated, gate, 1)
    threading.Timer(0.05, gate.set).start()
    compute.wait(WAIT_S)  # the test would take WAIT_S if wait did not wake with the call
    assert gate.is_set() and compute.completed() == [("a", 1)]
    compute.wait(WAIT_S)  # nothing in flight: returns at once


def test_a_calls_exception_is_raised_in_the_caller_and_the_later_results_stay(compute):
    def failing():
        raise ValueError("bad window")
    compute.submit("a", failing)
    compute.submit("b", lambda: 2)
    with pytest.raises(ValueError, match="bad window"):
        wait_for(lambda: compute.completed() and False, "the failure")
    assert compute.drain() == [("b", 2)]


def test_drain_waits_for_every_call(compute):
    gate = threading.Event()
    compute.submit("a", gated, gate, 1)
    compute.submit("b", lambda: 2)
    threading.Timer(0.05, gate.set).start()
    assert compute.drain() == [("a", 1), ("b", 2)] and len(compute) == 0


def test_close_drops_the_calls_not_started():
    compute = ComputeThread("test", max_in_flight=3)
    gate, ran = threading.Event(), []
    compute.submit("a", gated, gate, 1)
    compute.submit("b", ran.append, "b")
    threading.Timer(0.05, gate.set).start()
    compute.close()
    assert ran == [] and len(compute) == 0

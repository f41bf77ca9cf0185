"""ramen.wait_queue: a loop's wait for events gives up at its timeout even when a signal handler
ran meanwhile and outlasted it (the supervisor that got SIGTERM just then never stopped)."""

from __future__ import annotations

import queue
import signal
import threading
import time

import pytest

from ramen.wait_queue import wait_queue

TIMEOUT_S = 0.2
SIGNAL_AFTER_S = 0.1
"""The signal comes while the get waits..."""
HANDLER_S = 0.3
"""...and its handler returns after the get's deadline."""
RESCUE_S = 10.0
"""A get that would wait for ever is handed an item then, for the test to fail rather than hang."""


def test_a_signal_handled_past_the_timeout_does_not_make_the_wait_endless():
    q = wait_queue()
    rescue = threading.Timer(RESCUE_S, q.put, ["rescued"])
    handled = []
    previous = signal.signal(signal.SIGALRM, lambda *_: (time.sleep(HANDLER_S), handled.append(True)))
    try:
        rescue.start()
        signal.setitimer(signal.ITIMER_REAL, SIGNAL_AFTER_S)
        with pytest.raises(queue.Empty):
            q.get(timeout=TIMEOUT_S)
    finally:
        rescue.cancel()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert handled

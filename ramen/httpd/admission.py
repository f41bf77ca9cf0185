"""What renders may start: a bound on the replays httpd runs at once and on those waiting for one,
and the cancellation of a render whose client left.

Without a bound, 200 renders at once asked 200 replays of a loaded machine, none answered within
300 s, and a dashboard's refresh waited behind them for two minutes. A replay over a long hole
takes a slot (`max_running`); past them, up to `max_waiting` wait in turn; past those, the render
is refused at once with 503 and a Retry-After (Overloaded), which Grafana and our page show. A
replay of a short hole (a refresh's newest minutes, at most `light_s` long) takes no slot: the
dashboards on auto-refresh stay quick whatever the long renders queued behind.

Slots are counted in replays, not renders: the renders of one dashboard share their replays
(ramen/httpd/fetch.py), so its 20 panels take the few slots of their few functions, and start
together within the supervisor's merge delay.

Memory is admitted too: each render's estimate of what its buckets and series will take (made
before its fetches, ramen/httpd/renderer.py) is reserved while it runs (RenderMemory), and a
render that would take the renders running past `max_bytes` together is refused with the same
503, so that httpd's memory has a bound whatever the mix of renders.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Hashable, Iterator

MAX_RUNNING_REPLAYS = 8
"""Long replays at once: a dashboard's distinct (function, range) replays start together (its
panels share the rest), and past the 2 cores of a small machine more at once only share them."""
MAX_WAITING_REPLAYS = 32
"""Long replays waiting for a slot, each on one of the fetch pool's threads: the pool keeps threads
for the renders the cache answers (ramen/httpd/fetch.py, FETCH_THREADS)."""
LIGHT_REPLAY_S = 15 * 60
"""A hole this long or shorter is replayed without a slot: a dashboard's refresh (its newest
minutes, the rest cached) never queues behind long renders."""
RETRY_AFTER_S = 5
"""What an overloaded answer's Retry-After asks: about what a long replay of an hour takes here."""
MAX_RENDERS_BYTES = 4 << 30
"""What the renders running may take together, by their estimates: four renders at the most one
may take (ramen/httpd/state.py, MAX_RENDER_BYTES), on a machine of 24 GB."""
MIB = 1 << 20
WAIT_POLL_S = 0.2
"""How often a thread waiting for a slot or for a shared replay looks whether its render was
cancelled (a thread cannot wait on two things at once)."""


class Overloaded(Exception):
    """httpd runs and queues as many long replays as it takes: 503, try again after retry_after_s."""

    def __init__(self, message: str, retry_after_s: int = RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RenderCancelled(Exception):
    """The render's client left: what it alone waited for is dropped (never reaches a client)."""


@dataclass(frozen=True)
class AdmissionLimits:
    max_running: int = MAX_RUNNING_REPLAYS
    max_waiting: int = MAX_WAITING_REPLAYS
    light_s: int = LIGHT_REPLAY_S
    max_bytes: int = MAX_RENDERS_BYTES


class ReplaySlots:
    """The slots long replays take, in turn (threads wait on a condition, oldest woken first)."""

    def __init__(self, limits: AdmissionLimits = AdmissionLimits()) -> None:
        self.limits = limits
        self.running = 0
        self.waiting = 0
        self._changed = threading.Condition()

    @contextmanager
    def held(self, hole_s: int, stop: threading.Event) -> Iterator[None]:
        """Hold a slot for a replay of a hole `hole_s` long (none when light) while the block runs.
        Overloaded at once when every slot is taken and as many replays wait; RenderCancelled when
        `stop` is set while waiting."""
        if hole_s <= self.limits.light_s:
            yield
            return
        with self._changed:
            if self.running >= self.limits.max_running:
                if self.waiting >= self.limits.max_waiting:
                    raise Overloaded(f"httpd runs {self.running} long replays and {self.waiting} wait, the most it "
                                     f"takes: try again in a few seconds, or ask a shorter range")
                self.waiting += 1
                try:
                    while self.running >= self.limits.max_running:
                        if stop.is_set():
                            raise RenderCancelled()
                        self._changed.wait(WAIT_POLL_S)
                finally:
                    self.waiting -= 1
            self.running += 1
        try:
            yield
        finally:
            with self._changed:
                self.running -= 1
                self._changed.notify()


class RenderMemory:
    """What the renders running are estimated to take, reserved as each starts its fetches and
    released as it ends, by piece (a function over a range): the renders of one dashboard share
    their pieces' buckets (ramen/httpd/fetch.py), so a piece is reserved once, whoever holds it. A
    render alone is always let in (its own bound, Limits.max_render_bytes, is checked before);
    beside others, one whose new pieces would take them past `max_bytes` is Overloaded."""

    def __init__(self, limits: AdmissionLimits = AdmissionLimits()) -> None:
        self.limits = limits
        self.reserved = 0
        self._held: dict[Hashable, list[int]] = {}
        """piece -> [its bytes, the renders holding it]"""
        self._lock = threading.Lock()

    def reserve(self, pieces: dict[Hashable, int]) -> None:
        """Hold every piece (its estimated bytes), all or none."""
        with self._lock:
            new = sum(nbytes for piece, nbytes in pieces.items() if piece not in self._held)
            if new and self.reserved and self.reserved + new > self.limits.max_bytes:
                raise Overloaded(f"the renders running are estimated to take {self.reserved / MIB:,.0f} MiB, and "
                                 f"this one {new / MIB:,.0f} MiB more, past the {self.limits.max_bytes / MIB:,.0f} "
                                 f"MiB they may take together: try again in a few seconds, or ask a shorter range")
            for piece, nbytes in pieces.items():
                held = self._held.setdefault(piece, [nbytes, 0])
                self.reserved += nbytes if held[1] == 0 else 0
                held[1] += 1

    def release(self, pieces) -> None:
        with self._lock:
            for piece in pieces:
                held = self._held[piece]
                held[1] -= 1
                if held[1] == 0:
                    del self._held[piece]
                    self.reserved -= held[0]

"""A publication's flow control and cleaning: how far its writer may go, and the space it may reuse.

Each subscriber publishes its position and a heartbeat in the counters file. The writer may start a
message only below its limit, the slowest live subscriber's position plus half a term. A subscriber
silent for longer than the liveness timeout is dropped (a tethered one, a recorder, is waited for
for its hold instead: see `update`). The space two terms behind the slowest subscriber is zeroed
before the writer comes round to it again: the two terms before the tail stay as written, so a
restarted writer finds its last message there (`frame_walk.last_message`) and a restarted recorder
the frames it had not recorded yet.
"""

from __future__ import annotations

import logging

import numpy as np

from ramen.clocks import Clock
from ramen.transport import counters as ctr
from ramen.transport.counters import Counter, CountersFile
from ramen.transport.defaults import LIMIT_REFRESH_INTERVAL_S, SUBSCRIBER_SCAN_INTERVAL_S, TETHER_HOLD_S
from ramen.transport.logbuffer import LogBuffer
from ramen.transport.position import PARTITION_COUNT

log = logging.getLogger(__name__)

CLEAN_LAG_TERMS = 2
"""How far behind the slowest subscriber cleaning stays (see TermCleaner.clean_to)."""

_NANOS_PER_MILLI = 1_000_000


class TermCleaner:
    """Zeroes a log's terms behind its slowest subscriber, so that a reader never mistakes the frames
    of the stream's previous lap for new ones."""

    def __init__(self, terms_np: list[np.ndarray], term_length: int, position_bits_to_shift: int,
                 clean_position: int) -> None:
        """`terms_np`: the terms as uint8 arrays, the publication's own list (emptied at its close)."""
        self._terms_np = terms_np
        self._term_length = term_length
        self._bits = position_bits_to_shift
        self._clean_position = clean_position

    def clean_entered_term(self, index: int) -> None:
        """Nobody reports a position to clean behind: clear the term we enter, which still holds
        the stream of three terms ago, so a reader never mistakes old frames for new ones."""
        self._terms_np[index][:] = 0

    def clean_to(self, position: int) -> None:
        """Zero the bytes more than two terms behind the slowest subscriber (a term at most per
        step), before the writer comes round to them: it writes at most half a term and a message
        past that subscriber, which is three terms past what is zeroed."""
        term_length = self._term_length
        position -= CLEAN_LAG_TERMS * term_length
        clean = max(self._clean_position, position - PARTITION_COUNT * term_length)
        while clean < position:
            index = (clean >> self._bits) % PARTITION_COUNT
            offset = clean & (term_length - 1)
            length = min(position - clean, term_length - offset)
            self._terms_np[index][offset:offset + length] = 0
            clean += length
        self._clean_position = max(self._clean_position, position)


class FlowControl:
    """The subscribers of one log, as its writer sees them: who is live, and the limit they allow."""

    def __init__(self, log_buffer: LogBuffer, counters: CountersFile, clock: Clock, cleaner: TermCleaner, *,
                 liveness_timeout_s: float, limit_counter: Counter, dropped_counter: Counter) -> None:
        self._log = log_buffer
        self._counters = counters
        self._clock = clock
        self._cleaner = cleaner
        self._liveness_timeout_ms = int(liveness_timeout_s * 1000)
        self._limit_counter = limit_counter
        self._dropped_counter = dropped_counter
        self._half_term = log_buffer.term_length >> 1
        self._subscribers: list[tuple[int, int | None]] = []  # (counter id, tether hold ms or None)
        self._next_scan_ns = 0
        self.next_refresh_ns = 0
        """When the positions are worth reading again (the writer's hot path checks it)."""
        self.connected = False
        self.limit = 0

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    @property
    def has_tethered_subscriber(self) -> bool:
        return any(hold_ms is not None for _, hold_ms in self._subscribers)

    def rescan(self) -> None:
        """Look for new subscribers at the next update, whenever the last scan was."""
        self._next_scan_ns = 0

    def update(self) -> int:
        """Read the subscribers' positions, drop dead ones, clean behind the slowest, move the limit;
        returns the limit (0 with no live subscriber)."""
        counters = self._counters
        correlation_id = self._log.correlation_id
        now_ns = self._clock.nanos()
        self.next_refresh_ns = now_ns + int(LIMIT_REFRESH_INTERVAL_S * 1e9)
        scanned = now_ns >= self._next_scan_ns
        if scanned:
            self._scan_subscribers()
            self._next_scan_ns = now_ns + int(SUBSCRIBER_SCAN_INTERVAL_S * 1e9)
        now_ms = now_ns // _NANOS_PER_MILLI
        min_position = None
        live = []
        left = False
        for counter_id, hold_ms in self._subscribers:
            if counters.state(counter_id) != ctr.RECORD_ALLOCATED or \
                    counters.type_id(counter_id) != ctr.SUBSCRIBER_POSITION_TYPE_ID or \
                    counters.get(counter_id, ctr.REGISTRATION_ID_OFFSET) != correlation_id:
                left = True
                continue  # the subscriber closed (its slot may be another counter of this log's by now)
            if counters.get(counter_id, ctr.STATUS_OFFSET) == ctr.COUNTER_DROPPED:
                continue
            # A tethered subscriber (a recorder) is waited for while it is silent, even dead, for
            # its hold: a recorder killed with -9 and restarted within it takes over from where
            # it was (recorder.py), and nothing goes unrecorded. Past the hold the writer goes on.
            silence_limit_ms = self._liveness_timeout_ms if hold_ms is None else hold_ms
            if now_ms - counters.get(counter_id, ctr.HEARTBEAT_OFFSET) > silence_limit_ms:
                self._drop(counter_id, now_ms)
                continue
            live.append((counter_id, hold_ms))
            position = counters.get(counter_id)
            if min_position is None or position < min_position:
                min_position = position
        self._subscribers = live
        if left and not scanned:
            # One that left may have handed over to one not seen yet (a recorder or a network
            # sender taking over a tethered position): look now, not at the next scan, lest the
            # writer be told for a moment that nobody reads.
            self._next_scan_ns = 0
            return self.update()
        connected = min_position is not None
        if connected != self.connected:
            self.connected = connected
            self._log.is_connected = connected
        if not connected:
            self.limit = 0
        else:
            self._cleaner.clean_to(min_position)
            self.limit = min_position + self._half_term
        self._limit_counter.set(self.limit)
        return self.limit

    def _scan_subscribers(self) -> None:
        known = {counter_id for counter_id, _ in self._subscribers}
        for counter_id in self._counters.find(ctr.SUBSCRIBER_POSITION_TYPE_ID, self._log.correlation_id):
            if counter_id not in known:
                hold_ms = ctr.tether_hold_ms(self._counters.key(counter_id))
                if hold_ms == 0:
                    hold_ms = int(TETHER_HOLD_S * 1000)
                self._subscribers.append((counter_id, hold_ms))

    def _drop(self, counter_id: int, now_ms: int) -> None:
        counters = self._counters
        counters.put(counter_id, ctr.STATUS_OFFSET, ctr.COUNTER_DROPPED)
        self._dropped_counter.add(1)
        idle_s = (now_ms - counters.get(counter_id, ctr.HEARTBEAT_OFFSET)) / 1000
        log.warning("%s: dropped subscriber %r (pid %d) at position %d: no heartbeat for %.1f s",
                    self._log.path.name, counters.label(counter_id), counters.get(counter_id, ctr.OWNER_ID_OFFSET),
                    counters.get(counter_id), idle_s)

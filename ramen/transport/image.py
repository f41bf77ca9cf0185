"""An image: one subscriber's reading of one log buffer (Aeron's Image plus its subscriber position).

The reader walks committed frames from its position, stops at the first length <= 0, skips PAD
frames, and publishes its position and a heartbeat in the counters file so the writer knows how far
it may go. If the writer died mid-frame, the reader turns the stuck frame into padding after the
unblock timeout (Aeron's TermUnblocker) and goes on.
"""

from __future__ import annotations

import logging
from typing import Callable

from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.transport import counters as ctr
from ramen.transport import frame
from ramen.transport.counters import CountersFile
from ramen.transport.defaults import PUBLICATION_UNBLOCK_TIMEOUT_S, TETHER_HOLD_S
from ramen.transport.frame import ALIGN_MASK, ALIGN_UP, Header
from ramen.transport.logbuffer import LogBuffer
from ramen.transport.position import int32
from ramen.transport.status import ABORT, BREAK, COMMIT

log = logging.getLogger(__name__)

FragmentHandler = Callable[[memoryview, int, int, Header], None]
ControlledFragmentHandler = Callable[[memoryview, int, int, Header], int]
BlockHandler = Callable[[memoryview, int, int, int, int], None]

# Hot constants bound to module names: on a per-fragment path a global lookup is cheaper than the
# global-and-attribute lookup of frame.X.
_HDR = frame.HEADER_LENGTH
_TYPE_INDEX = frame.TYPE_OFFSET >> 1  # the type among a frame's 16-bit words
_PAD = frame.HDR_TYPE_PAD
_TERM_ID_INDEX = frame.TERM_ID_OFFSET >> 2  # the term id among a frame's 32-bit words
_DROPPED = ctr.COUNTER_DROPPED

_HOUSEKEEPING_INTERVAL_NS = 1_000_000
"""A poll heartbeats and looks for a stalled writer at most this often: the timeouts these serve are
seconds, and doing both on every poll made an empty poll about three times as slow."""

_RUN_MIN_FRAMES = 16
"""After this many frames in a row of one length, block_poll checks the frames after them a slice at
a time instead of one by one (see _count_same_length). A slice costs about a dozen steps of the walk:
shorter runs are cheaper walked."""


class Image:
    """Reads one log buffer; `poll` hands each committed fragment to a handler."""

    def __init__(self, log_buffer: LogBuffer, counters: CountersFile | None = None, *,
                 join_position: int | None = None, tethered: bool = False, tether_hold_s: float = TETHER_HOLD_S,
                 name: str = "", unblock_timeout_s: float = PUBLICATION_UNBLOCK_TIMEOUT_S,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        """A tethered image holds its writer back (a recorder's: nothing goes unread); once silent,
        for `tether_hold_s` at most, however it went silent (see defaults.TETHER_HOLD_S). `clock`:
        its nanos() stamp the heartbeats and time the unblocking, as the writer's clock reads them."""
        self._nanos = clock.nanos
        self.log = log_buffer
        self.counters = counters
        self.term_length = log_buffer.term_length
        self.bits = log_buffer.position_bits_to_shift
        self.mask = self.term_length - 1
        self.session_id = log_buffer.session_id
        self.stream_id = log_buffer.stream_id
        self.tethered = tethered
        self.name = name or log_buffer.path.name
        self.unblock_timeout_ns = int(unblock_timeout_s * 1e9)
        self._terms = log_buffer.terms
        self._terms_i32 = [t.cast("i") for t in self._terms]
        self._terms_u16 = [t.cast("H") for t in self._terms]
        self.header = Header(log_buffer.initial_term_id, self.bits)
        self._position = log_buffer.producer_position() if join_position is None else join_position
        if self._position & (frame.FRAME_ALIGNMENT - 1):
            raise ValueError(f"{self.name}: join position {self._position} is not frame-aligned")
        self._closed = False
        self._stall_position = -1
        self._stall_since_ns = 0
        self._next_housekeeping_ns = 0
        self._sub_pos = self._unblocked = None
        # The sub-pos counter's record as int64s, for a poll's position store and dropped check (plain
        # reads and stores, as Counter does, without the calls); a scratch record without counters.
        self._sub_pos_record, self._sub_pos_index = memoryview(bytearray(ctr.COUNTER_LENGTH)).cast("q"), 0
        if counters is not None:
            try:
                self._allocate_counters(counters, tether_hold_s)
            except BaseException:  # the counters file refused one: nothing of this image is left held
                self.close()
                raise

    def _allocate_counters(self, counters: CountersFile, tether_hold_s: float) -> None:
        log_buffer = self.log
        key = ctr.subscriber_key(log_buffer.correlation_id, self.session_id, self.stream_id,
                                 tether_hold_ms=round(tether_hold_s * 1000) if self.tethered else None)
        suffix = f"{self.session_id} {self.stream_id} {self.name}{' tethered' if self.tethered else ''}"
        self._sub_pos = counters.allocate(ctr.SUBSCRIBER_POSITION_TYPE_ID, f"sub-pos: {suffix}", key=key,
                                          registration_id=log_buffer.correlation_id,
                                          heartbeat_ms=self._nanos() // 1_000_000)
        self._sub_pos_record, self._sub_pos_index = self._sub_pos.slot()
        self._sub_pos.set(self._position)
        self._unblocked = counters.allocate(ctr.UNBLOCKED_FRAMES_TYPE_ID, f"unblocked: {suffix}", key=key,
                                            registration_id=log_buffer.correlation_id)

    # -- state ----------------------------------------------------------------------------------

    @property
    def position(self) -> int:
        return self._position

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def is_dropped(self) -> bool:
        """The writer gave up on this subscriber because it stopped reading for too long."""
        return self._sub_pos is not None and self._sub_pos.status == ctr.COUNTER_DROPPED

    @property
    def is_end_of_stream(self) -> bool:
        return self._position >= self.log.end_of_stream_position

    def close(self, *, keep_tether: bool = False) -> None:
        """Stop reading. `keep_tether`: leave this tethered image's position in the counters file,
        where it holds the writer back for its hold as a dead one's would, for a successor to take
        over (take_over_dead_tethers): a recorder stopped while its writer goes on loses nothing."""
        if self._closed:
            return
        self._closed = True
        for counter in (self._unblocked,) if keep_tether and self.tethered else (self._sub_pos, self._unblocked):
            if counter is not None:
                counter.close()
        for view in (*self._terms_i32, *self._terms_u16):
            view.release()

    def take_over_dead_tethers(self) -> list[int]:
        """Free the positions of the other tethered readers of this log whose processes are gone
        (a recorder killed, or stopped with keep_tether), which would hold the writer back for
        their hold; returns their counter ids. A network sender's are left to the log's next
        network sender (sender_agent.py). For a recorder that goes on where their recording
        stopped (recorder.py): from now on its own position holds the writer back. Until the writer
        has seen it, a few ms, nothing it needs is cleaned: cleaning stays two terms behind the
        slowest reader (publication.py)."""
        if self.counters is None or not self.tethered:
            return []
        counters = self.counters
        return counters.free_orphans(ctr.SUBSCRIBER_POSITION_TYPE_ID, self.log.correlation_id,
                                     keep=lambda counter_id: _not_a_reader_tether(counters.key(counter_id)))

    # -- polling --------------------------------------------------------------------------------

    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int:
        """Hand up to fragment_limit committed fragments to handler(buffer, offset, length, header)."""
        if self._closed or self._check_dropped():
            return 0
        position = self._position
        index = (position >> self.bits) % 3
        term = self._terms[index]
        lengths = self._terms_i32[index]
        types = self._terms_u16[index]
        header = self.header
        header.buffer = term
        offset = start = position & self.mask
        if start == 0 and self._stale_term_start(lengths, position):
            self._advance(position, 0)
            return 0
        term_length = self.term_length
        fragments = 0
        while fragments < fragment_limit and offset < term_length:
            length = lengths[offset >> 2]
            if length <= 0:
                break
            frame_offset = offset
            offset += (length + ALIGN_UP) & ALIGN_MASK
            if types[(frame_offset >> 1) + _TYPE_INDEX] == _PAD:
                continue
            fragments += 1
            header.offset = frame_offset
            handler(term, frame_offset + _HDR, length - _HDR, header)
        self._advance(position, offset - start)
        return fragments

    def controlled_poll(self, handler: ControlledFragmentHandler, fragment_limit: int) -> int:
        """Like poll, but the handler steers: ABORT, BREAK, COMMIT or CONTINUE."""
        if self._closed or self._check_dropped():
            return 0
        position = self._position
        index = (position >> self.bits) % 3
        term = self._terms[index]
        lengths = self._terms_i32[index]
        types = self._terms_u16[index]
        header = self.header
        header.buffer = term
        offset = start = position & self.mask
        if start == 0 and self._stale_term_start(lengths, position):
            self._advance(position, 0)
            return 0
        fragments = 0
        while fragments < fragment_limit and offset < self.term_length:
            length = lengths[offset >> 2]
            if length <= 0:
                break
            frame_offset = offset
            aligned = (length + ALIGN_UP) & ALIGN_MASK
            if types[(frame_offset >> 1) + _TYPE_INDEX] == _PAD:
                offset += aligned
                continue
            header.offset = frame_offset
            action = handler(term, frame_offset + _HDR, length - _HDR, header)
            if action == ABORT:
                break
            fragments += 1
            offset += aligned
            if action == BREAK:
                break
            if action == COMMIT:
                self._advance(position, offset - start)
                position = self._position
                start = offset
        self._advance(position, offset - start)
        return fragments

    def block_poll(self, handler: BlockHandler, block_length_limit: int) -> int:
        """Hand a run of whole committed frames (headers included) to handler(term, offset, length,
        session_id, term_id) in one call; returns the bytes consumed. The fast path for bulk readers."""
        if self._closed or self._check_dropped():
            return 0
        position = self._position
        index = (position >> self.bits) % 3
        lengths = self._terms_i32[index]
        offset = start = position & self.mask
        if start == 0 and self._stale_term_start(lengths, position):
            self._advance(position, 0)
            return 0
        limit = min(self.term_length, offset + block_length_limit)
        previous = run = 0  # the last frame's length, and how many frames in a row before it had it
        while offset < limit:
            length = lengths[offset >> 2]
            if length <= 0:
                break
            aligned = (length + ALIGN_UP) & ALIGN_MASK
            if offset + aligned > limit and offset > start:
                break
            offset += aligned
            if length != previous:
                previous = length
                run = 0
            elif run < _RUN_MIN_FRAMES:
                run += 1
            else:
                # Frames of one length come in runs (a batch, fixed-size records). Check as many
                # frames again as the run has so far, up to the limit, in one go: the work grows
                # with the frames it may skip, so a run that ends soon costs little.
                same = _count_same_length(lengths, offset, aligned, length, min(run, (limit - offset) // aligned))
                offset += same * aligned
                run += same
        consumed = offset - start
        if consumed:
            term_id = int32(self.header.initial_term_id + (position >> self.bits))
            handler(self._terms[index], start, consumed, self.session_id, term_id)
        self._advance(position, consumed)
        return consumed

    # -- internals ------------------------------------------------------------------------------

    def _stale_term_start(self, lengths, position: int) -> bool:
        """At a term's start, whether the frame there is left from the stream three terms back.

        A reader can reach a term before its writer does (the previous term ended exactly, or with
        padding the writer committed before rotating). Cleaning behind subscribers, or a counters-less
        writer clearing the term it enters, zeroes that space, but only once the writer gets there:
        until then the old frame's term id gives it away."""
        if lengths[0] <= 0:
            return False
        return lengths[_TERM_ID_INDEX] != int32(self.header.initial_term_id + (position >> self.bits))

    def keep_alive(self) -> None:
        """Heartbeat without reading. A reader that holds back on purpose (its own output is back
        pressured) is alive, and must not be dropped by the writer as a dead one would be."""
        self._advance(self._position, 0)

    def _advance(self, position: int, consumed: int) -> None:
        if consumed:
            self._position = position = position + consumed
            self._sub_pos_record[self._sub_pos_index] = position
        now_ns = self._nanos()
        if now_ns >= self._next_housekeeping_ns:
            self._next_housekeeping_ns = now_ns + _HOUSEKEEPING_INTERVAL_NS
            if self._sub_pos is not None:
                self._sub_pos.heartbeat(now_ns // 1_000_000)
            if consumed == 0:
                self._check_blocked(position, now_ns)

    def _check_dropped(self) -> bool:
        if self._sub_pos_record[self._sub_pos_index + ctr.STATUS_OFFSET // 8] == _DROPPED:  # is_dropped, inlined
            log.warning("%s: subscriber at position %d was dropped by the writer for not reading; "
                        "closing this image", self.name, self._position)
            self.close()
            return True
        return False

    def _check_blocked(self, position: int, now_ns: int) -> None:
        """If the writer claimed space past us but left it uncommitted for too long, pad it."""
        if self.log.producer_position() <= position:
            self._stall_position = -1
            return
        if self._stall_position != position:
            self._stall_position = position
            self._stall_since_ns = now_ns
            return
        if now_ns - self._stall_since_ns < self.unblock_timeout_ns:
            return
        if unblock(self.log, position):
            if self._unblocked is not None:
                self._unblocked.add(1)
            log.warning("%s: unblocked a frame left uncommitted at position %d (its writer died mid-message?)",
                        self.name, position)
        self._stall_position = -1


def _not_a_reader_tether(key: bytes) -> bool:
    """A position take_over_dead_tethers leaves: untethered, or a network sender's (which the log's
    next network sender takes over: sender_agent.py)."""
    return ctr.tether_hold_ms(key) is None or ctr.is_network_sender(key)


def _count_same_length(lengths: memoryview, offset: int, aligned: int, length: int, frames: int) -> int:
    """How many of the `frames` frames from offset, `aligned` bytes apart, have the length `length`,
    counted up to the first that does not: where a walk frame by frame would stop."""
    if frames <= 0:
        return 0
    first = offset >> 2
    found = lengths[first:first + frames * (aligned >> 2):aligned >> 2].tolist()
    if found.count(length) == frames:
        return frames
    same = 0
    while found[same] == length:
        same += 1
    return same


def unblock(log_buffer: LogBuffer, position: int) -> bool:
    """Replace the frame stuck at position with padding, as Aeron's TermUnblocker does."""
    term_length = log_buffer.term_length
    bits = log_buffer.position_bits_to_shift
    index = (position >> bits) % 3
    term = log_buffer.terms[index]
    offset = position & (term_length - 1)
    term_id = log_buffer.initial_term_id + (position >> bits)
    producer = log_buffer.producer_position()
    tail_offset = min(term_length, offset + (producer - position))
    length = frame.INT32.unpack_from(term, offset)[0]
    if length < 0:
        pad = -length
    elif length == 0:
        scan = offset + frame.FRAME_ALIGNMENT
        while scan < tail_offset and frame.INT32.unpack_from(term, scan)[0] == 0:
            scan += frame.FRAME_ALIGNMENT
        if scan < tail_offset and any(term[offset:scan]):
            return False  # not a clean gap: leave it
        pad = scan - offset
    else:
        return False
    pad = min(pad, term_length - offset)
    frame.HEADER.pack_into(term, offset, -pad, 0, frame.UNFRAGMENTED, frame.HDR_TYPE_PAD, offset,
                           log_buffer.session_id, log_buffer.stream_id, int32(term_id), 0)
    term[offset:offset + 4] = pad.to_bytes(4, "little", signed=True)
    return True


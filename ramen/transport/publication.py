"""The exclusive publication: the one writer of a log buffer (Aeron's ExclusivePublication).

Every write claims its space by moving the tail first, writes the frame header with a negative
length, then the payload, and commits by storing the positive length last. A reader that meets a
length <= 0 stops there; a frame left negative by a writer that died is turned into padding by the
readers after a timeout (see image.py).

Flow control: each subscriber publishes its position in the counters file. The publication may
start a message only below its limit, the slowest live subscriber's position plus half a term.
Past it, offers return BACK_PRESSURED and nothing is written. The space two terms behind the
slowest subscriber is zeroed before the writer comes round to it again: the two terms before the
tail stay as written, so a restarted writer finds its last message there (workers/worker.py,
last_event_time_us) and a restarted recorder the frames it had not recorded yet.

A publication holds the log's writer lock (writer_lock.py) from before its first write to close:
one writer per log, checked by the kernel. Holding it also proves that whoever wrote the log before
is gone, so a frame it claimed and never committed can be padded at once (seal_dead_writer_claims),
not after the readers' unblock timeout.
"""

from __future__ import annotations

import logging
import struct
import time
from typing import Callable, Sequence

import numpy as np

from ramen.locks import FileLock
from ramen.transport import counters as ctr
from ramen.transport import frame
from ramen.transport.counters import CountersFile
from ramen.transport.defaults import (LIMIT_REFRESH_INTERVAL_S, SUBSCRIBER_LIVENESS_TIMEOUT_S,
                                      SUBSCRIBER_SCAN_INTERVAL_S, TETHER_HOLD_S)
from ramen.transport.image import unblock
from ramen.transport.logbuffer import LogBuffer, pack_tail, tail_term_id, tail_term_offset
from ramen.transport.position import (PARTITION_COUNT, index_by_term_count, int32,
                                      max_possible_position)
from ramen.transport.status import (ADMIN_ACTION, BACK_PRESSURED, CLOSED, MAX_POSITION_EXCEEDED,
                                    NOT_CONNECTED)
from ramen.transport.writer_lock import acquire_writer_lock

log = logging.getLogger(__name__)

# Hot constants bound to module names: on a per-message path a global lookup is cheaper than the
# global-and-attribute lookup of frame.X.
_HDR = frame.HEADER_LENGTH
_ALIGN_UP = frame.FRAME_ALIGNMENT - 1  # frame.align(n) is (n + _ALIGN_UP) & _ALIGN_MASK, inlined
_ALIGN_MASK = -frame.FRAME_ALIGNMENT
_DATA_WORD = frame.DATA_WORD_UNFRAGMENTED
_pack_header = frame.HEADER_BY_WORD.pack_into
_FRAME_LENGTH = struct.Struct("<i")
_FRAME_IDS = struct.Struct("<iiii")  # term offset, session id, stream id, term id: adjacent in the header

# The header's fields as indexes of its int32 words, for writing a block's headers a field at a time.
_LENGTH_WORD = frame.FRAME_LENGTH_OFFSET // 4
_FLAGS_WORD = frame.VERSION_OFFSET // 4  # version, flags and type: _DATA_WORD
_TERM_OFFSET_WORD = frame.TERM_OFFSET_OFFSET // 4
_SESSION_ID_WORD = frame.SESSION_ID_OFFSET // 4
_STREAM_ID_WORD = frame.STREAM_ID_OFFSET // 4
_TERM_ID_WORD = frame.TERM_ID_OFFSET // 4
_RESERVED_WORD = frame.RESERVED_VALUE_OFFSET // 4  # the first of two
_HEADER_WORDS = frame.HEADER_LENGTH // 4

CLEAN_LAG_TERMS = 2
"""How far behind the slowest subscriber cleaning stays (see _clean_to)."""

_COPY_EACH_MIN_LENGTH = 4096
"""Batched payloads of at least this many bytes are copied into the term one by one; shorter ones are
joined and copied in one numpy assignment. Above it the join's second copy of every byte costs more
than a Python step per message (measured: the two are even at 4 KiB)."""


class BufferClaim:
    """Space claimed in a term for a zero-copy write: fill `buffer`, then commit() or abort()."""

    __slots__ = ("buffer", "_term_i32", "_frame_index", "_frame_length", "_term")

    def __init__(self) -> None:
        self.buffer: memoryview | None = None
        self._term = None
        self._term_i32 = None
        self._frame_index = 0
        self._frame_length = 0

    def _wrap(self, term: memoryview, term_i32: memoryview, frame_offset: int, frame_length: int) -> None:
        self._term = term
        self._term_i32 = term_i32
        self._frame_index = frame_offset >> 2
        self._frame_length = frame_length
        self.buffer = term[frame_offset + frame.HEADER_LENGTH:frame_offset + frame_length]

    def commit(self) -> None:
        """Make the message visible to readers."""
        self.buffer.release()
        self.buffer = None
        self._term_i32[self._frame_index] = self._frame_length

    def abort(self) -> None:
        """Give the space up: it becomes padding that readers skip."""
        self.buffer.release()
        self.buffer = None
        frame_offset = self._frame_index << 2
        self._term[frame_offset + frame.TYPE_OFFSET:frame_offset + frame.TYPE_OFFSET + 2] = \
            frame.HDR_TYPE_PAD.to_bytes(2, "little")
        self._term_i32[self._frame_index] = self._frame_length


class ExclusivePublication:
    """Single-writer publication over one log buffer."""

    def __init__(self, log_buffer: LogBuffer, counters: CountersFile | None = None, *,
                 subscriber_liveness_timeout_s: float = SUBSCRIBER_LIVENESS_TIMEOUT_S,
                 writer_lock: FileLock | None = None,
                 nano_clock: Callable[[], int] = time.monotonic_ns) -> None:
        """`writer_lock`: the log's (writer_lock.py), taken before the log was opened for writing
        (workers/worker.py open_output_log); without one, it is taken here (LogBufferBusy if
        another process writes the log). `nano_clock`: CLOCK_MONOTONIC in ns, the clock of the
        subscribers' heartbeats (a test may run it ahead)."""
        self._nano_clock = nano_clock
        self._writer_lock = writer_lock if writer_lock is not None else acquire_writer_lock(log_buffer.path)
        self.log = log_buffer
        self.counters = counters
        self.term_length = log_buffer.term_length
        self.bits = log_buffer.position_bits_to_shift
        self.initial_term_id = log_buffer.initial_term_id
        self.session_id = log_buffer.session_id
        self.stream_id = log_buffer.stream_id
        self.max_payload_length = log_buffer.max_payload_length
        self.max_message_length = log_buffer.max_message_length
        self.max_possible_position = max_possible_position(self.term_length)
        self.subscriber_liveness_timeout_ms = int(subscriber_liveness_timeout_s * 1000)
        self._terms = log_buffer.terms
        self._terms_i32 = [t.cast("i") for t in self._terms]
        self._terms_np = [np.frombuffer(t, dtype=np.uint8) for t in self._terms]
        self._terms_words = [t.view(np.int32) for t in self._terms_np]
        self._tails = log_buffer.tail_counters
        # Resume where the log's tail says: a new log starts at its initial position, a reopened
        # one after the last claimed frame.
        self._term_count = log_buffer.active_term_count
        index = index_by_term_count(self._term_count)
        raw = log_buffer.raw_tail(index)
        self._term_id = tail_term_id(raw)
        # pack_tail(term_id, offset) is pack_tail(term_id, 0) + offset: a claim is an addition and a
        # store. Kept with _term_id (see _pad_and_rotate).
        self._tail_base = pack_tail(self._term_id, 0)
        self._term_offset = tail_term_offset(raw, self.term_length)
        self._term_begin = self._term_count << self.bits
        self._index = index
        self._closed = False
        # Without a counters file nobody can hold the writer back: only the stream end limits it.
        self._limit = self.max_possible_position if counters is None else 0
        # A reopened log may hold frames its previous writer never cleaned: they reappear past our
        # tail when we come round the ring again, so cleaning starts a whole ring behind us.
        self._clean_position = max(0, self.position - PARTITION_COUNT * self.term_length)
        self._subscribers: list[tuple[int, int | None]] = []  # (counter id, tether hold ms or None)
        self._connected = counters is None
        self._next_scan_ns = 0
        self._next_refresh_ns = 0
        self._pub_lmt = self._pub_pos = self._back_pressure = self._dropped = None
        # Where each write stores the new position: the pub-pos counter's value (a plain store, as
        # Counter.set does, without the call), or a scratch word when there is no counters file.
        self._pub_pos_word, self._pub_pos_index = memoryview(bytearray(8)).cast("q"), 0
        if counters is not None:
            key = ctr.STREAM_KEY.pack(log_buffer.correlation_id, self.session_id, self.stream_id, 0)
            suffix = f"{self.session_id} {self.stream_id} {log_buffer.path.name}"
            alloc = counters.allocate
            corr = log_buffer.correlation_id
            self._pub_lmt = alloc(ctr.PUBLISHER_LIMIT_TYPE_ID, f"pub-lmt: {suffix}", key=key, registration_id=corr)
            self._pub_pos = alloc(ctr.PUBLISHER_POSITION_TYPE_ID, f"pub-pos: {suffix}", key=key, registration_id=corr)
            self._back_pressure = alloc(ctr.BACK_PRESSURE_EVENTS_TYPE_ID, f"back-pressure: {suffix}", key=key,
                                        registration_id=corr)
            self._dropped = alloc(ctr.SUBSCRIBERS_DROPPED_TYPE_ID, f"subs-dropped: {suffix}", key=key,
                                  registration_id=corr)
            self._pub_pos_word, self._pub_pos_index = self._pub_pos.slot()
            self._pub_pos.set(self.position)
        self._claim_scratch = BufferClaim()

    # -- state ----------------------------------------------------------------------------------

    @property
    def position(self) -> int:
        return self._term_begin + self._term_offset

    @property
    def position_limit(self) -> int:
        return self._limit

    @property
    def is_connected(self) -> bool:
        """Whether any live subscriber reads this log; while there is none, asking looks again."""
        if not self._connected and self.counters is not None and not self._closed:
            self._update_limit()
        return self._connected

    @property
    def has_tethered_subscriber(self) -> bool:
        """Whether a live tethered subscriber (a recorder) reads this log; asking looks again.
        Beyond Aeron, whose archive starts a recording before its publication connects: a writer
        whose every message must be recorded waits for this before its first."""
        if self.counters is None or self._closed:
            return False
        self._update_limit()
        return any(hold_ms is not None for _, hold_ms in self._subscribers)

    @property
    def subscriber_count(self) -> int:
        """How many live subscribers read this log; asking looks again. For a writer that must
        not start before all its expected readers have joined (a replayer with several)."""
        if self.counters is None or self._closed:
            return 0
        self._next_scan_ns = 0
        self._update_limit()
        return len(self._subscribers)

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def back_pressure_events(self) -> int:
        return 0 if self._back_pressure is None else self._back_pressure.get()

    def close(self, *, end_of_stream: bool = True) -> None:
        """Stop writing; readers see the end of the stream at the current position."""
        if self._closed:
            return
        self._closed = True
        if end_of_stream:
            self.log.end_of_stream_position = self.position
        for counter in (self._pub_lmt, self._pub_pos, self._back_pressure, self._dropped):
            if counter is not None:
                counter.close()
        for view in self._terms_i32:
            view.release()
        self._terms_words.clear()
        self._terms_np.clear()
        self._writer_lock.release()

    # -- offers ---------------------------------------------------------------------------------

    def offer(self, buffer, offset: int = 0, length: int | None = None, reserved_value: int = 0) -> int:
        """Write one message; returns the new position, or a negative status (nothing written)."""
        if length is None:
            length = len(buffer) - offset
        if length > self.max_payload_length:
            return self._offer_fragmented(buffer, offset, length, reserved_value)
        term_offset = self._term_offset
        # The hot path of every offer: _check_limit() runs only when it may have something to say
        # (closed, at the limit, or time to re-read the subscribers' positions), and the claim and
        # the position store are _claim() and _advanced() inlined.
        if self._closed or self._term_begin + term_offset >= self._limit or \
                (self.counters is not None and self._nano_clock() >= self._next_refresh_ns):
            position = self._check_limit()
            if position < 0:
                return position
        frame_length = length + _HDR
        new_offset = term_offset + ((frame_length + _ALIGN_UP) & _ALIGN_MASK)
        if new_offset > self.term_length:
            return self._pad_and_rotate()
        index = self._index
        term = self._terms[index]
        self._tails[index] = self._tail_base + new_offset
        self._term_offset = new_offset
        _pack_header(term, term_offset, -frame_length, _DATA_WORD, term_offset, self.session_id, self.stream_id,
                     self._term_id, reserved_value)
        start = term_offset + _HDR
        if offset or length != len(buffer):
            buffer = memoryview(buffer)[offset:offset + length]
        term[start:start + length] = buffer
        self._terms_i32[index][term_offset >> 2] = frame_length
        position = self._term_begin + new_offset
        self._pub_pos_word[self._pub_pos_index] = position
        return position

    def try_claim(self, length: int, claim: BufferClaim) -> int:
        """Claim space for one unfragmented message, to be written in place and committed."""
        if length > self.max_payload_length:
            raise ValueError(f"claim of {length} bytes exceeds the max payload {self.max_payload_length}")
        position = self._check_limit()
        if position < 0:
            return position
        frame_length = length + frame.HEADER_LENGTH
        aligned = frame.align(frame_length)
        term_offset = self._term_offset
        if term_offset + aligned > self.term_length:
            return self._pad_and_rotate()
        term = self._terms[self._index]
        self._claim(term_offset + aligned)
        frame.HEADER.pack_into(term, term_offset, -frame_length, 0, frame.UNFRAGMENTED, frame.HDR_TYPE_DATA,
                               term_offset, self.session_id, self.stream_id, self._term_id, 0)
        claim._wrap(term, self._terms_i32[self._index], term_offset, frame_length)
        return self._advanced()

    def offer_batch(self, messages: Sequence) -> tuple[int, int]:
        """Write as many whole messages as the limit allows, in blocks of one commit each.

        Returns (messages written, position after them or a negative status if none was written).
        Rotation inside the batch is handled here; the caller retries the rest on back pressure.
        """
        count = len(messages)
        if count == 0:
            return 0, self.position
        lengths = list(map(len, messages))
        payload_length = lengths[0]
        if lengths.count(payload_length) == count:
            # Messages of one length, the common case: where each goes is plain arithmetic.
            if payload_length > self.max_payload_length:
                return self._offer_batch_slow(messages)
            return self._offer_one_length(count, payload_length,
                                          lambda first, block: _copy_messages(messages, first, block, payload_length))
        if max(lengths) > self.max_payload_length:
            return self._offer_batch_slow(messages)
        return self._offer_varied_lengths(messages, np.array(lengths, dtype=np.int64))

    def offer_rows(self, rows: np.ndarray) -> tuple[int, int]:
        """Write each row of a 2-D uint8 array as one message: offer_batch for fixed-size records,
        with no Python work per message (a block's headers and its payloads go in as two arrays).

        Returns (messages written, position after them or a negative status if none was written).
        """
        if not isinstance(rows, np.ndarray) or rows.ndim != 2 or rows.dtype != np.uint8:
            got = f"a {rows.ndim}-D {rows.dtype} array" if isinstance(rows, np.ndarray) else type(rows).__name__
            raise ValueError(f"offer_rows takes a 2-D uint8 array, one message a row (got {got})")
        count, payload_length = rows.shape
        if count == 0:
            return 0, self.position
        if payload_length > self.max_payload_length:
            return self._offer_batch_slow(rows)

        def copy_rows(first: int, block: np.ndarray) -> None:
            block[:, _HDR:_HDR + payload_length] = rows[first:first + len(block)]

        return self._offer_one_length(count, payload_length, copy_rows)

    def offer_block(self, buffer, offset: int, length: int) -> int:
        """Write a block of whole, already framed fragments at the current term offset (Aeron's
        offerBlock): how a replay copies recorded frames. The first frame must carry this
        publication's session, stream, term id and term offset, and the block must fit the term."""
        if self._closed:
            return CLOSED
        if self._term_offset >= self.term_length:
            return self._pad_and_rotate()
        term_offset = self._term_offset
        _, _, _, frame_type, first_offset, session_id, stream_id, term_id, _ = frame.HEADER.unpack_from(buffer, offset)
        if (frame_type, first_offset, session_id, stream_id, term_id) != \
                (frame.HDR_TYPE_DATA, term_offset, self.session_id, self.stream_id, self._term_id):
            raise ValueError(f"block's first frame (type {frame_type}, term {term_id} offset {first_offset}, session "
                             f"{session_id}, stream {stream_id}) does not continue this publication (term "
                             f"{self._term_id} offset {term_offset}, session {self.session_id}, stream {self.stream_id})")
        if length > self.term_length - term_offset or length % frame.FRAME_ALIGNMENT:
            raise ValueError(f"block of {length} bytes does not fit the {self.term_length - term_offset} bytes left in the term")
        position = self._check_limit()
        if position < 0:
            return position
        term = self._terms[self._index]
        self._claim(term_offset + length)
        first_length = int.from_bytes(buffer[offset:offset + 4], "little", signed=True)
        self._terms_i32[self._index][term_offset >> 2] = -length
        term[term_offset + 4:term_offset + length] = memoryview(buffer)[offset + 4:offset + length]
        self._terms_i32[self._index][term_offset >> 2] = first_length
        return self._advanced()

    def offer_frames(self, buffer, offset: int, length: int) -> int:
        """Write whole messages that are already framed elsewhere (a recording's, at any position,
        of any session) at the tail, each frame's term offset, session, stream and term id made
        this publication's; lengths, flags and reserved values are kept.

        Beyond Aeron: how a replayer forwards recorded messages as they lie in a segment, in one
        copy and without reassembling them. The frames must be DATA frames holding whole messages
        and fit one term; a block past the term's end pads it (ADMIN_ACTION), as offer does."""
        if length > self.term_length or length % frame.FRAME_ALIGNMENT:
            raise ValueError(f"a block of {length} bytes of frames does not fit a term of {self.term_length}")
        position = self._check_limit()
        if position < 0:
            return position
        term_offset = self._term_offset
        if term_offset + length > self.term_length:
            return self._pad_and_rotate()
        source = memoryview(buffer)[offset:offset + length]
        first_length = _FRAME_LENGTH.unpack_from(source, 0)[0]
        term = self._terms[self._index]
        self._claim(term_offset + length)
        # Everything but the first length word, which goes last: until then a reader sees no frame.
        term[term_offset + 4:term_offset + length] = source[4:]
        session_id, stream_id, term_id = self.session_id, self.stream_id, self._term_id
        at = 0
        while at < length:
            frame_length = _FRAME_LENGTH.unpack_from(source, at)[0]
            aligned = (frame_length + _ALIGN_UP) & _ALIGN_MASK
            if frame_length < _HDR or at + aligned > length:
                raise ValueError(f"frame of length {frame_length} at {at} of a {length}-byte block")
            _FRAME_IDS.pack_into(term, term_offset + at + frame.TERM_OFFSET_OFFSET, term_offset + at, session_id,
                                 stream_id, term_id)
            at += aligned
        source.release()
        self._terms_i32[self._index][term_offset >> 2] = first_length
        return self._advanced()

    def term_window(self, max_length: int) -> tuple[int, memoryview | None]:
        """(length, view) of the free space at the tail, up to the term end, for frames written in
        place and made visible by commit_window; or (status, None) when no message may start now.

        Beyond Aeron: how a replay reads from its segment files straight into the log, whose
        positions line up with the recording's. The length word at the tail reads zero (here the
        space is clean, zeroed behind the slowest subscriber or when the term was entered; an
        InPlacePublication zeroes just that word), so nothing in the window is visible until
        committed, provided the writer keeps the first frame's length word out of it until then."""
        if self._closed:
            return CLOSED, None
        if self._term_offset >= self.term_length:
            return self._pad_and_rotate(), None
        position = self._check_limit()
        if position < 0:
            return position, None
        term_offset = self._term_offset
        length = min(max_length, self.term_length - term_offset)
        return length, self._terms[self._index][term_offset:term_offset + length]

    def commit_window(self, length: int, first_frame_length: int) -> int:
        """Make the first `length` bytes of the term window visible: claim them, then store the
        first frame's length last. The caller has zeroed the length word just past them."""
        term_offset = self._term_offset
        self._claim(term_offset + length)
        self._terms_i32[self._index][term_offset >> 2] = first_frame_length
        return self._advanced()

    def append_padding(self, length: int) -> int:
        """Write a PAD frame of `length` bytes (header included) that readers skip (Aeron's
        appendPadding): how a replay reproduces the padding at a recorded term's end."""
        if length < frame.HEADER_LENGTH or length % frame.FRAME_ALIGNMENT:
            raise ValueError(f"padding of {length} bytes is not a whole number of frame alignments")
        if self._term_offset >= self.term_length:
            return self._pad_and_rotate()
        term_offset = self._term_offset
        if length > self.term_length - term_offset:
            raise ValueError(f"padding of {length} bytes does not fit the {self.term_length - term_offset} bytes left")
        position = self._check_limit()
        if position < 0:
            return position
        term = self._terms[self._index]
        self._claim(term_offset + length)
        frame.HEADER.pack_into(term, term_offset, -length, 0, frame.UNFRAGMENTED, frame.HDR_TYPE_PAD, term_offset,
                               self.session_id, self.stream_id, self._term_id, 0)
        self._terms_i32[self._index][term_offset >> 2] = length
        return self._advanced()

    def _offer_batch_slow(self, messages: Sequence) -> tuple[int, int]:
        written = 0
        result = self.position
        for message in messages:
            result = self.offer(message)
            if result == ADMIN_ACTION:
                result = self.offer(message)
            if result < 0:
                break
            written += 1
        return written, (self.position if written else result)

    def _offer_one_length(self, count: int, payload_length: int, copy) -> tuple[int, int]:
        """offer_batch for `count` messages of one length; copy(first, block) copies messages
        first.. into the payloads of block, their frames as an (n, stride) uint8 array."""
        frame_length = payload_length + _HDR
        stride = (frame_length + _ALIGN_UP) & _ALIGN_MASK

        def fit(first: int, room: int, allowance: int) -> int:
            # The messages left, those that fit the room, those that start below the limit.
            return min(count - first, room // stride, max(-(-allowance // stride), 1))

        def write(first: int, n: int, term_offset: int) -> None:
            block = self._begin_block_of_one_length(term_offset, n, stride, frame_length)
            copy(first, block)
            self._commit_block(term_offset, frame_length)

        return self._offer_blocks(count, fit, write)

    def _offer_varied_lengths(self, messages: Sequence, lengths: np.ndarray) -> tuple[int, int]:
        """offer_batch for messages of different lengths: the frames' ends, found by a search."""
        aligned = (lengths + (_HDR + _ALIGN_UP)) & _ALIGN_MASK
        ends = np.cumsum(aligned)  # each frame's end, from the first frame's start

        def fit(first: int, room: int, allowance: int) -> int:
            base = int(ends[first - 1]) if first else 0
            in_room = int(np.searchsorted(ends, base + room, side="right")) - first
            start_below_limit = int(np.searchsorted(ends, base + allowance, side="left")) + 1 - first
            return min(in_room, max(start_below_limit, 1))

        def write(first: int, n: int, term_offset: int) -> None:
            self._write_block(messages, first, n, lengths, aligned, ends, term_offset)

        return self._offer_blocks(len(messages), fit, write)

    def _offer_blocks(self, count: int, fit, write) -> tuple[int, int]:
        """Write `count` messages as blocks of one commit each, until all are written or the limit
        or the end of the stream stops them; rotate the term where the next one does not fit.

        fit(first, room, allowance) is how many messages from `first` on make the next block: at
        most those that fit the `room` left in the term, of which at least one and at most those
        that start less than `allowance` bytes ahead (below the limit); 0 if the next one does not
        fit the term. write(first, n, term_offset) writes them as one block.
        """
        written = 0
        result = 0
        while written < count:
            position = self._check_limit()
            if position < 0:
                result = position
                break
            term_offset = self._term_offset
            n = fit(written, self.term_length - term_offset, self._limit - position)
            if n == 0:
                result = self._pad_and_rotate()
                if result == MAX_POSITION_EXCEEDED:
                    break
                continue
            write(written, n, term_offset)
            written += n
        return written, (self.position if written else result)

    def _begin_block_of_one_length(self, term_offset: int, n: int, stride: int, frame_length: int) -> np.ndarray:
        """Claim n frames of `stride` bytes and write their headers, a field at a time through an
        (n, words a frame) view of the term. Returns the block as an (n, stride) uint8 array.

        The first frame holds minus the whole block's length until _commit_block (see _write_block).
        """
        block_length = n * stride
        self._claim(term_offset + block_length)
        first_word = term_offset >> 2
        frames = self._terms_words[self._index][first_word:first_word + (block_length >> 2)].reshape(n, stride >> 2)
        frames[0, _LENGTH_WORD] = -block_length
        frames[1:, _LENGTH_WORD] = frame_length
        frames[:, _FLAGS_WORD] = _DATA_WORD
        frames[:, _TERM_OFFSET_WORD] = np.arange(term_offset, term_offset + block_length, stride, dtype=np.int32)
        frames[:, _SESSION_ID_WORD] = self.session_id
        frames[:, _STREAM_ID_WORD] = self.stream_id
        frames[:, _TERM_ID_WORD] = self._term_id
        frames[:, _RESERVED_WORD:_HEADER_WORDS] = 0
        return frames.view(np.uint8)

    def _write_block(self, messages, first: int, n: int, lengths, aligned, ends, term_offset: int) -> None:
        base = int(ends[first - 1]) if first else 0
        block_length = int(ends[first + n - 1]) - base
        self._claim(term_offset + block_length)
        offsets = term_offset + (ends[first:first + n] - aligned[first:first + n] - base)
        lens = lengths[first:first + n]
        # Frame 1 holds minus the whole block's length until the end: a reader waits at it, and a
        # writer dying here leaves one gap that unblocking pads in one go. It goes first, so the
        # other frames, written with their positive lengths, stay invisible until it commits.
        words = self._terms_words[self._index]
        idx = offsets >> 2
        words[idx[0] + _LENGTH_WORD] = -block_length
        words[idx[1:] + _LENGTH_WORD] = lens[1:] + _HDR
        words[idx + _FLAGS_WORD] = _DATA_WORD
        words[idx + _TERM_OFFSET_WORD] = offsets
        words[idx + _SESSION_ID_WORD] = self.session_id
        words[idx + _STREAM_ID_WORD] = self.stream_id
        words[idx + _TERM_ID_WORD] = self._term_id
        words[idx + _RESERVED_WORD] = 0
        words[idx + _RESERVED_WORD + 1] = 0
        payload_length = int(lens[0])
        if n > 1 and (lens == payload_length).all():
            stride = int(aligned[first])
            block = self._terms_np[self._index][term_offset:term_offset + n * stride].reshape(n, stride)
            _copy_messages(messages, first, block, payload_length)
        else:
            term = self._terms[self._index]
            for start, message in zip((offsets + _HDR).tolist(), messages[first:first + n]):
                term[start:start + len(message)] = message
        self._commit_block(term_offset, payload_length + _HDR)

    def _commit_block(self, term_offset: int, first_frame_length: int) -> None:
        """Store the block's first frame's own length: the whole block becomes visible at once."""
        self._terms_i32[self._index][term_offset >> 2] = first_frame_length
        self._advanced()

    def _offer_fragmented(self, buffer, offset: int, length: int, reserved_value: int) -> int:
        if length > self.max_message_length:
            raise ValueError(f"message of {length} bytes exceeds the max message length {self.max_message_length}")
        position = self._check_limit()
        if position < 0:
            return position
        max_payload = self.max_payload_length
        full, remainder = divmod(length, max_payload)
        required = full * (max_payload + frame.HEADER_LENGTH)
        if remainder:
            required += frame.align(remainder + frame.HEADER_LENGTH)
        term_offset = self._term_offset
        if term_offset + required > self.term_length:
            return self._pad_and_rotate()
        term = self._terms[self._index]
        term_i32 = self._terms_i32[self._index]
        self._claim(term_offset + required)
        source = memoryview(buffer)[offset:offset + length]
        flags = frame.BEGIN_FLAG
        remaining = length
        frame_offset = term_offset
        while remaining > 0:
            chunk = min(remaining, max_payload)
            frame_length = chunk + frame.HEADER_LENGTH
            if remaining == chunk:
                flags |= frame.END_FLAG
            frame.HEADER.pack_into(term, frame_offset, -frame_length, 0, flags, frame.HDR_TYPE_DATA, frame_offset,
                                   self.session_id, self.stream_id, self._term_id, reserved_value)
            consumed = length - remaining
            term[frame_offset + frame.HEADER_LENGTH:frame_offset + frame_length] = source[consumed:consumed + chunk]
            term_i32[frame_offset >> 2] = frame_length
            remaining -= chunk
            frame_offset += frame.align(frame_length)
            flags = 0
        source.release()
        return self._advanced()

    # -- internals ------------------------------------------------------------------------------

    def _check_limit(self) -> int:
        """The position if a message may start now, else the status that says why not."""
        if self._closed:
            return CLOSED
        position = self._term_begin + self._term_offset
        if position < self._limit and (self.counters is None or self._nano_clock() < self._next_refresh_ns):
            return position
        # The refreshed limit decides, not the old one: a message written after the last reader
        # left is lost to the next, who joins where the writer is.
        if self.counters is None or position >= self.max_possible_position:
            return MAX_POSITION_EXCEEDED
        self._update_limit()
        if position < self._limit:
            return position
        if not self._connected:
            return NOT_CONNECTED
        self._back_pressure.add(1)
        return BACK_PRESSURED

    def _claim(self, new_term_offset: int) -> None:
        """Move the tail first, so readers know the space is taken even if we die mid-frame."""
        self._tails[self._index] = self._tail_base + new_term_offset
        self._term_offset = new_term_offset

    def _advanced(self) -> int:
        position = self._term_begin + self._term_offset
        self._pub_pos_word[self._pub_pos_index] = position
        return position

    def _pad_and_rotate(self) -> int:
        """Fill the rest of the term with one PAD frame and move to the next term: ADMIN_ACTION.

        In the last term of the stream there is no next term (its count would overflow the int32
        activeTermCount): the term is padded and MAX_POSITION_EXCEEDED returned, as Aeron does.
        """
        term_offset = self._term_offset
        pad_length = self.term_length - term_offset
        if pad_length > 0:
            term = self._terms[self._index]
            self._claim(self.term_length)
            frame.HEADER.pack_into(term, term_offset, -pad_length, 0, frame.UNFRAGMENTED, frame.HDR_TYPE_PAD,
                                   term_offset, self.session_id, self.stream_id, self._term_id, 0)
            self._terms_i32[self._index][term_offset >> 2] = pad_length
        if self._term_begin + self.term_length >= self.max_possible_position:
            self._advanced()
            return MAX_POSITION_EXCEEDED
        next_count = self._term_count + 1
        next_index = index_by_term_count(next_count)
        next_term_id = int32(self._term_id + 1)
        if self.counters is None:
            self._clean_entered_term(next_index)
        self.log.set_raw_tail(next_index, pack_tail(next_term_id, 0))
        self.log.active_term_count = next_count
        self._term_count = next_count
        self._term_id = next_term_id
        self._tail_base = pack_tail(next_term_id, 0)
        self._index = next_index
        self._term_begin = next_count << self.bits
        self._term_offset = 0
        self._advanced()
        return ADMIN_ACTION

    def _update_limit(self) -> None:
        """Read the subscribers' positions, drop dead ones, clean behind the slowest, move the limit."""
        counters = self.counters
        now_ns = self._nano_clock()
        self._next_refresh_ns = now_ns + int(LIMIT_REFRESH_INTERVAL_S * 1e9)
        if now_ns >= self._next_scan_ns:
            self._scan_subscribers()
            self._next_scan_ns = now_ns + int(SUBSCRIBER_SCAN_INTERVAL_S * 1e9)
        now_ms = now_ns // 1_000_000
        min_position = None
        live = []
        for counter_id, hold_ms in self._subscribers:
            if counters.state(counter_id) != ctr.RECORD_ALLOCATED or \
                    counters.type_id(counter_id) != ctr.SUBSCRIBER_POSITION_TYPE_ID or \
                    counters.get(counter_id, ctr.REGISTRATION_ID_OFFSET) != self.log.correlation_id:
                continue  # the subscriber closed (its slot may be another counter of this log's by now)
            if counters.get(counter_id, ctr.STATUS_OFFSET) == ctr.COUNTER_DROPPED:
                continue
            # A tethered subscriber (a recorder) is waited for while it is silent, even dead, for
            # its hold: a recorder killed with -9 and restarted within it takes over from where
            # it was (recorder.py), and nothing goes unrecorded. Past the hold the writer goes on.
            silence_limit_ms = self.subscriber_liveness_timeout_ms if hold_ms is None else hold_ms
            if now_ms - counters.get(counter_id, ctr.HEARTBEAT_OFFSET) > silence_limit_ms:
                self._drop(counter_id, now_ms)
                continue
            live.append((counter_id, hold_ms))
            position = counters.get(counter_id)
            if min_position is None or position < min_position:
                min_position = position
        self._subscribers = live
        connected = min_position is not None
        if connected != self._connected:
            self._connected = connected
            self.log.is_connected = connected
        if not connected:
            self._limit = 0
            self._pub_lmt.set(0)
            return
        self._clean_to(min_position)
        self._limit = min_position + (self.term_length >> 1)
        self._pub_lmt.set(self._limit)

    def _scan_subscribers(self) -> None:
        known = {counter_id for counter_id, _ in self._subscribers}
        for counter_id in self.counters.find(ctr.SUBSCRIBER_POSITION_TYPE_ID, self.log.correlation_id):
            if counter_id not in known:
                hold_ms = ctr.tether_hold_ms(self.counters.key(counter_id))
                if hold_ms == 0:
                    hold_ms = int(TETHER_HOLD_S * 1000)
                self._subscribers.append((counter_id, hold_ms))

    def _drop(self, counter_id: int, now_ms: int) -> None:
        counters = self.counters
        counters.put(counter_id, ctr.STATUS_OFFSET, ctr.COUNTER_DROPPED)
        self._dropped.add(1)
        idle_s = (now_ms - counters.get(counter_id, ctr.HEARTBEAT_OFFSET)) / 1000
        log.warning("%s: dropped subscriber %r (pid %d) at position %d: no heartbeat for %.1f s",
                    self.log.path.name, counters.label(counter_id), counters.get(counter_id, ctr.OWNER_ID_OFFSET),
                    counters.get(counter_id), idle_s)

    def _clean_entered_term(self, index: int) -> None:
        """Nobody reports a position to clean behind: clear the term we enter, which still holds
        the stream of three terms ago, so a reader never mistakes old frames for new ones."""
        self._terms_np[index][:] = 0

    def _clean_to(self, position: int) -> None:
        """Zero the bytes more than two terms behind the slowest subscriber (a term at most per
        step), before the writer comes round to them: it writes at most half a term and a message
        past that subscriber, which is three terms past what is zeroed."""
        position -= CLEAN_LAG_TERMS * self.term_length
        clean = max(self._clean_position, position - PARTITION_COUNT * self.term_length)
        while clean < position:
            index = (clean >> self.bits) % PARTITION_COUNT
            offset = clean & (self.term_length - 1)
            length = min(position - clean, self.term_length - offset)
            self._terms_np[index][offset:offset + length] = 0
            clean += length
        self._clean_position = max(self._clean_position, position)


class InPlacePublication(ExclusivePublication):
    """A publication written only in place, a window at a time (term_window, commit_window,
    append_padding): a replay's, whose frames land in the log straight from the archive.

    It does not clean. A reader only ever looks at the length word at its position, which is at
    most the tail; so what a writer must keep is that the word at the tail reads zero. Here each
    claim zeroes the word just past it before the tail moves there (at a term's end, the first word
    of the next term), and a window's frames stay invisible until their first length word is
    stored last. Aeron zeroes every byte behind the slowest reader instead, which a writer of
    small messages needs (a frame it claimed and died before writing must read as a zero gap);
    for a replay that costs a sixth of its time and buys nothing. Offers, which would need it, are
    refused."""

    def __init__(self, log_buffer: LogBuffer, counters: CountersFile | None = None, **kwargs) -> None:
        super().__init__(log_buffer, counters, **kwargs)
        self._zero_length_word(self._term_offset)  # a reopened log may hold a frame at its tail

    def _claim(self, new_term_offset: int) -> None:
        self._zero_length_word(new_term_offset)
        super()._claim(new_term_offset)

    def _zero_length_word(self, term_offset: int) -> None:
        """Zero the length word a reader finds at `term_offset` of the active term: at the term's
        end, that is the next term's first."""
        if term_offset < self.term_length:
            self._terms_i32[self._index][term_offset >> 2] = 0
        else:
            self._terms_i32[index_by_term_count(self._term_count + 1)][0] = 0

    def _clean_to(self, position: int) -> None:
        pass

    def _clean_entered_term(self, index: int) -> None:
        pass

    def _offer(self, *args, **kwargs):
        raise TypeError("an InPlacePublication is written through term_window and commit_window only")

    offer = offer_batch = offer_rows = try_claim = offer_block = offer_frames = _offer


def _copy_messages(messages: Sequence, first: int, block: np.ndarray, payload_length: int) -> None:
    """Copy messages[first:first + n], all of payload_length bytes, into the payloads of block, n
    frames as an (n, stride) uint8 array."""
    n, stride = block.shape
    batch = messages[first:first + n]
    if payload_length >= _COPY_EACH_MIN_LENGTH:
        flat = memoryview(block).cast("B")
        start = _HDR
        for message in batch:
            flat[start:start + payload_length] = message
            start += stride
        flat.release()
    else:
        block[:, _HDR:_HDR + payload_length] = np.frombuffer(b"".join(batch), dtype=np.uint8).reshape(n, payload_length)


def seal_dead_writer_claims(log_buffer: LogBuffer) -> int:
    """Pad the space an earlier writer of a reopened log claimed in its active term and never
    committed; returns how many bytes. Only for the holder of the log's writer lock, which proves
    that writer gone: its readers then go on at once instead of after their unblock timeout.

    A walk over the active term's frames from its start to the tail, so only for a log whose
    active term holds its stream from offset 0 (a log reopened by its writer; not one created to
    start mid-term, as a replay's is)."""
    index = index_by_term_count(log_buffer.active_term_count)
    term = log_buffer.terms[index]
    term_length = log_buffer.term_length
    term_begin = log_buffer.active_term_count << log_buffer.position_bits_to_shift
    tail = tail_term_offset(log_buffer.raw_tail(index), term_length)
    padded = 0
    offset = 0
    while offset < tail:
        length = int.from_bytes(term[offset:offset + 4], "little", signed=True)
        if length <= 0:
            if not unblock(log_buffer, term_begin + offset):
                log.warning("%s: the space at position %d was claimed and not committed, and is not a clean gap: "
                            "left to the readers", log_buffer.path.name, term_begin + offset)
                break
            length = int.from_bytes(term[offset:offset + 4], "little", signed=True)
            padded += (length + _ALIGN_UP) & _ALIGN_MASK
            log.warning("%s: padded the frame of %d bytes at position %d that the previous writer claimed and never "
                        "committed", log_buffer.path.name, length, term_begin + offset)
        offset += (length + _ALIGN_UP) & _ALIGN_MASK
    return padded

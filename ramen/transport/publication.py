"""The exclusive publication: the one writer of a log buffer (Aeron's ExclusivePublication).

Every write claims its space by moving the tail first, writes the frame header with a negative
length, then the payload, and commits by storing the positive length last. A reader that meets a
length <= 0 stops there; a frame left negative by a writer that died is turned into padding by the
readers after a timeout (see image.py).

Flow control and cleaning are flow_control.py's: past the limit the slowest subscriber allows,
offers return BACK_PRESSURED and nothing is written. The frames themselves are written by
term_appender.py into the space this class claims. A replay writes in place (term_window and
commit_window, ramen.archive.replay) or forwards recorded frames whole (offer_frames).

A publication holds the log's writer lock (writer_lock.py) from before its first write to close:
one writer per log, checked by the kernel. Holding it also proves that whoever wrote the log before
is gone, so a frame it claimed and never committed can be padded at once (writer_lock.py,
seal_dead_writer_claims), not after the readers' unblock timeout.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.locks import FileLock
from ramen.transport import counters as ctr
from ramen.transport import frame
from ramen.transport import term_appender as appender
from ramen.transport.term_appender import BufferClaim
from ramen.transport.counters import CountersFile
from ramen.transport.defaults import SUBSCRIBER_LIVENESS_TIMEOUT_S
from ramen.transport.flow_control import FlowControl, TermCleaner
from ramen.transport.frame import ALIGN_MASK, ALIGN_UP, HEADER_LENGTH
from ramen.transport.logbuffer import LogBuffer, pack_tail, tail_term_id, tail_term_offset
from ramen.transport.position import (PARTITION_COUNT, index_by_term_count, int32,
                                      max_possible_position)
from ramen.transport.status import (ADMIN_ACTION, BACK_PRESSURED, CLOSED, MAX_POSITION_EXCEEDED,
                                    NOT_CONNECTED)
from ramen.transport.writer_lock import acquire_writer_lock

log = logging.getLogger(__name__)

_DATA_WORD = frame.DATA_WORD_UNFRAGMENTED
_pack_header = frame.HEADER_BY_WORD.pack_into  # bound once: the offer's hot path calls it per message


class ExclusivePublication:
    """Single-writer publication over one log buffer."""

    _cleaner_type = TermCleaner  # replay_publication.py's cleans nothing

    def __init__(self, log_buffer: LogBuffer, counters: CountersFile | None = None, *,
                 subscriber_liveness_timeout_s: float = SUBSCRIBER_LIVENESS_TIMEOUT_S,
                 writer_lock: FileLock | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        """`writer_lock`: the log's (writer_lock.py), taken before the log was opened for writing
        (workers/outputs.py open_output_log); without one, it is taken here (LogBufferBusy if
        another process writes the log). `clock`: its nanos() are the clock of the subscribers'
        heartbeats (a test drives a ManualClock)."""
        self._nanos = clock.nanos  # bound once: the offer's hot path asks it
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
        self._cleaner = self._cleaner_type(self._terms_np, self.term_length, self.bits,
                                    max(0, self.position - PARTITION_COUNT * self.term_length))
        self._flow: FlowControl | None = None
        self._connected = counters is None
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
            self._flow = FlowControl(log_buffer, counters, clock, self._cleaner,
                                     liveness_timeout_s=subscriber_liveness_timeout_s,
                                     limit_counter=self._pub_lmt, dropped_counter=self._dropped)

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
        return self._flow.has_tethered_subscriber

    @property
    def subscriber_count(self) -> int:
        """How many live subscribers read this log; asking looks again. For a writer that must
        not start before all its expected readers have joined (a replayer with several)."""
        if self.counters is None or self._closed:
            return 0
        self._flow.rescan()
        self._update_limit()
        return self._flow.subscriber_count

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
        self._terms_np.clear()  # the cleaner's too: it holds this list
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
                (self.counters is not None and self._nanos() >= self._next_refresh_ns):
            position = self._check_limit()
            if position < 0:
                return position
        frame_length = length + HEADER_LENGTH
        new_offset = term_offset + ((frame_length + ALIGN_UP) & ALIGN_MASK)
        if new_offset > self.term_length:
            return self._pad_and_rotate()
        index = self._index
        term = self._terms[index]
        self._tails[index] = self._tail_base + new_offset
        self._term_offset = new_offset
        _pack_header(term, term_offset, -frame_length, _DATA_WORD, term_offset, self.session_id, self.stream_id,
                     self._term_id, reserved_value)
        start = term_offset + HEADER_LENGTH
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
        frame_length = length + HEADER_LENGTH
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
            return self._offer_one_length(messages, payload_length)
        if max(lengths) > self.max_payload_length:
            return self._offer_batch_slow(messages)
        return self._offer_varied_lengths(messages, np.array(lengths, dtype=np.int64))

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
        self._claim(term_offset + length)
        first_length = appender.copy_frames(self._terms[self._index], term_offset, source, self.session_id,
                                            self.stream_id, self._term_id)
        source.release()
        self._terms_i32[self._index][term_offset >> 2] = first_length
        return self._advanced()

    def term_window(self, max_length: int) -> tuple[int, memoryview | None]:
        """(length, view) of the free space at the tail, up to the term end, for frames written in
        place and made visible by commit_window; or (status, None) when no message may start now.

        Beyond Aeron: how a replay reads from its segment files straight into the log, whose
        positions line up with the recording's. The length word at the tail reads zero (the space
        is clean, zeroed behind the slowest subscriber, when the term was entered or, in a
        ReplayPublication, by the last claim), so nothing
        in the window is visible until committed, provided the writer keeps the first frame's
        length word out of it until then."""
        if self._closed:
            return CLOSED, None
        if self._term_offset >= self.term_length:
            return self._pad_and_rotate(), None
        position = self._check_limit()
        if position < 0:
            return position, None
        term_offset = self._term_offset
        # A window may start below the limit and reach a quarter of a term past it (room for the
        # largest message, an eighth of a term, and its fragments' headers), no further: the
        # writer must stay within a term of the slowest reader, or the cleaning behind that reader
        # (two terms back, the same place a lap later) zeroes what was just written (a replay with
        # a slow reader stalled on it). With ramen's 4 MiB terms the bound is never below 1 MiB.
        length = min(max_length, self.term_length - term_offset, self._limit - position + (self.term_length >> 2))
        return length, self._terms[self._index][term_offset:term_offset + length]

    def commit_window(self, length: int, first_frame_length: int) -> int:
        """Make the first `length` bytes of the term window visible: claim them, then store the
        first frame's length last. The caller has zeroed the length word just past them."""
        term_offset = self._term_offset
        self._claim(term_offset + length)
        self._terms_i32[self._index][term_offset >> 2] = first_frame_length
        return self._advanced()

    # -- batches --------------------------------------------------------------------------------

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

    def _offer_one_length(self, messages: Sequence, payload_length: int) -> tuple[int, int]:
        """offer_batch for messages of one length: where each frame goes is plain arithmetic."""
        count = len(messages)
        frame_length = payload_length + HEADER_LENGTH
        stride = (frame_length + ALIGN_UP) & ALIGN_MASK

        def fit(first: int, room: int, allowance: int) -> int:
            # The messages left, those that fit the room, those that start below the limit.
            return min(count - first, room // stride, max(-(-allowance // stride), 1))

        def write(first: int, n: int, term_offset: int) -> None:
            self._claim(term_offset + n * stride)
            block = appender.begin_block_of_one_length(self._terms_words[self._index], term_offset, n, stride,
                                                       frame_length, self.session_id, self.stream_id, self._term_id)
            appender.copy_messages(messages, first, block, payload_length)
            self._commit_block(term_offset, frame_length)

        return self._offer_blocks(count, fit, write)

    def _offer_varied_lengths(self, messages: Sequence, lengths: np.ndarray) -> tuple[int, int]:
        """offer_batch for messages of different lengths: the frames' ends, found by a search."""
        aligned = (lengths + (HEADER_LENGTH + ALIGN_UP)) & ALIGN_MASK
        ends = np.cumsum(aligned)  # each frame's end, from the first frame's start

        def fit(first: int, room: int, allowance: int) -> int:
            base = int(ends[first - 1]) if first else 0
            in_room = int(np.searchsorted(ends, base + room, side="right")) - first
            start_below_limit = int(np.searchsorted(ends, base + allowance, side="left")) + 1 - first
            return min(in_room, max(start_below_limit, 1))

        def write(first: int, n: int, term_offset: int) -> None:
            base = int(ends[first - 1]) if first else 0
            block_length = int(ends[first + n - 1]) - base
            self._claim(term_offset + block_length)
            offsets = term_offset + (ends[first:first + n] - aligned[first:first + n] - base)
            lens = lengths[first:first + n]
            appender.begin_block(self._terms_words[self._index], offsets, lens, block_length, self.session_id,
                                 self.stream_id, self._term_id)
            payload_length = int(lens[0])
            if n > 1 and (lens == payload_length).all():
                stride = int(aligned[first])
                block = self._terms_np[self._index][term_offset:term_offset + n * stride].reshape(n, stride)
                appender.copy_messages(messages, first, block, payload_length)
            else:
                appender.copy_each(self._terms[self._index], offsets, messages[first:first + n])
            self._commit_block(term_offset, payload_length + HEADER_LENGTH)

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
        required = full * (max_payload + HEADER_LENGTH)
        if remainder:
            required += frame.align(remainder + HEADER_LENGTH)
        term_offset = self._term_offset
        if term_offset + required > self.term_length:
            return self._pad_and_rotate()
        self._claim(term_offset + required)
        source = memoryview(buffer)[offset:offset + length]
        appender.write_fragments(self._terms[self._index], self._terms_i32[self._index], term_offset, source,
                                 max_payload, self.session_id, self.stream_id, self._term_id, reserved_value)
        source.release()
        return self._advanced()

    # -- the tail and the limit -----------------------------------------------------------------

    def _check_limit(self) -> int:
        """The position if a message may start now, else the status that says why not."""
        if self._closed:
            return CLOSED
        position = self._term_begin + self._term_offset
        if position < self._limit and (self.counters is None or self._nanos() < self._next_refresh_ns):
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

    def _update_limit(self) -> None:
        flow = self._flow
        self._limit = flow.update()
        self._next_refresh_ns = flow.next_refresh_ns
        self._connected = flow.connected

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
            self._claim(self.term_length)
            appender.write_pad(self._terms[self._index], self._terms_i32[self._index], term_offset, pad_length,
                               self.session_id, self.stream_id, self._term_id)
        if self._term_begin + self.term_length >= self.max_possible_position:
            self._advanced()
            return MAX_POSITION_EXCEEDED
        next_count = self._term_count + 1
        next_index = index_by_term_count(next_count)
        next_term_id = int32(self._term_id + 1)
        if self.counters is None:
            self._cleaner.clean_entered_term(next_index)
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

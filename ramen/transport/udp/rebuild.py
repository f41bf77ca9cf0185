"""The receiver's core, without sockets: an image log buffer rebuilt from the frames a sender sent.

A frame says where it goes (termId, termOffset), so frames may come in any order, twice, or not at
all: each is copied into its place in the image's log buffer (ramen.transport.LogBuffer, the same
layout a publication writes, so an Image reads it as it reads any log) unless its place is already
filled. Like Aeron's TermRebuilder, the header and payload go in first and the frame length last,
as its commit: a reader mapping the same file never sees half a frame. A run of frames that lands
in fresh space (insert_run: past the hwm, within the window) goes in as one block the same way,
its first frame's length last.

Three positions follow from it (Aeron's names): the rebuilt position (rcv-pos, everything before it
is in the log without a gap), the high-water mark (rcv-hwm, the end of the furthest frame or
heartbeat seen), and the consumer position (how far the image's reader got, told by the caller).
The gaps between the rebuilt position and the hwm are what a NAK asks for. Frames past the consumer
position plus the receiver window are refused (Aeron's flow-control over-run): the window is at most
half a term, so a frame never lands in a partition a reader has yet to read, and the space of a
partition is cleaned (zeroed) a term behind the reader before frames three terms on reuse it.

The status-message rule is a policy apart (StatusMessagePolicy), pure but for its injected clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.transport import frame
from ramen.transport.frame import FRAME_ALIGNMENT, align
from ramen.transport.logbuffer import LogBuffer
from ramen.transport.position import PARTITION_COUNT, compute_position, int32, term_id_of
from ramen.transport.udp.defaults import RECEIVER_WINDOW_MAX_BYTES, SM_TIMEOUT_NS, SM_WINDOW_THRESHOLD_DIVISOR
from ramen.transport.udp.protocol import DataFrame, NakFrame, StatusMessage, WireError, frames_of


# What insert() did with a frame: status codes, as a hot path returns them (STYLE.md, section 2).
INSERTED = 1
"""Copied into the log."""
HEARTBEAT = 2
"""A heartbeat: no bytes, but the hwm may move (a loss before an idle spell shows this way)."""
DUPLICATE = 0
"""Its place is already filled, or it lies before the rebuilt position: ignored."""
OVER_RUN = -1
"""Past the consumer position plus the window: dropped, the sender sends it again when allowed."""
REJECTED = -2
"""Not a frame of this image (other session or stream, term out of range, misplaced): dropped."""
NOT_A_RUN = -3
"""insert_run only: the run is not wholly new space within the window; nothing was done."""

_LENGTH_WORDS_PER_SLOT = FRAME_ALIGNMENT // 4
_LENGTH_BYTES = frame.INT32.size


def receiver_window(term_length: int, initial_window: int = RECEIVER_WINDOW_MAX_BYTES) -> int:
    """Aeron's receiver window: the initial window, at most half a term."""
    return min(initial_window, term_length // 2)


@dataclass(frozen=True)
class Gap:
    """Missing term bytes below the hwm, within one term: what one NAK asks for."""
    term_id: int
    term_offset: int
    length: int


class ImageRebuilder:
    """Rebuilds one image's log buffer from DATA and PAD frames."""

    def __init__(self, log_buffer: LogBuffer, join_position: int, *, window_length: int | None = None) -> None:
        """`log_buffer`: a fresh log of the sender's term length, initial term id, session and
        stream (from its SETUP); `join_position`: where the image starts (the SETUP's position)."""
        if join_position % FRAME_ALIGNMENT:
            raise ValueError(f"join position {join_position} is not frame-aligned")
        self.log = log_buffer
        self.term_length = log_buffer.term_length
        self.bits = log_buffer.position_bits_to_shift
        self.mask = self.term_length - 1
        self.initial_term_id = log_buffer.initial_term_id
        self.session_id = log_buffer.session_id
        self.stream_id = log_buffer.stream_id
        self.window_length = receiver_window(self.term_length) if window_length is None else window_length
        if not 0 < self.window_length <= self.term_length // 2:
            raise ValueError(f"window {self.window_length} must be in 1..{self.term_length // 2} (half a term)")
        self._terms = log_buffer.terms
        self._lengths = [term.cast("i") for term in self._terms]
        self.join_position = join_position
        self.rebuilt_position = join_position
        self.hwm_position = join_position
        self.consumer_position = join_position
        self._clean_position = join_position
        self.end_of_stream_position: int | None = None

    @classmethod
    def resuming(cls, log_buffer: LogBuffer, sender_position: int, *,
                 window_length: int | None = None) -> "ImageRebuilder":
        """Go on rebuilding a log that an earlier receiver of the same stream rebuilt and left
        without an end (its process died while readers still map the log): from the end of what
        it rebuilt without a gap, which the frames past its published tail extend, so the readers
        lose nothing. The sender, at `sender_position` (its SETUP's), is asked for what lies between
        (the gap up to it is NAKed at once) and is still within the window: the earlier receiver's
        last SM held it there. The space a term behind that end is cleaned on from there, as the
        earlier receiver did (the old laps' frames would read as duplicates three terms on).

        Beyond Aeron, whose new receiver makes a new image at the sender's position. ValueError
        when the sender is not within reach: past that end plus the window (what lies between may
        be gone from its log), or more than a term behind it (not the stream this log holds)."""
        start = log_buffer.producer_position()
        rebuilder = cls(log_buffer, start, window_length=window_length)
        rebuilder.hwm_position = start + rebuilder.window_length
        rebuilder._advance_rebuilt()
        resumed = rebuilder.rebuilt_position
        if not resumed - rebuilder.term_length <= sender_position <= resumed + rebuilder.window_length:
            rebuilder.close()
            raise ValueError(f"the sender is at {sender_position}, out of reach of {resumed}, where the "
                             f"log was rebuilt to (window {rebuilder.window_length})")
        rebuilder.join_position = rebuilder.consumer_position = resumed
        rebuilder.hwm_position = max(resumed, sender_position)
        rebuilder._clean_position = max(0, resumed - rebuilder.term_length)
        return rebuilder

    def close(self) -> None:
        for view in self._lengths:
            view.release()

    # -- frames in ----------------------------------------------------------------------------

    def on_datagram(self, datagram) -> list[int]:
        """Insert every DATA/PAD frame of a datagram; the status of each. Raises WireError for a
        datagram that is not frames (nothing of it is inserted then)."""
        frames = frames_of(datagram)
        return [self.insert(item) for item in frames if isinstance(item, DataFrame)]

    def insert(self, item: DataFrame) -> int:
        """Put one DATA or PAD frame (or a heartbeat) in its place; returns INSERTED, HEARTBEAT,
        DUPLICATE, OVER_RUN or REJECTED."""
        if item.session_id != self.session_id or item.stream_id != self.stream_id:
            return REJECTED
        term_offset = item.term_offset
        term_count = int32(item.term_id - self.initial_term_id)
        if term_count < 0 or term_offset < 0 or term_offset % FRAME_ALIGNMENT or term_offset > self.term_length:
            return REJECTED
        position = (term_count << self.bits) + term_offset
        if item.is_heartbeat:
            if position > self.hwm_position and position <= self.consumer_position + self.window_length:
                self.hwm_position = position
            if item.is_eos and self.end_of_stream_position is None:
                self.end_of_stream_position = position
                self.log.end_of_stream_position = position
            return HEARTBEAT
        length = item.frame_length
        aligned = align(length)
        if term_offset + aligned > self.term_length:
            return REJECTED
        if position < self.rebuilt_position:
            return DUPLICATE
        end = position + aligned
        # A PAD is sent header-only and nothing behind its header is written: like Aeron, only
        # the header needs to be within the window (its end, the term's end, may lie beyond).
        if (position + frame.HEADER_LENGTH if item.is_pad else end) > self.consumer_position + self.window_length:
            return OVER_RUN
        index = term_count % PARTITION_COUNT
        lengths = self._lengths[index]
        if lengths[term_offset >> 2]:
            return DUPLICATE
        term = self._terms[index]
        # Header and payload first, the length last: the commit a reader of this log waits for.
        frame.HEADER.pack_into(term, term_offset, 0, frame.CURRENT_VERSION, item.flags, item.frame_type,
                               term_offset, item.session_id, item.stream_id, item.term_id, item.reserved_value)
        if not item.is_pad:
            body = term_offset + frame.HEADER_LENGTH
            term[body:body + length - frame.HEADER_LENGTH] = item.payload
        lengths[term_offset >> 2] = length
        if end > self.hwm_position:
            self.hwm_position = end
        if position == self.rebuilt_position:
            self._advance_rebuilt()
        return INSERTED

    def insert_run(self, run: memoryview, term_id: int, term_offset: int, first_length: int) -> int:
        """Put a run of plain DATA frames (protocol.data_run vouched for it: chained, one term, this
        image's session and stream, no PAD, heartbeat or EOS) in the log as one block, when it lies
        wholly in fresh space: at or past the hwm, where no frame was put yet (the space of the lap
        before was cleaned: consumed_to), and within the window. Returns INSERTED then; REJECTED,
        DUPLICATE or OVER_RUN never: anything else (a gap being filled, a duplicate, an over-run)
        returns NOT_A_RUN and nothing was done, for the caller to insert frame by frame.

        As Aeron's TermRebuilder: everything but the first frame's length goes in first (the other
        frames' lengths with it: a reader stops at the first frame's length, 0 until the end), then
        that length, as the commit of the whole block."""
        term_count = int32(term_id - self.initial_term_id)
        size = len(run)
        if term_count < 0 or term_offset < 0 or term_offset % FRAME_ALIGNMENT or term_offset + size > self.term_length:
            return NOT_A_RUN
        position = (term_count << self.bits) + term_offset
        end = position + size
        if position < self.hwm_position or end > self.consumer_position + self.window_length:
            return NOT_A_RUN
        index = term_count % PARTITION_COUNT
        self._terms[index][term_offset + _LENGTH_BYTES:term_offset + size] = run[_LENGTH_BYTES:]
        self._lengths[index][term_offset >> 2] = first_length
        self.hwm_position = end
        if position == self.rebuilt_position:
            self.rebuilt_position = end  # nothing lies past the old hwm: no walk
        return INSERTED

    def _advance_rebuilt(self) -> None:
        """Walk the frames from the rebuilt position up to the first hole."""
        position = self.rebuilt_position
        hwm = self.hwm_position
        while position < hwm:
            length = self._lengths[(position >> self.bits) % PARTITION_COUNT][(position & self.mask) >> 2]
            if length <= 0:
                break
            position += align(length)
        self.rebuilt_position = position

    # -- the reader ---------------------------------------------------------------------------

    def consumed_to(self, position: int) -> None:
        """The image's reader got to `position`: the window moves on, and the log is cleaned a
        term behind it, so that frames three terms on find their place empty."""
        if position < self.consumer_position or position > self.rebuilt_position:
            raise ValueError(f"consumer position {position} is outside {self.consumer_position}.."
                             f"{self.rebuilt_position} (what was rebuilt)")
        self.consumer_position = position
        target = position - self.term_length
        while self._clean_position < target:
            start = self._clean_position
            stop = min(target, (start | self.mask) + 1)  # never past the end of this term
            term = self._terms[(start >> self.bits) % PARTITION_COUNT]
            offset = start & self.mask
            term[offset:offset + stop - start] = bytes(stop - start)
            self._clean_position = stop

    # -- what a NAK asks for ------------------------------------------------------------------

    def gaps(self, limit: int | None = None) -> list[Gap]:
        """The holes between the rebuilt position and the hwm, each within one term, in order
        (at most `limit` of them)."""
        found: list[Gap] = []
        position = self.rebuilt_position
        hwm = self.hwm_position
        while position < hwm and (limit is None or len(found) < limit):
            lengths = self._lengths[(position >> self.bits) % PARTITION_COUNT]
            length = lengths[(position & self.mask) >> 2]
            if length > 0:
                position += align(length)
                continue
            term_start = position & ~self.mask
            stop = min(hwm, term_start + self.term_length)
            first = (position & self.mask) >> 2
            last = (stop - term_start) >> 2
            slots = lengths[first:last:_LENGTH_WORDS_PER_SLOT].tolist()
            filled = next((i for i, word in enumerate(slots) if word), len(slots))
            gap_end = min(stop, position + filled * FRAME_ALIGNMENT)
            found.append(Gap(term_id_of(position, self.bits, self.initial_term_id), position & self.mask,
                             gap_end - position))
            position = gap_end
        return found

    def nak(self, gap: Gap) -> NakFrame:
        """The NAK asking the sender for one gap again."""
        return NakFrame(self.session_id, self.stream_id, gap.term_id, gap.term_offset, gap.length)

    # -- status messages ----------------------------------------------------------------------

    def status_message(self, consumption_position: int, receiver_id: int, *, flags: int = 0,
                       group_tag: int | None = None) -> StatusMessage:
        """The SM reporting consumption_position with this image's window."""
        return StatusMessage(self.session_id, self.stream_id,
                             term_id_of(consumption_position, self.bits, self.initial_term_id),
                             consumption_position & self.mask, self.window_length, receiver_id,
                             group_tag=group_tag, flags=flags)

    def position_of(self, term_id: int, term_offset: int) -> int:
        return compute_position(term_id, term_offset, self.bits, self.initial_term_id)


class StatusMessagePolicy:
    """When a receiver sends an SM (Aeron's receiver): at once the first time, then whenever the
    consumption position moved past the last SM's position + window / 4, and whenever more than
    200 ms passed since the last SM (so an idle stream still tells its sender it is alive)."""

    def __init__(self, window_length: int, *, timeout_ns: int = SM_TIMEOUT_NS, clock: Clock = SYSTEM_CLOCK) -> None:
        self.window_length = window_length
        self.threshold = window_length // SM_WINDOW_THRESHOLD_DIVISOR
        self.timeout_ns = timeout_ns
        self._clock = clock
        self.last_position: int | None = None
        self.last_sent_ns = 0

    def due(self, consumption_position: int) -> bool:
        """Whether an SM for consumption_position is to be sent now."""
        if self.last_position is None:
            return True
        if consumption_position > self.last_position + self.threshold:
            return True
        # Aeron's test is (last + timeout) - now < 0: exactly the timeout is not yet due.
        return self._clock.nanos() - self.last_sent_ns > self.timeout_ns

    def sent(self, consumption_position: int) -> None:
        """An SM for consumption_position went out now."""
        self.last_position = consumption_position
        self.last_sent_ns = self._clock.nanos()


__all__ = ["INSERTED", "HEARTBEAT", "DUPLICATE", "OVER_RUN", "REJECTED", "NOT_A_RUN", "Gap", "ImageRebuilder",
           "StatusMessagePolicy", "WireError", "receiver_window"]

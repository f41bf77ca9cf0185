"""Reading a recording's whole messages from its segment files, a chunk at a time, for a process that
takes them apart itself (a replayer tagging and filtering them) rather than replaying them into a log
(replay.py's ReplaySession).

Each archive byte is consumed once: a message cut by the chunk's end is moved to the front of the
other of two buffers (the messages returned point into this one) and the next read appends to it; a
PAD frame's body, never stored, is skipped, not read. Frames are found by the one frame walker
(ramen.transport.frame_walk) and checked as they are walked (length, type, term offset and term id,
fragments in order, and the checksum when the archive keeps one); the data must reach the range's
end. Damage is a RecordingReadError naming the recording, the segment file and the offset, never a
read that hangs or comes back short. An active recording (stop unknown) is followed through its
recording-position counter; one that has not grown for ACTIVE_RECORDING_QUIET_S is taken as read.

Also here: what a reader of recorded frames does with a message (`first_payload`, `reassemble`,
`group_messages`) and the in-place edits of a replay block (`pad`, `write_messages`).
"""

from __future__ import annotations

import os
from typing import Callable

from ramen import message as msg
from ramen.archive.catalog import NULL_POSITION, Catalog, RecordingDescriptor
from ramen.archive.checksum import Checksum
from ramen.archive.errors import ArchiveError
from ramen.archive.segment import SegmentError, SegmentReader
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.transport import frame
from ramen.transport.frame import ALIGN_MASK, ALIGN_UP, HDR_TYPE_PAD, HEADER_LENGTH
from ramen.transport.frame_walk import frame_problem, walk
from ramen.transport.position import int32

READ_CHUNK_LENGTH = 1024 * 1024
"""Bytes read from a segment file per call of read (Aeron's replay buffer)."""
ACTIVE_RECORDING_QUIET_S = 1.0
"""An active recording that has not grown for this long is taken as read to its end."""


class RecordingReadError(ArchiveError):
    """A recording that cannot be read as asked (damaged, cut short, or without an end); the message
    names the recording, and for damaged data the segment file and the offset."""


class RecordingReader:
    """The whole ramen messages of [start, stop) of one recording, a chunk at a time, each as the
    recorded frames that hold it (`first_payload` and `reassemble` read them)."""

    def __init__(self, archive_dir: str | os.PathLike, descriptor: RecordingDescriptor, start: int,
                 stop: int | None, *, checksum: Checksum | None = None, follow: Callable[[], int] | None = None,
                 done_at_min_time_us: int | None = None, chunk_length: int = READ_CHUNK_LENGTH,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        """`follow`: the live position of an active recording (stop None), NULL_POSITION once it
        stopped. `done_at_min_time_us`: an active recording is read once a message begins at or
        after this event time (past the range wanted by more than the recording's disorder)."""
        self.descriptor = descriptor
        self.recording_id = descriptor.recording_id
        self.checksum = checksum
        self.stop = stop
        self.follow = follow
        self.done_at_min_time_us = done_at_min_time_us
        self.term_length = descriptor.term_buffer_length
        self.position = start  # stream position of buffer[0]
        self.consumed = 0
        self.done = False
        self._clock = clock
        self._reader = SegmentReader.for_recording(archive_dir, descriptor)
        self._chunk_length = max(chunk_length, descriptor.mtu_length * 2)
        self._buffers = [bytearray(self._chunk_length), bytearray(self._chunk_length)]
        self._views = [memoryview(b) for b in self._buffers]
        self._current = 0
        self._filled = 0  # bytes of the buffer holding data (a carried partial message)
        self._last_growth_s = clock.seconds()

    def close(self) -> None:
        self._reader.close()

    def where(self, position: int) -> str:
        """`<segment file> offset <o>` of a position of the recording, for messages."""
        return self._reader.where(position)

    def read(self) -> list[memoryview]:
        """The messages completed by one chunk, each the frames holding it (valid until the next
        call); an empty list when nothing new could be read. Sets `done` at the end."""
        if self.done:
            return []
        limit = self._limit()
        read_at = self.position + self._filled
        if read_at >= limit:
            if self.stop is not None:
                if self._filled:
                    raise RecordingReadError(f"recording {self.recording_id}: the range ends inside a message "
                                             f"at position {self.position}")
                self.done = True
            elif self._clock.seconds() - self._last_growth_s > ACTIVE_RECORDING_QUIET_S:
                self.done = True  # active but idle: what it holds is what there is
            return []
        view = self._views[self._current]
        term_end = (read_at | (self.term_length - 1)) + 1
        want = min(len(view) - self._filled, term_end - read_at, limit - read_at)
        try:
            # Everything below the limit was recorded: bytes a segment file does not hold are lost.
            got = self._reader.read(read_at, view[self._filled:self._filled + want], must_exist=True)
        except SegmentError as e:
            raise RecordingReadError(f"recording {self.recording_id}: {e}") from None
        self._last_growth_s = self._clock.seconds()
        return self._walk(self._filled + got)

    def _limit(self) -> int:
        """How far the data may be read now."""
        if self.stop is not None:
            return self.stop
        live = self.follow() if self.follow is not None else NULL_POSITION
        if live == NULL_POSITION:  # the recording stopped meanwhile: where it ended is final
            self.follow = None
            self.stop = self._catalog_stop()
            return self.stop
        return live

    def _catalog_stop(self) -> int:
        with Catalog.open(self._reader.archive_dir) as catalog:
            stop = catalog.stop_position(self.recording_id)
        if stop == NULL_POSITION:
            raise RecordingReadError(f"recording {self.recording_id} has no stop position and no live recorder "
                                     f"(unclean shutdown? restart the archiver to repair the catalog)")
        return stop

    def _walk(self, end: int) -> list[memoryview]:
        """The whole messages of the buffer's first `end` bytes; what follows the last is carried."""
        buffer, view = self._buffers[self._current], self._views[self._current]
        base = self.position
        mask = self.term_length - 1
        # A read never crosses a term end (nor does a message it carries over): one term per walk.
        term_id = int32(self.descriptor.initial_term_id + (base >> (self.term_length.bit_length() - 1)))
        frames = walk(buffer, 0, end, term_offset=base & mask)
        bad = frames.first_misfit(term_id=term_id, mtu_length=self.descriptor.mtu_length)
        if bad is not None:
            self._bad_frame(buffer, frames.start_of(bad), base)
        offset = frames.end  # past the frames found; a header there is a frame cut by the end, or damage
        starts, ends, _, types, flags = frames.columns()
        if offset + HEADER_LENGTH <= end:
            length, _, _, frame_type, _ = frame.LENGTH_TO_TERM_OFFSET.unpack_from(buffer, offset)
            if length <= 0 or self._problem(buffer, offset, base) is not None:
                self._bad_frame(buffer, offset, base)
            if frame_type == HDR_TYPE_PAD:  # its body is not stored: reading resumes after it
                starts.append(offset)
                ends.append(offset + ((length + ALIGN_UP) & ALIGN_MASK))
                types.append(HDR_TYPE_PAD)
                flags.append(frame.UNFRAGMENTED)
        if self.checksum is not None:
            for at, frame_end, frame_type in zip(starts, ends, types):
                stored = frame.INT32.unpack_from(buffer, at + frame.SESSION_ID_OFFSET)[0]
                if frame_type != HDR_TYPE_PAD and self.checksum.compute(view[at + HEADER_LENGTH:frame_end]) != stored:
                    raise self._error(base + at, f"checksum mismatch: the {self.checksum.name} of the payload does "
                                                 f"not match the frame's (damaged data)")
        bounds, open_at, consumed = group_messages(starts, ends, types, flags, base,
                                                   lambda at, problem: self._error(base + at, problem))
        messages = [view[starts[first]:ends[last]] for first, last in bounds]
        self._advance(consumed if open_at is None else starts[open_at], end)
        if self.done_at_min_time_us is not None and self.stop is None:
            for m in messages:
                bounds = msg.event_time_bounds(first_payload(m))
                if bounds is not None and bounds[0] >= self.done_at_min_time_us:
                    self.done = True  # past `until` by more than the disorder: nothing wanted follows
                    break
        return messages

    def _problem(self, buffer, offset: int, base: int) -> str | None:
        length, _, _, frame_type, term_offset = frame.LENGTH_TO_TERM_OFFSET.unpack_from(buffer, offset)
        return frame_problem(base + offset, length, frame_type, term_offset,
                             frame.INT32.unpack_from(buffer, offset + frame.TERM_ID_OFFSET)[0],
                             term_length=self.term_length, initial_term_id=self.descriptor.initial_term_id,
                             mtu_length=self.descriptor.mtu_length)

    def _error(self, position: int, problem: str) -> RecordingReadError:
        return RecordingReadError(f"recording {self.recording_id}: {self._reader.where(position)} "
                                  f"(position {position}): {problem}")

    def _bad_frame(self, buffer, offset: int, base: int) -> None:
        length = frame.INT32.unpack_from(buffer, offset)[0]
        if length <= 0:
            problem = f"frame length {length}: no frame where the recording holds data (zeroed or damaged)"
        else:
            problem = self._problem(buffer, offset, base)
        raise self._error(base + offset, f"corrupt frame: {problem}")

    def _advance(self, offset: int, end: int) -> None:
        """Move the unconsumed tail (a partial message) to the front of the other buffer, leaving
        the messages just found intact; past a PAD, drop what was read."""
        carry = max(0, end - offset)
        if carry:
            other = 1 - self._current
            if len(self._buffers[other]) < carry + self._chunk_length // 2:  # a long message: room for the rest
                self._buffers[other] = bytearray(carry + self._chunk_length)
                self._views[other] = memoryview(self._buffers[other])
            self._views[other][:carry] = self._views[self._current][offset:end]
            self._current = other
        self.position += offset
        self.consumed += offset
        self._filled = carry


# -- recorded messages -----------------------------------------------------------------------------


def first_payload(frames: memoryview) -> memoryview:
    """The first fragment's payload of a recorded message: the ramen header, and the start of the
    body (where its IPC metadata lies)."""
    return frames[HEADER_LENGTH:frame.INT32.unpack_from(frames, 0)[0]]


def reassemble(frames: memoryview) -> bytes:
    """The message held by recorded frames, in one piece."""
    return joined(frames, frame_parts(frames))


def frame_parts(frames: memoryview) -> list[tuple[int, int]]:
    """(offset, length) of each of the recorded frames that hold one message, back to back."""
    parts = []
    at = 0
    while at < len(frames):
        length = frame.INT32.unpack_from(frames, at)[0]
        parts.append((at, length))
        at += (length + ALIGN_UP) & ALIGN_MASK
    return parts


def joined(window, frames: list[tuple[int, int]]) -> bytes:
    """The message held by frames at (offset, length) in a window, in one piece."""
    return b"".join([window[at + HEADER_LENGTH:at + length] for at, length in frames])


def joined_from(window, frames: list[tuple[int, int]], start: int) -> bytes:
    """The message held by frames at (offset, length) in a window, from its byte `start` on, in one
    piece: a rollup at a message's end is copied without the rows before it."""
    pieces = []
    for at, length in frames:
        payload = length - HEADER_LENGTH
        if start >= payload:
            start -= payload
            continue
        pieces.append(window[at + HEADER_LENGTH + start:at + length])
        start = 0
    return b"".join(pieces)


def group_messages(starts: list[int], ends: list[int], types: list[int], flags: list[int], base: int,
                   error: Callable[[int, str], Exception]) -> tuple[list[tuple[int, int]], int | None, int]:
    """Frames grouped into whole DATA messages, in order: (index of the first, index of the last) of
    each; the index where a message left unfinished begins (None); and the end of the last message
    or padding. Padding stands alone. Frames out of order raise error(offset, problem), `base`
    being the stream position of offset 0 (for the problem's words)."""
    messages = []
    begin = None  # the index of the first frame of the message being walked
    consumed = 0
    for i, (frame_type, frame_flags) in enumerate(zip(types, flags)):
        if frame_type == HDR_TYPE_PAD:
            if begin is not None:
                raise error(starts[i], f"padding inside the message begun at position {base + starts[begin]}")
            consumed = ends[i]
            continue
        if frame_flags & frame.BEGIN_FLAG:
            if begin is not None:
                raise error(starts[i], f"a message begins inside the one begun at position {base + starts[begin]}, "
                                       f"which never ended")
            begin = i
        elif begin is None:
            raise error(starts[i], "fragment without a beginning")
        if frame_flags & frame.END_FLAG:
            messages.append((begin, i))
            begin = None
            consumed = ends[i]
    return messages, begin, consumed


def pad(window, start: int, end: int) -> int:
    """Turn window[start:end], whole frames, into one PAD frame that readers skip. Like
    write_messages, it leaves the length word at `start` to the caller and returns its value. The
    frame's other header fields (term offset and ids) stay as they are."""
    frame.KIND_WORD.pack_into(window, start + frame.VERSION_OFFSET, frame.PAD_WORD)
    return end - start


def write_messages(window, start: int, end: int, messages: list[bytes], *, max_payload: int, term_offset: int,
                   session_id: int, stream_id: int, term_id: int) -> int | None:
    """Write `messages` as frames (fragmented to max_payload) in place of the whole frames of
    window[start:end], whose first lies at `term_offset` of its term, and padding after them; None,
    with nothing written, when they do not fit. Every length word is stored but the one at `start`,
    whose value is returned: the caller stores it (a replay block's first is stored last, at the
    commit, which makes the block visible)."""
    framed = []
    for message in messages:
        pieces = [message[at:at + max_payload] for at in range(0, len(message), max_payload)]
        for i, piece in enumerate(pieces):
            flags = (frame.BEGIN_FLAG if i == 0 else 0) | (frame.END_FLAG if i == len(pieces) - 1 else 0)
            framed.append((flags, piece))
    if sum((HEADER_LENGTH + len(p) + ALIGN_UP) & ALIGN_MASK for _, p in framed) > end - start:
        return None
    at = start
    for flags, piece in framed:
        frame_length = HEADER_LENGTH + len(piece)
        frame.HEADER.pack_into(window, at, 0 if at == start else frame_length, frame.CURRENT_VERSION, flags,
                               frame.HDR_TYPE_DATA, term_offset + at - start, session_id, stream_id, term_id, 0)
        window[at + HEADER_LENGTH:at + frame_length] = piece
        at += (frame_length + ALIGN_UP) & ALIGN_MASK
    if at < end:
        frame.HEADER.pack_into(window, at, end - at, frame.CURRENT_VERSION, frame.UNFRAGMENTED, HDR_TYPE_PAD,
                               term_offset + at - start, session_id, stream_id, term_id, 0)
    return HEADER_LENGTH + len(framed[0][1])

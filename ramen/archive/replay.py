"""Replay sessions: a recording read back into an exclusive publication (Aeron's ReplaySession).

An agent: each `do_work` reads at most one replay buffer's worth (1 MiB by default) from the
segment files, never past a term end or the stop position, trims it to whole messages, verifies
the checksums if the archive has them, rewrites the session and stream ids to the replay
publication's, and commits it as one block. Only when the publication may start a message (below
its flow-control limit) is anything read, so back pressure delays the replay and loses nothing.
A replay of an active recording follows the recording's position counter and ends when the
recording stops.

The replay publication's log must line up with the recording (same term length and initial term
id, starting at the replay's start position; `replay_log_params` makes those parameters). Then
frames keep their term offsets, and the session reads straight into the log's term: the block is
invisible to readers until its first frame's length, kept aside meanwhile, is stored last.

Damage never stalls a replay nor gets through it: every frame's length, type, term offset and
term id are checked before its length is trusted (frames are found by the one frame walker,
ramen.transport.frame_walk), the data up to the stop (or the live position) must be there (a segment
file that ends before it is truncated, a zero length before it is damaged), and the session fails
with an error naming the recording, the segment file and the offset.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ramen.archive.catalog import NULL_POSITION, RecordingDescriptor
from ramen.archive.checksum import Checksum
from ramen.archive.errors import ArchiveError
from ramen.archive.segment import SegmentError, SegmentReader
from ramen.archive.time_index import TimeIndex, index_path
from ramen.transport import frame
from ramen.transport.counters import Counter
from ramen.transport.frame import ALIGN_MASK, ALIGN_UP, KIND_WORD_INDEX, TYPE_SHIFT_IN_KIND
from ramen.transport.frame_walk import frame_problem, walk
from ramen.transport.logbuffer import LogBufferParams
from ramen.transport.position import term_id_of
from ramen.transport.publication import ExclusivePublication
from ramen.transport.status import ADMIN_ACTION

log = logging.getLogger(__name__)

REPLAY_BUFFER_LENGTH = 1024 * 1024
"""Bytes read per duty cycle, as Aeron's default replay buffer."""

# Session states.
REPLAYING, DONE, FAILED = "replaying", "done", "failed"


class ReplayError(ArchiveError):
    """A replay that cannot start or go on, with a message naming the recording and position (and,
    for damaged data, the segment file and offset)."""


@dataclass
class ReplayStats:
    """Archive-wide read counters (cf. Aeron's archive replayer counters)."""
    bytes_read: Counter | None = None
    read_time_ns: Counter | None = None
    max_read_time_ns: Counter | None = None

    def record(self, length: int, elapsed_ns: int) -> None:
        if self.bytes_read is not None:
            self.bytes_read.add(length)
            self.read_time_ns.add(elapsed_ns)
            if elapsed_ns > self.max_read_time_ns.get():
                self.max_read_time_ns.set(elapsed_ns)


def replay_log_params(descriptor: RecordingDescriptor, start_position: int, *, session_id: int, stream_id: int,
                      page_size: int = 4096) -> LogBufferParams:
    """Parameters of a replay log whose positions coincide with the recording's."""
    term_length = descriptor.term_buffer_length
    bits = term_length.bit_length() - 1
    return LogBufferParams(term_length=term_length, mtu_length=descriptor.mtu_length, page_size=page_size,
                           initial_term_id=descriptor.initial_term_id, session_id=session_id, stream_id=stream_id,
                           term_id=term_id_of(start_position, bits, descriptor.initial_term_id),
                           term_offset=start_position & (term_length - 1))


BlockTransform = Callable[[memoryview, int, int, int], int]
"""transform(window, length, first_frame_length, position) -> first_frame_length: rewrites the
whole messages of window[:length] in place (their frames already carry the replay publication's
ids; the first frame's length word is not in the window but given, and returned, possibly changed),
keeping every frame boundary it does not replace: used by a replayer to tag, filter and drop
messages as they go by."""


class ReplaySession:
    """Replays [start_position, stop_position) of one recording into `publication`."""

    def __init__(self, archive_dir: str | os.PathLike, descriptor: RecordingDescriptor,
                 publication: ExclusivePublication, *, start_position: int | None = None,
                 stop_position: int | None = None, follow: Callable[[], int] | None = None,
                 checksum: Checksum | None = None, replay_buffer_length: int = REPLAY_BUFFER_LENGTH,
                 stats: ReplayStats | None = None, transform: BlockTransform | None = None) -> None:
        """`stop_position` None replays to the recording's stop position; for an active recording,
        `follow` returns its live position (its recording-position counter), or NULL_POSITION
        once it has stopped, after which the catalog's stop position is final.

        With `transform`, every block holds whole messages only (one larger than the window waits
        for room; one cut by the stop is an error) and goes through the transform, which may
        rewrite its messages in place, after its ids are rewritten and before it is committed."""
        self.archive_dir = Path(archive_dir)
        self.descriptor = descriptor
        self.publication = publication
        self.checksum = checksum
        self.stats = stats or ReplayStats()
        self.term_length = descriptor.term_buffer_length
        self.segment_length = descriptor.segment_file_length
        self.follow = follow
        self.transform = transform
        self.state = REPLAYING
        self.error: str | None = None
        start = descriptor.start_position if start_position is None else start_position
        recorded_stop = descriptor.stop_position
        self._check_start(start, recorded_stop)
        if stop_position is not None and stop_position < start:
            raise ReplayError(f"recording {descriptor.recording_id}: stop position {stop_position} is before the "
                              f"start position {start}")
        if stop_position is None and recorded_stop == NULL_POSITION and follow is None:
            raise ReplayError(f"recording {descriptor.recording_id} is active: give a stop position or follow it")
        self.position = start
        self.stop_position = stop_position
        self.max_block_length = max(replay_buffer_length, descriptor.mtu_length)
        if publication.position != start:
            raise ReplayError(f"recording {descriptor.recording_id}: the replay publication is at position "
                              f"{publication.position}, not the start {start} (see replay_log_params)")
        # The block being built sits in the replay log's term itself (the term window); its first
        # frame's length word is kept here instead, so readers see nothing until the commit.
        self._head = bytearray(4)
        self._head_view = memoryview(self._head)
        self._first_length = 0
        self._carry = 0  # complete frames already in the window, read but not yet committed
        self._window_length = 0
        self._window: memoryview | None = None
        self._words = np.zeros(0, dtype=np.int32)
        self._reader = SegmentReader.for_recording(archive_dir, descriptor)

    # -- agent ----------------------------------------------------------------------------------

    def do_work(self) -> int:
        if self.state != REPLAYING:
            return 0
        try:
            limit = self._limit()
            if limit is None:
                return 0
            if self.position >= limit:
                if self._finished(limit):
                    self._done()
                return 0
            return self._replay_block(limit)
        except ReplayError as e:
            self._fail(str(e))
            return 0

    @property
    def is_done(self) -> bool:
        return self.state != REPLAYING

    def close(self) -> None:
        """Release the segment files and every view of the replay log (so it can be unmapped)."""
        self._reader.close()
        self._words = np.zeros(0, dtype=np.int32)
        if self._window is not None:
            self._window.release()
            self._window = None
        if self.state == REPLAYING:
            self.state = DONE

    # -- internals ------------------------------------------------------------------------------

    def _check_start(self, start: int, recorded_stop: int) -> None:
        d = self.descriptor
        if start & (frame.FRAME_ALIGNMENT - 1):
            raise ReplayError(f"recording {d.recording_id}: start position {start} is not aligned to "
                              f"{frame.FRAME_ALIGNMENT} bytes")
        if start < d.start_position or (recorded_stop != NULL_POSITION and start > recorded_stop):
            stop = "active" if recorded_stop == NULL_POSITION else recorded_stop
            raise ReplayError(f"recording {d.recording_id}: start position {start} is outside the recording "
                              f"[{d.start_position}, {stop}]")

    def _limit(self) -> int | None:
        """How far we may read now: the stop position, or what the recording has reached."""
        if self.follow is not None:
            live = self.follow()
            if live == NULL_POSITION:  # stopped: its final position is in the catalog
                self.follow = None
                live = self._recorded_stop()
            limit = live
        else:
            limit = self._recorded_stop() if self.stop_position is None else self.stop_position
        if self.stop_position is not None:
            limit = min(limit, self.stop_position)
        return limit

    def _recorded_stop(self) -> int:
        stop = self.descriptor.stop_position
        return self.stop_position if stop == NULL_POSITION and self.stop_position is not None else stop

    def _finished(self, limit: int) -> bool:
        if self.stop_position is not None and self.position >= self.stop_position:
            return True
        return self.follow is None and self.position >= limit

    def _replay_block(self, limit: int) -> int:
        """Read whole messages from the segments straight into the replay log's term, check them,
        rewrite their ids and commit them; returns the work done (0: back pressure or no data).

        Complete frames past the last whole message stay in the term (the carry), their first
        length word set aside, and the next read appends to them: each archive byte is read once."""
        available, window = self.publication.term_window(self.max_block_length)
        if window is None:
            return 1 if available == ADMIN_ACTION else 0  # rotated: go on next cycle; else held back
        position = self.position
        carry = self._carry
        room = min(available, limit - position)
        read = 0
        if room > carry:
            read = self._read(window, position, carry, room)
        length = (carry + read) & ~(frame.FRAME_ALIGNMENT - 1)
        self._words = np.frombuffer(window, dtype=np.int32, count=length >> 2)
        self._window_length = room
        self._window = window
        # At a fixed stop, a message cut by the stop position still goes out, frame by frame.
        at_stop = self.follow is None and position + length == limit
        whole, frames, complete = self._whole_messages(length, at_stop and self.transform is None)
        if whole == 0:
            if at_stop and complete == length and self.transform is not None:
                raise ReplayError(f"recording {self.descriptor.recording_id}: the range ends inside a message "
                                  f"at position {position}")
            self._carry = complete
            self._clear_past(complete, length)
            return 0
        if self.checksum is not None:
            self._verify(frames)
        self._rewrite_ids(frames)
        next_first = int(self._words[whole >> 2]) if complete > whole else 0
        first_length = self._first_length
        if self.transform is not None:
            first_length = self.transform(window, whole, first_length, position)
        self._clear_past(whole, length)
        self.publication.commit_window(whole, first_length)
        self.position += whole
        self._carry = complete - whole
        self._first_length = next_first
        return 1

    def _read(self, window: memoryview, position: int, carry: int, room: int) -> int:
        """One preadv from the segment file at position + carry into the window after the carry;
        when the block starts afresh, its first length word goes aside (see _head)."""
        started = time.perf_counter_ns()
        try:
            fd, file_offset = self._reader.file_at(position + carry)
            if carry == 0:
                read = os.preadv(fd, [self._head_view, window[4:room]], file_offset)
                self._first_length = int.from_bytes(self._head, "little", signed=True) if read >= 4 else 0
            else:
                read = os.preadv(fd, [window[carry:room]], file_offset)
        except SegmentError as e:
            raise ReplayError(f"recording {self.descriptor.recording_id}: {e}") from None
        except OSError as e:
            raise ReplayError(f"recording {self.descriptor.recording_id}: {self._reader.where(position + carry)}: "
                              f"cannot read: {e.strerror}") from None
        self.stats.record(read, time.perf_counter_ns() - started)
        if read < room - carry:
            # Everything below the limit was recorded: a file that ends before it lost its end.
            at = position + carry + read
            raise ReplayError(f"recording {self.descriptor.recording_id}: {self._reader.where(at)} (position {at}): "
                              f"the segment file ends at offset {self._reader.file_size(at)}, before position "
                              f"{position + room} that the recording holds (truncated)")
        return read

    def _clear_past(self, end: int, length: int) -> None:
        """Zero the length word just past what is (or will be) committed, when we wrote there:
        readers must stop at `end`, whatever the read put beyond it."""
        if end < length:
            self._words[end >> 2] = 0

    def _whole_messages(self, length: int, at_stop: bool) -> tuple[int, np.ndarray, int]:
        """Bytes up to the end of the last whole message (or of the frames that fit, when one
        message is larger than the buffer), the offsets of the frames in it, and the end of the
        last complete frame read. Every frame read, and the header the walk stopped at, is checked
        against its place first: what was read lies below the limit, so was recorded."""
        frames = walk(self._window, 0, length, term_offset=self.position & (self.term_length - 1),
                      first_length=self._first_length)
        bad = frames.first_misfit(term_id=self._term_id, mtu_length=self.descriptor.mtu_length)
        if bad is not None:
            self._bad_frame(frames.start_of(bad), frames.length_of(bad))
        complete = frames.end
        if complete + frame.HEADER_LENGTH <= length:  # the walk stopped at a header: damage, or a frame cut
            stopped_length = self._first_length if complete == 0 else int(self._words[complete >> 2])
            self._check_frame(complete, stopped_length)
        if len(frames) == 0:
            return 0, frames.starts, 0
        count = frames.message_frames()
        if count == 0:
            if self._window_is_full(length) or at_stop:
                # One message larger than the buffer, or cut by the stop: its fragments go as they come.
                return complete, frames.starts, complete
            return 0, frames.starts[:0], complete
        return frames.end_of(count - 1), frames.starts[:count], complete

    @property
    def _term_id(self) -> int:
        """The term id every frame of the block being read must carry (a block lies in one term)."""
        return term_id_of(self.position, self.term_length.bit_length() - 1, self.descriptor.initial_term_id)

    def _window_is_full(self, length: int) -> bool:
        """Whether the block filled the window: a message that has not ended by then is larger
        than the window, and must go out fragment by fragment (a frame torn at the window's end
        is read again, whole, at the start of the next window). Not with a transform, which takes
        whole messages: it waits for the window to grow (a message is at most an eighth of a term,
        flow control lets the window grow to half of one; the replay buffer must hold the largest)."""
        return self.transform is None and length == self._window_length & ALIGN_MASK

    def _check_frame(self, offset: int, frame_length: int) -> None:
        """Raise if the header at `offset` does not fit its place (a frame merely cut by the
        window's end does)."""
        if frame_length > 0 and self._problem(offset, frame_length) is None:
            return
        self._bad_frame(offset, frame_length)

    def _problem(self, offset: int, frame_length: int) -> str | None:
        _, _, _, frame_type, term_offset = frame.LENGTH_TO_TERM_OFFSET.unpack_from(self._window, offset)
        term_id = frame.INT32.unpack_from(self._window, offset + frame.TERM_ID_OFFSET)[0]
        d = self.descriptor
        return frame_problem(self.position + offset, frame_length, frame_type, term_offset, term_id,
                             term_length=self.term_length, initial_term_id=d.initial_term_id,
                             mtu_length=d.mtu_length)

    def _bad_frame(self, offset: int, frame_length: int) -> None:
        position = self.position + offset
        d = self.descriptor
        if frame_length <= 0:
            problem = (f"frame length {frame_length}: no frame where the recording holds data (up to position "
                       f"{self.position + self._window_length}): zeroed or damaged")
        else:
            problem = self._problem(offset, frame_length) or f"corrupt frame (length {frame_length})"
        raise ReplayError(f"recording {d.recording_id}: corrupt frame at {self._reader.where(position)} (position "
                          f"{position}): {problem}")

    def where(self, position: int) -> str:
        """`<segment file> offset <o>` of a position of the recording, for messages."""
        return self._reader.where(position)

    def _rewrite_ids(self, frames: np.ndarray) -> None:
        """Give every frame the replay publication's session and stream ids: two numpy stores."""
        index = frames >> 2
        self._words[index + frame.SESSION_ID_WORD] = self.publication.session_id
        self._words[index + frame.STREAM_ID_WORD] = self.publication.stream_id

    def _verify(self, frames) -> None:
        """Check each DATA frame's payload against the checksum its sessionId field holds: for the
        many frames of a scan, their bounds and stored checksums gathered with numpy, then one CRC
        call a frame (the CRC itself runs at 10-20 GB/s; the Python around it is what costs)."""
        if len(frames) > 1:
            self._verify_many(frames)
            return
        window = self._window
        for offset in map(int, frames):
            frame_length, _, _, frame_type = frame.LENGTH_FLAGS_TYPE.unpack_from(window, offset)
            if frame_type != frame.HDR_TYPE_DATA:
                continue
            if offset == 0:
                frame_length = self._first_length
            payload = frame.align(frame_length) - frame.HEADER_LENGTH
            expected = frame.INT32.unpack_from(window, offset + frame.SESSION_ID_OFFSET)[0]
            start = offset + frame.HEADER_LENGTH
            actual = self.checksum.compute(window[start:start + payload])
            if actual != expected:
                position = self.position + offset
                raise ReplayError(f"recording {self.descriptor.recording_id}: checksum mismatch at "
                                  f"{self._reader.where(position)} (position {position}): {self.checksum.name} of "
                                  f"the payload {actual & 0xFFFFFFFF:#010x}, the frame records "
                                  f"{expected & 0xFFFFFFFF:#010x} (damaged data)")

    def _verify_many(self, starts: np.ndarray) -> None:
        words = self._words
        index = starts >> 2
        lengths = words[index]  # a copy: the block's first length word is not in the window
        lengths[0] = self._first_length
        data = (words[index + KIND_WORD_INDEX] >> TYPE_SHIFT_IN_KIND) == frame.HDR_TYPE_DATA
        begins = starts[data] + frame.HEADER_LENGTH
        ends = starts[data] + ((lengths[data] + ALIGN_UP) & ALIGN_MASK)
        stored = words[index[data] + frame.SESSION_ID_WORD].view(np.uint32)
        crc, window = self.checksum.unsigned, self._window
        for begin, end, expected in zip(begins.tolist(), ends.tolist(), stored.tolist()):
            if crc(window[begin:end]) != expected:
                self._verify([begin - frame.HEADER_LENGTH])  # names it
                raise AssertionError("a checksum mismatch the frame-by-frame check did not find")

    def _done(self) -> None:
        self.state = DONE
        log.debug("replay of recording %d done at position %d", self.descriptor.recording_id, self.position)

    def _fail(self, message: str) -> None:
        """`error` says why; the owner reports it (a replayer, as its one-line error)."""
        self.state = FAILED
        self.error = message
        log.info("replay failed: %s", message)


def positions_for_times(archive_dir: str | os.PathLike, descriptor: RecordingDescriptor, since_us: int,
                        until_us: int | None = None) -> tuple[int | None, int | None]:
    """Where a replay of event times [since, until) starts and may stop, from the recording's
    event-time index, in O(log n): (None, _) when nothing at or after `since` is recorded yet,
    (_, None) when the end is not known yet (replay to the end, or follow)."""
    index = TimeIndex.open(index_path(archive_dir, descriptor.recording_id), descriptor.recording_id)
    try:
        start = index.seek(since_us)
        stop = None if until_us is None else index.stop(until_us)
    finally:
        index.close()
    if start is not None:
        start = max(start, descriptor.start_position)
    return start, stop

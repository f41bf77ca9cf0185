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
from ramen.archive.segment import SegmentError, SegmentReader
from ramen.archive.time_index import TimeIndex, index_path
from ramen.transport import frame
from ramen.transport.counters import Counter
from ramen.transport.logbuffer import LogBufferParams
from ramen.transport.position import term_id_of
from ramen.transport.publication import ExclusivePublication
from ramen.transport.status import ADMIN_ACTION

log = logging.getLogger(__name__)

REPLAY_BUFFER_LENGTH = 1024 * 1024
"""Bytes read per duty cycle, as Aeron's default replay buffer."""

# Session states.
REPLAYING, DONE, FAILED = "replaying", "done", "failed"


class ReplayError(ValueError):
    """A replay that cannot start or go on, with a message naming the recording and position."""


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


class ReplaySession:
    """Replays [start_position, stop_position) of one recording into `publication`."""

    def __init__(self, archive_dir: str | os.PathLike, descriptor: RecordingDescriptor,
                 publication: ExclusivePublication, *, start_position: int | None = None,
                 stop_position: int | None = None, follow: Callable[[], int] | None = None,
                 checksum: Checksum | None = None, replay_buffer_length: int = REPLAY_BUFFER_LENGTH,
                 stats: ReplayStats | None = None) -> None:
        """`stop_position` None replays to the recording's stop position; for an active recording,
        `follow` returns its live position (its recording-position counter), or NULL_POSITION
        once it has stopped, after which the catalog's stop position is final."""
        self.archive_dir = Path(archive_dir)
        self.descriptor = descriptor
        self.publication = publication
        self.checksum = checksum
        self.stats = stats or ReplayStats()
        self.term_length = descriptor.term_buffer_length
        self.segment_length = descriptor.segment_file_length
        self.follow = follow
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
        self._bytes = np.zeros(0, dtype=np.uint8)
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
        self._bytes = np.zeros(0, dtype=np.uint8)
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
            started = time.perf_counter_ns()
            try:
                fd, file_offset = self._reader.file_at(position + carry)
            except SegmentError as e:
                raise ReplayError(f"recording {self.descriptor.recording_id}: {e}") from None
            if carry == 0:
                read = os.preadv(fd, [self._head_view, window[4:room]], file_offset)
                self._first_length = int.from_bytes(self._head, "little", signed=True) if read >= 4 else 0
            else:
                read = os.preadv(fd, [window[carry:room]], file_offset)
            self.stats.record(read, time.perf_counter_ns() - started)
        length = (carry + read) & ~(frame.FRAME_ALIGNMENT - 1)
        self._words = np.frombuffer(window, dtype=np.int32, count=length >> 2)
        self._bytes = np.frombuffer(window, dtype=np.uint8, count=length)
        self._window_length = room
        self._window = window
        # At a fixed stop, a message cut by the stop position still goes out, frame by frame.
        at_stop = self.follow is None and position + length == limit
        whole, frames, complete = self._whole_messages(length, at_stop)
        if whole == 0:
            self._carry = complete
            self._clear_past(complete, length)
            return 0
        if self.checksum is not None:
            self._verify(frames)
        words = self._words
        idx = np.asarray(frames, dtype=np.int64) >> 2
        words[idx + frame.SESSION_ID_OFFSET // 4] = self.publication.session_id
        words[idx + frame.STREAM_ID_OFFSET // 4] = self.publication.stream_id
        next_first = int(words[whole >> 2]) if complete > whole else 0
        self._clear_past(whole, length)
        self.publication.commit_window(whole, self._first_length)
        self.position += whole
        self._carry = complete - whole
        self._first_length = next_first
        return 1

    def _clear_past(self, end: int, length: int) -> None:
        """Zero the length word just past what is (or will be) committed, when we wrote there:
        readers must stop at `end`, whatever the read put beyond it."""
        if end < length:
            self._words[end >> 2] = 0

    def _length_at(self, offset: int) -> int:
        return self._first_length if offset == 0 else int(self._words[offset >> 2])

    def _whole_messages(self, length: int, at_stop: bool) -> tuple[int, list[int] | np.ndarray, int]:
        """Bytes up to the end of the last whole message (or of the frames that fit, when one
        message is larger than the buffer), the offsets of the frames in it, and the end of the
        last complete frame read.

        Vectorised: every 32-byte slot whose header claims the slot's own term offset is a
        candidate frame, and the candidates must chain exactly (each frame ends where the next
        begins). A payload that happens to look like a header breaks the chain and sends this
        block through the frame-by-frame walk instead, so the result is exact either way."""
        slots = length >> 5
        if slots == 0:
            return 0, [], 0
        words = self._words[:slots * 8].reshape(slots, 8)
        base = self.position & (self.term_length - 1)
        frame_lengths = words[:, 0].copy()
        frame_lengths[0] = self._first_length
        claimed = words[:, frame.TERM_OFFSET_OFFSET // 4]
        candidates = np.flatnonzero((frame_lengths >= frame.HEADER_LENGTH)
                                    & (claimed == base + (np.arange(slots, dtype=np.int32) << 5)))
        if len(candidates) == 0 or candidates[0] != 0:
            return self._whole_messages_walk(length, at_stop)
        starts = candidates << 5
        ends = starts + ((frame_lengths[candidates].astype(np.int64) + 31) & ~31)
        chained = ends[:-1] == starts[1:]
        if not chained.all():
            # Either a header look-alike inside a payload, or the data ends (zeros) and an old
            # frame lies beyond: the walk tells which.
            return self._whole_messages_walk(length, at_stop)
        whole_frames = ends <= length
        count = int(np.count_nonzero(whole_frames))
        starts, ends = starts[:count], ends[:count]
        if count == 0:
            return 0, [], 0
        complete = int(ends[-1])
        flags = self._bytes[starts + frame.FLAGS_OFFSET]
        types = self._bytes[starts + frame.TYPE_OFFSET]
        # A message ends at an END fragment; padding (a term's end) stands alone.
        message_ends = np.flatnonzero((flags & frame.END_FLAG) | (types == frame.HDR_TYPE_PAD))
        if len(message_ends) == 0:
            if count and (complete == self._window_length or at_stop):
                # One message larger than the buffer, or cut by the stop: its fragments go as they come.
                return int(ends[-1]), starts, complete
            return 0, [], complete
        last = int(message_ends[-1])
        return int(ends[last]), starts[:last + 1], complete

    def _whole_messages_walk(self, length: int, at_stop: bool) -> tuple[int, list[int], int]:
        """The same, frame by frame: for blocks the vectorised scan cannot vouch for."""
        offset = 0
        boundary = 0
        frames: list[int] = []
        boundary_frames = 0
        while offset + frame.HEADER_LENGTH <= length:
            frame_length = self._length_at(offset)
            if frame_length <= 0:
                break  # not yet written: an active recording's edge
            aligned = (frame_length + 31) & ~31
            if offset + aligned > length:
                break
            flags = int(self._bytes[offset + frame.FLAGS_OFFSET])
            frame_type = int(self._bytes[offset + frame.TYPE_OFFSET])
            self._check_frame(offset, frame_length)
            frames.append(offset)
            offset += aligned
            if frame_type == frame.HDR_TYPE_PAD or flags & frame.END_FLAG:
                boundary, boundary_frames = offset, len(frames)
        if boundary == 0 and frames and (offset == self._window_length or at_stop):
            # One message larger than the buffer, or cut by the stop: its fragments go as they come.
            return offset, frames, offset
        return boundary, frames[:boundary_frames], offset

    def _check_frame(self, offset: int, frame_length: int) -> None:
        expected = (self.position + offset) & (self.term_length - 1)
        term_offset = int(self._words[(offset + frame.TERM_OFFSET_OFFSET) >> 2])
        if term_offset != expected or frame_length < frame.HEADER_LENGTH:
            raise ReplayError(f"recording {self.descriptor.recording_id}: bad frame at position "
                              f"{self.position + offset} (term offset {term_offset}, length {frame_length})")

    def _verify(self, frames) -> None:
        for offset in map(int, frames):
            if self._bytes[offset + frame.TYPE_OFFSET] != frame.HDR_TYPE_DATA:
                continue
            payload = frame.align(self._length_at(offset)) - frame.HEADER_LENGTH
            expected = int(self._words[(offset + frame.SESSION_ID_OFFSET) >> 2])
            start = offset + frame.HEADER_LENGTH
            actual = self.checksum.compute(self._window[start:start + payload])
            if actual != expected:
                raise ReplayError(f"recording {self.descriptor.recording_id}: checksum mismatch at position "
                                  f"{self.position + offset} (stored {expected & 0xFFFFFFFF:#010x}, "
                                  f"computed {actual & 0xFFFFFFFF:#010x})")

    def _done(self) -> None:
        self.state = DONE
        log.debug("replay of recording %d done at position %d", self.descriptor.recording_id, self.position)

    def _fail(self, message: str) -> None:
        self.state = FAILED
        self.error = message
        log.error("replay failed: %s", message)


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

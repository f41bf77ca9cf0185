"""The replayer process: reads one function's archive once and serves every replay channel merged
onto it (docs/runtime.md, "sites/<site>/replayers/<id>").

The supervisor merges the replays that need the same archived function over overlapping time
ranges into one replayer key, `{id, source, log, archive_dir, channels: [{channel, since_us,
until_us}]}`. The replayer reads the source's recordings once, from the smallest `since` to the
largest `until` (positions from the time index, `ramen.archive.coverage.recordings_for`), and for
each TUPLES message writes to its output log, for each channel whose range meets the message's
event-time bounds, the rows inside that range tagged with that channel. Messages are skipped or
taken whole on their header's bounds alone. One taken whole goes out as it was recorded: its frames
are copied into the log in one piece, with the log's ids and offsets in their headers and the
channel and source in its ramen header, and never reassembled (`offer_frames`). Only a message cut
by a channel's edge is reassembled, decoded and filtered (one vectorised comparison over the
event-time column), and re-encoded in messages that fit the log. At the end each channel gets one
END_OF_REPLAY whose source is the replayer id, the stats go to `…/replayers/<id>/stats`, and the
process exits 0.

With one channel, the first recording's range is replayed in place (`Replayer.attach_in_place`):
the log is created lined up with the recording, a ReplaySession reads the segments straight into
it, and each block is tagged, padded and filtered where it lies before it is committed: one copy
of the archive's bytes instead of two (the replayer's CPU for an hour of traffic: 0.15-0.20 s ->
0.11-0.15 s). Otherwise the archive is read from its segment files a chunk at a time into the
replayer's own buffer; a message cut by a chunk's end is carried over to the next chunk rather
than read again, and the zero body of a PAD frame (never stored) is skipped. Either way every byte
of the range is consumed exactly once: the `replayer <id> bytes read` counter ends at the sum of
the ranges' lengths. Frames are checked as they are walked (length, type, term offset and term id,
fragments in order, and the checksum when the archive keeps one), the data must reach the range's
end, and each recording's descriptor must be sound (its checksum too): damage is an error naming
the recording, the file and the offset, never a replay that hangs or comes back short.

Run it as `python -m workers.replayer --site SITE --id ID` with $RAMEN_CONFSERVER (and
$RAMEN_CONFSERVER_AUTH, $RAMEN_DIR) set. Errors are one line on stderr and exit 1; the same line
goes into the `error` of each replay it serves (`replays/<channel>`), so that the client prints it
at once (the supervisor, seeing the exit, keeps the first error). SIGTERM stops it with exit 0.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import signal
import struct
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ramen import keyspace, paths
from ramen import message as msg
from ramen.archive import checksum as checksums
from ramen.archive.catalog import NULL_POSITION, Catalog, RecordingDescriptor, layout_problem
from ramen.archive.coverage import RecordingRange, recordings_for
from ramen.archive.errors import ArchiveError
from ramen.archive.recorder import recording_position
from ramen.archive.replay import FAILED, REPLAY_BUFFER_LENGTH, ReplaySession, replay_log_params
from ramen.archive.segment import SegmentError, SegmentReader, frame_problem
from ramen.archive.time_index import TimeIndex, index_path
from ramen.memory import freeze_startup_objects, retain_freed_memory
from ramen.program import Program, split_qualified
from ramen.replay.contract import ChannelRange, ContractError, ReplayerAssignment, error_of, with_error
from ramen.replay.contract import ReplayerStats as ReplayerStatsValue
from ramen.transport import frame
from ramen.transport.counters import CountersFile, CountersFileError
from ramen.transport.defaults import IPC_MTU_LENGTH, IPC_TERM_LENGTH
from ramen.transport.idle import BackoffIdleStrategy
from ramen.transport.logbuffer import LogBuffer, LogBufferError, LogBufferParams, compute_max_message_length
from ramen.transport.position import int32
from ramen.transport.publication import ExclusivePublication
from ramen.transport.status import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED
from ramen.tuples import encode_tuples, end_of_replay, tuple_count
from workers.spare import wait_for_key, warm_up_arrow

log = logging.getLogger(__name__)

CONFSERVER_IDENTITY = "worker"
SUBSCRIBER_WAIT_TIMEOUT_S = 30.0
"""How long the replayer waits for a reader of its log (before its first write, and whenever the
reader goes away) before it gives up with an error."""
READ_CHUNK_LENGTH = 1024 * 1024
"""Bytes read from a segment file per duty cycle (Aeron's replay buffer)."""
IDLE_MAX_SPINS = 0
IDLE_MAX_YIELDS = 0
IDLE_MAX_PARK_S = 0.001
"""A replayer outruns its readers, so most of its idle cycles find the log full: it sleeps at once
(backing off from the transport's IDLE_MIN_PARK_S), since spinning or yielding would take the CPU
its readers need to catch up (0.04 s a replay of an hour, of 0.25 s, measured on two cores). It
sleeps at most 1 ms: a reader empties the log's window (2 MiB) in a few."""
STATS_INTERVAL_S = 1.0
"""How often the stats key is rewritten while replaying (and once at the end)."""
ACTIVE_RECORDING_QUIET_S = 1.0
"""An active recording that has not grown for this long is taken as read to its end."""
REPLAYER_BYTES_READ_TYPE_ID = 1010
"""Counter type of `replayer <id> bytes read` (ramen's own type ids start at 1000)."""
EXIT_ERROR = 1
SOURCE_MASK = 0xFFFFFFFF
"""The message header's source field is a u32: the low 32 bits of the replayer id."""

_FRAME_HEADER = struct.Struct("<iBBHi")  # length, version, flags, type, term offset
_TERM_ID = struct.Struct("<i")
_INT32 = struct.Struct("<i")
_ALIGN_UP = frame.FRAME_ALIGNMENT - 1
_ALIGN_MASK = -frame.FRAME_ALIGNMENT
_FLAGS_TYPE = struct.Struct("<BH")  # a frame's flags and type: adjacent in its header
_PAD_WORD = struct.Struct("<I")  # version, flags and type as one word
_SOURCE_FIELDS = struct.Struct("<II")  # channel, source: adjacent in the ramen message header
_FIRST_CHANNEL_OFFSET = frame.HEADER_LENGTH + msg.CHANNEL_OFFSET  # in a recorded message's first frame


class ReplayerError(Exception):
    """Why a replayer cannot go on, as the one line it prints."""


# -- reading the archive ---------------------------------------------------------------------------


def archive_checksum(catalog: Catalog, recording_id: int) -> checksums.Checksum | None:
    """The algorithm of an archive's checksums, found from a descriptor's stored checksum (the
    archiver uses one algorithm for frames and descriptors); None when the archive keeps none.
    A checksum no algorithm gives (a damaged descriptor) is a CatalogError naming the entry."""
    return catalog.descriptor_checksum(recording_id)


class RecordingReader:
    """The whole ramen messages of [start, stop) of one recording, a chunk at a time, each as the
    recorded frames that hold it (`payload` and `reassemble` read them).

    Each archive byte is consumed once: a message cut by the chunk's end is moved to the front of
    the other of two buffers (the messages returned point into this one) and the next read appends
    to it; a PAD frame's body is skipped, not read. An active recording (stop unknown) is followed
    through its recording-position counter."""

    def __init__(self, archive_dir: str | os.PathLike, descriptor: RecordingDescriptor, start: int,
                 stop: int | None, *, checksum: checksums.Checksum | None = None, follow=None,
                 done_at_min_time_us: int | None = None, chunk_length: int = READ_CHUNK_LENGTH) -> None:
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
        self._reader = SegmentReader.for_recording(archive_dir, descriptor)
        self._chunk_length = max(chunk_length, descriptor.mtu_length * 2)
        self._buffers = [bytearray(self._chunk_length), bytearray(self._chunk_length)]
        self._views = [memoryview(b) for b in self._buffers]
        self._current = 0
        self._filled = 0  # bytes of the buffer holding data (a carried partial message)
        self._last_growth_s = time.monotonic()

    def close(self) -> None:
        self._reader.close()

    def _limit(self) -> int | None:
        """How far the data may be read now; None when nothing more can be read yet."""
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
            raise ReplayerError(f"recording {self.recording_id} has no stop position and no live recorder "
                                f"(unclean shutdown? restart the archiver to repair the catalog)")
        return stop

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
                    raise ReplayerError(f"recording {self.recording_id}: the range ends inside a message "
                                        f"at position {self.position}")
                self.done = True
            elif time.monotonic() - self._last_growth_s > ACTIVE_RECORDING_QUIET_S:
                self.done = True  # active but idle: what it holds is what there is
            return []
        view = self._views[self._current]
        term_end = (read_at | (self.term_length - 1)) + 1
        want = min(len(view) - self._filled, term_end - read_at, limit - read_at)
        try:
            # Everything below the limit was recorded: bytes a segment file does not hold are lost.
            got = self._reader.read(read_at, view[self._filled:self._filled + want], must_exist=True)
        except SegmentError as e:
            raise ReplayerError(f"recording {self.recording_id}: {e}") from None
        self._last_growth_s = time.monotonic()
        return self._walk(self._filled + got)

    def _walk(self, end: int) -> list[memoryview]:
        buffer, view = self._buffers[self._current], self._views[self._current]
        base = self.position
        mask = self.term_length - 1
        unpack = _FRAME_HEADER.unpack_from
        messages = []
        offset = 0
        begin = None  # where the message being walked starts
        mtu_length = self.descriptor.mtu_length
        # A read never crosses a term end (nor does a message it carries over): one term per walk.
        term_id = int32(self.descriptor.initial_term_id + (base >> (self.term_length.bit_length() - 1)))
        while offset + frame.HEADER_LENGTH <= end:
            length, _, flags, frame_type, term_offset = unpack(buffer, offset)
            position = base + offset
            aligned = (length + _ALIGN_UP) & _ALIGN_MASK
            term_end = (position | mask) + 1
            # Checked before the length is trusted; what was read lies below the limit, so was
            # recorded: a length <= 0 there is damage, even in an active recording.
            if length < frame.HEADER_LENGTH or position + aligned > term_end or frame_type > frame.HDR_TYPE_DATA \
                    or term_offset != position & mask or (frame_type == frame.HDR_TYPE_DATA and length > mtu_length) \
                    or _TERM_ID.unpack_from(buffer, offset + frame.TERM_ID_OFFSET)[0] != term_id:
                self._bad_frame(buffer, offset, position)
            if frame_type == frame.HDR_TYPE_PAD:
                if begin is not None:
                    raise self._error(position, f"padding inside the message begun at position {base + begin}")
                offset += aligned  # its body is not stored; reading resumes after it
                if offset >= end:
                    break
                continue
            if offset + aligned > end:
                break  # cut by the chunk's end: carried over
            if self.checksum is not None:
                stored = _INT32.unpack_from(buffer, offset + frame.SESSION_ID_OFFSET)[0]
                if self.checksum.compute(view[offset + frame.HEADER_LENGTH:offset + aligned]) != stored:
                    raise self._error(position, f"checksum mismatch: the {self.checksum.name} of the payload does "
                                                f"not match the frame's (damaged data)")
            if flags & frame.BEGIN_FLAG:
                if begin is not None:
                    raise self._error(position, f"a message begins inside the one begun at position {base + begin}, "
                                                f"which never ended")
                begin = offset
            elif begin is None:
                raise self._error(position, "fragment without a beginning")
            offset += aligned
            if flags & frame.END_FLAG:
                messages.append(view[begin:offset])
                begin = None
        self._advance(offset if begin is None else begin, end)
        if self.done_at_min_time_us is not None and self.stop is None:
            for m in messages:
                bounds = msg.event_time_bounds(payload(m))
                if bounds is not None and bounds[0] >= self.done_at_min_time_us:
                    self.done = True  # past `until` by more than the disorder: nothing wanted follows
                    break
        return messages

    def _error(self, position: int, problem: str) -> ReplayerError:
        return ReplayerError(f"recording {self.recording_id}: {self._reader.where(position)} (position {position}): "
                             f"{problem}")

    def _bad_frame(self, buffer, offset: int, position: int) -> None:
        length, _, _, frame_type, term_offset = _FRAME_HEADER.unpack_from(buffer, offset)
        if length <= 0:
            problem = f"frame length {length}: no frame where the recording holds data (zeroed or damaged)"
        else:
            problem = frame_problem(position, length, frame_type, term_offset,
                                    _TERM_ID.unpack_from(buffer, offset + frame.TERM_ID_OFFSET)[0],
                                    term_length=self.term_length, initial_term_id=self.descriptor.initial_term_id,
                                    mtu_length=self.descriptor.mtu_length)
        raise self._error(position, f"corrupt frame: {problem}")

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


def payload(frames: memoryview) -> memoryview:
    """The first fragment's payload of a recorded message: the ramen header, and the start of the
    body (where its IPC metadata lies)."""
    return frames[frame.HEADER_LENGTH:_INT32.unpack_from(frames, 0)[0]]


def reassemble(frames: memoryview) -> bytes:
    """The message held by recorded frames, in one piece."""
    pieces = []
    at = 0
    while at < len(frames):
        length = _INT32.unpack_from(frames, at)[0]
        pieces.append(frames[at + frame.HEADER_LENGTH:at + length])
        at += (length + _ALIGN_UP) & _ALIGN_MASK
    return b"".join(pieces)


def _joined(window: memoryview, frames: list[tuple[int, int]]) -> bytes:
    """The message held by frames at (offset, length) in a window, in one piece."""
    return b"".join([window[at + frame.HEADER_LENGTH:at + length] for at, length in frames])


# -- the replayer agent ----------------------------------------------------------------------------


@dataclass
class ReplayerStats:
    """Counted as the replayer goes; written as the contract's ReplayerStats."""
    bytes_read: int = 0
    messages: int = 0
    rows_out: int = 0
    channels: dict[int, int] = field(default_factory=dict)
    done: bool = False

    def to_value(self) -> dict:
        return ReplayerStatsValue(self.bytes_read, self.messages, self.rows_out, dict(self.channels),
                                  self.done).to_value()


class Replayer:
    """An agent: each do_work offers what is pending, or reads and splits one chunk of the archive."""

    def __init__(self, spec: ReplayerAssignment, schema: pa.Schema, event_time: str, readers: list[RecordingReader],
                 publication: ExclusivePublication, bytes_counter=None) -> None:
        self.spec = spec
        self.schema = schema
        self.event_time = event_time
        self.readers = collections.deque(readers)
        self.publication = publication
        self.bytes_counter = bytes_counter
        self.source = spec.id & SOURCE_MASK
        self.stats = ReplayerStats(channels={c.channel: 0 for c in spec.channels})
        # What to offer, in order: encoded messages, or (recorded message, channel) pairs that point
        # into the reader's buffer. It is emptied before the next read, which keeps them valid.
        self._outbox: collections.deque = collections.deque()
        self._ended = False
        self.done = False
        self._not_connected_since: float | None = None
        self._consumed_before = 0
        self.in_place: ReplaySession | None = None
        """The first recording's range, replayed straight into the log (see attach_in_place)."""
        self._in_place_start = 0

    def attach_in_place(self, reader: RecordingReader, archive_dir: str | os.PathLike) -> None:
        """Replay `reader`'s range (the first) as the archive's ReplaySession does, straight from
        the segment files into the log, whose positions line up with the recording's (see
        open_output): one copy instead of two, and one commit a block instead of an offer a
        message. Each block goes through `_in_place_block`, which tags the messages inside the
        channel's range, turns those outside it into padding, and filters the edges' in place.
        For one channel only: a message has room for one channel's tag."""
        self.readers.remove(reader)
        reader.close()
        # A block holds whole messages: the buffer must take the largest the recording's terms allow.
        buffer_length = max(REPLAY_BUFFER_LENGTH, compute_max_message_length(reader.descriptor.term_buffer_length))
        self.in_place = ReplaySession(archive_dir, reader.descriptor, self.publication, start_position=reader.position,
                                      stop_position=reader.stop, checksum=reader.checksum,
                                      replay_buffer_length=buffer_length, transform=self._in_place_block)
        self._in_place_start = reader.position

    def do_work(self) -> int:
        if self.done:
            return 0
        if self._outbox:
            return self._offer()
        if self.in_place is not None:
            return self._replay_in_place()
        if self.readers:
            reader = self.readers[0]
            messages = reader.read()
            self._count_bytes(reader)
            for message in messages:
                self._split(message)
            if reader.done:
                reader.close()
                self.readers.popleft()
                self._consumed_before += reader.consumed
            return 1 if messages else 0
        if not self._ended:
            self._ended = True
            for c in self.spec.channels:
                self._outbox.append(end_of_replay(c.channel, self.source))
            return 1
        self.done = self.stats.done = True
        return 1

    def close(self) -> None:
        for reader in self.readers:
            reader.close()
        self.readers.clear()
        if self.in_place is not None:
            self.in_place.close()
            self.in_place = None

    def _replay_in_place(self) -> int:
        session = self.in_place
        work = session.do_work()
        consumed = session.position - self._in_place_start
        self._set_bytes(self._consumed_before + consumed)
        if session.state == FAILED:
            raise ReplayerError(session.error)
        if session.is_done:
            session.close()
            self.in_place = None
            self._consumed_before += consumed
            return 1
        return work

    def _in_place_block(self, window: memoryview, length: int, first_length: int, position: int) -> int:
        """ReplaySession's transform (see attach_in_place): every whole message of the block, in
        place. Returns the block's first frame length, which changes when its message does."""
        c = self.spec.channels[0]
        offset = 0
        while offset < length:
            start = offset
            frames = []
            while True:  # the message's frames, to its END (a block holds whole messages)
                frame_length = first_length if offset == 0 else _INT32.unpack_from(window, offset)[0]
                flags, frame_type = _FLAGS_TYPE.unpack_from(window, offset + frame.FLAGS_OFFSET)
                if frame_type == frame.HDR_TYPE_PAD and frames:
                    raise self._in_place_error(position + offset, f"padding inside the message begun at position "
                                                                  f"{position + start}")
                if frame_type != frame.HDR_TYPE_PAD and not frames and not flags & frame.BEGIN_FLAG:
                    raise self._in_place_error(position + offset, "fragment without a beginning")
                if frames and flags & frame.BEGIN_FLAG:
                    raise self._in_place_error(position + offset, f"a message begins inside the one begun at "
                                                                  f"position {position + start}, which never ended")
                frames.append((offset, frame_length))
                offset += (frame_length + _ALIGN_UP) & _ALIGN_MASK
                if frame_type == frame.HDR_TYPE_PAD or flags & frame.END_FLAG:
                    break
            if frame_type == frame.HDR_TYPE_PAD:
                continue  # the recording's own, at a term's end: the log's term ends there too
            first = window[start + frame.HEADER_LENGTH:start + frames[0][1]]
            taggable = len(first) >= msg.HEADER_LENGTH  # else a first fragment too short for the header (tiny MTUs)
            header = msg.decode_header(first if taggable else _joined(window, frames))
            if header is None or header.kind != msg.KIND_TUPLES or header.min_event_time_us == msg.NO_EVENT_TIME:
                first_length = self._pad(window, start, offset, first_length)
                continue
            self.stats.messages += 1
            low, high = header.min_event_time_us, header.max_event_time_us
            if high < c.since_us or low >= c.until_us:
                first_length = self._pad(window, start, offset, first_length)
                continue
            if c.since_us <= low and high < c.until_us and taggable:
                _SOURCE_FIELDS.pack_into(window, start + _FIRST_CHANNEL_OFFSET, c.channel, self.source)
                rows = tuple_count(first)
                if rows is None:
                    rows = self._decode(_joined(window, frames)).num_rows
            else:
                part = self._filter(self._decode(_joined(window, frames)), c)
                rows = part.num_rows
                if rows == 0:
                    first_length = self._pad(window, start, offset, first_length)
                    continue
                first_length = self._rewrite(window, start, offset, self._encode(part, c.channel), first_length,
                                             position)
            self.stats.rows_out += rows
            self.stats.channels[c.channel] += rows
        return first_length

    def _in_place_error(self, position: int, problem: str) -> ReplayerError:
        session = self.in_place
        return ReplayerError(f"recording {session.descriptor.recording_id}: {session.where(position)} (position "
                             f"{position}): {problem}")

    def _pad(self, window: memoryview, start: int, end: int, first_length: int) -> int:
        """Turn window[start:end] into one PAD frame (readers skip it); returns the block's first
        frame length. The frame's other header fields (term offset and ids) stay as they are."""
        _PAD_WORD.pack_into(window, start + 4, frame.PAD_WORD)
        return self._set_length(window, start, end - start, first_length)

    @staticmethod
    def _set_length(window: memoryview, at: int, frame_length: int, first_length: int) -> int:
        """Store a frame's length word, but the block's first, which the session stores last."""
        if at == 0:
            return frame_length
        _INT32.pack_into(window, at, frame_length)
        return first_length

    def _rewrite(self, window: memoryview, start: int, end: int, messages: list[bytes], first_length: int,
                 position: int) -> int:
        """Write `messages` (an edge message's rows inside the range) in place of window[start:end],
        and padding after them. They take no more room than the message they come from (fewer rows
        of the same columns); should they ever, they go out after the block instead, and the
        message's place is padding."""
        payload = self.publication.max_payload_length
        framed = []
        for message in messages:
            pieces = [message[at:at + payload] for at in range(0, len(message), payload)]
            for i, piece in enumerate(pieces):
                flags = (frame.BEGIN_FLAG if i == 0 else 0) | (frame.END_FLAG if i == len(pieces) - 1 else 0)
                framed.append((flags, piece))
        if sum((frame.HEADER_LENGTH + len(p) + _ALIGN_UP) & _ALIGN_MASK for _, p in framed) > end - start:
            log.warning("replayer %d: a filtered message outgrew its place; it follows its block", self.spec.id)
            self._outbox.extend(messages)
            return self._pad(window, start, end, first_length)
        term_mask = self.publication.term_length - 1
        term_id = _INT32.unpack_from(window, start + frame.TERM_ID_OFFSET)[0]
        ids = (self.publication.session_id, self.publication.stream_id, term_id, 0)
        at = start
        for flags, piece in framed:
            frame_length = frame.HEADER_LENGTH + len(piece)
            frame.HEADER.pack_into(window, at, 0, frame.CURRENT_VERSION, flags, frame.HDR_TYPE_DATA,
                                   (position + at) & term_mask, *ids)
            window[at + frame.HEADER_LENGTH:at + frame_length] = piece
            first_length = self._set_length(window, at, frame_length, first_length)
            at += (frame_length + _ALIGN_UP) & _ALIGN_MASK
        if at < end:  # at > 0: the first frame is written, so this length word is not the block's first
            frame.HEADER.pack_into(window, at, end - at, frame.CURRENT_VERSION, frame.UNFRAGMENTED, frame.HDR_TYPE_PAD,
                                   (position + at) & term_mask, *ids)
        return first_length

    def _count_bytes(self, reader: RecordingReader) -> None:
        self._set_bytes(self._consumed_before + reader.consumed)

    def _set_bytes(self, total: int) -> None:
        if self.bytes_counter is not None:
            self.bytes_counter.set(total)
        self.stats.bytes_read = total

    def _offer(self) -> int:
        message = self._outbox[0]
        try:
            if type(message) is tuple:  # a recorded message going out whole: tagged in place, just now
                frames, channel = message
                _SOURCE_FIELDS.pack_into(frames, _FIRST_CHANNEL_OFFSET, channel, self.source)
                result = self.publication.offer_frames(frames, 0, len(frames))
            else:
                result = self.publication.offer(message)
        except ValueError as e:
            raise ReplayerError(f"{self.spec.source}: a message does not fit the replay log ({e})") from None
        if result >= 0:
            self._outbox.popleft()
            self._not_connected_since = None
            return 1
        if result == ADMIN_ACTION:
            return 1
        if result == BACK_PRESSURED:
            return 0
        if result == NOT_CONNECTED:
            now = time.monotonic()
            if self._not_connected_since is None:
                self._not_connected_since = now
            elif now - self._not_connected_since > SUBSCRIBER_WAIT_TIMEOUT_S:
                raise ReplayerError(f"no reader of {self.publication.log.path} for {SUBSCRIBER_WAIT_TIMEOUT_S:g} s")
            return 0
        raise ReplayerError(f"cannot write to {self.publication.log.path} (status {result})")

    def _split(self, frames: memoryview) -> None:
        """Queue, for each channel whose range meets the message, the rows of the message inside it."""
        first = payload(frames)
        forward = len(first) >= msg.HEADER_LENGTH  # else a first fragment too short for the header (tiny MTUs)
        if not forward:
            first = reassemble(frames)
        header = msg.decode_header(first)
        if header is None or header.kind != msg.KIND_TUPLES or header.min_event_time_us == msg.NO_EVENT_TIME:
            return
        self.stats.messages += 1
        low, high = header.min_event_time_us, header.max_event_time_us
        batch = None
        for c in self.spec.channels:
            if high < c.since_us or low >= c.until_us:
                continue
            if c.since_us <= low and high < c.until_us and forward:
                # The recorded frames as they are: only the channel and source change, written into
                # the read buffer right before the offer (each channel in turn), so nothing is
                # copied but into the log.
                self._outbox.append((frames, c.channel))
                rows = tuple_count(first) if batch is None else batch.num_rows
                if rows is None:
                    batch = self._decode(reassemble(frames))
                    rows = batch.num_rows
            else:
                if batch is None:
                    batch = self._decode(reassemble(frames))
                part = self._filter(batch, c)
                rows = part.num_rows
                if rows == 0:
                    continue
                self._outbox.extend(self._encode(part, c.channel))
            self.stats.rows_out += rows
            self.stats.channels[c.channel] += rows

    def _encode(self, batch: pa.RecordBatch, channel: int) -> list[bytes]:
        """The rows as messages within the log's max message length: a recorded message may be
        longer than this log takes (its log had longer terms), so its part inside a range is cut
        in halves until each fits."""
        message = encode_tuples(batch, self.event_time, channel=channel, source=self.source)
        if len(message) <= self.publication.max_message_length or batch.num_rows <= 1:
            return [message]
        half = batch.num_rows // 2
        return self._encode(batch.slice(0, half), channel) + self._encode(batch.slice(half), channel)

    def _decode(self, message) -> pa.RecordBatch:
        try:
            return pa.ipc.read_record_batch(pa.py_buffer(message)[msg.HEADER_LENGTH:], self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowException) as e:
            raise ReplayerError(f"{self.spec.source}: a recorded batch does not decode with the function's "
                                f"schema ({e})") from None

    def _filter(self, batch: pa.RecordBatch, c: ChannelRange) -> pa.RecordBatch:
        times = batch.column(self.event_time).cast(pa.timestamp("us")).cast(pa.int64())
        mask = pc.and_(pc.greater_equal(times, c.since_us), pc.less(times, c.until_us))
        return batch.filter(mask)


# -- setting up ------------------------------------------------------------------------------------


def load_spec(client, site: str, replayer_id: int, wait_s: float = 0.0,
              stop: threading.Event | None = None, parent: int | None = None) -> ReplayerAssignment | None:
    """The replayer's key. A warm replayer (started before its replay is merged, so that its start-up
    overlaps the merge delay) waits up to wait_s for it; None if it never comes, or once `parent`
    (the supervisor that started it) is no longer its parent."""
    key = keyspace.replayer_key(site, replayer_id)
    if wait_s > 0:
        entry = wait_for_key(client, key, wait_s, stop, parent)
        if entry is None:
            return None
    else:
        entry = client.get_or_none(key)
    if entry is None:
        raise ReplayerError(f"no replayer key {key}")
    try:
        return ReplayerAssignment.from_value(entry.value, key)
    except ContractError as e:
        raise ReplayerError(str(e)) from None


def load_function(client, qualified_name: str):
    program_name, function_name = split_qualified(qualified_name)
    if not program_name or not function_name:
        raise ReplayerError(f"source {qualified_name!r} is not prog/func")
    entry = client.get_or_none(keyspace.program_key(program_name))
    if entry is None:
        raise ReplayerError(f"source {qualified_name}: no program {program_name} loaded")
    program = Program.from_dict(entry.value)
    if function_name not in program:
        raise ReplayerError(f"source {qualified_name}: program {program_name} has no function {function_name}")
    function = program.function(function_name)
    if function.event_time is None:
        raise ReplayerError(f"source {qualified_name} has no event time: nothing to replay by time")
    return function


def open_readers(spec: ReplayerAssignment, counters: CountersFile) -> list[RecordingReader]:
    """A reader per recording of the source holding event times of the spec's whole range."""
    archive_dir = Path(spec.archive_dir)
    try:
        ranges: list[RecordingRange] = recordings_for(archive_dir, spec.source, spec.since_us, spec.until_us)
    except ArchiveError as e:
        raise ReplayerError(str(e)) from None
    except OSError as e:
        raise ReplayerError(f"{archive_dir}: {e}") from None
    if not ranges:
        raise ReplayerError(f"no recording of {spec.source} in {archive_dir} covers "
                            f"[{spec.since_us}, {spec.until_us}) µs")
    readers = []
    try:
        with Catalog.open(archive_dir) as catalog:
            for r in ranges:
                descriptor = catalog.get(r.recording_id)
                problem = layout_problem(descriptor)
                if problem is not None:
                    raise ReplayerError(f"{catalog.where(r.recording_id)}: recording {r.recording_id}: {problem} "
                                        f"(damaged descriptor)")
                checksum = archive_checksum(catalog, r.recording_id)
                follow = done_at = None
                if r.stop_position is None:
                    follow = recording_position(counters, r.recording_id)
                    index = TimeIndex.open(index_path(archive_dir, r.recording_id), r.recording_id)
                    done_at = spec.until_us + index.disorder_us
                    index.close()
                readers.append(RecordingReader(archive_dir, descriptor, r.start_position, r.stop_position,
                                               checksum=checksum, follow=follow, done_at_min_time_us=done_at))
    except (ArchiveError, ReplayerError) as e:
        for reader in readers:
            reader.close()
        raise ReplayerError(str(e)) from None
    return readers


def open_output(path: Path, counters: CountersFile,
                aligned_with: RecordingReader | None = None) -> tuple[ExclusivePublication, bool]:
    """The replayer's log, and whether it lines up with `aligned_with`'s recording (positions,
    terms and term ids alike, starting where the reader does: `replay_log_params`), so that its
    range can be replayed in place. Created so when asked; a log already there (a replayer that
    restarted) is opened as it is, and does not."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if aligned_with is not None:
        params = replay_log_params(aligned_with.descriptor, aligned_with.position, session_id=0, stream_id=0)
    else:
        params = LogBufferParams(term_length=IPC_TERM_LENGTH, mtu_length=IPC_MTU_LENGTH)
    try:
        log_buffer = LogBuffer.create(path, params)
        aligned = aligned_with is not None
    except LogBufferError:
        log_buffer = LogBuffer.open(path)
        aligned = False
    return ExclusivePublication(log_buffer, counters), aligned


def in_place_candidate(spec: ReplayerAssignment, readers: list[RecordingReader]) -> RecordingReader | None:
    """The reader whose range can be replayed in place: the first, when the replay has one channel
    (a message has room for one tag) and the range's end is known (an active recording's end is
    found as it is read, by the reader)."""
    if len(spec.channels) != 1 or not readers or readers[0].stop is None or readers[0].follow is not None:
        return None
    return readers[0]


def wait_for_reader(publication: ExclusivePublication, stop: threading.Event, readers: int = 1) -> None:
    """Until `readers` subscribers read the log: each joins where the log is, so one that came
    after the first message would miss the replay's start."""
    deadline = time.monotonic() + SUBSCRIBER_WAIT_TIMEOUT_S
    idle = BackoffIdleStrategy()
    while (count := publication.subscriber_count) < readers:
        if stop.is_set():
            return
        if time.monotonic() > deadline:
            raise ReplayerError(f"{count} of the {readers} expected readers subscribed to {publication.log.path} "
                                f"within {SUBSCRIBER_WAIT_TIMEOUT_S:g} s")
        idle.idle(0)


def replay(client, site: str, replayer_id: int, stop: threading.Event,
           wait_for_key_s: float = 0.0, parent: int | None = None) -> ReplayerStats | None:
    """Do the whole replay; None when stopped by a signal before the end (or never given one)."""
    warm_up_arrow()  # before the key: a warm replayer does it while it waits
    freeze_startup_objects()
    spec = load_spec(client, site, replayer_id, wait_for_key_s, stop, parent)
    if spec is None:
        log.info("replayer %d: no replay came within %g s", replayer_id, wait_for_key_s)
        return None
    try:
        return _replay(client, site, replayer_id, spec, stop)
    except ArchiveError as e:  # one a reader did not name as ours (all of them should)
        error = ReplayerError(str(e))
    except ReplayerError as e:
        error = e
    report_failure(client, spec, f"replayer {replayer_id} of {spec.source}: {error}")
    raise error


def report_failure(client, spec: ReplayerAssignment, message: str) -> None:
    """Put the replayer's one-line error into each replay it serves, unless one is there already:
    the client prints it and exits at once, and the supervisor keeps this first error when it sees
    the replayer exit."""
    from confserver.errors import ConfError
    for c in spec.channels:
        key = keyspace.replay_key(c.channel)
        try:
            entry = client.get_or_none(key)
            if entry is None or error_of(entry.value):
                continue
            client.update(key, with_error(entry.value, message), version=entry.version)
        except ConfError as e:  # gone or changed meanwhile: the supervisor reports the exit anyway
            log.warning("replayer %d: cannot set the error of %s: %s", spec.id, key, e)


def _replay(client, site: str, replayer_id: int, spec: ReplayerAssignment,
            stop: threading.Event) -> ReplayerStats | None:
    function = load_function(client, spec.source)
    try:
        counters = CountersFile.open(paths.counters_path())
    except CountersFileError as e:
        raise ReplayerError(str(e)) from None
    readers = open_readers(spec, counters)
    stats_key = keyspace.replayer_stats_key(site, replayer_id)
    bytes_counter = counters.allocate(REPLAYER_BYTES_READ_TYPE_ID, f"replayer {replayer_id} bytes read",
                                      registration_id=replayer_id)
    # Not freed at exit: the figure stays readable by `ramen stat` (and reclaimed once the file fills).
    candidate = in_place_candidate(spec, readers)
    publication, aligned = open_output(Path(spec.log), counters, candidate)
    replayer = Replayer(spec, function.schema, function.event_time, readers, publication, bytes_counter)
    if aligned:
        replayer.attach_in_place(candidate, spec.archive_dir)
    try:
        wait_for_reader(publication, stop, spec.readers)
        idle = BackoffIdleStrategy(max_spins=IDLE_MAX_SPINS, max_yields=IDLE_MAX_YIELDS,
                                   max_park_s=IDLE_MAX_PARK_S)
        next_stats_s = time.monotonic() + STATS_INTERVAL_S
        while not stop.is_set() and not replayer.done:
            idle.idle(replayer.do_work())
            if time.monotonic() >= next_stats_s:
                client.set(stats_key, replayer.stats.to_value())
                next_stats_s = time.monotonic() + STATS_INTERVAL_S
        client.set(stats_key, replayer.stats.to_value())
        if not replayer.done:
            return None
        log.info("replayer %d: %s", replayer_id, replayer.stats.to_value())
        return replayer.stats
    finally:
        replayer.close()
        publication.close(end_of_stream=replayer.done)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.replayer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", default=keyspace.default_site())
    parser.add_argument("--id", type=int, required=True, help="the replayer id (its key under sites/<site>/replayers)")
    parser.add_argument("--wait-for-key", type=float, default=0.0, metavar="S",
                        help="start warm: wait up to S seconds for the key (then exit 0 if none came)")
    parser.add_argument("--parent", type=int, metavar="PID",
                        help="a warm replayer exits once this process is no longer its parent (its supervisor died)")
    parser.add_argument("--debug", action="store_true", help="tracebacks and debug logs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    retain_freed_memory()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    import confserver
    from confserver.errors import ConfError
    try:
        client = confserver.connect(None, identity=CONFSERVER_IDENTITY,
                                    connect_timeout_s=confserver.SERVICE_CONNECT_TIMEOUT_S)
    except (ConfError, OSError) as e:
        print(f"ramen: replayer {args.id}: cannot reach the confserver: {e}", file=sys.stderr)
        return EXIT_ERROR
    try:
        replay(client, args.site, args.id, stop, args.wait_for_key, args.parent)
    except ReplayerError as e:
        print(f"ramen: replayer {args.id}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except (ConfError, OSError, ValueError, zlib.error) as e:
        if args.debug:
            raise
        print(f"ramen: replayer {args.id}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

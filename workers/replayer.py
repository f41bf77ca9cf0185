"""The replayer: reads one function's archive once and serves every replay channel merged onto it
(docs/runtime.md, "sites/<site>/replayers/<id>"). This module is its agent (split, tag, filter,
offer); the process around it (key, readers, log, stats, errors) is workers/replayer_process.py.

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
event-time column), and re-encoded in messages that fit the log. Channels of one range are split
as one, under the first one's tag (ChannelRange.tag): their rows are written once. At the end each
channel gets one END_OF_REPLAY whose source is the replayer id, the stats go to
`…/replayers/<id>/stats`, and the process exits 0.

With one tag (one channel, or channels of one range), the first recording's range is replayed in
place (`Replayer.attach_in_place`): the log is created lined up with the recording, a ReplaySession
reads the segments straight into it, and each block is tagged, padded and filtered where it lies
before it is committed: one copy of the archive's bytes instead of two (the replayer's CPU for an
hour of traffic: 0.15-0.20 s -> 0.11-0.15 s). Otherwise the archive is read a chunk at a time by a RecordingReader
(ramen.archive.reader), which checks every frame and carries a message cut by a chunk's end over to
the next. Either way every byte of the range is consumed exactly once: the `replayer <id> bytes
read` counter ends at the sum of the ranges' lengths. Each recording's descriptor must be sound
(its checksum too): damage is an error naming the recording, the file and the offset, never a
replay that hangs or comes back short.

Run it as `python -m workers.replayer --site SITE --id ID` (see replayer_process.py).
"""

from __future__ import annotations

import collections
import logging
import os
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from ramen import message as msg
from ramen.archive.reader import (RecordingReader, first_payload, frame_parts, group_messages, joined, joined_from,
                                  pad, reassemble, write_messages)
from ramen.archive.replay import FAILED, REPLAY_BUFFER_LENGTH, ReplaySession
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.replay.contract import ChannelRange, ReplayerAssignment
from ramen.replay.contract import ReplayerStats as ReplayerStatsValue
from ramen.transport import frame
from ramen.transport.frame_walk import walk
from ramen.transport.logbuffer import compute_max_message_length
from ramen.transport.publication import ExclusivePublication
from ramen.transport.status import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED
from ramen.tuples import encode_tuples, end_of_replay, tuple_count
from workers.served import ServedChannel

log = logging.getLogger(__name__)

SUBSCRIBER_WAIT_TIMEOUT_S = 30.0
"""How long the replayer waits for a reader of its log (before its first write, and whenever the
reader goes away) before it gives up with an error."""
SOURCE_MASK = 0xFFFFFFFF
"""The message header's source field is a u32: the low 32 bits of the replayer id."""

_SOURCE_FIELDS = struct.Struct("<II")  # channel, source: adjacent in the ramen message header
_FIRST_CHANNEL_OFFSET = frame.HEADER_LENGTH + msg.CHANNEL_OFFSET  # in a recorded message's first frame


class ReplayerError(Exception):
    """Why a replayer cannot go on, as the one line it prints."""


# -- the replayer agent ----------------------------------------------------------------------------


@dataclass
class ReplayerStats:
    """Counted as the replayer goes; written as the contract's ReplayerStats."""
    bytes_read: int = 0
    messages: int = 0
    rows_out: int = 0
    channels: dict[int, int] = field(default_factory=dict)
    done: bool = False
    rollups: int = 0

    def to_value(self) -> dict:
        return ReplayerStatsValue(self.bytes_read, self.messages, self.rows_out, dict(self.channels),
                                  self.done, self.rollups).to_value()


def tags_of(spec: ReplayerAssignment) -> list[tuple[ChannelRange, tuple[int, ...]]]:
    """Per tag (ChannelRange.tag), its range and the channels whose rows it carries: the log holds
    the rows of channels of one range once, tagged with the first of them. Channels the replayer
    serves itself are not on the log."""
    members: dict[int, list[int]] = {}
    for c in spec.channels:
        if not c.served:
            members.setdefault(c.tagged, []).append(c.channel)
    ranges = {c.channel: c for c in spec.channels}
    return [(ranges[tag], tuple(channels)) for tag, channels in members.items()]


class Replayer:
    """An agent: each do_work offers what is pending, or reads and splits one chunk of the archive."""

    def __init__(self, spec: ReplayerAssignment, schema: pa.Schema, event_time: str, readers: list[RecordingReader],
                 publication: ExclusivePublication | None, bytes_counter=None, clock: Clock = SYSTEM_CLOCK,
                 served: Sequence[ServedChannel] = (), on_served: Callable[[ServedChannel], None] | None = None,
                 rollups_counter=None) -> None:
        """`publication`: the log, None when every channel is `served` (the channels this replayer
        is the target of, workers/served.py); `on_served(channel)` once one of those has ended."""
        self.spec = spec
        self._clock = clock
        self.schema = schema
        self.event_time = event_time
        self.readers = collections.deque(readers)
        self.publication = publication
        self.bytes_counter = bytes_counter
        self.rollups_counter = rollups_counter
        self.source = spec.id & SOURCE_MASK
        self.stats = ReplayerStats(channels={c.channel: 0 for c in spec.channels})
        self.tags = tags_of(spec)
        """The ranges to split messages by, one per tag, and the channels each one's rows count for."""
        self.served = list(served)
        self._on_served = on_served
        self._serving = list(self.served)
        """Those not ended yet."""
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
        For one tag only (channels of one range): a message has room for one channel's tag."""
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
        work = self._flush_served() if self._serving else 0
        if self._outbox:
            return self._offer() + work
        if self.in_place is not None:
            return self._replay_in_place() + work
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
            return (1 if messages else 0) + work
        if not self._ended:
            self._ended = True
            for c in self.spec.channels:
                if not c.served:
                    self._outbox.append(end_of_replay(c.channel, self.source))
            for served in self.served:
                served.finish()
            return 1
        if self._serving:
            return work
        self.done = self.stats.done = True
        return 1

    def _flush_served(self) -> int:
        work = 0
        for served in list(self._serving):
            work += served.flush()
            if served.ended:
                self._serving.remove(served)
                if self._on_served is not None:
                    self._on_served(served)
                work += 1
        return work

    def close(self) -> None:
        for reader in self.readers:
            reader.close()
        self.readers.clear()
        for served in self.served:
            served.close()
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
        c, members = self.tags[0]
        frames = walk(window, 0, length, term_offset=position & (self.publication.term_length - 1),
                      first_length=first_length)
        starts, ends, lengths, types, flags = frames.columns()
        bounds, _, _ = group_messages(starts, ends, types, flags, position, self._in_place_error)
        for first, last in bounds:
            start, end = starts[first], ends[last]
            parts = list(zip(starts[first:last + 1], lengths[first:last + 1]))
            head = window[start + frame.HEADER_LENGTH:start + lengths[first]]
            taggable = len(head) >= msg.HEADER_LENGTH  # else a first fragment too short for the header (tiny MTUs)
            header = msg.decode_header(head if taggable else joined(window, parts))
            if header is None or header.kind != msg.KIND_TUPLES or header.min_event_time_us == msg.NO_EVENT_TIME:
                first_length = self._set_length(window, start, pad(window, start, end), first_length)
                continue
            self.stats.messages += 1
            batch = self._serve(window, parts, head, header) if self.served else None
            low, high = header.min_event_time_us, header.max_event_time_us
            if high < c.since_us or low >= c.until_us:
                first_length = self._set_length(window, start, pad(window, start, end), first_length)
                continue
            if c.since_us <= low and high < c.until_us and taggable:
                _SOURCE_FIELDS.pack_into(window, start + _FIRST_CHANNEL_OFFSET, c.channel, self.source)
                rows = tuple_count(head) if batch is None else batch.num_rows
                if rows is None:
                    rows = self._decode(joined(window, parts)).num_rows
            else:
                part = self._filter(batch if batch is not None else self._decode(joined(window, parts)), c)
                rows = part.num_rows
                if rows == 0:
                    first_length = self._set_length(window, start, pad(window, start, end), first_length)
                    continue
                messages = self._encode(part, c.channel)
                written = write_messages(window, start, end, messages, max_payload=self.publication.max_payload_length,
                                         term_offset=(position + start) & (self.publication.term_length - 1),
                                         session_id=self.publication.session_id,
                                         stream_id=self.publication.stream_id,
                                         term_id=frame.INT32.unpack_from(window, start + frame.TERM_ID_OFFSET)[0])
                if written is None:  # fewer rows of the same columns, yet longer: they follow the block
                    log.warning("replayer %d: a filtered message outgrew its place; it follows its block", self.spec.id)
                    self._outbox.extend(messages)
                    written = pad(window, start, end)
                first_length = self._set_length(window, start, written, first_length)
            self._count(rows, members)
        return first_length

    def _in_place_error(self, offset: int, problem: str) -> ReplayerError:
        session = self.in_place
        position = session.position + offset
        return ReplayerError(f"recording {session.descriptor.recording_id}: {session.where(position)} (position "
                             f"{position}): {problem}")

    @staticmethod
    def _set_length(window: memoryview, at: int, frame_length: int, first_length: int) -> int:
        """Store a frame's length word, but the block's first, which the session stores last."""
        if at == 0:
            return frame_length
        frame.INT32.pack_into(window, at, frame_length)
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
            now = self._clock.seconds()
            if self._not_connected_since is None:
                self._not_connected_since = now
            elif now - self._not_connected_since > SUBSCRIBER_WAIT_TIMEOUT_S:
                if self.spec.sent_to is not None:
                    raise ReplayerError(f"site {self.spec.sent_to} stopped receiving {self.publication.log.path} "
                                        f"for {SUBSCRIBER_WAIT_TIMEOUT_S:g} s (is a site's netd down?)")
                raise ReplayerError(f"no reader of {self.publication.log.path} for {SUBSCRIBER_WAIT_TIMEOUT_S:g} s")
            return 0
        raise ReplayerError(f"cannot write to {self.publication.log.path} (status {result})")

    def _split(self, frames: memoryview) -> None:
        """Queue, for each channel whose range meets the message, the rows of the message inside it."""
        first = first_payload(frames)
        forward = len(first) >= msg.HEADER_LENGTH  # else a first fragment too short for the header (tiny MTUs)
        if not forward:
            first = reassemble(frames)
        header = msg.decode_header(first)
        if header is None or header.kind != msg.KIND_TUPLES or header.min_event_time_us == msg.NO_EVENT_TIME:
            return
        self.stats.messages += 1
        low, high = header.min_event_time_us, header.max_event_time_us
        batch = self._serve(frames, frame_parts(frames), first, header) if self.served else None
        for c, members in self.tags:
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
            self._count(rows, members)

    def _serve(self, window, parts: list[tuple[int, int]], head, header: msg.MessageHeader) -> pa.RecordBatch | None:
        """A TUPLES message (its frames at `parts` of `window`, `head` its first payload or the
        whole message) for each channel this replayer serves whose range it meets: a message inside
        the range whole by its rollup (only the rollup copied out of the frames), else its rows
        inside the range. Returns its rows when it had to decode them, for the log's channels."""
        low, high = header.min_event_time_us, header.max_event_time_us
        batch = tail = None
        for served in self.served:
            c = served.spec
            if high < c.since_us or low >= c.until_us:
                continue
            whole = c.since_us <= low and high < c.until_us
            if whole and header.rollup_offset and served.takes_rollups and (rows := tuple_count(head)) is not None:
                if tail is None:
                    tail = joined_from(window, parts, header.rollup_offset)
                if served.add_rollup(tail):
                    self._count(rows, (c.channel,))
                    self.stats.rollups += 1
                    if self.rollups_counter is not None:
                        self.rollups_counter.add(1)
                    continue
            if batch is None:
                batch = self._decode(joined(window, parts))
            part = batch if whole else self._filter(batch, c)
            if part.num_rows:
                served.add_rows(part)
                self._count(part.num_rows, (c.channel,))
        return batch

    def _count(self, rows: int, members: tuple[int, ...]) -> None:
        """Rows written once under a tag, for each channel it carries."""
        self.stats.rows_out += rows * len(members)
        for channel in members:
            self.stats.channels[channel] += rows

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


if __name__ == "__main__":  # python -m workers.replayer: the process, run by the supervisor
    from workers.replayer_process import main
    sys.exit(main())

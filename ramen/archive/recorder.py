"""The recorder: copies one publication's log into a recording (Aeron's RecordingSession).

An agent over a *tethered* image, so the writer waits for it instead of dropping it: recording
never loses a message, back pressure stops the writer. Each duty cycle takes a block of committed
frames, appends it to the segment files, indexes the event times of the ramen messages that
begin in it, and moves the recording-position counter that live replays follow. The catalog gets
the start when recording begins and the stop when it ends (end of stream, or close); after a
crash, the catalog refresh finds the stop by walking the last segment.

A recorder may also go on with an earlier recording of the same log from its stop position
(Aeron's extendRecording): when its recorder was killed, or stopped with the tether kept, the log
held its writer back (its tether's hold) and still holds every frame from there
(continued_recording says when), so the recording goes on with nothing missing.
"""

from __future__ import annotations

import logging
import os
import struct

from ramen import message
from ramen.archive.catalog import NULL_POSITION, NULL_TIMESTAMP, Catalog, RecordingDescriptor
from ramen.archive.checksum import Checksum
from ramen.archive.gaps import append_gap, gaps_path
from ramen.archive.segment import SegmentWriter, segment_file_base_position, segment_file_name
from ramen.archive.time_index import TimeIndexWriter, index_path
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.transport import frame
from ramen.transport import counters as ctr
from ramen.transport.counters import RECORDING_POSITION_TYPE_ID, CountersFile
from ramen.transport.defaults import TETHER_HOLD_S
from ramen.transport.frame_walk import walk
from ramen.transport.image import Image
from ramen.transport.logbuffer import LogBuffer

log = logging.getLogger(__name__)

RECORDING_KEY = struct.Struct("<qi")  # recording id, session id
BLOCK_LENGTH_LIMIT = 1024 * 1024
"""Bytes taken from the log per duty cycle."""
INDEX_FLUSH_INTERVAL_S = 0.1
"""How often new index entries are written out, so replays of a live recording can seek to them."""


class Recorder:
    """Records one log buffer into the archive until its stream ends or the recorder is closed."""

    def __init__(self, catalog: Catalog, log_buffer: LogBuffer, counters: CountersFile, *,
                 segment_length: int, checksum: Checksum | None = None, channel: str = "",
                 source_identity: str = "", join_position: int | None = None,
                 index_event_time: bool = True, tether_hold_s: float = TETHER_HOLD_S,
                 extend: RecordingDescriptor | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        """`extend`: an earlier recording of this log to go on with from its stop position (see
        continued_recording); else a new recording starts at `join_position` (default: where the
        writer is). The recording's original channel is `channel` with the log's id, which says
        later which log a recording came from. `clock`: of the index flushes and the recording's
        timestamps."""
        self.catalog = catalog
        self._clock = clock
        self.archive_dir = catalog.path.parent
        self.log = log_buffer
        if extend is not None:
            join_position = extend.stop_position
        self.image = Image(log_buffer, counters, join_position=join_position, tethered=True,
                           tether_hold_s=tether_hold_s, name=f"recorder {log_buffer.path.name}")
        self.image.take_over_dead_tethers()
        join_position = self.image.position
        if extend is None:
            self.recording_id = catalog.add_recording(
                start_position=join_position, start_timestamp=clock.epoch_us() // 1000,
                initial_term_id=log_buffer.initial_term_id, segment_file_length=segment_length,
                term_buffer_length=log_buffer.term_length, mtu_length=log_buffer.mtu_length,
                session_id=log_buffer.session_id, stream_id=log_buffer.stream_id,
                stripped_channel=channel, original_channel=channel_of_log(channel, log_buffer),
                source_identity=source_identity)
            start_position = join_position
        else:
            self.recording_id = extend.recording_id
            start_position = extend.start_position
            segment_length = extend.segment_file_length
            catalog.recording_stopped(self.recording_id, NULL_POSITION, NULL_TIMESTAMP)  # active again
            _clear_segment_after(self.archive_dir, extend, join_position)
        self.writer = SegmentWriter(self.archive_dir, self.recording_id, start_position,
                                    log_buffer.term_length, segment_length, checksum=checksum,
                                    position=join_position)
        self.index = TimeIndexWriter(index_path(self.archive_dir, self.recording_id), self.recording_id,
                                     descriptor=extend) if index_event_time else None
        key = RECORDING_KEY.pack(self.recording_id, log_buffer.session_id)
        # A rec-pos counter a killed recorder left: a live replay following it would wait for ever.
        counters.free_orphans(RECORDING_POSITION_TYPE_ID, self.recording_id)
        self.position_counter = counters.allocate(
            RECORDING_POSITION_TYPE_ID, f"rec-pos: {self.recording_id} {log_buffer.session_id} "
            f"{log_buffer.stream_id} {channel or log_buffer.path.name}", key=key, registration_id=self.recording_id)
        self.position_counter.set(join_position)
        self._next_index_flush = 0.0
        self._stopped = False
        log.info("recording %d of %s %s position %d", self.recording_id, log_buffer.path,
                 "goes on from" if extend is not None else "from", join_position)

    @property
    def position(self) -> int:
        return self.image.position

    @property
    def is_stopped(self) -> bool:
        return self._stopped

    def do_work(self) -> int:
        if self._stopped:
            return 0
        consumed = self.image.block_poll(self._on_block, BLOCK_LENGTH_LIMIT)
        if consumed:
            self.position_counter.set(self.image.position)
        now = self._clock.seconds()
        if self.index is not None and now >= self._next_index_flush:
            self.index.flush()
            self._next_index_flush = now + INDEX_FLUSH_INTERVAL_S
        if not consumed and self.image.is_end_of_stream:
            self.close()
        return consumed

    def _on_block(self, term, offset: int, length: int, session_id: int, term_id: int) -> None:
        position = self.image.position  # the block starts where the image stands
        self.writer.on_block(term, offset, length, session_id, term_id)
        if self.index is not None:
            self._index_block(term, offset, length, position)

    def _index_block(self, term, offset: int, length: int, position: int) -> None:
        """Index every ramen message that begins in the block, by its header's event-time bounds."""
        frames = walk(term, offset, offset + length)
        first = (frames.types == frame.HDR_TYPE_DATA) & ((frames.flags & frame.BEGIN_FLAG) != 0) & \
            (frames.lengths >= frame.HEADER_LENGTH + message.HEADER_LENGTH)
        index = self.index
        for frame_offset in frames.starts[first].tolist():
            bounds = message.event_time_bounds(term, frame_offset + frame.HEADER_LENGTH)
            if bounds is not None:
                index.append(position + (frame_offset - offset), bounds[0], bounds[1])
                if term[frame_offset + frame.HEADER_LENGTH + message.KIND_OFFSET] == message.KIND_GAP:
                    append_gap(gaps_path(self.archive_dir, self.recording_id), bounds[0], bounds[1] + 1)

    def close(self, *, keep_tether: bool = False) -> None:
        """Stop recording: the catalog gets the stop position; the tethered image lets the writer
        go, unless `keep_tether`: then the writer waits for a successor to go on with this
        recording from here, for the tether's hold (a recorder that stops while its writer runs)."""
        if self._stopped:
            return
        self._stopped = True
        stop = self.image.position
        self.writer.close()
        if self.index is not None:
            self.index.close()
        self.catalog.recording_stopped(self.recording_id, stop, self._clock.epoch_us() // 1000)
        self.position_counter.set(stop)
        self.position_counter.close()
        self.image.close(keep_tether=keep_tether)
        log.info("recording %d stopped at position %d%s", self.recording_id, stop,
                 ", its writer held for a successor" if keep_tether else "")


LOG_ID_PARAMETER = "log-id"
"""In a recording's original channel: the correlation id of the log it records (a log file
created anew has another)."""


def channel_of_log(channel: str, log_buffer: LogBuffer) -> str:
    """The original channel of a recording of this log: `ramen:net/traffic?log-id=123`."""
    return f"{channel}{'&' if '?' in channel else '?'}{LOG_ID_PARAMETER}={log_buffer.correlation_id}"


def log_id_of(original_channel: str) -> int | None:
    """The correlation id of the log a recording came from, None if its channel does not say."""
    _, _, query = original_channel.partition("?")
    for parameter in query.split("&"):
        name, _, value = parameter.partition("=")
        if name == LOG_ID_PARAMETER and value.lstrip("-").isdigit():
            return int(value)
    return None


def continued_recording(descriptor: RecordingDescriptor | None, log_buffer: LogBuffer) -> RecordingDescriptor | None:
    """The descriptor, if a recorder of this log can go on with it: it recorded this very log
    (same log id, session, stream, terms), it stopped, and the log still holds every frame from its
    stop position on. A log keeps the two terms before its tail as written (publication.py), and
    more while a tether it had held the writer back; anything older may be cleaned."""
    if descriptor is None or descriptor.stop_position == NULL_POSITION or \
            log_id_of(descriptor.original_channel) != log_buffer.correlation_id:
        return None
    if (descriptor.session_id, descriptor.stream_id, descriptor.initial_term_id, descriptor.term_buffer_length,
            descriptor.mtu_length) != (log_buffer.session_id, log_buffer.stream_id, log_buffer.initial_term_id,
                                       log_buffer.term_length, log_buffer.mtu_length):
        return None
    return descriptor if oldest_kept_position(log_buffer) <= descriptor.stop_position \
        <= log_buffer.producer_position() else None


def oldest_kept_position(log_buffer: LogBuffer) -> int:
    """The oldest position from which a log surely holds every frame up to its tail: the start of
    the term before the active one (never cleaned, publication.CLEAN_LAG_TERMS)."""
    return max(0, log_buffer.active_term_count - 1) << log_buffer.position_bits_to_shift


def _clear_segment_after(archive_dir, descriptor: RecordingDescriptor, position: int) -> None:
    """Zero the segment file holding `position` from there on: a torn frame the killed recorder
    left past its last whole one must never read as part of the recording."""
    base = segment_file_base_position(descriptor.start_position, position, descriptor.term_buffer_length,
                                      descriptor.segment_file_length)
    path = archive_dir / segment_file_name(descriptor.recording_id, base)
    if path.exists():
        os.truncate(path, position - base)  # down, then up again: the rest reads as zeros (sparse)
        os.truncate(path, descriptor.segment_file_length)



def recording_position(counters: CountersFile, recording_id: int):
    """A callable giving an active recording's live position, or NULL_POSITION once it stopped:
    what a replay that follows the recording polls."""
    ids = counters.find(RECORDING_POSITION_TYPE_ID, recording_id)
    if not ids:
        return lambda: NULL_POSITION
    counter_id = ids[0]

    def position() -> int:
        if counters.state(counter_id) != ctr.RECORD_ALLOCATED or \
                counters.type_id(counter_id) != RECORDING_POSITION_TYPE_ID or \
                counters.get(counter_id, ctr.REGISTRATION_ID_OFFSET) != recording_id:
            return NULL_POSITION  # stopped (its slot may hold another counter by now)
        return counters.get(counter_id)
    return position

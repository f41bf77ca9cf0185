"""The recorder: copies one publication's log into a recording (Aeron's RecordingSession).

An agent over a *tethered* image, so the writer waits for it instead of dropping it: recording
never loses a message, back pressure stops the writer. Each duty cycle takes a block of committed
frames, appends it to the segment files, indexes the event times of the ramen messages that
begin in it, and moves the recording-position counter that live replays follow. The catalog gets
the start when recording begins and the stop when it ends (end of stream, or close); after a
crash, the catalog refresh finds the stop by walking the last segment.
"""

from __future__ import annotations

import logging
import struct
import time

from ramen import message
from ramen.archive.catalog import NULL_POSITION, Catalog, epoch_ms
from ramen.archive.checksum import Checksum
from ramen.archive.segment import SegmentWriter
from ramen.archive.time_index import TimeIndexWriter, index_path
from ramen.transport import frame
from ramen.transport import counters as ctr
from ramen.transport.counters import CountersFile
from ramen.transport.image import Image
from ramen.transport.logbuffer import LogBuffer

log = logging.getLogger(__name__)

RECORDING_POSITION_TYPE_ID = 100  # Aeron's archive recording-position counter
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
                 index_event_time: bool = True) -> None:
        self.catalog = catalog
        self.archive_dir = catalog.path.parent
        self.log = log_buffer
        self.image = Image(log_buffer, counters, join_position=join_position, tethered=True,
                           name=f"recorder {log_buffer.path.name}")
        start_position = self.image.position
        self.recording_id = catalog.add_recording(
            start_position=start_position, start_timestamp=epoch_ms(),
            initial_term_id=log_buffer.initial_term_id, segment_file_length=segment_length,
            term_buffer_length=log_buffer.term_length, mtu_length=log_buffer.mtu_length,
            session_id=log_buffer.session_id, stream_id=log_buffer.stream_id,
            stripped_channel=channel, original_channel=channel, source_identity=source_identity)
        self.writer = SegmentWriter(self.archive_dir, self.recording_id, start_position,
                                    log_buffer.term_length, segment_length, checksum=checksum)
        self.index = TimeIndexWriter(index_path(self.archive_dir, self.recording_id), self.recording_id) \
            if index_event_time else None
        key = RECORDING_KEY.pack(self.recording_id, log_buffer.session_id)
        self.position_counter = counters.allocate(
            RECORDING_POSITION_TYPE_ID, f"rec-pos: {self.recording_id} {log_buffer.session_id} "
            f"{log_buffer.stream_id} {channel or log_buffer.path.name}", key=key, registration_id=self.recording_id)
        self.position_counter.set(start_position)
        self._next_index_flush = 0.0
        self._stopped = False
        log.info("recording %d of %s from position %d", self.recording_id, log_buffer.path, start_position)

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
        now = time.monotonic()
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
        end = offset + length
        frame_offset = offset
        index = self.index
        while frame_offset < end:
            frame_length = int.from_bytes(term[frame_offset:frame_offset + 4], "little", signed=True)
            flags = term[frame_offset + frame.FLAGS_OFFSET]
            is_data = term[frame_offset + frame.TYPE_OFFSET] == frame.HDR_TYPE_DATA
            if is_data and flags & frame.BEGIN_FLAG:
                bounds = message.event_time_bounds(term, frame_offset + frame.HEADER_LENGTH) \
                    if frame_length >= frame.HEADER_LENGTH + message.HEADER_LENGTH else None
                if bounds is not None:
                    index.append(position + (frame_offset - offset), bounds[0], bounds[1])
            frame_offset += frame.align(frame_length)

    def close(self) -> None:
        """Stop recording: the catalog gets the stop position; the tethered image lets the writer go."""
        if self._stopped:
            return
        self._stopped = True
        stop = self.image.position
        self.writer.close()
        if self.index is not None:
            self.index.close()
        self.catalog.recording_stopped(self.recording_id, stop, epoch_ms())
        self.position_counter.set(stop)
        self.position_counter.close()
        self.image.close()
        log.info("recording %d stopped at position %d", self.recording_id, stop)



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

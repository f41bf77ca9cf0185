"""`archive.catalog`: the list of an archive's recordings, byte for byte as Aeron Archive keeps it.

Layout (little endian; SBE schema 101 of aeron-archive-codecs.xml, io.aeron.archive.Catalog):

    CatalogHeader, 32 bytes at offset 0:
        version i32 @0 (SemanticVersion 3.1.0 = 0x030100), length i32 @4 (= 32),
        nextRecordingId i64 @8, alignment i32 @16 (64 for new catalogs), reserved to @31.
    Then, from offset 32, one entry per recording, each `alignment`-aligned:
        RecordingDescriptorHeader, 32 bytes:
            length i32 @0 (of the descriptor that follows, alignment padding included),
            state i32 @4 (INVALID 0, VALID 1, DELETED 2), checksum i32 @8, reserved to @31.
        RecordingDescriptor: an 80-byte block (offsets below), then strippedChannel,
            originalChannel, sourceIdentity, each a u32 length and that many ASCII bytes; zeros up to
            the entry's aligned end.

The descriptor checksum (when the archive has one) covers the `length` bytes after the 32-byte
header: the whole descriptor with its alignment padding, and nothing of the header (so a state
change leaves it valid). An entry whose length is <= 0 ends the list.

Updates are plain stores into a shared mapping of the file, which the OS keeps if the process is
killed; flush() (or sync=True) makes them durable against power loss too. A new entry's length is
stored last, so a reader (or a restart) never sees half an entry.

ramen finds an archive's checksum algorithm from each descriptor's stored checksum (the archiver
uses one algorithm for frames and descriptors): an update keeps the algorithm the descriptor was
made with (none stays none), whatever the catalog was opened with, and `descriptor_checksum`
names a descriptor whose checksum matches no algorithm as damaged. All but one: a checksum made
before the recording's stop position and time were written (over them as NULL, as while it
recorded) is *stale*, not damage: real Aeron, restarted after an unclean stop, refreshes the
catalog (Catalog.refreshAndFixDescriptor) and writes them without updating the checksum, and
replays the recording as usual. ramen reads it too, with one warning (`checksum_is_stale`;
`ramen archive verify` reports it, as Aeron's CatalogTool verify -checksum does). Problems name
the catalog file and the offset of the entry or field.
"""

from __future__ import annotations

import enum
import logging
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ramen.archive import checksum as checksums
from ramen.archive import segment
from ramen.archive.checksum import Checksum
from ramen.archive.errors import ArchiveError
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.transport.frame import FRAME_ALIGNMENT, align
from ramen.transport.position import max_possible_position

log = logging.getLogger(__name__)
_stale_warned: set[tuple[Path, int]] = set()
"""(catalog, recording) whose stale checksum was warned of: once a process."""

CATALOG_FILE_NAME = "archive.catalog"

# SemanticVersion.compose(major, minor, patch) = major << 16 | minor << 8 | patch.
MAJOR_VERSION, MINOR_VERSION, PATCH_VERSION = 3, 1, 0
SEMANTIC_VERSION = MAJOR_VERSION << 16 | MINOR_VERSION << 8 | PATCH_VERSION

# CatalogHeader
CATALOG_HEADER_LENGTH = 32
VERSION_OFFSET = 0
LENGTH_OFFSET = 4
NEXT_RECORDING_ID_OFFSET = 8
ALIGNMENT_OFFSET = 16
_CATALOG_HEADER = struct.Struct("<iiqi")

# RecordingDescriptorHeader, from the start of an entry
DESCRIPTOR_HEADER_LENGTH = 32
DESCRIPTOR_LENGTH_OFFSET = 0
STATE_OFFSET = 4
CHECKSUM_OFFSET = 8
_DESCRIPTOR_HEADER = struct.Struct("<iii")

# RecordingDescriptor block, from the start of the descriptor (entry offset + 32)
CONTROL_SESSION_ID_OFFSET = 0
CORRELATION_ID_OFFSET = 8
RECORDING_ID_OFFSET = 16
START_TIMESTAMP_OFFSET = 24
STOP_TIMESTAMP_OFFSET = 32
START_POSITION_OFFSET = 40
STOP_POSITION_OFFSET = 48
INITIAL_TERM_ID_OFFSET = 56
SEGMENT_FILE_LENGTH_OFFSET = 60
TERM_BUFFER_LENGTH_OFFSET = 64
MTU_LENGTH_OFFSET = 68
SESSION_ID_OFFSET = 72
STREAM_ID_OFFSET = 76
DESCRIPTOR_BLOCK_LENGTH = 80
_DESCRIPTOR_BLOCK = struct.Struct("<qqqqqqqiiiiii")
VAR_LENGTH_HEADER = 4
"""Bytes of the u32 length in front of each string."""
_U32 = struct.Struct("<I")

DEFAULT_ALIGNMENT = 64
"""Bytes; Aeron aligns entries of new catalogs to a cache line."""
LEGACY_ALIGNMENT = 1024
"""Bytes; catalogs with alignment 0 in their header are older ones, with 1024-byte entries from offset 1024."""
DEFAULT_CAPACITY = 1024 * 1024
"""Bytes; the size of a new catalog file (Aeron's default)."""
MAX_CAPACITY = 2**31 - 1
"""Bytes; Aeron maps the catalog with int offsets."""

NULL_POSITION = -1
NULL_TIMESTAMP = -1


class RecordingState(enum.IntEnum):
    INVALID = 0
    VALID = 1
    DELETED = 2


class CatalogError(ArchiveError):
    """A catalog that cannot be used or a request it cannot satisfy; the message names the file."""


class UnknownRecordingError(CatalogError):
    def __init__(self, path: Path, recording_id: int) -> None:
        super().__init__(f"{path}: no recording {recording_id}")
        self.recording_id = recording_id



def version_string(version: int) -> str:
    return f"{(version >> 16) & 0xFF}.{(version >> 8) & 0xFF}.{version & 0xFF}"


@dataclass(frozen=True)
class CatalogHeader:
    version: int
    length: int
    next_recording_id: int
    alignment: int


@dataclass(frozen=True)
class RecordingDescriptor:
    """One recording as the catalog describes it (a copy: later updates do not show in it)."""

    recording_id: int
    start_timestamp: int
    stop_timestamp: int
    start_position: int
    stop_position: int
    initial_term_id: int
    segment_file_length: int
    term_buffer_length: int
    mtu_length: int
    session_id: int
    stream_id: int
    stripped_channel: str
    original_channel: str
    source_identity: str
    control_session_id: int = 0
    correlation_id: int = 0
    state: RecordingState = RecordingState.VALID
    checksum: int = field(default=0, compare=False)
    """The header's descriptor checksum as stored (0 when the archive keeps none)."""

    def to_aeron_dict(self) -> dict:
        """The fields under Aeron's names (as in its RecordingDescriptor and listRecordings)."""
        return {
            "controlSessionId": self.control_session_id,
            "correlationId": self.correlation_id,
            "recordingId": self.recording_id,
            "startTimestamp": self.start_timestamp,
            "stopTimestamp": self.stop_timestamp,
            "startPosition": self.start_position,
            "stopPosition": self.stop_position,
            "initialTermId": self.initial_term_id,
            "segmentFileLength": self.segment_file_length,
            "termBufferLength": self.term_buffer_length,
            "mtuLength": self.mtu_length,
            "sessionId": self.session_id,
            "streamId": self.stream_id,
            "strippedChannel": self.stripped_channel,
            "originalChannel": self.original_channel,
            "sourceIdentity": self.source_identity,
            "state": self.state.name,
        }


def layout_problem(d: RecordingDescriptor) -> str | None:
    """What makes a descriptor's numbers unusable to read its recording (lengths, positions), or
    None: a damaged descriptor is named before anyone reads segments, or memory, by its numbers."""
    try:
        segment.check_segment_file_length(d.segment_file_length, d.term_buffer_length)
        segment.check_mtu_length(d.mtu_length, d.term_buffer_length)
    except segment.SegmentError as e:
        return str(e)
    start, stop = d.start_position, d.stop_position
    if start < 0 or start & (FRAME_ALIGNMENT - 1):
        return f"start position {start} is not a non-negative multiple of {FRAME_ALIGNMENT}"
    if stop != NULL_POSITION and (stop < start or stop & (FRAME_ALIGNMENT - 1)):
        return f"stop position {stop} is not an aligned position at or after the start position {start}"
    largest = max_possible_position(d.term_buffer_length)
    if max(start, stop) > largest:
        return (f"{'stop' if stop > start else 'start'} position {max(start, stop)} is past the largest position a "
                f"stream of {d.term_buffer_length}-byte terms reaches ({largest})")
    return None


def descriptor_frame_length(stripped_channel: str, original_channel: str, source_identity: str,
                            alignment: int) -> int:
    """Bytes an entry takes in the catalog: header, block and strings, aligned."""
    length = (DESCRIPTOR_HEADER_LENGTH + DESCRIPTOR_BLOCK_LENGTH + 3 * VAR_LENGTH_HEADER
              + len(stripped_channel) + len(original_channel) + len(source_identity))
    return align(length, alignment)


def _ascii(name: str, value: str) -> bytes:
    try:
        return value.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError(f"{name} {value!r} is not ASCII: the catalog stores it as US-ASCII") from None


class Catalog:
    """A mapped `archive.catalog`: read descriptors, add recordings, update them in place.

    Open with Catalog.open (an existing catalog) or Catalog.create (a new one). One process writes a
    catalog (the archiver); others may open it read-only and see its updates.
    """

    def __init__(self, path: Path, fd: int, mapped: mmap.mmap, writable: bool, checksum: Checksum | None,
                 sync: bool, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = path
        self.clock = clock
        """Stamps the recordings' start and stop timestamps that callers do not give."""
        self._fd = fd
        self._mm = mapped
        self.writable = writable
        self.checksum = checksum
        self.sync = sync
        self._i64: memoryview | None = None
        self._map_views()
        try:
            self._load()
        except BaseException:
            self._release_views()
            raise

    def _load(self) -> None:
        path, mapped, writable = self.path, self._mm, self.writable
        version, length, next_id, alignment = _CATALOG_HEADER.unpack_from(mapped, 0)
        if alignment == 0:
            self.alignment = LEGACY_ALIGNMENT
            self.first_entry_offset = LEGACY_ALIGNMENT
        else:
            self.alignment = alignment
            self.first_entry_offset = CATALOG_HEADER_LENGTH
        self._next_recording_id = next_id
        self._offsets: dict[int, int] = {}
        self._end_offset = self.first_entry_offset
        self._scan_entries(self.first_entry_offset)
        last_id = max(self._offsets, default=-1)
        if self._next_recording_id <= last_id:
            # A writer killed between storing an entry and the header's next id: the entries are right.
            log.warning("%s: nextRecordingId %d is not past the last recording %d; using %d",
                        path, self._next_recording_id, last_id, last_id + 1)
            self._next_recording_id = last_id + 1
            if writable:
                struct.pack_into("<q", self._mm, NEXT_RECORDING_ID_OFFSET, self._next_recording_id)

    # -- opening and creating ------------------------------------------------------------------

    @classmethod
    def open(cls, archive_dir: str | os.PathLike, *, writable: bool = False, checksum: Checksum | None = None,
             sync: bool = False, clock: Clock = SYSTEM_CLOCK) -> "Catalog":
        """Map the catalog of an existing archive, after checking that it is one.

        `checksum` is the archive's descriptor checksum: updates then keep each descriptor's checksum.
        """
        archive_dir = Path(archive_dir)
        path = archive_dir / CATALOG_FILE_NAME
        if not archive_dir.is_dir():
            raise CatalogError(f"{archive_dir}: no such archive directory")
        try:
            fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        except FileNotFoundError:
            raise CatalogError(f"{path}: no catalog in this directory (not an archive?)") from None
        except IsADirectoryError:
            raise CatalogError(f"{path}: is a directory, not a catalog file") from None
        except PermissionError:
            raise CatalogError(f"{path}: permission denied (opening it {'to write' if writable else 'to read'})") \
                from None
        try:
            size = os.fstat(fd).st_size
            if size < CATALOG_HEADER_LENGTH:
                raise CatalogError(f"{path}: {size} bytes is too short for a catalog header "
                                   f"({CATALOG_HEADER_LENGTH} bytes; truncated?)")
            _check_header(path, os.pread(fd, CATALOG_HEADER_LENGTH, 0))
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        try:
            return cls(path, fd, mapped, writable, checksum, sync, clock)
        except BaseException:
            mapped.close()
            os.close(fd)
            raise

    @classmethod
    def create(cls, archive_dir: str | os.PathLike, *, capacity: int = DEFAULT_CAPACITY,
               alignment: int = DEFAULT_ALIGNMENT, checksum: Checksum | None = None, sync: bool = False,
               clock: Clock = SYSTEM_CLOCK) -> "Catalog":
        """Create the catalog of a new archive (the directory is created if needed).

        The file appears whole or not at all: it is written under a temporary name and renamed.
        """
        if not CATALOG_HEADER_LENGTH <= capacity <= MAX_CAPACITY:
            raise ValueError(f"catalog capacity {capacity} is outside {CATALOG_HEADER_LENGTH}..{MAX_CAPACITY}")
        if alignment < FRAME_ALIGNMENT or alignment & (alignment - 1):
            raise ValueError(f"catalog alignment {alignment} is not a power of two >= {FRAME_ALIGNMENT}")
        archive_dir = Path(archive_dir)
        archive_dir.mkdir(parents=True, exist_ok=True)
        path = archive_dir / CATALOG_FILE_NAME
        if path.exists():
            raise CatalogError(f"{path}: a catalog already exists")
        tmp = archive_dir / (CATALOG_FILE_NAME + ".tmp")
        with open(tmp, "wb") as f:
            f.truncate(capacity)
            f.write(_CATALOG_HEADER.pack(SEMANTIC_VERSION, CATALOG_HEADER_LENGTH, 0, alignment))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
        _fsync_directory(archive_dir)
        log.info("%s: created (capacity %d bytes, alignment %d)", path, capacity, alignment)
        return cls.open(archive_dir, writable=True, checksum=checksum, sync=sync, clock=clock)

    @classmethod
    def open_or_create(cls, archive_dir: str | os.PathLike, *, checksum: Checksum | None = None,
                       sync: bool = False, clock: Clock = SYSTEM_CLOCK) -> "Catalog":
        if (Path(archive_dir) / CATALOG_FILE_NAME).exists():
            return cls.open(archive_dir, writable=True, checksum=checksum, sync=sync, clock=clock)
        return cls.create(archive_dir, checksum=checksum, sync=sync, clock=clock)

    def epoch_ms(self) -> int:
        """Now, as a recording's timestamps are: ms since the Unix epoch, by the catalog's clock."""
        return self.clock.epoch_us() // 1000

    def close(self) -> None:
        if self._mm is None:
            return
        if self.writable:
            self._mm.flush()
        self._release_views()
        self._mm.close()
        self._mm = None
        os.close(self._fd)

    def __enter__(self) -> "Catalog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def flush(self) -> None:
        """Make every update so far durable (msync)."""
        if self.writable:
            self._mm.flush()

    # -- reading -------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return len(self._mm)

    @property
    def header(self) -> CatalogHeader:
        version, length, next_id, alignment = _CATALOG_HEADER.unpack_from(self._mm, 0)
        return CatalogHeader(version, length, next_id, alignment)

    @property
    def next_recording_id(self) -> int:
        return self._next_recording_id

    def recording_ids(self) -> list[int]:
        """Ids of every entry, whatever its state, in catalog order."""
        self._refresh()
        return list(self._offsets)

    def __contains__(self, recording_id: int) -> bool:
        return self._offset(recording_id, missing_ok=True) is not None

    def __iter__(self) -> Iterator[RecordingDescriptor]:
        return iter(self.descriptors())

    def descriptors(self, *, states: tuple[RecordingState, ...] | None = None) -> list[RecordingDescriptor]:
        """Every entry (or those in `states`), in catalog order."""
        self._refresh()
        found = [self._decode(offset) for offset in self._offsets.values()]
        return found if states is None else [d for d in found if d.state in states]

    def get(self, recording_id: int) -> RecordingDescriptor:
        return self._decode(self._offset(recording_id))

    def find(self, recording_id: int) -> RecordingDescriptor | None:
        offset = self._offset(recording_id, missing_ok=True)
        return None if offset is None else self._decode(offset)

    def stop_position(self, recording_id: int) -> int:
        """The stop position as stored now (NULL_POSITION while recording): a cheap read for tailing."""
        return self._i64[(self._offset(recording_id) + DESCRIPTOR_HEADER_LENGTH + STOP_POSITION_OFFSET) >> 3]

    def start_position(self, recording_id: int) -> int:
        return self._i64[(self._offset(recording_id) + DESCRIPTOR_HEADER_LENGTH + START_POSITION_OFFSET) >> 3]

    def entry_offset(self, recording_id: int) -> int:
        """Where the recording's entry (its RecordingDescriptorHeader) starts in the file."""
        return self._offset(recording_id)

    def where(self, recording_id: int) -> str:
        """`<catalog> entry at offset <o>`: where a recording's descriptor lies, for messages."""
        return f"{self.path} entry at offset {self._offset(recording_id)}"

    def descriptor_checksum(self, recording_id: int) -> Checksum | None:
        """The algorithm the recording's descriptor checksum was made with, so also its frames'
        (None: the recording has no checksums). A stored checksum that no algorithm gives is a
        damaged descriptor: CatalogError naming the entry."""
        stored = self.get(recording_id).checksum
        if stored == 0:
            return None
        offset = self._offset(recording_id)
        algorithm = self._matching_algorithm(offset, stored)
        if algorithm is not None:
            return algorithm
        algorithm = self._matching_algorithm(offset, stored, before_stop=True)
        if algorithm is None:
            raise CatalogError(f"{self.where(recording_id)}: recording {recording_id}'s descriptor checksum {stored} "
                               f"matches none of {', '.join(checksums.NAMES)} over its contents (damaged descriptor)")
        if (self.path, recording_id) not in _stale_warned:
            _stale_warned.add((self.path, recording_id))
            log.warning("%s: recording %d's descriptor checksum %d is stale: it is the %s of the descriptor before "
                        "its stop position and time were written (as real Aeron's catalog refresh after an unclean "
                        "stop leaves it); read as Aeron reads it", self.where(recording_id), recording_id, stored,
                        algorithm.name)
        return algorithm

    def checksum_is_stale(self, recording_id: int) -> bool:
        """Whether the descriptor's checksum was made before its stop position and time were
        written, and not since (see the module's docstring): read as Aeron reads it, and reported
        by verify."""
        stored = self.get(recording_id).checksum
        offset = self._offset(recording_id)
        return stored != 0 and self._matching_algorithm(offset, stored) is None and \
            self._matching_algorithm(offset, stored, before_stop=True) is not None

    def compute_descriptor_checksum(self, recording_id: int, checksum: Checksum) -> int:
        """What `checksum` gives over this entry's descriptor bytes (to compare with the stored one)."""
        offset = self._offset(recording_id)
        length = _DESCRIPTOR_HEADER.unpack_from(self._mm, offset)[0]
        start = offset + DESCRIPTOR_HEADER_LENGTH
        with memoryview(self._mm) as view:
            return checksum.compute(view[start:start + length])

    # -- writing -------------------------------------------------------------------------------

    def add_recording(self, *, start_position: int, initial_term_id: int, segment_file_length: int,
                      term_buffer_length: int, mtu_length: int, session_id: int, stream_id: int,
                      stripped_channel: str, original_channel: str, source_identity: str,
                      start_timestamp: int | None = None, stop_position: int = NULL_POSITION,
                      stop_timestamp: int = NULL_TIMESTAMP, control_session_id: int = 0,
                      correlation_id: int = 0) -> int:
        """Add a VALID recording and return its id (Aeron's addNewRecording). Timestamps are epoch ms."""
        self._check_writable()
        segment.check_segment_file_length(segment_file_length, term_buffer_length)
        if start_position < 0 or start_position & (FRAME_ALIGNMENT - 1):
            raise CatalogError(f"start position {start_position} is not a non-negative multiple of {FRAME_ALIGNMENT}")
        if stop_position != NULL_POSITION and stop_position < start_position:
            raise CatalogError(f"stop position {stop_position} is before the start position {start_position}")
        strings = [_ascii("strippedChannel", stripped_channel), _ascii("originalChannel", original_channel),
                   _ascii("sourceIdentity", source_identity)]
        frame_length = descriptor_frame_length(stripped_channel, original_channel, source_identity, self.alignment)
        offset = self._end_offset
        if offset + frame_length > self.capacity:
            self._grow(offset + frame_length)
        recording_id = self._next_recording_id
        if start_timestamp is None:
            start_timestamp = self.epoch_ms()
        mm = self._mm
        start = offset + DESCRIPTOR_HEADER_LENGTH
        mm[offset:offset + frame_length] = bytes(frame_length)
        _DESCRIPTOR_BLOCK.pack_into(mm, start, control_session_id, correlation_id, recording_id, start_timestamp,
                                    stop_timestamp, start_position, stop_position, initial_term_id,
                                    segment_file_length, term_buffer_length, mtu_length, session_id, stream_id)
        at = start + DESCRIPTOR_BLOCK_LENGTH
        for data in strings:
            _U32.pack_into(mm, at, len(data))
            mm[at + VAR_LENGTH_HEADER:at + VAR_LENGTH_HEADER + len(data)] = data
            at += VAR_LENGTH_HEADER + len(data)
        descriptor_length = frame_length - DESCRIPTOR_HEADER_LENGTH
        struct.pack_into("<i", mm, offset + STATE_OFFSET, RecordingState.VALID)
        struct.pack_into("<i", mm, offset + CHECKSUM_OFFSET, self._checksum_of(start, descriptor_length))
        # The next id first: a crash before the entry's length is stored then only skips an id.
        self._next_recording_id = recording_id + 1
        self._i64[NEXT_RECORDING_ID_OFFSET >> 3] = recording_id + 1
        struct.pack_into("<i", mm, offset + DESCRIPTOR_LENGTH_OFFSET, descriptor_length)
        self._offsets[recording_id] = offset
        self._end_offset = offset + frame_length
        self._after_write()
        log.debug("%s: added recording %d at offset %d", self.path, recording_id, offset)
        return recording_id

    def recording_stopped(self, recording_id: int, stop_position: int, stop_timestamp: int | None = None) -> None:
        """Store where and when a recording stopped (Aeron's recordingStopped)."""
        self._check_writable()
        offset = self._offset(recording_id)
        start = offset + DESCRIPTOR_HEADER_LENGTH
        self._check_stop(recording_id, start, stop_position)
        algorithm = self._algorithm_of(offset)
        self._i64[(start + STOP_TIMESTAMP_OFFSET) >> 3] = self.epoch_ms() if stop_timestamp is None else stop_timestamp
        self._i64[(start + STOP_POSITION_OFFSET) >> 3] = stop_position
        self._update_checksum(offset, algorithm)
        self._after_write()

    def set_stop_position(self, recording_id: int, stop_position: int) -> None:
        """Store a stop position alone (Aeron's stopPosition), e.g. one recovered from the segment files."""
        self._check_writable()
        offset = self._offset(recording_id)
        start = offset + DESCRIPTOR_HEADER_LENGTH
        self._check_stop(recording_id, start, stop_position)
        algorithm = self._algorithm_of(offset)
        self._i64[(start + STOP_POSITION_OFFSET) >> 3] = stop_position
        self._update_checksum(offset, algorithm)
        self._after_write()

    def set_start_position(self, recording_id: int, start_position: int) -> None:
        """Move a recording's start (after its first segments were purged; Aeron's startPosition)."""
        self._check_writable()
        offset = self._offset(recording_id)
        start = offset + DESCRIPTOR_HEADER_LENGTH
        if start_position < 0 or start_position & (FRAME_ALIGNMENT - 1):
            raise CatalogError(f"start position {start_position} is not a non-negative multiple of {FRAME_ALIGNMENT}")
        stop = self._i64[(start + STOP_POSITION_OFFSET) >> 3]
        if stop != NULL_POSITION and start_position > stop:
            raise CatalogError(f"recording {recording_id}: start position {start_position} is past the stop "
                               f"position {stop}")
        algorithm = self._algorithm_of(offset)
        self._i64[(start + START_POSITION_OFFSET) >> 3] = start_position
        self._update_checksum(offset, algorithm)
        self._after_write()

    def change_state(self, recording_id: int, state: RecordingState) -> None:
        """Mark a recording VALID, INVALID or DELETED (the checksum does not cover the state)."""
        self._check_writable()
        offset = self._offset(recording_id)
        struct.pack_into("<i", self._mm, offset + STATE_OFFSET, RecordingState(state))
        self._after_write()

    def refresh_stop_positions(self, *, checksum: Checksum | None = None, on_torn=None) -> list[int]:
        """Give each VALID recording left without a stop position (an unclean shutdown) the position
        its segment files end at, stamped now, as Aeron's catalog does when the archive starts.

        `checksum` is the frame checksum of the archive, to judge a last frame that straddles a page
        (see segment.find_stop_position, which also explains on_torn). Returns the ids it fixed.
        Unlike Aeron's refresh, which leaves it stale, the descriptor checksum is updated too.
        """
        self._check_writable()
        bases = segment.list_segment_files(self.path.parent)
        fixed = []
        for d in self.descriptors(states=(RecordingState.VALID,)):
            if d.stop_position != NULL_POSITION:
                continue
            stop = segment.find_stop_position(self.path.parent, d.recording_id, d.start_position,
                                              d.term_buffer_length, d.segment_file_length, checksum=checksum,
                                              on_torn=on_torn, segment_bases=bases.get(d.recording_id, []))
            self.recording_stopped(d.recording_id, stop)
            log.warning("%s: recording %d had no stop position (unclean shutdown); recovered %d from its segments",
                        self.path, d.recording_id, stop)
            self._catch_up_index(d.recording_id)
            fixed.append(d.recording_id)
        return fixed

    def _catch_up_index(self, recording_id: int) -> None:
        """An unclean shutdown also loses the time index entries not flushed yet (or leaves a torn
        flush): reopening the index validates it and adds what the segments hold past its end."""
        from ramen.archive.time_index import TimeIndexError, TimeIndexWriter, index_path
        path = index_path(self.path.parent, recording_id)
        if not path.exists():
            return
        try:
            TimeIndexWriter(path, recording_id, descriptor=self.get(recording_id)).close()
        except (TimeIndexError, OSError) as e:
            log.warning("%s: cannot bring it up to date with recording %d's segments: %s", path, recording_id, e)

    # -- internals -----------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if not self.writable:
            raise CatalogError(f"{self.path}: opened read-only")

    def _check_stop(self, recording_id: int, start: int, stop_position: int) -> None:
        if stop_position == NULL_POSITION:
            return
        start_position = self._i64[(start + START_POSITION_OFFSET) >> 3]
        if stop_position < start_position or stop_position & (FRAME_ALIGNMENT - 1):
            raise CatalogError(f"recording {recording_id}: stop position {stop_position} is not an aligned position "
                               f"at or after the start position {start_position}")

    def _checksum_of(self, start: int, length: int) -> int:
        if self.checksum is None:
            return 0
        with memoryview(self._mm) as view:
            return self.checksum.compute(view[start:start + length])

    def _algorithm_of(self, offset: int) -> Checksum | None:
        """The algorithm an entry's stored checksum was made with, found before an update changes
        the descriptor (None: no checksum, or one that matches none: left as it is)."""
        stored = _DESCRIPTOR_HEADER.unpack_from(self._mm, offset)[2]
        return None if stored == 0 else self._matching_algorithm(offset, stored)

    def _matching_algorithm(self, offset: int, stored: int, *, before_stop: bool = False) -> Checksum | None:
        """The algorithm whose checksum of the descriptor is `stored`; `before_stop`: of the
        descriptor with its stop position and time NULL, as while it recorded."""
        length = _DESCRIPTOR_HEADER.unpack_from(self._mm, offset)[0]
        start = offset + DESCRIPTOR_HEADER_LENGTH
        candidates = [self.checksum] if self.checksum is not None else []
        candidates += [checksums.get(name) for name in checksums.NAMES if self.checksum is None or
                       name != self.checksum.name]
        descriptor = bytearray(self._mm[start:start + length])
        if before_stop:
            struct.pack_into("<q", descriptor, STOP_POSITION_OFFSET, NULL_POSITION)
            struct.pack_into("<q", descriptor, STOP_TIMESTAMP_OFFSET, NULL_TIMESTAMP)
        for algorithm in candidates:
            if algorithm.compute(descriptor) == stored:
                return algorithm
        return None

    def _update_checksum(self, offset: int, algorithm: Checksum | None) -> None:
        """Recompute an updated descriptor's checksum with the algorithm it had (see _algorithm_of)."""
        if algorithm is not None:
            length = _DESCRIPTOR_HEADER.unpack_from(self._mm, offset)[0]
            with memoryview(self._mm) as view:
                value = algorithm.compute(view[offset + DESCRIPTOR_HEADER_LENGTH:offset + DESCRIPTOR_HEADER_LENGTH
                                               + length])
            struct.pack_into("<i", self._mm, offset + CHECKSUM_OFFSET, value)

    def _after_write(self) -> None:
        if self.sync:
            self._mm.flush()

    def _offset(self, recording_id: int, *, missing_ok: bool = False) -> int | None:
        offset = self._offsets.get(recording_id)
        if offset is None and recording_id >= 0:
            self._refresh()  # another process may have added it since we looked
            offset = self._offsets.get(recording_id)
        if offset is None and not missing_ok:
            raise UnknownRecordingError(self.path, recording_id)
        return offset

    def _refresh(self) -> None:
        """Pick up entries another process appended (and the file growing) since we mapped it."""
        if self.writable or self._mm is None:
            return
        size = os.fstat(self._fd).st_size
        if size > len(self._mm):
            self._release_views()
            self._mm.close()
            self._mm = mmap.mmap(self._fd, size, access=mmap.ACCESS_READ)
            self._map_views()
        self._scan_entries(self._end_offset)
        self._next_recording_id = max(self._next_recording_id,
                                      struct.unpack_from("<q", self._mm, NEXT_RECORDING_ID_OFFSET)[0])

    def _scan_entries(self, offset: int) -> None:
        """Index the entries from offset on, checking each one's layout (Aeron's buildIndex)."""
        mm = self._mm
        capacity = len(mm)
        last_id = max(self._offsets, default=-1)
        while offset + DESCRIPTOR_HEADER_LENGTH <= capacity:
            length, state, _ = _DESCRIPTOR_HEADER.unpack_from(mm, offset)
            if length <= 0:
                break
            frame_length = align(length + DESCRIPTOR_HEADER_LENGTH, self.alignment)
            where = f"{self.path}: entry at offset {offset}"
            if offset + frame_length > capacity:
                raise CatalogError(f"{where} claims {length} bytes, past the end of the file at {capacity} "
                                   f"(truncated or damaged)")
            if length < DESCRIPTOR_BLOCK_LENGTH + 3 * VAR_LENGTH_HEADER:
                raise CatalogError(f"{where} has length {length}, too short for a recording descriptor (damaged)")
            if state not in RecordingState._value2member_map_:
                raise CatalogError(f"{where} has state {state}, not INVALID, VALID or DELETED (damaged)")
            descriptor = self._decode(offset, where)
            if descriptor.recording_id <= last_id:
                raise CatalogError(f"{where} has recording id {descriptor.recording_id}, not after the previous "
                                   f"one ({last_id}) (damaged)")
            last_id = descriptor.recording_id
            self._offsets[last_id] = offset
            offset += frame_length
        self._end_offset = offset

    def _decode(self, offset: int, where: str | None = None) -> RecordingDescriptor:
        mm = self._mm
        length, state, checksum_value = _DESCRIPTOR_HEADER.unpack_from(mm, offset)
        start = offset + DESCRIPTOR_HEADER_LENGTH
        end = start + length
        (control_session_id, correlation_id, recording_id, start_timestamp, stop_timestamp, start_position,
         stop_position, initial_term_id, segment_file_length, term_buffer_length, mtu_length, session_id,
         stream_id) = _DESCRIPTOR_BLOCK.unpack_from(mm, start)
        strings = []
        at = start + DESCRIPTOR_BLOCK_LENGTH
        for name in ("strippedChannel", "originalChannel", "sourceIdentity"):
            if at + VAR_LENGTH_HEADER > end:
                raise CatalogError(f"{where or self.path}: {name} is past the end of the descriptor (damaged)")
            size = _U32.unpack_from(mm, at)[0]
            at += VAR_LENGTH_HEADER
            if at + size > end:
                raise CatalogError(f"{where or self.path}: {name} of {size} bytes runs past the end of the "
                                   f"descriptor (damaged)")
            strings.append(mm[at:at + size].decode("ascii", "replace"))
            at += size
        return RecordingDescriptor(
            recording_id=recording_id, start_timestamp=start_timestamp, stop_timestamp=stop_timestamp,
            start_position=start_position, stop_position=stop_position, initial_term_id=initial_term_id,
            segment_file_length=segment_file_length, term_buffer_length=term_buffer_length, mtu_length=mtu_length,
            session_id=session_id, stream_id=stream_id, stripped_channel=strings[0], original_channel=strings[1],
            source_identity=strings[2], control_session_id=control_session_id, correlation_id=correlation_id,
            state=RecordingState(state), checksum=checksum_value)

    def _grow(self, needed: int) -> None:
        """Make room for `needed` bytes: grow by half again until it fits (Aeron's growCatalog), remap."""
        old = self.capacity
        if needed > MAX_CAPACITY:
            raise CatalogError(f"{self.path}: catalog is full: {needed} bytes needed, at most {MAX_CAPACITY}")
        new = old
        while new < needed:
            new = min(new + (new >> 1), MAX_CAPACITY)
        self._mm.flush()
        self._release_views()
        self._mm.close()
        os.ftruncate(self._fd, new)
        self._mm = mmap.mmap(self._fd, new, access=mmap.ACCESS_WRITE)
        self._map_views()
        log.info("%s: grew from %d to %d bytes", self.path, old, new)

    def _map_views(self) -> None:
        usable = len(self._mm) & ~7
        with memoryview(self._mm) as view:
            # Aligned 8-byte stores and loads, so a reader never sees half a position.
            self._i64 = view[:usable].cast("q")

    def _release_views(self) -> None:
        if self._i64 is not None:
            self._i64.release()
            self._i64 = None


def _check_header(path: Path, header: bytes) -> None:
    version, length, next_id, alignment = _CATALOG_HEADER.unpack_from(header, 0)
    if (version >> 16) != MAJOR_VERSION:
        raise CatalogError(f"{path} offset {VERSION_OFFSET}: not an Aeron Archive catalog of version {MAJOR_VERSION}.x "
                           f"(header version field {version_string(version)}; garbage or another format)")
    if alignment != 0:
        if length != CATALOG_HEADER_LENGTH:
            raise CatalogError(f"{path} offset {LENGTH_OFFSET}: catalog header length {length}, expected "
                               f"{CATALOG_HEADER_LENGTH} (damaged)")
        if alignment < FRAME_ALIGNMENT or alignment & (alignment - 1):
            raise CatalogError(f"{path} offset {ALIGNMENT_OFFSET}: catalog alignment {alignment} is not a power of "
                               f"two >= {FRAME_ALIGNMENT} (damaged)")
    if next_id < 0:
        raise CatalogError(f"{path} offset {NEXT_RECORDING_ID_OFFSET}: nextRecordingId {next_id} is negative (damaged)")


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

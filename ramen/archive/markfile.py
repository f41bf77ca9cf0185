"""`archive-mark.dat`: proof that an archiver is alive in a directory, so a second one stays out.

Layout (little endian; aeron-archive-mark-codecs.xml, schema 100 version 2, ArchiveMarkFile):

    SBE message header, 8 bytes at 0: blockLength u16 (128), templateId u16 (200), schemaId u16 (100),
        version u16 (2).
    MarkFileHeader block, 128 bytes at 8 (offsets below are from the start of the file):
        version i32 @8 (SemanticVersion 3.1.0; 0 while the owner is still initialising),
        activityTimestamp i64 @16 (epoch ms; -1 after a clean shutdown), startTimestamp i64 @24,
        pid i64 @32, controlStreamId i32 @40, localControlStreamId i32 @44, eventsStreamId i32 @48,
        headerLength i32 @52 (8192), errorBufferLength i32 @56, archiveId i64 @64.
    Then, at 136: controlChannel, localControlChannel, eventsChannel, aeronDirectory, each a u32
        length and ASCII bytes.
    The header region is 8192 bytes; an error log of errorBufferLength bytes follows (Aeron's
        default 1 MiB, so the file is 1056768 bytes).

The owner stores the epoch time in activityTimestamp every second. Another process may take the
directory over only when that timestamp is at least 10 s old (Aeron's LIVENESS_TIMEOUT_MS); a clean
shutdown stores -1 so the next start need not wait. Beyond Aeron: when the recorded pid names no
process on this host, the owner is dead and the directory is taken over at once.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from ramen.archive.catalog import MAJOR_VERSION, SEMANTIC_VERSION
from ramen.archive.errors import ArchiveError
from ramen.processes import pid_alive

log = logging.getLogger(__name__)

MARK_FILE_NAME = "archive-mark.dat"

# The mark file carries the archive's SemanticVersion, the catalog's (MAJOR_VERSION, SEMANTIC_VERSION).

MESSAGE_HEADER_LENGTH = 8
BLOCK_LENGTH = 128
TEMPLATE_ID = 200
SCHEMA_ID = 100
SCHEMA_VERSION = 2
_MESSAGE_HEADER = struct.Struct("<HHHH")

VERSION_OFFSET = 8
ACTIVITY_TIMESTAMP_OFFSET = 16
START_TIMESTAMP_OFFSET = 24
PID_OFFSET = 32
CONTROL_STREAM_ID_OFFSET = 40
LOCAL_CONTROL_STREAM_ID_OFFSET = 44
EVENTS_STREAM_ID_OFFSET = 48
HEADER_LENGTH_OFFSET = 52
ERROR_BUFFER_LENGTH_OFFSET = 56
ARCHIVE_ID_OFFSET = 64
VAR_DATA_OFFSET = MESSAGE_HEADER_LENGTH + BLOCK_LENGTH
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")

HEADER_LENGTH = 8 * 1024
"""Bytes of the header region, before the error log."""
DEFAULT_ERROR_BUFFER_LENGTH = 1024 * 1024
"""Bytes; Aeron's default archive error log."""
UPDATE_INTERVAL_MS = 1000
"""How often the owner refreshes its activity timestamp (Aeron's MARK_FILE_UPDATE_INTERVAL_MS)."""
LIVENESS_TIMEOUT_MS = 10 * UPDATE_INTERVAL_MS
"""An activity timestamp younger than this means the owner is alive."""
NULL_VALUE = -1

# Aeron's defaults, for the informational fields of a mark file we write.
DEFAULT_CONTROL_STREAM_ID = 10
DEFAULT_LOCAL_CONTROL_STREAM_ID = 10
DEFAULT_EVENTS_STREAM_ID = 30


class MarkFileError(ArchiveError):
    """The mark file refuses us (another archiver is live) or is unreadable; the message says which."""


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class MarkFileInfo:
    """What a mark file says about its owner."""

    path: Path
    version: int
    activity_timestamp: int
    start_timestamp: int
    pid: int
    archive_id: int

    def age_ms(self, now_ms: int | None = None) -> int:
        return (epoch_ms() if now_ms is None else now_ms) - self.activity_timestamp

    @property
    def is_ready(self) -> bool:
        """The owner has finished starting (its version is stored)."""
        return self.version != 0

    def is_active(self, now_ms: int | None = None) -> bool:
        """Alive by Aeron's rule: activity less than LIVENESS_TIMEOUT_MS ago (or in the future)."""
        return self.activity_timestamp != NULL_VALUE and self.age_ms(now_ms) < LIVENESS_TIMEOUT_MS


def _header_offset(data) -> int:
    """Where the MarkFileHeader fields start: after an SBE message header, or at 0 in old files."""
    block_length, template_id, schema_id, _ = _MESSAGE_HEADER.unpack_from(data, 0)
    return MESSAGE_HEADER_LENGTH if (template_id, schema_id) == (TEMPLATE_ID, SCHEMA_ID) else 0


def read_info(archive_dir: str | os.PathLike) -> MarkFileInfo | None:
    """The mark file of a directory, or None if it has none."""
    path = Path(archive_dir) / MARK_FILE_NAME
    try:
        with open(path, "rb") as f:
            data = f.read(VAR_DATA_OFFSET)
    except FileNotFoundError:
        return None
    return _decode(path, data)


def _decode(path: Path, data) -> MarkFileInfo:
    if len(data) < VAR_DATA_OFFSET:
        raise MarkFileError(f"{path}: {len(data)} bytes is too short for a mark file header (truncated?)")
    shift = _header_offset(data) - MESSAGE_HEADER_LENGTH  # -8 for old files without a message header
    return MarkFileInfo(
        path=path,
        version=_I32.unpack_from(data, VERSION_OFFSET + shift)[0],
        activity_timestamp=_I64.unpack_from(data, ACTIVITY_TIMESTAMP_OFFSET + shift)[0],
        start_timestamp=_I64.unpack_from(data, START_TIMESTAMP_OFFSET + shift)[0],
        pid=_I64.unpack_from(data, PID_OFFSET + shift)[0],
        archive_id=_I64.unpack_from(data, ARCHIVE_ID_OFFSET + shift)[0] if shift == 0 else NULL_VALUE,
    )


class ArchiveMarkFile:
    """Our ownership of an archive directory: acquire() it, update_activity() every second, close()."""

    def __init__(self, path: Path, fd: int, mapped: mmap.mmap) -> None:
        self.path = path
        self._fd = fd
        self._mm = mapped

    @classmethod
    def acquire(cls, archive_dir: str | os.PathLike, *, archive_id: int = NULL_VALUE,
                control_channel: str = "", local_control_channel: str = "", events_channel: str = "",
                aeron_directory: str = "", control_stream_id: int = DEFAULT_CONTROL_STREAM_ID,
                local_control_stream_id: int = DEFAULT_LOCAL_CONTROL_STREAM_ID,
                events_stream_id: int = DEFAULT_EVENTS_STREAM_ID,
                error_buffer_length: int = DEFAULT_ERROR_BUFFER_LENGTH) -> "ArchiveMarkFile":
        """Take the directory (creating it if needed), or raise MarkFileError while another archiver
        is alive in it. The channel and stream fields are informational, for Aeron's tools."""
        archive_dir = Path(archive_dir)
        archive_dir.mkdir(parents=True, exist_ok=True)
        path = archive_dir / MARK_FILE_NAME
        strings = [s.encode("ascii") for s in (control_channel, local_control_channel, events_channel,
                                               aeron_directory)]
        if VAR_DATA_OFFSET + sum(_U32.size + len(s) for s in strings) > HEADER_LENGTH:
            raise ValueError(f"mark file channels and directory take more than the {HEADER_LENGTH}-byte header")
        total_length = HEADER_LENGTH + error_buffer_length
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # Two archivers starting at once must not both see the file free: the check and the
            # takeover happen under an exclusive lock (held only for this, not for our lifetime).
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size >= VAR_DATA_OFFSET:
                cls._refuse_if_active(archive_dir, _decode(path, os.pread(fd, VAR_DATA_OFFSET, 0)))
            if size != total_length:
                os.ftruncate(fd, total_length)
            mapped = mmap.mmap(fd, total_length)
            now = epoch_ms()
            # Not ready (version 0) until signal_ready(): the owner still has to recover its catalog.
            _I32.pack_into(mapped, VERSION_OFFSET, 0)
            mapped[:HEADER_LENGTH] = bytes(HEADER_LENGTH)
            _MESSAGE_HEADER.pack_into(mapped, 0, BLOCK_LENGTH, TEMPLATE_ID, SCHEMA_ID, SCHEMA_VERSION)
            _I64.pack_into(mapped, ACTIVITY_TIMESTAMP_OFFSET, now)
            _I64.pack_into(mapped, START_TIMESTAMP_OFFSET, now)
            _I64.pack_into(mapped, PID_OFFSET, os.getpid())
            struct.pack_into("<iiiii", mapped, CONTROL_STREAM_ID_OFFSET, control_stream_id, local_control_stream_id,
                             events_stream_id, HEADER_LENGTH, error_buffer_length)
            _I64.pack_into(mapped, ARCHIVE_ID_OFFSET, archive_id)
            at = VAR_DATA_OFFSET
            for data in strings:
                _U32.pack_into(mapped, at, len(data))
                mapped[at + _U32.size:at + _U32.size + len(data)] = data
                at += _U32.size + len(data)
            mapped.flush()
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            os.close(fd)
            raise
        log.info("%s: acquired by pid %d", path, os.getpid())
        return cls(path, fd, mapped)

    @staticmethod
    def _refuse_if_active(archive_dir: Path, info: MarkFileInfo) -> None:
        if info.version != 0 and (info.version >> 16) != MAJOR_VERSION:
            raise MarkFileError(f"{info.path}: mark file version {info.version >> 16}.{(info.version >> 8) & 0xFF}."
                                f"{info.version & 0xFF} is not an Aeron Archive {MAJOR_VERSION}.x mark file")
        now = epoch_ms()
        # Beyond Aeron: on this host a dead owner's pid tells at once that it will not come back,
        # so a restart after kill -9 need not wait out the liveness timeout.
        if info.is_active(now) and pid_alive(info.pid):
            raise MarkFileError(
                f"{archive_dir}: another archiver is active here (pid {info.pid}, last activity "
                f"{info.age_ms(now) / 1000:.1f} s ago); it may be taken over once its activity is "
                f"{LIVENESS_TIMEOUT_MS // 1000} s old")
        if info.activity_timestamp != NULL_VALUE:
            log.warning("%s: taking over from pid %d, silent for %.1f s (it did not shut down cleanly)",
                        info.path, info.pid, info.age_ms(now) / 1000)

    # -- the owner's side ----------------------------------------------------------------------

    @property
    def info(self) -> MarkFileInfo:
        return _decode(self.path, self._mm[:VAR_DATA_OFFSET])

    @property
    def activity_timestamp(self) -> int:
        return _I64.unpack_from(self._mm, ACTIVITY_TIMESTAMP_OFFSET)[0]

    def signal_ready(self) -> None:
        """Store the version, last, as Aeron does once its archive is set up: readers of the file
        may then rely on what the owner recovered at start (the catalog's stop positions)."""
        _I32.pack_into(self._mm, VERSION_OFFSET, SEMANTIC_VERSION)
        self._mm.flush()

    def update_activity(self, now_ms: int | None = None) -> None:
        """Proof of life: call at least every UPDATE_INTERVAL_MS."""
        _I64.pack_into(self._mm, ACTIVITY_TIMESTAMP_OFFSET, epoch_ms() if now_ms is None else now_ms)

    def flush(self) -> None:
        self._mm.flush()

    def close(self) -> None:
        """Clean shutdown: activity -1, so the next archiver may start at once."""
        if self._mm is None:
            return
        _I64.pack_into(self._mm, ACTIVITY_TIMESTAMP_OFFSET, NULL_VALUE)
        self._mm.flush()
        self._mm.close()
        self._mm = None
        os.close(self._fd)
        log.info("%s: released", self.path)

    def __enter__(self) -> "ArchiveMarkFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Aeron log buffer files: three terms and a 4096-byte metadata section, mapped by every process.

The layout is Aeron's (io.aeron.logbuffer.LogBufferDescriptor) byte for byte, so a file written
here reads in Aeron's tools and a file written by Aeron reads here. There is no media driver: the
one writer and its readers map the same file.
"""

from __future__ import annotations

import mmap
import os
import random
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ramen.transport import frame
from ramen.transport.defaults import DEFAULT_MTU_LENGTH, DEFAULT_PAGE_SIZE, DEFAULT_TERM_LENGTH
from ramen.transport.errors import TransportError
from ramen.transport.position import (PARTITION_COUNT, compute_position, index_by_term_count,
                                      int32, position_bits_to_shift)

TERM_MIN_LENGTH = 64 * 1024
TERM_MAX_LENGTH = 1024 * 1024 * 1024
PAGE_MIN_SIZE = 4 * 1024
PAGE_MAX_SIZE = 1024 * 1024 * 1024
LOG_META_DATA_LENGTH = 4096
MAX_MESSAGE_LENGTH_CAP = 16 * 1024 * 1024

# Metadata offsets, from the start of the metadata section.
TERM_TAIL_COUNTERS_OFFSET = 0
LOG_ACTIVE_TERM_COUNT_OFFSET = 24
LOG_END_OF_STREAM_POSITION_OFFSET = 128
LOG_IS_CONNECTED_OFFSET = 136
LOG_ACTIVE_TRANSPORT_COUNT = 140
LOG_CORRELATION_ID_OFFSET = 256
LOG_INITIAL_TERM_ID_OFFSET = 264
LOG_DEFAULT_FRAME_HEADER_LENGTH_OFFSET = 268
LOG_MTU_LENGTH_OFFSET = 272
LOG_TERM_LENGTH_OFFSET = 276
LOG_PAGE_SIZE_OFFSET = 280
LOG_DEFAULT_FRAME_HEADER_OFFSET = 320

END_OF_STREAM_UNSET = 0x7FFFFFFFFFFFFFFF  # Long.MAX_VALUE, as Aeron initialises it

_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux only


class LogBufferError(TransportError):
    """A log buffer file that cannot be used, with a message that names the file and the problem."""


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def check_term_length(term_length: int) -> None:
    if not TERM_MIN_LENGTH <= term_length <= TERM_MAX_LENGTH:
        raise LogBufferError(f"term length {term_length} is outside {TERM_MIN_LENGTH}..{TERM_MAX_LENGTH}")
    if not is_power_of_two(term_length):
        raise LogBufferError(f"term length {term_length} is not a power of two")


def check_page_size(page_size: int) -> None:
    if not PAGE_MIN_SIZE <= page_size <= PAGE_MAX_SIZE or not is_power_of_two(page_size):
        raise LogBufferError(f"page size {page_size} is not a power of two in {PAGE_MIN_SIZE}..{PAGE_MAX_SIZE}")


def check_mtu(mtu_length: int) -> None:
    if mtu_length <= frame.HEADER_LENGTH or mtu_length % frame.FRAME_ALIGNMENT:
        raise LogBufferError(f"MTU {mtu_length} must be a multiple of {frame.FRAME_ALIGNMENT} above {frame.HEADER_LENGTH}")


def compute_log_length(term_length: int, page_size: int) -> int:
    return frame.align(term_length * PARTITION_COUNT + LOG_META_DATA_LENGTH, page_size)


def compute_max_message_length(term_length: int) -> int:
    return min(term_length // 8, MAX_MESSAGE_LENGTH_CAP)


def pack_tail(term_id: int, term_offset: int) -> int:
    """A raw tail counter: termId in the high 32 bits, offset in the low 32 (as a signed int64)."""
    raw = ((term_id & 0xFFFFFFFF) << 32) | (term_offset & 0xFFFFFFFF)
    return raw - (1 << 64) if raw >= 1 << 63 else raw


def tail_term_id(raw_tail: int) -> int:
    return int32(raw_tail >> 32)


def tail_term_offset(raw_tail: int, term_length: int) -> int:
    """The usable offset: tails of concurrent publications may run past the term end."""
    return min(raw_tail & 0xFFFFFFFF, term_length)


@dataclass(frozen=True)
class LogBufferParams:
    term_length: int = DEFAULT_TERM_LENGTH
    mtu_length: int = DEFAULT_MTU_LENGTH
    page_size: int = DEFAULT_PAGE_SIZE
    initial_term_id: int = 0
    session_id: int = 0
    stream_id: int = 0
    correlation_id: int | None = None
    """Identifies this log in the counters file; random when not given."""
    term_id: int | None = None
    """The first active term id (defaults to the initial one); with term_offset, a stream may start mid-stream."""
    term_offset: int = 0


class LogBuffer:
    """A mapped log buffer file: term views, metadata fields, and the default frame header."""

    def __init__(self, path: str | os.PathLike, mapped: mmap.mmap, term_length: int, inode: int | None = None) -> None:
        self.path = Path(path)
        self.inode = inode
        """The mapped file's inode: a reader tells by it that the file at `path` was replaced."""
        self.mmap = mapped
        self.term_length = term_length
        self.buffer = memoryview(mapped)
        self.meta_offset = len(mapped) - LOG_META_DATA_LENGTH
        self.metadata = self.buffer[self.meta_offset:self.meta_offset + LOG_META_DATA_LENGTH]
        self.terms = [self.buffer[i * term_length:(i + 1) * term_length] for i in range(PARTITION_COUNT)]
        self._meta_i64 = self.metadata.cast("q")
        tails = TERM_TAIL_COUNTERS_OFFSET
        self.tail_counters = self.metadata[tails:tails + 8 * PARTITION_COUNT].cast("q")
        """The raw tail counters by partition, for a writer that claims space with one store."""
        self._meta_i32 = self.metadata.cast("i")
        self.position_bits_to_shift = position_bits_to_shift(term_length)
        self.initial_term_id = self._meta_i32[LOG_INITIAL_TERM_ID_OFFSET // 4]
        self.mtu_length = self._meta_i32[LOG_MTU_LENGTH_OFFSET // 4]
        self.page_size = self._meta_i32[LOG_PAGE_SIZE_OFFSET // 4]
        self.correlation_id = self._meta_i64[LOG_CORRELATION_ID_OFFSET // 8]
        default_header = frame.HEADER.unpack_from(self.metadata, LOG_DEFAULT_FRAME_HEADER_OFFSET)
        self.session_id = default_header[5]
        self.stream_id = default_header[6]

    # -- creation and opening --------------------------------------------------------------------

    @classmethod
    def create(cls, path: str | os.PathLike, params: LogBufferParams = LogBufferParams(),
               *, pre_touch: bool = False) -> "LogBuffer":
        """Create and map a new log buffer file, initialised as Aeron's driver initialises one.

        The file appears at `path` whole: it is built unnamed in the same directory and linked
        there once its metadata is written, so a reader never maps a log whose metadata is still
        zeros, and a writer killed while creating leaves nothing behind (LogBufferError if a log
        is already there).

        `pre_touch` faults every page in now (Aeron's aeron.pre.touch.mapped.memory). A fresh file
        is sparse: its first lap otherwise pays a page fault every 4 KiB on the writer's hot path
        (about 3 µs each here, 40 ms for a 48 MiB log), which halves the rate of a fast writer such
        as a replay until it comes round."""
        check_term_length(params.term_length)
        check_page_size(params.page_size)
        check_mtu(params.mtu_length)
        term_length = params.term_length
        length = compute_log_length(term_length, params.page_size)
        initial_term_id = int32(params.initial_term_id)
        term_id = initial_term_id if params.term_id is None else int32(params.term_id)
        term_count = int32(term_id - initial_term_id)
        path = Path(path)
        if term_count < 0:
            raise LogBufferError(f"{path}: term id {term_id} is before the initial term id {initial_term_id}")
        if params.term_offset % frame.FRAME_ALIGNMENT or not 0 <= params.term_offset < term_length:
            raise LogBufferError(f"{path}: term offset {params.term_offset} is not an aligned offset in the term")
        if path.exists():
            raise LogBufferError(f"{path}: log buffer already exists")
        fd, unlink_on_failure = _open_unnamed(path)
        mapped = None
        try:
            os.ftruncate(fd, length)
            mapped = _map(fd, length, mmap.ACCESS_WRITE, pre_touch, new=True)
            _initialise_metadata(mapped, length, params, initial_term_id, term_id, term_count)
            _link(fd, unlink_on_failure, path)
            inode = os.fstat(fd).st_ino
        except BaseException:
            if mapped is not None:
                mapped.close()
            if unlink_on_failure is not None:
                unlink_on_failure.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return cls(path, mapped, term_length, inode)

    @classmethod
    def open(cls, path: str | os.PathLike, *, writable: bool = True, pre_touch: bool = False) -> "LogBuffer":
        """Map an existing log buffer file, after checking that its layout is sound. `pre_touch`
        maps every page into this process now rather than on its first lap (see create)."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        except FileNotFoundError:
            raise LogBufferError(f"{path}: no such log buffer file") from None
        except IsADirectoryError:
            raise LogBufferError(f"{path}: is a directory, not a log buffer file") from None
        try:
            stat = os.fstat(fd)
            length, inode = stat.st_size, stat.st_ino
            if length < compute_log_length(TERM_MIN_LENGTH, PAGE_MIN_SIZE):
                raise LogBufferError(f"{path}: {length} bytes is too short for a log buffer "
                                     f"(at least {compute_log_length(TERM_MIN_LENGTH, PAGE_MIN_SIZE)}; truncated?)")
            mapped = _map(fd, length, mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ, pre_touch)
        finally:
            os.close(fd)
        try:
            term_length = _validate_layout(path, mapped, length)[0]
        except LogBufferError:
            mapped.close()
            raise
        return cls(path, mapped, term_length, inode)

    def close(self) -> None:
        for view in (self.tail_counters, self._meta_i64, self._meta_i32, self.metadata, *self.terms, self.buffer):
            view.release()
        self.mmap.close()

    def __enter__(self) -> "LogBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- metadata ------------------------------------------------------------------------------

    def raw_tail(self, index: int) -> int:
        return self.tail_counters[index]

    def set_raw_tail(self, index: int, raw: int) -> None:
        self.tail_counters[index] = raw

    def set_tail_position(self, position: int) -> None:
        """Move the tail to `position` (and the active term with it) for a log filled by other
        means than appending, as a rebuilt image is: the new partition's tail goes before the term
        count, as a publication rotates."""
        term_count = position >> self.position_bits_to_shift
        self.set_raw_tail(index_by_term_count(term_count),
                          pack_tail(int32(self.initial_term_id + term_count), position & (self.term_length - 1)))
        if self.active_term_count != term_count:
            self.active_term_count = term_count

    @property
    def active_term_count(self) -> int:
        return self._meta_i32[LOG_ACTIVE_TERM_COUNT_OFFSET // 4]

    @active_term_count.setter
    def active_term_count(self, value: int) -> None:
        self._meta_i32[LOG_ACTIVE_TERM_COUNT_OFFSET // 4] = value

    @property
    def end_of_stream_position(self) -> int:
        return self._meta_i64[LOG_END_OF_STREAM_POSITION_OFFSET // 8]

    @end_of_stream_position.setter
    def end_of_stream_position(self, value: int) -> None:
        self._meta_i64[LOG_END_OF_STREAM_POSITION_OFFSET // 8] = value

    @property
    def is_connected(self) -> bool:
        return self._meta_i32[LOG_IS_CONNECTED_OFFSET // 4] != 0

    @is_connected.setter
    def is_connected(self, value: bool) -> None:
        self._meta_i32[LOG_IS_CONNECTED_OFFSET // 4] = 1 if value else 0

    @property
    def active_transport_count(self) -> int:
        return self._meta_i32[LOG_ACTIVE_TRANSPORT_COUNT // 4]

    @property
    def max_payload_length(self) -> int:
        return self.mtu_length - frame.HEADER_LENGTH

    @property
    def max_message_length(self) -> int:
        return compute_max_message_length(self.term_length)

    def producer_position(self) -> int:
        """The position the writer has claimed up to, from the active partition's tail."""
        term_count = self.active_term_count
        raw = self.raw_tail(index_by_term_count(term_count))
        return compute_position(tail_term_id(raw), tail_term_offset(raw, self.term_length),
                                self.position_bits_to_shift, self.initial_term_id)

    def metadata_fields(self) -> dict:
        """Every metadata field, tails decoded, for inspection tools."""
        tails = []
        for i in range(PARTITION_COUNT):
            raw = self.raw_tail(i)
            tails.append({"raw": raw, "term_id": tail_term_id(raw), "term_offset": raw & 0xFFFFFFFF})
        hdr = frame.HEADER.unpack_from(self.metadata, LOG_DEFAULT_FRAME_HEADER_OFFSET)
        return {
            "file_length": len(self.buffer),
            "term_length": self.term_length,
            "term_tail_counters": tails,
            "active_term_count": self.active_term_count,
            "end_of_stream_position": self.end_of_stream_position,
            "is_connected": self.is_connected,
            "active_transport_count": self.active_transport_count,
            "correlation_id": self.correlation_id,
            "initial_term_id": self.initial_term_id,
            "default_frame_header_length": self._meta_i32[LOG_DEFAULT_FRAME_HEADER_LENGTH_OFFSET // 4],
            "mtu_length": self.mtu_length,
            "page_size": self.page_size,
            "default_frame_header": {
                "frame_length": hdr[0], "version": hdr[1], "flags": hdr[2], "type": hdr[3],
                "term_offset": hdr[4], "session_id": hdr[5], "stream_id": hdr[6], "term_id": hdr[7],
                "reserved_value": hdr[8],
            },
            "session_id": self.session_id,
            "stream_id": self.stream_id,
            "producer_position": self.producer_position(),
        }


def _open_unnamed(path: Path) -> tuple[int, Path | None]:
    """A new file in path's directory, not yet at path: unnamed where the file system can (nothing
    is left if the process dies), else under a hidden name that is removed on failure."""
    try:
        return os.open(path.parent, os.O_RDWR | os.O_TMPFILE, 0o644), None
    except FileNotFoundError:
        raise LogBufferError(f"{path}: no such directory") from None
    except OSError:
        pass  # a file system without unnamed files
    hidden = path.with_name(f".{path.name}.{os.getpid()}.{random.getrandbits(32):08x}.new")
    return os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), hidden


def _link(fd: int, hidden: Path | None, path: Path) -> None:
    """Give the file at fd (unnamed, or at `hidden`) the name `path`, unless something has it."""
    try:
        if hidden is None:
            # Given a directory fd, os.link calls linkat(AT_SYMLINK_FOLLOW), which links the file
            # the fd's /proc entry names; a plain link() would try to link the entry itself.
            directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.link(f"/proc/self/fd/{fd}", path.name, dst_dir_fd=directory)
            finally:
                os.close(directory)
        else:
            os.link(hidden, path)
            hidden.unlink()
    except FileExistsError:
        raise LogBufferError(f"{path}: log buffer already exists") from None


def _initialise_metadata(mapped: mmap.mmap, length: int, params: LogBufferParams, initial_term_id: int,
                         term_id: int, term_count: int) -> None:
    meta = memoryview(mapped)[length - LOG_META_DATA_LENGTH:]
    correlation_id = params.correlation_id
    if correlation_id is None:
        correlation_id = random.getrandbits(62) + 1
    # Tails as Aeron's initialisePositionCounters() leaves them: the active partition at the
    # start term, and the two others one rotation behind it, so rotation finds what it expects.
    active_index = index_by_term_count(term_count)
    for i in range(PARTITION_COUNT):
        if i == active_index:
            raw = pack_tail(term_id, params.term_offset)
        else:
            expected_term_id = term_id + i - active_index
            if i > active_index:
                expected_term_id -= PARTITION_COUNT
            raw = pack_tail(int32(expected_term_id), 0)
        struct.pack_into("<q", meta, TERM_TAIL_COUNTERS_OFFSET + 8 * i, raw)
    struct.pack_into("<i", meta, LOG_ACTIVE_TERM_COUNT_OFFSET, term_count)
    struct.pack_into("<q", meta, LOG_END_OF_STREAM_POSITION_OFFSET, END_OF_STREAM_UNSET)
    struct.pack_into("<q", meta, LOG_CORRELATION_ID_OFFSET, correlation_id)
    struct.pack_into("<iiiii", meta, LOG_INITIAL_TERM_ID_OFFSET, initial_term_id, frame.HEADER_LENGTH,
                     params.mtu_length, params.term_length, params.page_size)
    # Aeron's createDefaultHeader(sessionId, streamId, initialTermId): the term id is the initial one.
    frame.write_header(meta, LOG_DEFAULT_FRAME_HEADER_OFFSET, 0, frame.UNFRAGMENTED, frame.HDR_TYPE_DATA,
                       0, params.session_id, params.stream_id, initial_term_id)
    meta.release()


def _map(fd: int, length: int, access: int, pre_touch: bool, *, new: bool = False) -> mmap.mmap:
    """Map the file shared. With `pre_touch`, every page is in this mapping before it returns. A
    file being created is stored to, a byte a page (each page allocated and its write fault taken
    now; the contents unchanged). An existing file, which a writer may be writing, is only read:
    MAP_POPULATE maps it in one call where there is one, else a byte a page is read (the kernel
    maps 16 pages a read fault)."""
    if pre_touch and not new and _MAP_POPULATE:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if access == mmap.ACCESS_WRITE else 0)
        return mmap.mmap(fd, length, flags=mmap.MAP_SHARED | _MAP_POPULATE, prot=prot)
    mapped = mmap.mmap(fd, length, access=access)
    if pre_touch:
        pages = np.frombuffer(mapped, dtype=np.uint8)[::mmap.PAGESIZE]
        if new:
            pages |= 0
        else:
            int(pages.sum())
        del pages
    return mapped


def _validate_layout(path: Path, mapped: mmap.mmap, length: int) -> tuple[int, int, int]:
    """Check what the metadata claims against the file itself, as Aeron's LogBuffers does.

    The metadata is the file's last 4096 bytes (the file is page-aligned, so there may be a gap
    between the third term and the metadata).
    """
    meta = length - LOG_META_DATA_LENGTH
    term_length, page_size = struct.unpack_from("<ii", mapped, meta + LOG_TERM_LENGTH_OFFSET)
    try:
        check_term_length(term_length)
        check_page_size(page_size)
    except LogBufferError as e:
        raise LogBufferError(f"{path}: {e} (metadata at offset {meta}; not a log buffer, or damaged)") from None
    expected = compute_log_length(term_length, page_size)
    if length != expected:
        raise LogBufferError(f"{path}: file is {length} bytes, but a log of term length {term_length} "
                             f"and page size {page_size} is {expected} bytes (truncated?)")
    mtu, = struct.unpack_from("<i", mapped, meta + LOG_MTU_LENGTH_OFFSET)
    header_length, = struct.unpack_from("<i", mapped, meta + LOG_DEFAULT_FRAME_HEADER_LENGTH_OFFSET)
    if header_length != frame.HEADER_LENGTH:
        raise LogBufferError(f"{path}: default frame header length is {header_length}, expected {frame.HEADER_LENGTH}")
    try:
        check_mtu(mtu)
    except LogBufferError as e:
        raise LogBufferError(f"{path}: {e}") from None
    return term_length, page_size, mtu

"""Segment files: where a recording's frames live on disk, as Aeron Archive lays them out.

A recording is a run of stream positions [startPosition, stopPosition) stored in fixed-length files
named `<recordingId>-<segmentFileBasePosition>.rec`. Each file holds the raw term bytes of
segmentFileLength bytes of stream, so a frame at stream position p sits at file offset p - base.

Base positions count from the start of the term the recording started in, not from 0 (Aeron's
AeronArchive.segmentFileBasePosition): a recording that starts at term offset 4096 of term 3 of a
64 KiB-term stream (position 200704) has its first file at base 196608, and its first frame at file
offset 4096; the bytes before it stay zero. Because a segment is a whole number of terms and
frames never cross a term end, frames never cross a segment end either.

What Aeron's RecordingWriter writes, and so what we write:
- DATA frames verbatim, in blocks of whole frames as read from a log buffer term;
- PAD frames header only (32 bytes): the file position still advances by the PAD's whole length,
  and the padded space stays zero (the files are created sparse at full length);
- with a checksum configured, each DATA frame's sessionId field holds the checksum of its payload
  including the alignment padding up to the next 32-byte boundary (the term buffer itself is left
  alone: the frames are copied to a scratch buffer first);
- on reaching a segment's end, the next segment file is created at once (so a recording stopped
  exactly at a segment boundary has an empty last file).

Reading trusts nothing: a frame header is checked against its position before its length is used
to find the next one (`frame_problem`), a file that is not a regular file or ends before the data
it must hold is named with the offset, and a walk reads a bounded chunk at a time whatever the
positions it is given (a damaged catalog may claim any stop position).
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import stat
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ramen.archive.checksum import Checksum
from ramen.archive.errors import ArchiveError
from ramen.transport import frame
from ramen.transport.frame import (BEGIN_FLAG, END_FLAG, FRAME_ALIGNMENT, HDR_TYPE_DATA, HDR_TYPE_PAD, HEADER,
                                   HEADER_LENGTH, align)
from ramen.transport.frame_walk import frame_problem, headers_fit, walk
from ramen.transport.logbuffer import MAX_MESSAGE_LENGTH_CAP, TERM_MAX_LENGTH, TERM_MIN_LENGTH, is_power_of_two
from ramen.transport.position import int32, position_bits_to_shift

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".rec"
SEGMENT_MIN_LENGTH = 64 * 1024
"""Bytes; Aeron's smallest segment file (equal to the smallest term)."""
SEGMENT_MAX_LENGTH = 1024 * 1024 * 1024
"""Bytes; Aeron's largest segment file."""
PAGE_SIZE = 4096
"""Bytes; the unit a crash can tear a write at (Aeron's Catalog.PAGE_SIZE), for the torn-frame rule."""
READ_CHUNK_LENGTH = 1024 * 1024
"""Bytes read from a segment file at a time (Aeron's FILE_IO_MAX_LENGTH_DEFAULT)."""
MAX_MTU_LENGTH = MAX_MESSAGE_LENGTH_CAP + HEADER_LENGTH
"""Bytes; no frame of a recording is longer (Aeron's own cap is 65504): what a reader's chunk must hold
at most, whatever a damaged descriptor claims."""
NULL_POSITION = -1

_SEGMENT_NAME = re.compile(r"^(\d+)-(\d+)" + re.escape(SEGMENT_SUFFIX) + "$")
_ZERO_WORD = bytes(8)


class SegmentError(ArchiveError):
    """A segment file that cannot be read as a recording; the message names the file, the offset and
    the problem."""


class TornFrameError(SegmentError):
    """The last frame of a recording crosses a page boundary and may be only partly on disk."""

    def __init__(self, path: Path, position: int) -> None:
        super().__init__(f"{path}: the last frame, at position {position}, straddles a page boundary and may be "
                         f"incomplete (torn by a crash); run `ramen archive verify` and decide whether to truncate it")
        self.path = path
        self.position = position


# -- names and positions ---------------------------------------------------------------------------


def segment_file_name(recording_id: int, base_position: int) -> str:
    return f"{recording_id}-{base_position}{SEGMENT_SUFFIX}"


def parse_segment_file_name(name: str) -> tuple[int, int] | None:
    """(recording id, base position) of a segment file name, or None if the name is not one."""
    match = _SEGMENT_NAME.match(name)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def segment_file_base_position(start_position: int, position: int, term_length: int, segment_length: int) -> int:
    """The base position of the segment file holding `position` of a recording that began at start_position."""
    start_term_base = start_position - (start_position & (term_length - 1))
    from_base = position - start_term_base
    return start_term_base + from_base - (from_base & (segment_length - 1))


def check_segment_file_length(segment_length: int, term_length: int) -> None:
    """Raise SegmentError unless segment_length is a power of two in 64 KiB..1 GiB and holds whole terms."""
    if not SEGMENT_MIN_LENGTH <= segment_length <= SEGMENT_MAX_LENGTH or not is_power_of_two(segment_length):
        raise SegmentError(f"segment file length {segment_length} is not a power of two in "
                           f"{SEGMENT_MIN_LENGTH}..{SEGMENT_MAX_LENGTH}")
    if not TERM_MIN_LENGTH <= term_length <= TERM_MAX_LENGTH or not is_power_of_two(term_length):
        raise SegmentError(f"term length {term_length} is not a power of two in {TERM_MIN_LENGTH}..{TERM_MAX_LENGTH}")
    if segment_length < term_length:
        raise SegmentError(f"segment file length {segment_length} is shorter than the term length {term_length}: "
                           f"a segment must hold whole terms")


def list_segment_files(archive_dir: str | os.PathLike) -> dict[int, list[int]]:
    """Recording id -> sorted base positions of its segment files; other files are ignored."""
    segments: dict[int, list[int]] = {}
    for entry in os.scandir(archive_dir):
        parsed = parse_segment_file_name(entry.name)
        if parsed is not None:
            segments.setdefault(parsed[0], []).append(parsed[1])
    for bases in segments.values():
        bases.sort()
    return segments


def _check_aligned(what: str, position: int) -> None:
    if position < 0 or position & (FRAME_ALIGNMENT - 1):
        raise SegmentError(f"{what} {position} is not a non-negative multiple of {FRAME_ALIGNMENT}")


# -- writing ---------------------------------------------------------------------------------------


class SegmentWriter:
    """Appends a recording's frames to its segment files (Aeron's RecordingWriter).

    `on_block` has the signature of Image.block_poll's handler, so a recorder passes it straight in.
    Writes go through the page cache with pwrite: a process killed with SIGKILL loses nothing it
    wrote. `sync=True` (Aeron's fileSyncLevel > 0) also makes each block durable against power loss.
    """

    def __init__(self, archive_dir: str | os.PathLike, recording_id: int, start_position: int, term_length: int,
                 segment_length: int, *, checksum: Checksum | None = None, position: int | None = None,
                 sync: bool = False) -> None:
        check_segment_file_length(segment_length, term_length)
        _check_aligned("start position", start_position)
        position = start_position if position is None else position
        _check_aligned("join position", position)
        if position < start_position:
            raise ValueError(f"join position {position} is before the start position {start_position}")
        self.archive_dir = Path(archive_dir)
        self.recording_id = recording_id
        self.start_position = start_position
        self.term_length = term_length
        self.segment_length = segment_length
        self.checksum = checksum
        self.sync = sync
        self._term_mask = term_length - 1
        self._segment_base = segment_file_base_position(start_position, position, term_length, segment_length)
        self._segment_offset = position - self._segment_base
        # A block is at most one term (block_poll never crosses a term end), so one term of scratch will do.
        self._scratch = bytearray(term_length) if checksum is not None else None
        self._fd = -1
        self._fd = self._open_segment(self._segment_base, must_be_new=False)

    @property
    def position(self) -> int:
        """The stream position just after the last byte written."""
        return self._segment_base + self._segment_offset

    @property
    def segment_path(self) -> Path:
        """The file being written now."""
        return self.archive_dir / segment_file_name(self.recording_id, self._segment_base)

    def on_block(self, term_buffer, term_offset: int, length: int, session_id: int, term_id: int) -> None:
        """Append `length` bytes of whole frames found at term_offset of a term buffer."""
        if length <= 0:
            return
        if self._fd < 0:
            raise ValueError(f"recording {self.recording_id}: segment writer is closed")
        if term_offset & (FRAME_ALIGNMENT - 1) or length & (FRAME_ALIGNMENT - 1):
            raise ValueError(f"recording {self.recording_id}: block at term offset {term_offset}, length {length} "
                             f"is not frame-aligned")
        expected = self.position & self._term_mask
        if term_offset != expected:
            raise ValueError(f"recording {self.recording_id}: block starts at term offset {term_offset} but the "
                             f"recording is at position {self.position} (term offset {expected}): a gap or a repeat")
        if self._segment_offset + length > self.segment_length:
            raise ValueError(f"recording {self.recording_id}: block of {length} bytes at position {self.position} "
                             f"runs past the end of segment {self.segment_path.name}")
        with memoryview(term_buffer) as term:
            if term.format != "B":
                term = term.cast("B")
            if term_offset + length > len(term):
                raise ValueError(f"recording {self.recording_id}: block [{term_offset}, {term_offset + length}) "
                                 f"is outside the term buffer of {len(term)} bytes")
            if self._scratch is None:
                self._write_frames(term, term_offset, length, term_offset)
            else:
                with memoryview(self._scratch) as scratch:
                    scratch[:length] = term[term_offset:term_offset + length]
                    self._write_frames(scratch, 0, length, term_offset)
        if self.sync:
            os.fdatasync(self._fd)
        self._segment_offset += length
        if self._segment_offset >= self.segment_length:
            self._roll_over()

    def _write_frames(self, src: memoryview, offset: int, length: int, term_offset: int) -> None:
        """Write the frames of src[offset:offset+length] (found at `term_offset` of their term): runs
        of DATA verbatim, PADs header only.

        With a checksum, src is our scratch copy and each DATA frame's sessionId is set first.
        """
        end = offset + length
        frames = walk(src, offset, end, term_offset=term_offset)
        if frames.end != end:
            raise ValueError(f"recording {self.recording_id}: the frame at position "
                             f"{self.position + frames.end - offset} does not fit the block: a block must hold "
                             f"whole committed frames, each where its header says")
        file_offset = self._segment_offset - offset  # file offset = this + offset in src
        checksum = self.checksum
        run_start = offset
        for at, frame_end, _, frame_type, _ in zip(*frames.columns()):
            if frame_type == HDR_TYPE_PAD:
                self._pwrite(src[run_start:at], file_offset + run_start)
                self._pwrite(src[at:at + HEADER_LENGTH], file_offset + at)
                run_start = frame_end
            elif checksum is not None:
                frame.INT32.pack_into(src, at + frame.SESSION_ID_OFFSET,
                                      checksum.compute(src[at + HEADER_LENGTH:frame_end]))
        self._pwrite(src[run_start:end], file_offset + run_start)

    def _pwrite(self, data: memoryview, file_offset: int) -> None:
        while len(data):
            written = os.pwrite(self._fd, data, file_offset)
            data = data[written:]
            file_offset += written

    def _roll_over(self) -> None:
        os.close(self._fd)
        self._fd = -1
        self._segment_base += self.segment_length
        self._segment_offset = 0
        self._fd = self._open_segment(self._segment_base, must_be_new=True)

    def _open_segment(self, base_position: int, *, must_be_new: bool) -> int:
        path = self.archive_dir / segment_file_name(self.recording_id, base_position)
        flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if must_be_new else 0)
        try:
            fd = os.open(path, flags, 0o644)
        except FileExistsError:
            raise SegmentError(f"{path}: segment file already exists; recording {self.recording_id} cannot "
                               f"roll over into it") from None
        try:
            if os.fstat(fd).st_size < self.segment_length:
                os.ftruncate(fd, self.segment_length)  # sparse: unwritten space reads as zeros
            if self.sync:
                _sync_directory(self.archive_dir)
        except BaseException:
            os.close(fd)
            raise
        log.debug("recording %d: writing %s from offset %d", self.recording_id, path.name, self._segment_offset)
        return fd

    def flush(self) -> None:
        """Make everything written so far durable (a clean point; SIGKILL alone loses nothing anyway)."""
        if self._fd >= 0:
            os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "SegmentWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- reading ---------------------------------------------------------------------------------------


class SegmentFrame:
    """One frame read from a segment file, with its header decoded.

    `buffer` is the reader's chunk buffer, reused when the reader reads the next chunk: copy what
    you keep (payload() copies).
    """

    __slots__ = ("position", "length", "version", "flags", "type", "term_offset", "session_id", "stream_id",
                 "term_id", "reserved_value", "buffer", "offset", "segment_base")

    def __init__(self, position: int, fields: tuple, buffer: memoryview, offset: int, segment_base: int) -> None:
        self.position = position
        (self.length, self.version, self.flags, self.type, self.term_offset, self.session_id, self.stream_id,
         self.term_id, self.reserved_value) = fields
        self.buffer = buffer
        self.offset = offset
        self.segment_base = segment_base

    @property
    def aligned_length(self) -> int:
        return align(self.length)

    @property
    def end_position(self) -> int:
        """The stream position after this frame (what Aeron's Header.position() reports)."""
        return self.position + align(self.length)

    @property
    def file_offset(self) -> int:
        return self.position - self.segment_base

    @property
    def is_data(self) -> bool:
        return self.type == HDR_TYPE_DATA

    @property
    def is_pad(self) -> bool:
        return self.type == HDR_TYPE_PAD

    def payload(self) -> bytes:
        """A copy of the payload (without the alignment padding)."""
        return bytes(self.buffer[self.offset + HEADER_LENGTH:self.offset + self.length])

    def padded_payload(self) -> memoryview:
        """The payload and its alignment padding: what a frame checksum covers. Valid until the next read."""
        return self.buffer[self.offset + HEADER_LENGTH:self.offset + align(self.length)]

    def __repr__(self) -> str:
        return (f"SegmentFrame(position={self.position}, length={self.length}, flags={self.flags:#x}, "
                f"type={self.type}, term_id={self.term_id}, term_offset={self.term_offset}, "
                f"session_id={self.session_id}, stream_id={self.stream_id})")


class FrameError(SegmentError):
    """A frame that cannot be right where it lies (or data missing where a frame must be), with where."""

    def __init__(self, path: Path, position: int, file_offset: int, problem: str) -> None:
        super().__init__(f"{path} offset {file_offset} (position {position}): {problem}")
        self.path = path
        self.position = position
        self.file_offset = file_offset
        self.problem = problem


class MessageOrder:
    """Checks that DATA fragments make whole messages: BEGIN, middles, END, with no padding inside.
    Fragments before the first BEGIN are tolerated: a walk may start inside a message (a purged
    start, a dump's --from). A message left open at the end of a walk is not a problem either: a
    recording may stop between two fragments."""

    __slots__ = ("open_at", "begun")

    def __init__(self) -> None:
        self.open_at: int | None = None  # where the message being walked began
        self.begun = False

    def problem(self, position: int, frame_type: int, flags: int) -> str | None:
        if frame_type == HDR_TYPE_PAD:
            if self.open_at is not None:
                return f"padding inside the message begun at position {self.open_at}"
            return None
        if flags & BEGIN_FLAG:
            if self.open_at is not None:
                return f"a message begins inside the one begun at position {self.open_at}, which never ended"
            self.begun = True
            self.open_at = None if flags & END_FLAG else position
            return None
        if self.open_at is None:
            if self.begun:
                return "a fragment without a beginning (no BEGIN flag, and no message open)"
            return None  # before the first BEGIN of the walk
        if flags & END_FLAG:
            self.open_at = None
        return None


class SegmentReader:
    """Reads a recording's bytes and frames by stream position, across its segment files.

    Files are opened on first use and kept open until close(). Space a file does not hold reads as
    zeros (the end of the data) in `read`; `frames` and `read(must_exist=True)` call it truncation.
    Given the recording's initial term id and MTU (`for_recording` passes them), frames are checked
    against those too.
    """

    def __init__(self, archive_dir: str | os.PathLike, recording_id: int, start_position: int, term_length: int,
                 segment_length: int, *, initial_term_id: int | None = None,
                 mtu_length: int | None = None) -> None:
        check_segment_file_length(segment_length, term_length)
        _check_aligned("start position", start_position)
        if mtu_length is not None:
            check_mtu_length(mtu_length, term_length)
        self.archive_dir = Path(archive_dir)
        self.recording_id = recording_id
        self.start_position = start_position
        self.term_length = term_length
        self.segment_length = segment_length
        self.initial_term_id = initial_term_id
        self.mtu_length = mtu_length
        self._fds: dict[int, int] = {}

    @classmethod
    def for_recording(cls, archive_dir: str | os.PathLike, descriptor) -> "SegmentReader":
        """A reader for a catalog RecordingDescriptor (anything with those field names)."""
        return cls(archive_dir, descriptor.recording_id, descriptor.start_position, descriptor.term_buffer_length,
                   descriptor.segment_file_length, initial_term_id=descriptor.initial_term_id,
                   mtu_length=descriptor.mtu_length)

    def segment_base(self, position: int) -> int:
        return segment_file_base_position(self.start_position, position, self.term_length, self.segment_length)

    def segment_path(self, position: int) -> Path:
        return self.archive_dir / segment_file_name(self.recording_id, self.segment_base(position))

    def where(self, position: int) -> str:
        """`<segment file> offset <o>`: where a position lies, for messages."""
        return f"{self.segment_path(position)} offset {position - self.segment_base(position)}"

    def _fd(self, base: int, position: int) -> int:
        fd = self._fds.get(base)
        if fd is None:
            path = self.archive_dir / segment_file_name(self.recording_id, base)
            where = f"{path} offset {position - base}"
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise SegmentError(f"{where}: missing segment file of recording {self.recording_id} "
                                   f"(it holds position {position} there)") from None
            except OSError as e:
                raise SegmentError(f"{where}: cannot open segment file of recording {self.recording_id}: "
                                   f"{e.strerror}") from None
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                os.close(fd)
                what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
                raise SegmentError(f"{where}: is {what}, not a segment file of recording {self.recording_id} "
                                   f"(it holds position {position} there)")
            self._fds[base] = fd
        return fd

    def file_at(self, position: int) -> tuple[int, int]:
        """(file descriptor, file offset) of a position: for callers that read with their own
        preadv (a replay reading straight into a log). Reads never cross a term end, so never a
        segment end."""
        base = self.segment_base(position)
        return self._fd(base, position), position - base

    def file_size(self, position: int) -> int:
        """Bytes in the segment file holding `position`."""
        return os.fstat(self._fd(self.segment_base(position), position)).st_size

    def truncated(self, position: int, problem: str) -> SegmentError:
        """The error for data missing at `position` because its file ends before it."""
        path, base = self.segment_path(position), self.segment_base(position)
        return FrameError(path, position, position - base,
                          f"{problem}: the file ends at offset {self.file_size(position)} (truncated)")

    def read(self, position: int, buffer, limit_position: int | None = None, *, must_exist: bool = False) -> int:
        """Copy the recording's bytes from `position` into buffer, never past the end of the term (so
        never across a segment) nor past limit_position; returns how many bytes were copied. With
        `must_exist`, bytes the file does not hold are an error (truncated) rather than zeros."""
        _check_aligned("position", position)
        if position < self.start_position:
            raise SegmentError(f"position {position} is before the start of recording {self.recording_id} "
                               f"({self.start_position})")
        term_end = (position | (self.term_length - 1)) + 1
        with memoryview(buffer) as view:
            length = min(len(view), term_end - position)
            if limit_position is not None:
                length = min(length, limit_position - position)
            if length <= 0:
                return 0
            held = self._read_at(position, view[:length])
        if must_exist and held < length:
            raise self.truncated(position + held, f"bytes up to position {position + length} are missing")
        return length

    def _read_at(self, position: int, view: memoryview) -> int:
        """Fill view from the file at position; returns how many bytes the file held (the rest, past
        its end, is zeroed: nothing was written there)."""
        base = self.segment_base(position)
        fd = self._fd(base, position)
        done = 0
        wanted = len(view)
        while done < wanted:
            try:
                n = os.preadv(fd, [view[done:]], position - base + done)
            except OSError as e:
                raise SegmentError(f"{self.where(position + done)}: cannot read: {e.strerror}") from None
            if n <= 0:
                view[done:] = bytes(wanted - done)
                break
            done += n
        return done

    def frames(self, from_position: int | None = None, to_position: int | None = None, *,
               strict: bool = False) -> Iterator[SegmentFrame]:
        """Frames (PADs included) starting in [from_position, to_position), in position order.

        Each header is checked (`frame_problem`) before its length is used; a bad one, or a frame
        the file does not hold whole (truncated), raises FrameError. The walk stops where the data
        ends (a frame length <= 0), as in an active or unclean recording; with `strict`, data
        ending before to_position is an error too (a stopped recording's data must reach its stop).
        Memory is one chunk (1 MiB, or the MTU if larger), whatever the positions say.
        """
        position = self.start_position if from_position is None else from_position
        _check_aligned("from position", position)
        if position < self.start_position:
            raise SegmentError(f"from position {position} is before the start of recording {self.recording_id} "
                               f"({self.start_position})")
        term_length = self.term_length
        # A chunk of its own per walk, so two walks over one reader do not overwrite each other's frames.
        # Never more than a term: a read stops at the term end. A PAD's body is never needed (nor
        # stored), and a DATA frame is at most the MTU long, so one chunk always holds a frame.
        chunk_length = min(max(READ_CHUNK_LENGTH, align(self.mtu_length or 0)), term_length)
        chunk = memoryview(bytearray(chunk_length))
        unpack = HEADER.unpack_from
        initial_term_id, mtu_length = self.initial_term_id, self.mtu_length
        min_read = 0
        while to_position is None or position < to_position:
            term_end = (position | (term_length - 1)) + 1
            want = min(len(chunk), term_end - position)
            if to_position is not None:
                want = min(want, max(align(to_position - position), min_read, HEADER_LENGTH))
            held = self._read_at(position, chunk[:want])
            base = self.segment_base(position)
            offset = 0
            min_read = 0
            while offset + HEADER_LENGTH <= want and (to_position is None or position < to_position):
                # The frames that chain from here and fit their place, found by the one frame
                # walker; the frame it stops at is judged one at a time below.
                found = walk(chunk, offset, min(held, want), term_offset=position & (term_length - 1),
                             term_id=None if initial_term_id is None else
                             int32(initial_term_id + (position >> position_bits_to_shift(term_length))))
                fit = headers_fit(found.headers, term_id=found.headers[:, frame.TERM_ID_WORD], mtu_length=mtu_length)
                count = len(found) if fit.all() else int(fit.argmin())
                if to_position is not None:
                    count = min(count, int(np.searchsorted(found.starts, offset + to_position - position)))
                if count:
                    for at in found.starts[:count].tolist():
                        yield SegmentFrame(position + at - offset, unpack(chunk, at), chunk, at, base)
                    walked = int(found.ends[count - 1]) - offset
                    offset += walked
                    position += walked
                    continue
                must_go_on = strict and to_position is not None
                if offset + HEADER_LENGTH > held:
                    if offset < held or must_go_on:  # cut inside a header, or data that must go on is gone
                        raise self.truncated(position, f"no whole frame header at position {position}")
                    return  # the file ends here, between two frames: the end of the data
                fields = unpack(chunk, offset)
                frame_length = fields[0]
                if frame_length <= 0:
                    if must_go_on:
                        raise FrameError(self.segment_path(position), position, position - base,
                                         f"frame length {frame_length}: the data ends here, before position "
                                         f"{to_position} (zeroed or damaged)")
                    return
                problem = frame_problem(position, frame_length, fields[3], fields[4], fields[7],
                                        term_length=term_length, initial_term_id=initial_term_id,
                                        mtu_length=mtu_length)
                if problem is not None:
                    raise FrameError(self.segment_path(position), position, position - base, problem)
                aligned = (frame_length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
                stored = HEADER_LENGTH if fields[3] == HDR_TYPE_PAD else aligned
                if offset + stored > held and held < want:
                    raise self.truncated(position, f"the frame of length {frame_length} here is cut")
                if offset + stored > want:
                    if stored > len(chunk):  # a DATA frame longer than a chunk (no MTU known): make room
                        chunk = memoryview(bytearray(align(stored, PAGE_SIZE)))
                    min_read = stored  # read again from this frame, with room for all of it
                    break
                yield SegmentFrame(position, fields, chunk, offset, base)
                offset += aligned
                position += aligned
                if offset >= want:
                    break

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> "SegmentReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_mtu_length(mtu_length: int, term_length: int) -> None:
    """Raise SegmentError unless mtu_length is a frame-aligned length a recording's frames can have."""
    if not HEADER_LENGTH < mtu_length <= min(MAX_MTU_LENGTH, term_length) or mtu_length % FRAME_ALIGNMENT:
        raise SegmentError(f"MTU {mtu_length} is not a multiple of {FRAME_ALIGNMENT} in "
                           f"{HEADER_LENGTH + FRAME_ALIGNMENT}..{min(MAX_MTU_LENGTH, term_length)}")


# -- recovering the end of a recording -------------------------------------------------------------


def _straddles_page_boundary(offset: int, length: int) -> bool:
    return offset // PAGE_SIZE != (offset + length - 1) // PAGE_SIZE


def _has_data_in_every_page_after_the_first(data, offset: int, aligned_length: int) -> bool:
    """Aeron's test for a frame written whole: each page it reaches into holds some non-zero byte."""
    end = offset + aligned_length
    page = (offset // PAGE_SIZE + 1) * PAGE_SIZE
    while page < end:
        if not any(data[page:min(page + PAGE_SIZE, end)]):
            return False
        page += PAGE_SIZE
    return True


def is_complete_frame(data, offset: int, aligned_length: int, checksum: Checksum | None) -> bool:
    """Whether a frame that straddles a page boundary was written whole, by Aeron's rule: its
    checksum matches (when the archive has checksums), or every page after its first holds data."""
    if checksum is not None:
        recorded = frame.INT32.unpack_from(data, offset + frame.SESSION_ID_OFFSET)[0]
        if checksum.compute(data[offset + HEADER_LENGTH:offset + aligned_length]) == recorded:
            return True
    return _has_data_in_every_page_after_the_first(data, offset, aligned_length)


def find_stop_position(archive_dir: str | os.PathLike, recording_id: int, start_position: int, term_length: int,
                       segment_length: int, *, checksum: Checksum | None = None,
                       on_torn: Callable[[Path], bool] | None = None,
                       segment_bases: list[int] | None = None) -> int:
    """Where a recording's data ends, from its files: for a recording left without a stop position.

    Walks the frames of the segment file with the highest base position (from the recording's
    first frame if that file is also its first) until a frame length <= 0. The last frame is
    suspect if it crosses a page boundary, since a crash may have persisted only some of its pages;
    it counts as whole if is_complete_frame() says so. Otherwise `on_torn(path)` decides: True
    truncates the file to drop the frame (zeroing it, the file keeping its length) and the stop
    position is the frame's start; False keeps it. Without on_torn, TornFrameError is raised, as
    Aeron's catalog refuses to start until `ArchiveTool verify` has been run.

    One deviation from Aeron: a PAD frame is never suspect. Only its 32-byte header is written, and
    a header never crosses a page, but Aeron's rule would find its zeroed body "missing".
    """
    if segment_bases is None:
        segment_bases = list_segment_files(archive_dir).get(recording_id, [])
    if not segment_bases:
        return start_position
    base = max(segment_bases)
    start_term_offset = start_position & (term_length - 1)
    start_term_base = start_position - start_term_offset
    file_offset = start_term_offset if base == start_term_base else 0
    path = Path(archive_dir) / segment_file_name(recording_id, base)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        limit = min(segment_length, size)
        if limit <= file_offset:
            return max(base + file_offset, start_position)
        with mmap.mmap(f.fileno(), limit, access=mmap.ACCESS_READ) as data:
            offset = file_offset
            last_length = 0
            last_type = HDR_TYPE_DATA
            unpack = frame.LENGTH_AND_TYPE.unpack_from
            while offset + HEADER_LENGTH <= limit:
                # The frames that chain from here to the term's end, found by the one frame walker;
                # then the one it stopped at, judged as before (a header that does not claim its
                # place is taken at its length, as a walk of old did).
                frames = walk(data, offset, min((offset | (term_length - 1)) + 1, limit),
                              term_offset=offset & (term_length - 1))
                if len(frames):
                    last_length = int(frames.ends[-1] - frames.starts[-1])
                    last_type = int(frames.types[-1])
                    offset = frames.end
                    if offset + HEADER_LENGTH > limit:
                        break
                frame_length, frame_type = unpack(data, offset)
                if frame_length <= 0:
                    break
                # A length that cannot be right would send the walk anywhere (the segment starts on
                # a term boundary, so file offsets share the terms' alignment).
                if frame_length < HEADER_LENGTH or offset + align(frame_length) > (offset | (term_length - 1)) + 1:
                    raise FrameError(path, base + offset, offset, frame_problem(
                        base + offset, frame_length, frame_type, offset & (term_length - 1), 0,
                        term_length=term_length))
                last_length = (frame_length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
                last_type = frame_type
                offset += last_length
            last_offset = offset - last_length
            torn = last_length > 0 and last_type != HDR_TYPE_PAD and (
                offset > limit  # claims more bytes than the file holds
                or (_straddles_page_boundary(last_offset, last_length)
                    and not is_complete_frame(data, last_offset, last_length, checksum)))
    if not torn:
        return max(base + offset, start_position)
    if on_torn is None:
        raise TornFrameError(path, base + last_offset)
    if not on_torn(path):
        return max(base + offset, start_position)
    log.warning("%s: truncating a torn last frame at position %d", path, base + last_offset)
    with open(path, "r+b") as f:
        os.ftruncate(f.fileno(), last_offset)
        os.ftruncate(f.fileno(), segment_length)
    return max(base + last_offset, start_position)

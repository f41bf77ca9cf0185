"""Checking an archive directory: does every file, frame and position agree with the catalog?

What Aeron's `ArchiveTool verify` checks, read-only, and reported as one line per problem, each
naming the file and the offset where it lies:
- the catalog opens (its layout is sound), and each descriptor's numbers can be right (lengths,
  alignments, a stop position a stream can reach);
- segment file names: each parses, belongs to a recording in the catalog, sits on one of the
  recording's segment boundaries, and lies within [start, stop]; no file between them is missing,
  none is a directory, and the last one reaches the stop position;
- frames from start to stop: each header's length, type, termOffset and termId are those of its
  position, its streamId is the recording's, and fragments make whole messages;
- the data ends exactly at stopPosition (neither short of it, zeroed or truncated, nor going on
  past it); a recording without a stop position (still recording, or an unclean shutdown) is walked
  to the end of its data, and a torn last frame is reported;
- checksums: each DATA frame's payload (alignment padding included) against its sessionId field,
  and each descriptor against its catalog checksum. With `checksum` given, that algorithm for every
  recording that carries checksums; without, each recording's own, found from its descriptor
  checksum (none if it is 0). A recording made without checksums (`workers.archiver --checksum
  none`, or an archive older than the crc32c default) says so by a descriptor checksum of 0, and its
  frames' sessionId fields hold the stream's sessionId: both must hold, so that damage zeroing the
  descriptor's checksum cannot silence the frame checks (see `frames_carry_checksums`);
- the event-time index (`<recordingId>.tindex`), when there is one: its header and checksums, and
  each entry against the message its segment holds at its position.
Other files (the mark file) are not looked at. Memory is bounded whatever the catalog says: frames
and index entries are streamed a chunk at a time, and missing segment files are counted, not listed.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ramen import message
from ramen.archive import segment
from ramen.archive.catalog import (CATALOG_FILE_NAME, NULL_POSITION, Catalog, CatalogError, RecordingDescriptor,
                                   RecordingState, layout_problem)
from ramen.archive.checksum import Checksum, crc32c_extend
from ramen.archive.segment import SEGMENT_SUFFIX, FrameError, MessageOrder, SegmentError, SegmentReader
from ramen.archive.time_index import (CRC_CHUNK_LENGTH, DISORDER_OFFSET, ENTRIES_CHECKSUM_OFFSET, ENTRY_DTYPE,
                                      ENTRY_LENGTH, INDEX_HEADER_LENGTH, IndexDamage, LegacyIndex, index_path,
                                      parse_header)
from ramen.transport.frame import BEGIN_FLAG, HDR_TYPE_DATA, HEADER_LENGTH, INT32, align

log = logging.getLogger(__name__)

MAX_PROBLEMS_PER_RECORDING = 20
"""Past this many, a recording's further problems are counted rather than listed."""
MAX_MISSING_NAMED = 5
"""Missing segment files named in one problem; the rest are counted."""


@dataclass
class ArchiveReport:
    """What `verify_archive_report` found: the problems, one line each (none: the archive is sound),
    and the recordings a requested checksum could not be checked on because they carry none."""

    problems: list[str] = field(default_factory=list)
    without_checksums: list[int] = field(default_factory=list)


def verify_archive(archive_dir: str | os.PathLike, *, checksum: Checksum | None = None) -> list[str]:
    """Every problem found in the archive, one line each; an empty list means the archive is sound."""
    return verify_archive_report(archive_dir, checksum=checksum).problems


def verify_archive_report(archive_dir: str | os.PathLike, *, checksum: Checksum | None = None) -> ArchiveReport:
    """The archive's problems, and which recordings carry no checksums for `checksum` to check
    (those are verified in every other respect)."""
    archive_dir = Path(archive_dir)
    report = ArchiveReport()
    try:
        catalog = Catalog.open(archive_dir)
    except CatalogError as e:
        report.problems.append(str(e))
        return report
    try:
        descriptors = catalog.descriptors()
        problems = report.problems
        problems.extend(_check_file_names(archive_dir, descriptors))
        for descriptor in descriptors:
            if descriptor.state == RecordingState.DELETED:
                continue
            rid = descriptor.recording_id
            algorithm = checksum
            if checksum is not None and descriptor.checksum == 0 and \
                    catalog.compute_descriptor_checksum(rid, checksum) != 0 and \
                    not frames_carry_checksums(archive_dir, descriptor, checksum):
                report.without_checksums.append(rid)
                algorithm = None
            elif checksum is None:
                try:
                    algorithm = catalog.descriptor_checksum(rid)
                except CatalogError as e:
                    problems.append(f"recording {rid}: {e}")
                    continue  # its numbers cannot be trusted to read the rest
            elif catalog.compute_descriptor_checksum(rid, checksum) != descriptor.checksum:
                problems.append(f"recording {rid}: {catalog.where(rid)}: catalog descriptor checksum "
                                f"{descriptor.checksum} does not match its {checksum.name} "
                                f"{catalog.compute_descriptor_checksum(rid, checksum)}")
            if catalog.checksum_is_stale(rid):  # read on: Aeron replays it
                problems.append(f"recording {rid}: {catalog.where(rid)}: catalog descriptor checksum "
                                f"{descriptor.checksum} is stale: made before its stop position and time were "
                                f"written (as Aeron's catalog refresh after an unclean stop leaves it; its frames "
                                f"are checked as they are)")
            problems.extend(verify_recording(archive_dir, descriptor, checksum=algorithm,
                                             catalog_where=catalog.where(rid)))
    finally:
        catalog.close()
    return report


def frames_carry_checksums(archive_dir: Path, d: RecordingDescriptor, checksum: Checksum) -> bool:
    """Whether the recording's frames hold `checksum` in their sessionId fields, judged by its first
    DATA frame: a frame without one keeps the stream's sessionId (the descriptor's), which a
    checksum equals once in 2**32. Unreadable frames count as carrying checksums, so that the full
    walk reports them; a recording without a DATA frame has nothing to check."""
    if layout_problem(d) is not None:
        return True  # its numbers cannot be trusted to read a frame: verify_recording names the problem
    reader = SegmentReader.for_recording(archive_dir, d)
    try:
        for f in reader.frames(d.start_position, None):
            if f.type == HDR_TYPE_DATA:
                return f.session_id != d.session_id or checksum.compute(f.padded_payload()) == f.session_id
    except SegmentError:
        return True
    finally:
        reader.close()
    return False


def _check_file_names(archive_dir: Path, descriptors: list[RecordingDescriptor]) -> list[str]:
    by_id = {d.recording_id: d for d in descriptors}
    problems = []
    for name in sorted(os.listdir(archive_dir)):
        if not name.endswith(SEGMENT_SUFFIX):
            continue
        parsed = segment.parse_segment_file_name(name)
        if parsed is None:
            problems.append(f"{archive_dir / name}: not a segment file name (<recordingId>-<basePosition>.rec)")
            continue
        recording_id, base = parsed
        d = by_id.get(recording_id)
        if d is None:
            problems.append(f"{archive_dir / name}: segment file of recording {recording_id}, which is not in "
                            f"the {CATALOG_FILE_NAME}")
        elif d.state == RecordingState.DELETED:
            problems.append(f"{archive_dir / name}: segment file of recording {recording_id}, which is DELETED")
    return problems


def verify_recording(archive_dir: str | os.PathLike, d: RecordingDescriptor, *,
                     checksum: Checksum | None = None, catalog_where: str | None = None) -> list[str]:
    """The problems of one recording (its descriptor, files, positions, frames, frame checksums and
    time index)."""
    archive_dir = Path(archive_dir)
    rid = d.recording_id
    where = f"recording {rid}"
    problems: list[str] = []
    if d.state != RecordingState.VALID:
        problems.append(f"{where}: marked {d.state.name} in the catalog")
    problem = layout_problem(d)
    if problem is not None:
        entry = f"{catalog_where}: " if catalog_where else ""
        return problems + [f"{where}: {entry}{problem} (damaged descriptor)"]
    start, stop = d.start_position, d.stop_position
    bases = segment.list_segment_files(archive_dir).get(rid, [])
    term_length, segment_length = d.term_buffer_length, d.segment_file_length
    first = segment.segment_file_base_position(start, start, term_length, segment_length)
    for base in bases:
        name = segment.segment_file_name(rid, base)
        if segment.segment_file_base_position(start, base, term_length, segment_length) != base:
            problems.append(f"{where}: {name}: base position {base} is not on a segment boundary of this recording")
        elif base < first:
            problems.append(f"{where}: {name}: segment lies before the start position {start} (left behind by a "
                            f"purge?)")
        elif stop != NULL_POSITION and base > segment.segment_file_base_position(start, stop, term_length,
                                                                                 segment_length):
            problems.append(f"{where}: {name}: segment lies past the stop position {stop}")

    end = stop
    if stop == NULL_POSITION:
        try:
            end = segment.find_stop_position(archive_dir, rid, start, term_length, segment_length, checksum=checksum,
                                             on_torn=None, segment_bases=bases)
        except SegmentError as e:
            return problems + [f"{where}: {e}"]
    files_problem = _check_files(archive_dir, d, bases, first, end)
    if files_problem is not None:
        return problems + [files_problem]
    problems.extend(_check_frames(archive_dir, d, end, checksum))
    return problems


def _check_files(archive_dir: Path, d: RecordingDescriptor, bases: list[int], first: int, end: int) -> str | None:
    """The files holding [start, end) must all be there, and be files: counted by arithmetic and
    walked over the files present, never listed from the positions (which may be anything)."""
    rid, start, segment_length = d.recording_id, d.start_position, d.segment_file_length
    if end <= start:
        return None
    last = segment.segment_file_base_position(start, end - 1, d.term_buffer_length, segment_length)
    present = [b for b in bases if first <= b <= last]
    if last not in present:
        if not present:
            return (f"recording {rid}: no segment file holds its positions {start}..{end} (the first would be "
                    f"{archive_dir / segment.segment_file_name(rid, first)})")
        return (f"recording {rid}: stop position {end} lies past the end of its segment files: the last, "
                f"{archive_dir / segment.segment_file_name(rid, present[-1])}, ends at offset {segment_length} "
                f"(position {present[-1] + segment_length})")
    expected = (last - first) // segment_length + 1
    if len(present) < expected:
        missing = []
        previous = first - segment_length
        for base in present:
            for gap in range(previous + segment_length, base, segment_length):
                if len(missing) == MAX_MISSING_NAMED:
                    break
                missing.append(gap)
            previous = base
        more = expected - len(present) - 1
        others = ", ".join(segment.segment_file_name(rid, b) for b in missing[1:])
        return (f"recording {rid}: {archive_dir / segment.segment_file_name(rid, missing[0])} offset 0: missing "
                f"segment file (positions {max(start, missing[0])}..{min(end, missing[0] + segment_length)} are lost)"
                + (f"; {more} more missing: {others}{', …' if more > len(missing) - 1 else ''}" if more else ""))
    for base in present:
        path = archive_dir / segment.segment_file_name(rid, base)
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            return f"recording {rid}: {path} offset 0: is {what}, not a segment file (it holds positions from {base})"
    return None


def _check_frames(archive_dir: Path, d: RecordingDescriptor, end: int, checksum: Checksum | None) -> list[str]:
    rid = d.recording_id
    where = f"recording {rid}"
    problems: list[str] = []
    extra = 0
    order = MessageOrder()
    index = IndexCheck.open(archive_dir, d)
    reader = SegmentReader.for_recording(archive_dir, d)
    active = d.stop_position == NULL_POSITION
    try:
        for f in reader.frames(d.start_position, end, strict=True):
            position = f.position
            here = f"{where}: position {position} ({reader.segment_path(position)} offset {f.file_offset})"
            if f.stream_id != d.stream_id:
                problems.append(f"{here}: frame header does not fit its position: streamId {f.stream_id} "
                                f"(expected {d.stream_id})")
                return problems  # lengths can no longer be trusted to find the next frame
            if f.end_position > end:
                problems.append(f"{here}: frame of length {f.length} runs past the stop position {end}")
                return problems
            problem = order.problem(position, f.type, f.flags)
            if problem is not None:
                problems.append(f"{here}: {problem}")
                return problems
            if f.type != HDR_TYPE_DATA:
                continue
            if checksum is not None:
                computed = checksum.compute(f.padded_payload())
                if computed != f.session_id:
                    if len(problems) < MAX_PROBLEMS_PER_RECORDING:
                        problems.append(f"{here}: {checksum.name} checksum of the payload is {computed}, the frame "
                                        f"records {f.session_id} (damaged data)")
                    else:
                        extra += 1
                    continue
            if index is not None and f.flags & BEGIN_FLAG and f.length >= HEADER_LENGTH + message.HEADER_LENGTH:
                bounds = message.event_time_bounds(f.buffer, f.offset + HEADER_LENGTH)
                if bounds is not None:
                    index.message(position, bounds[0], bounds[1])
    except FrameError as e:
        return problems + [f"{where}: position {e.position} ({e.path} offset {e.file_offset}): {e.problem}"]
    except SegmentError as e:
        return problems + [f"{where}: {e}"]
    finally:
        reader.close()
        if index is not None:
            index.close()
    if extra:
        problems.append(f"{where}: {extra} more checksum mismatches")
    if problems:
        return problems
    if d.stop_position != NULL_POSITION:
        problems.extend(_check_nothing_after_stop(archive_dir, d))
    if index is not None and not problems:
        problem = index.finish(complete=not active)
        if problem is not None:
            problems.append(f"{where}: {problem}")
    return problems


def _check_nothing_after_stop(archive_dir: Path, d: RecordingDescriptor) -> list[str]:
    """A frame right after the stop position means the catalog lost the end of the recording."""
    stop = d.stop_position
    term_length = d.term_buffer_length
    reader = SegmentReader.for_recording(archive_dir, d)
    try:
        buffer = bytearray(HEADER_LENGTH)
        if reader.read(stop, buffer) < HEADER_LENGTH:
            return []
        length = INT32.unpack_from(buffer, 0)[0]
    except SegmentError:
        return []  # no file holds the position after the stop: nothing was written there
    finally:
        reader.close()
    if length > 0 and (stop & (term_length - 1)) + align(length) <= term_length:
        return [f"recording {d.recording_id}: a frame of length {length} follows the stop position {stop}: the data "
                f"goes on past it"]
    return []


class IndexCheck:
    """The recording's time index read alongside the frame walk: each message the recorder indexes
    must be the next entry, exactly; entries are read a chunk at a time and their checksum is
    computed as they go. The first problem is kept (one line); the rest are not looked for."""

    def __init__(self, path: Path, fd: int, count: int, checksum: int | None, header_problem: str | None) -> None:
        self.path = path
        self._fd = fd
        self.count = count
        self._checksum = checksum  # None: a version-1 index, without checksums
        self.problem = header_problem
        self._crc = 0
        self._next = 0  # index of the next entry
        self._chunk = np.zeros(0, dtype=ENTRY_DTYPE)
        self._chunk_start = 0
        self._last_running_max: int | None = None
        self._disorder_needed = 0
        self._extra_at: int | None = None  # the first message past the index's entries
        self.disorder_us = 0

    @classmethod
    def open(cls, archive_dir: Path, d: RecordingDescriptor) -> "IndexCheck | None":
        path = index_path(archive_dir, d.recording_id)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None  # recorded without an index (or by Aeron): nothing to check
        except OSError as e:
            check = cls(path, -1, 0, None, f"{path}: cannot open the time index: {e.strerror}")
            return check
        raw = os.pread(fd, INDEX_HEADER_LENGTH, 0)  # before the size: the recorder may be appending
        size = os.fstat(fd).st_size
        try:
            header = parse_header(path, raw, size, d.recording_id)
        except LegacyIndex as legacy:
            check = cls(path, fd, legacy.header.count, None, None)
            check.disorder_us = legacy.header.disorder_us
            return check
        except IndexDamage as damage:
            return cls(path, fd, 0, None, f"{damage} (a replay rebuilds it from the segments)")
        check = cls(path, fd, header.count, header.entries_checksum, None)
        check.disorder_us = header.disorder_us
        return check

    def _entry(self, i: int):
        if not self._chunk_start <= i < self._chunk_start + len(self._chunk):
            count = min(CRC_CHUNK_LENGTH // ENTRY_LENGTH, self.count - i)
            data = os.pread(self._fd, count * ENTRY_LENGTH, INDEX_HEADER_LENGTH + i * ENTRY_LENGTH)
            self._crc = crc32c_extend(data, self._crc)
            self._chunk = np.frombuffer(data, dtype=ENTRY_DTYPE)
            self._chunk_start = i
        return self._chunk[i - self._chunk_start]

    def _offset(self, i: int) -> int:
        return INDEX_HEADER_LENGTH + i * ENTRY_LENGTH

    def message(self, position: int, low: int, high: int) -> None:
        """The next message the recorder indexed, as the segments hold it."""
        if self.problem is not None:
            return
        i = self._next
        if i >= self.count:
            self._next += 1  # an active recording's index lags its segments; a stopped one's must not
            if self._extra_at is None:
                self._extra_at = position
            return
        entry = self._entry(i)
        running_max = high if self._last_running_max is None else max(self._last_running_max, high)
        if self._last_running_max is not None:
            self._disorder_needed = max(self._disorder_needed, self._last_running_max - low)
        expected = (position, low, high, running_max)
        got = tuple(int(v) for v in entry)
        if got != expected:
            self.problem = (f"{self.path} offset {self._offset(i)}: entry {i} says position {got[0]}, event times "
                            f"{got[1]}..{got[2]}, running max {got[3]}; the segments say position {expected[0]}, "
                            f"{expected[1]}..{expected[2]}, running max {expected[3]} (damaged index: a replay "
                            f"rebuilds it)")
        self._last_running_max = running_max
        self._next += 1

    def finish(self, *, complete: bool) -> str | None:
        """The first problem, once the walk is over (`complete`: the recording is stopped, so the
        index must hold every message)."""
        if self.problem is not None:
            return self.problem
        if self._next < self.count:
            return (f"{self.path} offset {self._offset(self._next)}: {self.count - self._next} entries past the "
                    f"recording's last message (damaged index: a replay rebuilds it)")
        if complete and self._extra_at is not None:
            return (f"{self.path} offset {self._offset(self.count)}: the index ends before the message at position "
                    f"{self._extra_at} and {self._next - self.count - 1} more (left behind by a crash? the archiver "
                    f"catches it up when it starts)")
        if self._disorder_needed > self.disorder_us:
            return (f"{self.path} offset {DISORDER_OFFSET}: disorder {self.disorder_us} µs, the entries need "
                    f"{self._disorder_needed} "
                    f"(damaged index: a replay rebuilds it)")
        if self._checksum is not None and self.count:
            self._entry(self.count - 1)  # read whatever the walk did not need, for the checksum
            if self._crc != self._checksum:
                return (f"{self.path} offset {ENTRIES_CHECKSUM_OFFSET}: the checksum of its {self.count} entries does "
                        f"not match (damaged index: a replay rebuilds it)")
        return None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


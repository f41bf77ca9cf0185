"""Checking an archive directory: does every file, frame and position agree with the catalog?

What Aeron's `ArchiveTool verify` checks, read-only, and reported as one line per problem:
- the catalog opens (its layout is sound);
- segment file names: each parses, belongs to a recording in the catalog, sits on one of the
  recording's segment boundaries, and lies within [start, stop]; no file between them is missing;
- positions: start and stop frame-aligned, stop not before start;
- frames from start to stop: each header's termOffset and termId are those of its position, its
  streamId is the recording's, its length is sane, its type DATA or PAD;
- the last frame ends exactly at stopPosition (data neither stops short nor goes on past it);
  a recording without a stop position (still recording, or an unclean shutdown) is walked to the
  end of its data, and a torn last frame is reported;
- with a checksum: each DATA frame's payload (alignment padding included) against its sessionId
  field, and each descriptor against its catalog checksum.
Other files (the mark file, indexes kept beside the recordings) are not looked at.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ramen.archive import segment
from ramen.archive.catalog import (CATALOG_FILE_NAME, NULL_POSITION, Catalog, CatalogError, RecordingDescriptor,
                                   RecordingState)
from ramen.archive.checksum import Checksum
from ramen.archive.segment import SEGMENT_SUFFIX, SegmentError, SegmentReader
from ramen.transport.frame import FRAME_ALIGNMENT, HDR_TYPE_DATA, HDR_TYPE_PAD, HEADER_LENGTH, align
from ramen.transport.position import int32, position_bits_to_shift

log = logging.getLogger(__name__)

MAX_PROBLEMS_PER_RECORDING = 20
"""Past this many, a recording's further problems are counted rather than listed."""


def verify_archive(archive_dir: str | os.PathLike, *, checksum: Checksum | None = None) -> list[str]:
    """Every problem found in the archive, one line each; an empty list means the archive is sound."""
    archive_dir = Path(archive_dir)
    try:
        catalog = Catalog.open(archive_dir)
    except CatalogError as e:
        return [str(e)]
    try:
        descriptors = catalog.descriptors()
        problems = _check_file_names(archive_dir, descriptors)
        for descriptor in descriptors:
            if descriptor.state == RecordingState.DELETED:
                continue
            found = verify_recording(archive_dir, descriptor, checksum=checksum)
            if checksum is not None:
                computed = catalog.compute_descriptor_checksum(descriptor.recording_id, checksum)
                if computed != descriptor.checksum:
                    found.insert(0, f"recording {descriptor.recording_id}: catalog descriptor checksum "
                                    f"{descriptor.checksum} does not match its {checksum.name} {computed}")
            problems.extend(found)
    finally:
        catalog.close()
    return problems


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
                     checksum: Checksum | None = None) -> list[str]:
    """The problems of one recording (its files, positions, frames and frame checksums)."""
    archive_dir = Path(archive_dir)
    rid = d.recording_id
    where = f"recording {rid}"
    problems: list[str] = []
    if d.state != RecordingState.VALID:
        problems.append(f"{where}: marked {d.state.name} in the catalog")
    try:
        segment.check_segment_file_length(d.segment_file_length, d.term_buffer_length)
    except ValueError as e:
        return problems + [f"{where}: {e}"]
    start, stop = d.start_position, d.stop_position
    if start < 0 or start & (FRAME_ALIGNMENT - 1):
        return problems + [f"{where}: start position {start} is not a non-negative multiple of {FRAME_ALIGNMENT}"]
    if stop != NULL_POSITION and (stop < start or stop & (FRAME_ALIGNMENT - 1)):
        return problems + [f"{where}: stop position {stop} is not an aligned position at or after the start "
                           f"position {start}"]

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
    last = segment.segment_file_base_position(start, max(start, end - 1), term_length, segment_length)
    if end > start:
        present = set(bases)
        missing = [b for b in range(first, last + 1, segment_length) if b not in present]
        if missing:
            names = ", ".join(segment.segment_file_name(rid, b) for b in missing)
            return problems + [f"{where}: missing segment file(s) {names} (positions {start}..{end})"]
    problems.extend(_check_frames(archive_dir, d, end, checksum))
    return problems


def _check_frames(archive_dir: Path, d: RecordingDescriptor, end: int, checksum: Checksum | None) -> list[str]:
    rid = d.recording_id
    where = f"recording {rid}"
    bits = position_bits_to_shift(d.term_buffer_length)
    mask = d.term_buffer_length - 1
    problems: list[str] = []
    extra = 0
    position = d.start_position
    reader = SegmentReader.for_recording(archive_dir, d)
    try:
        for f in reader.frames(d.start_position, end):
            position = f.position
            here = f"{where}: position {position} ({reader.segment_path(position).name} offset {f.file_offset})"
            expected_term_id = int32(d.initial_term_id + (position >> bits))
            wrong = []
            if f.term_offset != position & mask:
                wrong.append(f"termOffset {f.term_offset} (expected {position & mask})")
            if f.term_id != expected_term_id:
                wrong.append(f"termId {f.term_id} (expected {expected_term_id})")
            if f.stream_id != d.stream_id:
                wrong.append(f"streamId {f.stream_id} (expected {d.stream_id})")
            if f.type not in (HDR_TYPE_DATA, HDR_TYPE_PAD):
                wrong.append(f"frame type {f.type} (expected DATA or PAD)")
            if wrong:
                problems.append(f"{here}: frame header does not fit its position: {', '.join(wrong)}")
                return problems  # lengths can no longer be trusted to find the next frame
            if f.end_position > end:
                problems.append(f"{here}: frame of length {f.length} runs past the stop position {end}")
                return problems
            if checksum is not None and f.type == HDR_TYPE_DATA:
                computed = checksum.compute(f.padded_payload())
                if computed != f.session_id:
                    if len(problems) < MAX_PROBLEMS_PER_RECORDING:
                        problems.append(f"{here}: {checksum.name} checksum of the payload is {computed}, the frame "
                                        f"records {f.session_id} (damaged data)")
                    else:
                        extra += 1
            position = f.end_position
    except SegmentError as e:
        return problems + [f"{where}: {e}"]
    finally:
        reader.close()
    if extra:
        problems.append(f"{where}: {extra} more checksum mismatches")
    if position < end:
        problems.append(f"{where}: data ends at position {position}, before the stop position {end}")
    elif d.stop_position != NULL_POSITION:
        problems.extend(_check_nothing_after_stop(archive_dir, d))
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
        length = int.from_bytes(buffer[:4], "little", signed=True)
    except SegmentError:
        return []  # no file holds the position after the stop: nothing was written there
    finally:
        reader.close()
    if length > 0 and (stop & (term_length - 1)) + align(length) <= term_length:
        return [f"recording {d.recording_id}: a frame of length {length} follows the stop position {stop}: the data "
                f"goes on past it"]
    return []

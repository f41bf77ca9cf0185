"""Rebuilding a recording's event-time index from its segments: what the recorder would have
indexed, message by message, for an index that is damaged, of an old version, or behind its
segments after a crash (see time_index.py).

The recorder indexes every ramen message that begins in what it records: a DATA frame with the
BEGIN flag whose payload holds a ramen header with event-time bounds. Walking the segments with
the same rule gives the same entries. The walk checks every frame (and its checksum, when the
recording has them): an index is never rebuilt from damaged data.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ramen import message
from ramen.archive.catalog import CATALOG_FILE_NAME, NULL_POSITION, Catalog, CatalogError, layout_problem
from ramen.archive.checksum import Checksum
from ramen.archive.errors import ArchiveError
from ramen.archive.segment import SegmentError, SegmentReader
from ramen.transport.frame import BEGIN_FLAG, HDR_TYPE_DATA, HEADER_LENGTH

Message = tuple[int, int, int]
"""(position of its first frame, min event time µs, max event time µs): one index entry's source."""


class StaleEntry(ArchiveError):
    """An index entry that does not name the message its segment holds at its position."""


class Recording:
    """What rebuilding needs of a recording: its descriptor and its frame checksum algorithm."""

    def __init__(self, descriptor, checksum: Checksum | None) -> None:
        self.descriptor = descriptor
        self.checksum = checksum

    @property
    def is_stopped(self) -> bool:
        return self.descriptor.stop_position != NULL_POSITION


def find_recording(archive_dir: Path, recording_id: int, descriptor=None) -> Recording:
    """The recording an index beside a catalog belongs to (its descriptor checked), or the one given
    (whose checksum algorithm, if any, is then unknown)."""
    if descriptor is not None:
        return Recording(descriptor, None)
    if not (archive_dir / CATALOG_FILE_NAME).is_file():
        raise CatalogError(f"{archive_dir}: no {CATALOG_FILE_NAME} beside the index to find recording {recording_id}")
    with Catalog.open(archive_dir) as catalog:
        found = catalog.find(recording_id)
        if found is None:
            raise CatalogError(f"{catalog.path}: no recording {recording_id}")
        problem = layout_problem(found)
        if problem is not None:
            raise CatalogError(f"{catalog.where(recording_id)}: recording {recording_id}: {problem}")
        return Recording(found, catalog.descriptor_checksum(recording_id))


def indexed_messages(archive_dir: Path, recording: Recording, from_position: int | None = None) -> Iterator[Message]:
    """The messages the recorder indexes, from from_position (a frame start; default the
    recording's start) to its stop position (or, for an active recording, the end of its data)."""
    d = recording.descriptor
    checksum = recording.checksum
    stop = None if d.stop_position == NULL_POSITION else d.stop_position
    with SegmentReader.for_recording(archive_dir, d) as reader:
        for f in reader.frames(from_position, stop, strict=stop is not None):
            if f.type != HDR_TYPE_DATA:
                continue
            if checksum is not None and checksum.compute(f.padded_payload()) != f.session_id:
                raise SegmentError(f"{reader.where(f.position)} (position {f.position}): {checksum.name} checksum "
                                   f"of the payload does not match the frame's (damaged data)")
            if f.flags & BEGIN_FLAG and f.length >= HEADER_LENGTH + message.HEADER_LENGTH:
                bounds = message.event_time_bounds(f.buffer, f.offset + HEADER_LENGTH)
                if bounds is not None:
                    yield f.position, bounds[0], bounds[1]


def messages_after(archive_dir: Path, recording: Recording, last_entry: tuple | None) -> list[Message]:
    """The messages the segments hold after an index's last entry (all of them without one). The
    last entry must name the message at its position (StaleEntry otherwise: the index belongs to
    other data)."""
    start = recording.descriptor.start_position
    if last_entry is None or last_entry[0] < start:
        return list(indexed_messages(archive_dir, recording))
    position, low, high = last_entry[:3]
    found = indexed_messages(archive_dir, recording, position)
    first = next(found, None)
    if first != (position, low, high):
        raise StaleEntry(f"its last entry says a message at position {position} with event times {low}..{high}; "
                         f"the segments hold {'nothing there' if first is None else first}")
    return list(found)

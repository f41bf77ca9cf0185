"""Retention: dropping a recording's oldest data, whole segment files at a time.

Aeron's purgeSegments rules, which keep every remaining position readable:
- the new start position is a segment base of the recording (segment_file_base_position), so the
  recording's first remaining file starts exactly at its start;
- at least one whole segment goes, or nothing happens;
- the segment holding the recording's end (its stop position, or, while it is being recorded, the
  last segment file) is never deleted: the recorder may be writing it.
The catalog's startPosition moves first and is flushed; the files go after. A crash in between
leaves files before the start, which the next purge (or `ramen archive verify`) finds.

Purging by time needs a map from event time to position (the time index, kept elsewhere). Without
one, only the descriptor's timestamps are known, and they say little: a recording that stopped
before the cutoff can go (all but its last segment); otherwise nothing is known to be older, and
nothing is purged.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ramen.archive import segment
from ramen.archive.catalog import NULL_POSITION, NULL_TIMESTAMP, Catalog, RecordingState
from ramen.archive.errors import ArchiveError
from ramen.archive.gaps import gaps_path
from ramen.archive.time_index import index_path

log = logging.getLogger(__name__)


class RetentionError(ArchiveError):
    """A purge that may not be done; the message says why."""


@dataclass(frozen=True)
class PurgeResult:
    recording_id: int
    old_start_position: int
    new_start_position: int
    deleted: list[Path] = field(default_factory=list)

    @property
    def purged(self) -> bool:
        return self.new_start_position != self.old_start_position or bool(self.deleted)


def purge_before(catalog: Catalog, recording_id: int, position: int) -> PurgeResult:
    """Delete the segments of a recording that lie wholly before `position`; move its start."""
    if position < 0:
        raise RetentionError(f"purge position {position} is negative")
    d = catalog.get(recording_id)
    if d.state == RecordingState.DELETED:
        raise RetentionError(f"recording {recording_id} is DELETED")
    archive_dir = catalog.path.parent
    term_length, segment_length = d.term_buffer_length, d.segment_file_length
    start = d.start_position
    bases = segment.list_segment_files(archive_dir).get(recording_id, [])
    first = segment.segment_file_base_position(start, start, term_length, segment_length)
    if d.stop_position != NULL_POSITION:
        last = segment.segment_file_base_position(start, d.stop_position, term_length, segment_length)
    else:
        last = max(bases, default=first)  # still recording (or not yet refreshed): its last file is in use
    new_start = min(segment.segment_file_base_position(start, max(position, start), term_length, segment_length),
                    last)
    if new_start <= first:
        new_start = start  # not one whole segment before `position`: nothing to do
    else:
        catalog.set_start_position(recording_id, new_start)
        catalog.flush()
        log.info("recording %d: start position %d -> %d", recording_id, start, new_start)
    deleted = []
    for base in bases:
        if base < segment.segment_file_base_position(new_start, new_start, term_length, segment_length):
            path = archive_dir / segment.segment_file_name(recording_id, base)
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            deleted.append(path)
    return PurgeResult(recording_id, start, new_start, deleted)


def purge_before_time(catalog: Catalog, recording_id: int, time_ms: int, *,
                      time_to_position: Callable[[int], int | None] | None = None) -> PurgeResult:
    """Purge what was recorded before epoch time `time_ms`.

    time_to_position maps a time to the position of the first data at or after it (None: unknown);
    without it, see the module docstring.
    """
    d = catalog.get(recording_id)
    if time_to_position is not None:
        position = time_to_position(time_ms)
    elif (d.stop_position != NULL_POSITION and d.stop_timestamp != NULL_TIMESTAMP
          and d.stop_timestamp <= time_ms):
        position = d.stop_position
    else:
        position = None
    if position is None:
        return PurgeResult(recording_id, d.start_position, d.start_position)
    return purge_before(catalog, recording_id, position)


def purge_to_size(catalog: Catalog, recording_id: int, max_bytes: int) -> PurgeResult:
    """Keep at most about `max_bytes` of a recording: purge whole segments before its last
    `max_bytes` (rounded so that at least max_bytes stay; the last segment always stays)."""
    if max_bytes < 0:
        raise RetentionError(f"size limit {max_bytes} is negative")
    d = catalog.get(recording_id)
    if d.stop_position != NULL_POSITION:
        end = d.stop_position
    else:
        bases = segment.list_segment_files(catalog.path.parent).get(recording_id, [])
        end = max(bases, default=d.start_position)  # recording: count from its last file's start
    return purge_before(catalog, recording_id, max(d.start_position, end - max_bytes))


def delete_recording(catalog: Catalog, recording_id: int) -> list[Path]:
    """Drop a whole stopped recording (`ramen kill --purge`): DELETED in the catalog first, as Aeron
    does, then its segment files and time index. A live recording (no stop position) is refused."""
    descriptor = catalog.get(recording_id)
    if descriptor.stop_position == NULL_POSITION:
        raise RetentionError(f"recording {recording_id} is still being recorded: stop its archiver first")
    catalog.change_state(recording_id, RecordingState.DELETED)
    catalog.flush()
    archive_dir = catalog.path.parent
    paths = [archive_dir / segment.segment_file_name(recording_id, base)
             for base in segment.list_segment_files(archive_dir).get(recording_id, [])]
    paths += [index_path(archive_dir, recording_id), gaps_path(archive_dir, recording_id)]
    deleted = []
    for path in paths:
        try:
            os.unlink(path)
            deleted.append(path)
        except FileNotFoundError:
            pass
    log.info("recording %d deleted (%d files)", recording_id, len(deleted))
    return deleted

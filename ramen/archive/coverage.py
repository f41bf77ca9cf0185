"""Which event times an archive directory can replay, per function: what replay planning asks
before it picks its sources, and which recordings a replayer must then read.

Conventions (shared with the archiver, which makes the recordings):
- A function's output is recorded in its site's archive directory with `originalChannel` and
  `strippedChannel` both `ramen:<prog>/<func>` (`function_channel`). Other channels (plain Aeron
  recordings) belong to no function and are ignored here.
- Every restart of a worker starts a new recording of the same function, so a function has any
  number of recordings.
- The coverage of one recording is [first message's min event time, max event time of every
  message up to the last], as its time index holds them, made half-open by adding 1 µs: the
  last tuple's time is covered. The time index's running max is used for the end because a
  late last message would otherwise hide what came before it. A recording without an index file,
  or with an empty one, covers nothing: nothing says where its data lies.
- A function's coverage is the union of its valid recordings' coverage, merged where intervals
  overlap or touch; INVALID and DELETED recordings count for nothing. Gaps between recordings
  (a worker that was down) stay gaps: nothing was recorded then.

Only the catalog and the index files are read, never the segments: planning a replay of a
week-long archive costs a few small reads.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ramen.archive.catalog import CATALOG_FILE_NAME, NULL_POSITION, Catalog, RecordingDescriptor, RecordingState
from ramen.archive.gaps import gaps_path, read_gaps
from ramen.archive.replay import positions_for_times
from ramen.archive.time_index import TimeIndex, TimeIndexError, index_path

log = logging.getLogger(__name__)

FUNCTION_CHANNEL_PREFIX = "ramen:"
"""In front of the qualified function name in the channel of a function's recordings."""
COVERED_PAST_LAST_US = 1
"""µs added to the last covered event time to make a half-open interval that contains it."""


@dataclass(frozen=True, order=True)
class Interval:
    """Event times [since_us, until_us), µs since the epoch, UTC."""
    since_us: int
    until_us: int

    def __post_init__(self) -> None:
        if self.until_us < self.since_us:
            raise ValueError(f"interval ends ({self.until_us}) before it starts ({self.since_us})")

    def contains(self, since_us: int, until_us: int) -> bool:
        return self.since_us <= since_us and until_us <= self.until_us

    def overlaps(self, since_us: int, until_us: int) -> bool:
        return self.since_us < until_us and since_us < self.until_us


@dataclass(frozen=True)
class RecordingRange:
    """The part of one recording a replayer must read: [start_position, stop_position), stop None
    when the recording is still active and the end is not known yet (follow it)."""
    recording_id: int
    start_position: int
    stop_position: int | None


def function_channel(qualified_name: str) -> str:
    """The channel a function's recordings carry: `ramen:net/traffic`."""
    return FUNCTION_CHANNEL_PREFIX + qualified_name


def function_of_channel(channel: str) -> str | None:
    """The qualified function name a recording channel belongs to, None for other channels."""
    if not channel.startswith(FUNCTION_CHANNEL_PREFIX):
        return None
    return channel[len(FUNCTION_CHANNEL_PREFIX):] or None


def merge(intervals: list[Interval]) -> list[Interval]:
    """Sorted intervals, the overlapping or touching ones merged into one."""
    merged: list[Interval] = []
    for interval in sorted(intervals):
        if merged and interval.since_us <= merged[-1].until_us:
            if interval.until_us > merged[-1].until_us:
                merged[-1] = Interval(merged[-1].since_us, interval.until_us)
        else:
            merged.append(interval)
    return merged


def recording_coverage(archive_dir: str | os.PathLike, descriptor: RecordingDescriptor) -> Interval | None:
    """The event times one recording holds, from its time index alone; None when nothing says."""
    path = index_path(archive_dir, descriptor.recording_id)
    try:
        index = TimeIndex.open(path, descriptor.recording_id, descriptor=descriptor)
    except FileNotFoundError:
        log.debug("recording %d has no time index: it covers nothing", descriptor.recording_id)
        return None
    except TimeIndexError as e:
        log.warning("%s; recording %d covers nothing", e, descriptor.recording_id)
        return None
    try:
        if not len(index):
            return None
        first_min = int(index.entries["min_time"][0])
        last_max = int(index.entries["running_max"][-1])
    finally:
        index.close()
    return Interval(first_min, max(first_min, last_max) + COVERED_PAST_LAST_US)


def function_recordings(archive_dir: str | os.PathLike) -> dict[str, list[RecordingDescriptor]]:
    """Qualified name -> the valid recordings of that function, in recording id order. An
    archive directory without a catalog has recorded nothing yet: empty."""
    if not (Path(archive_dir) / CATALOG_FILE_NAME).exists():
        return {}
    recordings: dict[str, list[RecordingDescriptor]] = {}
    with Catalog.open(archive_dir) as catalog:
        for descriptor in catalog.descriptors(states=(RecordingState.VALID,)):
            name = function_of_channel(descriptor.stripped_channel)
            if name is not None:
                recordings.setdefault(name, []).append(descriptor)
    return recordings


def archive_coverage(archive_dir: str | os.PathLike) -> dict[str, list[Interval]]:
    """Qualified name -> sorted, merged intervals of event time its archive can replay, less the
    gaps its recordings hold (gaps.py: windows a worker may have missed rows of). Functions whose
    recordings all cover nothing are left out."""
    coverage: dict[str, list[Interval]] = {}
    for name, descriptors in function_recordings(archive_dir).items():
        intervals = [i for d in descriptors if (i := recording_coverage(archive_dir, d)) is not None]
        gaps = [gap for d in descriptors for gap in read_gaps(gaps_path(archive_dir, d.recording_id))]
        if intervals and (covered := without(merge(intervals), gaps)):
            coverage[name] = covered
    return coverage


def without(intervals: list[Interval], gaps: list[tuple[int, int]]) -> list[Interval]:
    """Sorted, merged intervals less the [since, until) gaps."""
    for since_us, until_us in gaps:
        intervals = [part for interval in intervals for part in (
            (interval,) if not interval.overlaps(since_us, until_us) else
            (Interval(interval.since_us, since_us), Interval(until_us, interval.until_us)))
            if part.since_us < part.until_us]
    return intervals


def last_event_time_us(archive_dir: str | os.PathLike, qualified_name: str) -> int | None:
    """The latest event time any recording of a function holds, None if none holds any: where a
    restarted source goes on when its live log no longer says."""
    ends = [interval.until_us - COVERED_PAST_LAST_US
            for descriptor in function_recordings(archive_dir).get(qualified_name, [])
            if (interval := recording_coverage(archive_dir, descriptor)) is not None]
    return max(ends, default=None)


def recordings_for(archive_dir: str | os.PathLike, qualified_name: str, since_us: int,
                   until_us: int) -> list[RecordingRange]:
    """The recordings of `qualified_name` that hold event times in [since_us, until_us), oldest
    data first, each with the positions to replay, found in O(log n) in its time index. A stopped
    recording's stop is always known (the index's, else the catalog's); only an active one may
    have None."""
    ranges = []
    for descriptor in function_recordings(archive_dir).get(qualified_name, []):
        interval = recording_coverage(archive_dir, descriptor)
        if interval is None or not interval.overlaps(since_us, until_us):
            continue
        start, stop = positions_for_times(archive_dir, descriptor, since_us, until_us)
        if start is None:
            continue
        if stop is None and descriptor.stop_position != NULL_POSITION:
            stop = descriptor.stop_position
        if stop is not None and stop <= start:
            continue
        ranges.append((interval.since_us, RecordingRange(descriptor.recording_id, start, stop)))
    return [r for _, r in sorted(ranges, key=lambda pair: (pair[0], pair[1].recording_id))]

"""Where a restarted source goes on: right after the last row it wrote, so that its stream has no
row twice and no gap the archive cannot see (docs/runtime.md, KIND_RESUMED)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from ramen.archive.coverage import last_event_time_us as archived_last_event_time_us
from ramen.message import HEADER_LENGTH, KIND_TUPLES, NO_EVENT_TIME, decode_header
from ramen.transport import LogBuffer, frame

log = logging.getLogger(__name__)


def last_event_time_us(buffer: LogBuffer) -> int | None:
    """The largest event time in the messages of the active and previous terms of a log: where a
    restarted source resumes. Frames from older rotations (a stale term id) are ignored."""
    term_count = buffer.active_term_count
    best = None
    for count in (term_count - 1, term_count):
        if count < 0:
            continue
        term = buffer.terms[count % 3]
        term_id = buffer.initial_term_id + count
        offset = 0
        while offset + frame.HEADER_LENGTH <= buffer.term_length:
            fields = frame.HEADER.unpack_from(term, offset)
            length, flags, kind, found_term_id = fields[0], fields[2], fields[3], fields[7]
            if length <= 0 or found_term_id != term_id:
                break
            if kind == frame.HDR_TYPE_DATA and flags & frame.BEGIN_FLAG and \
                    length >= frame.HEADER_LENGTH + HEADER_LENGTH:
                header = decode_header(term, offset + frame.HEADER_LENGTH)
                if header is not None and header.kind == KIND_TUPLES and header.max_event_time_us != NO_EVENT_TIME:
                    best = header.max_event_time_us if best is None else max(best, header.max_event_time_us)
            offset += frame.align(length)
    return best


def last_written_us(name: str, live_log: LogBuffer, archive_dir: Path,
                    last_stats: Callable[[], dict | None]) -> int | None:
    """The event time a restarted source `name` resumes after: the last row in its live log (the two
    terms behind a log's tail are never cleaned, and a message its writer died writing is padding
    by now, not rows), or in its archive if its log is new (it was removed). Only when neither holds
    a row, the last its stats name (`last_stats`: the value of its stats key, read only then), which
    are up to a second old: rows written since then come again, and a warning says so. None:
    nothing was written."""
    in_log = last_event_time_us(live_log)
    in_archive = archived_last_event_time_us(archive_dir, name)
    written = [t for t in (in_log, in_archive) if t is not None]
    if written:
        last = max(written)
        log.info("%s resumes after event time %d µs (the last row in its live log: %s; in its archive: %s)",
                 name, last, in_log, in_archive)
        return last
    stats = last_stats()
    previous = stats.get("live_event_time_us") if isinstance(stats, dict) else None
    if previous is not None:
        log.warning("%s: neither its live log nor its archive holds a row; it resumes after event time %d µs, "
                    "which its last stats name: rows written in the second before they were may come twice",
                    name, previous)
    return previous

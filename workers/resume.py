"""Where a restarted source goes on: right after the last row it wrote, so that its stream has no
row twice and no gap the archive cannot see (docs/runtime.md, KIND_RESUMED)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from ramen.archive.coverage import last_event_time_us as archived_last_event_time_us
from ramen.transport import LogBuffer
from ramen.transport.frame_walk import last_event_time_us
from ramen.worker_keys import WorkerStats

log = logging.getLogger(__name__)


def last_written_us(name: str, live_log: LogBuffer, archive_dir: Path,
                    last_stats: Callable[[], WorkerStats | None]) -> int | None:
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
    previous = stats.live_event_time_us if stats is not None else None
    if previous is not None:
        log.warning("%s: neither its live log nor its archive holds a row; it resumes after event time %d µs, "
                    "which its last stats name: rows written in the second before they were may come twice",
                    name, previous)
    return previous

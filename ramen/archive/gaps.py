"""The gaps a recording holds: event-time ranges its function's output may miss rows of, as its
worker said in a GAP message (ramen/message.py, KIND_GAP), kept beside the recording in
`<recordingId>.gaps` so that the archive's coverage (coverage.py) can leave them out without
reading segments.

Layout: 16-byte records, little endian, (since_us i64, until_us i64), appended by the recorder as it
indexes the GAP message; a torn last record (a recorder killed mid-write) is ignored. A recording
without the file has no gap.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

GAPS_FILE_SUFFIX = ".gaps"
GAP_RECORD = struct.Struct("<qq")


def gaps_path(archive_dir: str | os.PathLike, recording_id: int) -> Path:
    return Path(archive_dir) / f"{recording_id}{GAPS_FILE_SUFFIX}"


def append_gap(path: Path, since_us: int, until_us: int) -> None:
    """One more gap of the recording (one write: a record is whole or torn, never mixed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, GAP_RECORD.pack(since_us, until_us))
    finally:
        os.close(fd)


def read_gaps(path: Path) -> list[tuple[int, int]]:
    """The recording's gaps, [since_us, until_us) each, in the order they were written."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    whole = len(data) - len(data) % GAP_RECORD.size
    return [gap for gap in GAP_RECORD.iter_unpack(data[:whole]) if gap[0] < gap[1]]

"""The event-time index of a recording: position ↔ event time, so a replay seeks in O(log n).

Beyond Aeron. One file per recording, `<recordingId>.tindex`, beside the catalog: a 64-byte header,
then one 32-byte entry per indexed message:

    i64 position (of the message's first frame) | i64 min_event_time_us | i64 max_event_time_us |
    i64 running max of max_event_time_us over this and every earlier entry

The running max is non-decreasing, so the first message that can hold a time >= since is found by
binary search. Streams are not perfectly ordered, so the header also keeps the recording's
*disorder*: the furthest any message reached back below the running max before it. A message that
follows an entry whose running max is >= until + disorder cannot hold a time < until, which bounds
the end of a replay by binary search too, exactly.

One process appends (the recorder); readers map the file and use only the whole entries they see.
The disorder is stored before the entry that raised it, so readers never see an entry the header
does not account for.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

INDEX_FILE_SUFFIX = ".tindex"
INDEX_MAGIC = b"RAMENTIX"
INDEX_VERSION = 1
INDEX_HEADER = struct.Struct("<8siiqq")  # magic, version, entry length, recording id, disorder µs
INDEX_HEADER_LENGTH = 64
DISORDER_OFFSET = 24
ENTRY = struct.Struct("<qqqq")
ENTRY_LENGTH = ENTRY.size
ENTRY_DTYPE = np.dtype([("position", "<i8"), ("min_time", "<i8"), ("max_time", "<i8"), ("running_max", "<i8")])


class TimeIndexError(ValueError):
    """An index file that is not one, or that belongs to another recording."""


def index_path(archive_dir: str | os.PathLike, recording_id: int) -> Path:
    return Path(archive_dir) / f"{recording_id}{INDEX_FILE_SUFFIX}"


class TimeIndexWriter:
    """Appends entries for one recording (the recorder's side)."""

    def __init__(self, path: Path, recording_id: int) -> None:
        self.path = path
        self.recording_id = recording_id
        exists = path.exists() and path.stat().st_size >= INDEX_HEADER_LENGTH
        self._file = open(path, "r+b" if exists else "w+b")
        if exists:
            header = _read_header(path, self._file.read(INDEX_HEADER_LENGTH), recording_id)
            self.disorder_us = header[4]
            size = os.fstat(self._file.fileno()).st_size
            whole = (size - INDEX_HEADER_LENGTH) // ENTRY_LENGTH
            self._file.truncate(INDEX_HEADER_LENGTH + whole * ENTRY_LENGTH)  # a torn last entry
            self.entries = whole
            self.running_max = None
            if whole:
                self._file.seek(INDEX_HEADER_LENGTH + (whole - 1) * ENTRY_LENGTH)
                self.running_max = ENTRY.unpack(self._file.read(ENTRY_LENGTH))[3]
            self._file.seek(0, os.SEEK_END)
        else:
            self.disorder_us = 0
            self.entries = 0
            self.running_max = None
            self._file.write(INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, ENTRY_LENGTH, recording_id, 0)
                             .ljust(INDEX_HEADER_LENGTH, b"\0"))
        self._pending = bytearray()

    def append(self, position: int, min_time_us: int, max_time_us: int) -> None:
        """Index one message; written out at the next flush."""
        running_max = self.running_max
        if running_max is not None and running_max - min_time_us > self.disorder_us:
            self.flush()  # entries before the new disorder go out under the old header value
            self.disorder_us = running_max - min_time_us
            self._file.seek(DISORDER_OFFSET)
            self._file.write(struct.pack("<q", self.disorder_us))
            self._file.seek(0, os.SEEK_END)
        running_max = max_time_us if running_max is None else max(running_max, max_time_us)
        self.running_max = running_max
        self._pending += ENTRY.pack(position, min_time_us, max_time_us, running_max)
        self.entries += 1

    def flush(self) -> None:
        if self._pending:
            self._file.write(self._pending)
            self._pending.clear()
        self._file.flush()

    def truncate_before(self, position: int) -> None:
        """Drop entries of purged data (retention), keeping the running maxima as they were."""
        self.flush()
        reader = TimeIndex.open(self.path, self.recording_id)
        keep = reader.entries[reader.entries["position"] >= position].copy()
        reader.close()
        self._file.seek(INDEX_HEADER_LENGTH)
        self._file.write(keep.tobytes())
        self._file.truncate()
        self.entries = len(keep)

    def close(self) -> None:
        self.flush()
        self._file.close()


class TimeIndex:
    """A read-only view of a recording's index (the replayer's side)."""

    def __init__(self, path: Path, disorder_us: int, entries: np.ndarray) -> None:
        self.path = path
        self.disorder_us = disorder_us
        self.entries = entries

    @classmethod
    def open(cls, path: str | os.PathLike, recording_id: int | None = None) -> "TimeIndex":
        path = Path(path)
        with open(path, "rb") as f:
            header = _read_header(path, f.read(INDEX_HEADER_LENGTH), recording_id)
            size = os.fstat(f.fileno()).st_size
        count = (size - INDEX_HEADER_LENGTH) // ENTRY_LENGTH
        if count:
            entries = np.memmap(path, dtype=ENTRY_DTYPE, mode="r", offset=INDEX_HEADER_LENGTH, shape=(count,))
        else:
            entries = np.zeros(0, dtype=ENTRY_DTYPE)
        return cls(path, header[4], entries)

    def __len__(self) -> int:
        return len(self.entries)

    def seek(self, since_us: int) -> int | None:
        """Position of the first message that may hold an event time >= since_us (None: none does)."""
        i = int(np.searchsorted(self.entries["running_max"], since_us, side="left"))
        return int(self.entries["position"][i]) if i < len(self.entries) else None

    def stop(self, until_us: int) -> int | None:
        """Position after which no message holds an event time < until_us (None: not yet known,
        read to the end of the recording)."""
        i = int(np.searchsorted(self.entries["running_max"], until_us + self.disorder_us, side="left"))
        # Entries after i hold times >= running_max[i] - disorder >= until: stop at the next one,
        # or at i itself when it too starts at or past until.
        if i < len(self.entries) and self.entries["min_time"][i] >= until_us:
            return int(self.entries["position"][i])
        return int(self.entries["position"][i + 1]) if i + 1 < len(self.entries) else None

    def close(self) -> None:
        mm = getattr(self.entries, "_mmap", None)
        self.entries = np.zeros(0, dtype=ENTRY_DTYPE)
        if mm is not None:
            mm.close()


def _read_header(path: Path, raw: bytes, recording_id: int | None) -> tuple:
    if len(raw) < INDEX_HEADER.size:
        raise TimeIndexError(f"{path}: too short for a time index")
    header = INDEX_HEADER.unpack_from(raw)
    if header[0] != INDEX_MAGIC or header[1] != INDEX_VERSION or header[2] != ENTRY_LENGTH:
        raise TimeIndexError(f"{path}: not a ramen time index (version {header[1]})")
    if recording_id is not None and header[3] != recording_id:
        raise TimeIndexError(f"{path}: belongs to recording {header[3]}, not {recording_id}")
    return header

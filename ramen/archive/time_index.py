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

Header, version 2 (little endian, offsets below): magic, version, entry length, recording id,
disorder, the number of entries the header covers, the CRC-32C of those entries, and the CRC-32C of
the header's bytes before it. The writer (the recorder) appends entries, then rewrites the header
in one write: the entries' CRC is extended by what each flush adds (CRC-32C continues over
appended bytes), so a flush costs what it writes, never the size of the index. Entries past the
header's count (written by a flush that did not get to its header) are not used.

Readers trust nothing else: an index whose header or entries do not match their checksums (a torn
header read while the writer flushes is read again), that belongs to another recording, that is
truncated, or that is of version 1 (no checksums) is rebuilt from the recording's segments, with a
warning: written back (atomically) for a stopped recording, kept in memory for an active one, whose
recorder still appends to the file. A writer reopening an index (to append after a restart)
validates it the same way, rebuilds it in place if need be, and catches up with what the segments
hold past its last entry.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ramen.archive.checksum import crc32c_extend
from ramen.archive.errors import ArchiveError

log = logging.getLogger(__name__)

INDEX_FILE_SUFFIX = ".tindex"
INDEX_MAGIC = b"RAMENTIX"
INDEX_VERSION = 2
LEGACY_VERSION = 1
"""Version-1 indexes have no count and no checksums: readers rebuild them (or, with nothing to
rebuild them from, use their whole entries as version-1 readers did)."""
INDEX_HEADER_LENGTH = 64

MAGIC_OFFSET = 0
VERSION_OFFSET = 8
ENTRY_LENGTH_OFFSET = 12
RECORDING_ID_OFFSET = 16
DISORDER_OFFSET = 24
COUNT_OFFSET = 32
ENTRIES_CHECKSUM_OFFSET = 40
HEADER_CHECKSUM_OFFSET = 44
INDEX_HEADER = struct.Struct("<8siiqqqI")
"""magic, version, entry length, recording id, disorder µs, count, entries CRC-32C: the bytes the
header checksum (u32 @44) covers."""
LEGACY_HEADER = struct.Struct("<8siiqq")
_HEADER_CHECKSUM = struct.Struct("<I")

ENTRY = struct.Struct("<qqqq")
ENTRY_LENGTH = ENTRY.size
ENTRY_DTYPE = np.dtype([("position", "<i8"), ("min_time", "<i8"), ("max_time", "<i8"), ("running_max", "<i8")])

READ_ATTEMPTS = 3
"""How often a reader reads an index whose checksums do not match before it rebuilds it: a header
read while the writer rewrites it may be torn, and is right when read again."""
CRC_CHUNK_LENGTH = 1024 * 1024
"""Bytes of entries read at a time to check their checksum (bounded memory whatever the header says)."""


class TimeIndexError(ArchiveError):
    """An index file that is not one, or that belongs to another recording, and cannot be rebuilt."""


class IndexDamage(ArchiveError):
    """Why an index file cannot be used as it is (internal: readers rebuild it)."""

    def __init__(self, path: Path, offset: int, problem: str, *, legacy: bool = False,
                 maybe_torn: bool = False) -> None:
        super().__init__(f"{path} offset {offset}: {problem}")
        self.offset = offset
        self.legacy = legacy
        self.maybe_torn = maybe_torn


@dataclass(frozen=True)
class IndexHeader:
    version: int
    recording_id: int
    disorder_us: int
    count: int
    """Entries the header covers (version 1: the whole entries the file holds)."""
    entries_checksum: int


def index_path(archive_dir: str | os.PathLike, recording_id: int) -> Path:
    return Path(archive_dir) / f"{recording_id}{INDEX_FILE_SUFFIX}"


def recording_id_of(path: Path) -> int | None:
    """The recording id an index file's name says (`<recordingId>.tindex`), or None."""
    stem = path.name[:-len(INDEX_FILE_SUFFIX)] if path.name.endswith(INDEX_FILE_SUFFIX) else ""
    return int(stem) if stem.isdigit() else None


def pack_header(recording_id: int, disorder_us: int, count: int, entries_checksum: int) -> bytes:
    fields = INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, ENTRY_LENGTH, recording_id, disorder_us, count,
                               entries_checksum)
    return (fields + _HEADER_CHECKSUM.pack(crc32c_extend(fields))).ljust(INDEX_HEADER_LENGTH, b"\0")


def parse_header(path: Path, raw: bytes, file_size: int, recording_id: int | None) -> IndexHeader:
    """The header of an index file of `file_size` bytes, checked (its own checksum, the recording,
    and that the file holds the entries it covers). Raises IndexDamage naming the offset."""
    if len(raw) < INDEX_HEADER_LENGTH:
        raise IndexDamage(path, len(raw), f"{file_size} bytes, too short for a time index header "
                                          f"({INDEX_HEADER_LENGTH} bytes; truncated)")
    magic, version, entry_length = struct.unpack_from("<8sii", raw)
    if magic != INDEX_MAGIC:
        what = "zeroed" if not any(raw) else "damaged or another format"
        raise IndexDamage(path, MAGIC_OFFSET, f"not a ramen time index ({what})")
    if version == LEGACY_VERSION and entry_length == ENTRY_LENGTH:
        _, _, _, owner, disorder = LEGACY_HEADER.unpack_from(raw)
        header = IndexHeader(version, owner, disorder, (file_size - INDEX_HEADER_LENGTH) // ENTRY_LENGTH, 0)
        _check_owner(path, header, recording_id)
        raise LegacyIndex(path, header)
    fields = raw[:HEADER_CHECKSUM_OFFSET]
    stored = _HEADER_CHECKSUM.unpack_from(raw, HEADER_CHECKSUM_OFFSET)[0]
    if crc32c_extend(fields) != stored:
        raise IndexDamage(path, HEADER_CHECKSUM_OFFSET, f"the header's checksum {stored:#010x} does not match "
                                                        f"its contents (damaged)", maybe_torn=True)
    if version != INDEX_VERSION or entry_length != ENTRY_LENGTH:
        raise IndexDamage(path, VERSION_OFFSET, f"version {version} with {entry_length}-byte entries: not a "
                                                f"version {INDEX_VERSION} time index")
    _, _, _, owner, disorder, count, entries_checksum = INDEX_HEADER.unpack_from(raw)
    header = IndexHeader(version, owner, disorder, count, entries_checksum)
    _check_owner(path, header, recording_id)
    held = (file_size - INDEX_HEADER_LENGTH) // ENTRY_LENGTH
    if count < 0 or count > held:
        raise IndexDamage(path, INDEX_HEADER_LENGTH + held * ENTRY_LENGTH,
                          f"the header covers {count} entries, the file holds {held} (truncated)",
                          maybe_torn=True)  # or read while retention cut it: read again first
    return header


class LegacyIndex(IndexDamage):
    """A version-1 index: whole entries, no checksums."""

    def __init__(self, path: Path, header: IndexHeader) -> None:
        super().__init__(path, VERSION_OFFSET, f"version {LEGACY_VERSION}, without checksums", legacy=True)
        self.header = header


def _check_owner(path: Path, header: IndexHeader, recording_id: int | None) -> None:
    if recording_id is not None and header.recording_id != recording_id:
        raise IndexDamage(path, RECORDING_ID_OFFSET, f"belongs to recording {header.recording_id}, not "
                                                     f"{recording_id}")


def entries_checksum(fd: int, count: int) -> int:
    """CRC-32C of the first `count` entries of an open index file, read a chunk at a time."""
    value = 0
    at, end = INDEX_HEADER_LENGTH, INDEX_HEADER_LENGTH + count * ENTRY_LENGTH
    while at < end:
        data = os.pread(fd, min(CRC_CHUNK_LENGTH, end - at), at)
        if not data:
            break
        value = crc32c_extend(data, value)
        at += len(data)
    return value


def build_entries(messages) -> tuple[np.ndarray, int]:
    """Entries and disorder for (position, min, max) of each message in order, as the writer
    computes them."""
    rows = np.array(list(messages), dtype=np.int64).reshape(-1, 3)
    entries = np.zeros(len(rows), dtype=ENTRY_DTYPE)
    if not len(rows):
        return entries, 0
    entries["position"], entries["min_time"], entries["max_time"] = rows[:, 0], rows[:, 1], rows[:, 2]
    entries["running_max"] = np.maximum.accumulate(rows[:, 2])
    # The disorder: how far a message's min reaches below the running max of those before it.
    before = entries["running_max"][:-1] - entries["min_time"][1:]
    disorder = int(max(0, before.max())) if len(before) else 0
    return entries, disorder


def write_index(path: Path, recording_id: int, disorder_us: int, entries: np.ndarray) -> None:
    """Write a whole index under a temporary name, then rename it over `path` (readers see the old
    file or the new one, never a mix)."""
    data = np.ascontiguousarray(entries, dtype=ENTRY_DTYPE).tobytes()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(pack_header(recording_id, disorder_us, len(entries), crc32c_extend(data)))
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def rebuilt_entries(path: Path, recording_id: int, descriptor, reason: IndexDamage) -> tuple[np.ndarray, int, bool]:
    """Entries and disorder of a recording, from its segments, for an index that cannot be used,
    and whether the recording is stopped. Raises TimeIndexError when there is nothing to rebuild
    it from (no catalog entry, damaged segments)."""
    from ramen.archive import index_rebuild  # it reads segments: only when an index is damaged
    archive_dir = path.parent
    messages = []
    try:
        recording = index_rebuild.find_recording(archive_dir, recording_id, descriptor)
        for found in index_rebuild.indexed_messages(archive_dir, recording):
            messages.append(found)
    except ArchiveError as e:
        if not messages or recording.is_stopped:
            raise TimeIndexError(f"{reason}; cannot rebuild it from the segments: {e}") from None
        # An active recording's last frame may be read while its recorder writes it: the index
        # ends before it (a replay that reads there meets the damage, if it is damage).
        log.warning("%s: the index rebuilt from the segments of active recording %d ends at position %d: %s",
                    path, recording_id, messages[-1][0], e)
    entries, disorder = build_entries(messages)
    return entries, disorder, recording.is_stopped


class TimeIndexWriter:
    """Appends entries for one recording (the recorder's side).

    Reopening an existing index (to append after a restart) validates it: what its header does not
    cover (a torn last flush) is dropped, a damaged index is rebuilt in place from the recording's
    segments, and messages the segments hold past its last entry are added (`descriptor`, else the
    recording's catalog entry beside the index, says where the segments are; without one, the
    valid part of the index is kept as it is)."""

    def __init__(self, path: Path, recording_id: int, *, descriptor=None) -> None:
        self.path = Path(path)
        self.recording_id = recording_id
        self.disorder_us = 0
        self.entries = 0
        """Entries appended, flushed or not."""
        self.running_max: int | None = None
        self._flushed = 0  # entries the file's header covers
        self._checksum = 0  # CRC-32C of those
        self._pending = bytearray()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(self._fd).st_size == 0:
                self._write_header()
            else:
                self._reopen(descriptor)
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise

    def append(self, position: int, min_time_us: int, max_time_us: int) -> None:
        """Index one message; written out at the next flush (the header's disorder with it)."""
        running_max = self.running_max
        if running_max is not None and running_max - min_time_us > self.disorder_us:
            self.disorder_us = running_max - min_time_us
        running_max = max_time_us if running_max is None else max(running_max, max_time_us)
        self.running_max = running_max
        self._pending += ENTRY.pack(position, min_time_us, max_time_us, running_max)
        self.entries += 1

    def flush(self) -> None:
        """Write the pending entries, then the header that covers them: O(what is written)."""
        if not self._pending:
            return
        self._pwrite(self._pending, INDEX_HEADER_LENGTH + self._flushed * ENTRY_LENGTH)
        self._checksum = crc32c_extend(self._pending, self._checksum)
        self._flushed += len(self._pending) // ENTRY_LENGTH
        self._pending.clear()
        self._write_header()

    def truncate_before(self, position: int) -> None:
        """Drop entries of purged data (retention), keeping the running maxima as they were."""
        self.flush()
        entries = np.frombuffer(self._read_entries(self._flushed), dtype=ENTRY_DTYPE)
        keep = entries[entries["position"] >= position].tobytes()
        self._pwrite(keep, INDEX_HEADER_LENGTH)
        self._flushed = self.entries = len(keep) // ENTRY_LENGTH
        self._checksum = crc32c_extend(keep)
        self._write_header()
        os.ftruncate(self._fd, INDEX_HEADER_LENGTH + len(keep))

    def close(self) -> None:
        if self._fd < 0:
            return
        self.flush()
        os.close(self._fd)
        self._fd = -1

    # -- internals -----------------------------------------------------------------------------

    def _write_header(self) -> None:
        self._pwrite(pack_header(self.recording_id, self.disorder_us, self._flushed, self._checksum), 0)

    def _pwrite(self, data, offset: int) -> None:
        view = memoryview(data)
        while len(view):
            written = os.pwrite(self._fd, view, offset)
            view = view[written:]
            offset += written

    def _entry(self, i: int) -> tuple:
        return ENTRY.unpack(os.pread(self._fd, ENTRY_LENGTH, INDEX_HEADER_LENGTH + i * ENTRY_LENGTH))

    def _read_entries(self, count: int) -> bytes:
        return os.pread(self._fd, count * ENTRY_LENGTH, INDEX_HEADER_LENGTH)

    def _reopen(self, descriptor) -> None:
        size = os.fstat(self._fd).st_size
        try:
            header = parse_header(self.path, os.pread(self._fd, INDEX_HEADER_LENGTH, 0), size, self.recording_id)
            if entries_checksum(self._fd, header.count) != header.entries_checksum:
                raise IndexDamage(self.path, ENTRIES_CHECKSUM_OFFSET,
                                  f"the checksum of its {header.count} entries does not match (entries damaged)")
        except IndexDamage as damage:
            self._rebuild(descriptor, damage)
            return
        self.disorder_us = header.disorder_us
        self._flushed = self.entries = header.count
        self._checksum = header.entries_checksum
        if header.count:
            self.running_max = self._entry(header.count - 1)[3]
        os.ftruncate(self._fd, INDEX_HEADER_LENGTH + header.count * ENTRY_LENGTH)  # a torn last flush
        self._catch_up(descriptor)

    def _rebuild(self, descriptor, damage: IndexDamage) -> None:
        try:
            entries, disorder, _ = rebuilt_entries(self.path, self.recording_id, descriptor, damage)
        except TimeIndexError:
            if not isinstance(damage, LegacyIndex):
                raise
            # Nothing to rebuild it from: take its whole entries on trust, as version-1 readers did.
            entries = np.frombuffer(self._read_entries(damage.header.count), dtype=ENTRY_DTYPE)
            disorder = damage.header.disorder_us
        log.warning("%s; rewritten from the recording's segments (%d entries)", damage, len(entries))
        data = entries.tobytes()
        os.ftruncate(self._fd, INDEX_HEADER_LENGTH)
        self._pwrite(data, INDEX_HEADER_LENGTH)
        self.disorder_us = disorder
        self._flushed = self.entries = len(entries)
        self._checksum = crc32c_extend(data)
        self.running_max = int(entries["running_max"][-1]) if len(entries) else None
        self._write_header()

    def _catch_up(self, descriptor) -> None:
        """Index what the segments hold past the last entry (messages recorded after the last flush
        before a crash); a mismatch between the last entry and its segment rebuilds the index."""
        from ramen.archive import index_rebuild
        try:
            recording = index_rebuild.find_recording(self.path.parent, self.recording_id, descriptor)
        except ArchiveError as e:
            log.debug("%s: not caught up with the segments: %s", self.path, e)
            return
        last = self._entry(self._flushed - 1) if self._flushed else None
        try:
            missing = index_rebuild.messages_after(self.path.parent, recording, last)
        except ArchiveError as e:
            self._rebuild(descriptor, IndexDamage(self.path, INDEX_HEADER_LENGTH + (self._flushed - 1) * ENTRY_LENGTH,
                                                  str(e)))
            return
        except ArchiveError as e:
            log.warning("%s: not caught up with the segments: %s", self.path, e)
            return
        for position, low, high in missing:
            self.append(position, low, high)
        if missing:
            log.warning("%s: %d entries the recording's segments hold past the index's end added",
                        self.path, len(missing))
            self.flush()


class TimeIndex:
    """A read-only view of a recording's index (the replayer's side)."""

    def __init__(self, path: Path, disorder_us: int, entries: np.ndarray) -> None:
        self.path = path
        self.disorder_us = disorder_us
        self.entries = entries

    @classmethod
    def open(cls, path: str | os.PathLike, recording_id: int | None = None, *, descriptor=None) -> "TimeIndex":
        """The index, checked; one that cannot be used as it is is rebuilt from the segments (see
        the module's docstring), and so is a missing one of a stopped recording with data when
        `descriptor` is given. FileNotFoundError when there is none (and nothing to rebuild it
        from); TimeIndexError when it is damaged and cannot be rebuilt."""
        path = Path(path)
        if recording_id is None:
            recording_id = recording_id_of(path)
        if descriptor is not None and not path.exists() and descriptor.stop_position > descriptor.start_position:
            return cls._rebuilt(path, recording_id, descriptor, IndexDamage(path, 0, "no such file"))
        damage = None
        for _ in range(READ_ATTEMPTS):
            try:
                return cls._open_checked(path, recording_id)
            except IndexDamage as e:
                damage = e
                if not e.maybe_torn:
                    break
        return cls._rebuilt(path, recording_id, descriptor, damage)

    @classmethod
    def _open_checked(cls, path: Path, recording_id: int | None) -> "TimeIndex":
        with open(path, "rb") as f:
            # The header before the size: the recorder appends entries, then rewrites the header
            # that covers them, so a header read after the size could cover entries appended since
            # (taken for a truncated index, and the active recording's rebuilt from every segment).
            raw = f.read(INDEX_HEADER_LENGTH)
            size = os.fstat(f.fileno()).st_size
            header = parse_header(path, raw, size, recording_id)
        count = header.count
        if count:
            entries = np.memmap(path, dtype=ENTRY_DTYPE, mode="r", offset=INDEX_HEADER_LENGTH, shape=(count,))
        else:
            entries = np.zeros(0, dtype=ENTRY_DTYPE)
        index = cls(path, header.disorder_us, entries)
        if count and crc32c_extend(memoryview(entries).cast("B")) != header.entries_checksum:
            index.close()
            raise IndexDamage(path, ENTRIES_CHECKSUM_OFFSET,
                              f"the checksum of its {count} entries does not match (entries damaged)", maybe_torn=True)
        return index

    @classmethod
    def _rebuilt(cls, path: Path, recording_id: int | None, descriptor, damage: IndexDamage) -> "TimeIndex":
        if recording_id is None:
            raise TimeIndexError(f"{damage}; cannot rebuild it: its name does not say which recording it indexes")
        try:
            entries, disorder, stopped = rebuilt_entries(path, recording_id, descriptor, damage)
        except TimeIndexError:
            if not isinstance(damage, LegacyIndex):
                raise
            log.warning("%s; nothing to rebuild it from: its entries are used as they are", damage)
            return cls._legacy(path, damage.header)
        if stopped:
            try:
                write_index(path, recording_id, disorder, entries)
                log.warning("%s; rebuilt from the recording's segments (%d entries) and written back", damage,
                            len(entries))
            except OSError as e:
                log.warning("%s; rebuilt from the recording's segments (%d entries), in memory only: cannot "
                            "write it back (%s)", damage, len(entries), e.strerror)
        else:
            log.warning("%s; rebuilt from the recording's segments (%d entries), in memory only: the recording "
                        "is active and its recorder appends to the file", damage, len(entries))
        return cls(path, disorder, entries)

    @classmethod
    def _legacy(cls, path: Path, header: IndexHeader) -> "TimeIndex":
        if not header.count:
            return cls(path, header.disorder_us, np.zeros(0, dtype=ENTRY_DTYPE))
        return cls(path, header.disorder_us, np.memmap(path, dtype=ENTRY_DTYPE, mode="r", offset=INDEX_HEADER_LENGTH,
                                                       shape=(header.count,)))

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

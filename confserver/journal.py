"""Durability for the built-in server: a write-ahead log of store records plus periodic snapshots.

Log records are `u32 length | u32 crc32 | JSON`, little endian. The server appends records as it
applies them and acknowledges a write only after the batch holding it is written and fsync'ed
(group commit: one fsync for everything that arrived meanwhile). A crash can therefore tear only
unacknowledged records at the log's tail; loading stops at the first record whose length or CRC
does not hold and cuts the log there.

Every SNAPSHOT_EVERY_RECORDS records the whole state is written to `snapshot.json` (generation
g+1, atomically by rename) and a new log `wal.<g+1>` is started, so a restart replays at most that
many records. The data directory is guarded by an flock, so two servers cannot share it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import zlib
from pathlib import Path

from confserver.errors import ConfError
from confserver.store import Store

log = logging.getLogger(__name__)

RECORD_HEADER = struct.Struct("<II")
SNAPSHOT_FILE = "snapshot.json"
LOCK_FILE = "lock"
WAL_PREFIX = "wal."
SNAPSHOT_EVERY_RECORDS = 10_000


class DataDirInUse(ConfError):
    code = "data_dir_in_use"


def _wal_name(generation: int) -> str:
    return f"{WAL_PREFIX}{generation:08d}"


def encode_record(record: dict) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode()
    return RECORD_HEADER.pack(len(body), zlib.crc32(body)) + body


def decode_records(data: bytes) -> tuple[list[dict], int]:
    """The whole records at the start of data, and the length they take (where a torn tail starts)."""
    records, offset = [], 0
    while offset + RECORD_HEADER.size <= len(data):
        length, crc = RECORD_HEADER.unpack_from(data, offset)
        body = data[offset + RECORD_HEADER.size:offset + RECORD_HEADER.size + length]
        if len(body) < length or zlib.crc32(body) != crc:
            break
        try:
            records.append(json.loads(body))
        except (UnicodeDecodeError, json.JSONDecodeError):
            break
        offset += RECORD_HEADER.size + length
    return records, offset


class Journal:
    def __init__(self, data_dir: str | os.PathLike, *, fsync: bool = True,
                 snapshot_every_records: int = SNAPSHOT_EVERY_RECORDS):
        self.dir = Path(data_dir)
        self.fsync = fsync
        self.snapshot_every_records = snapshot_every_records
        self.generation = 0
        self.records_since_snapshot = 0
        self._pending = bytearray()
        self._fd = -1
        self._lock_fd = -1

    def load(self) -> Store:
        """Take the directory's lock, then rebuild the state from the snapshot and the log."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DataDirInUse(f"{self.dir} is used by another running confserver") from None
        store = Store()
        snapshot = self.dir / SNAPSHOT_FILE
        if snapshot.exists():
            obj = json.loads(snapshot.read_text())
            self.generation = obj["generation"]
            store = Store.from_json(obj["state"])
        for stale in self.dir.glob(WAL_PREFIX + "*"):
            if stale.name < _wal_name(self.generation):
                stale.unlink()
        wal = self.dir / _wal_name(self.generation)
        data = wal.read_bytes() if wal.exists() else b""
        records, good = decode_records(data)
        for record in records:
            store.apply(record)
        if good < len(data):
            log.warning("%s: cut a torn tail of %d bytes (unacknowledged writes)", wal, len(data) - good)
        self._fd = os.open(wal, os.O_WRONLY | os.O_CREAT, 0o600)
        os.ftruncate(self._fd, good)
        os.lseek(self._fd, good, os.SEEK_SET)
        self.records_since_snapshot = len(records)
        log.info("loaded %s: generation %d, %d keys, %d log records", self.dir, self.generation,
                 len(store.entries), len(records))
        return store

    def append(self, record: dict) -> None:
        self._pending += encode_record(record)
        self.records_since_snapshot += 1

    def take(self) -> bytes:
        """The records appended since the last take, to be written by write()."""
        batch, self._pending = bytes(self._pending), bytearray()
        return batch

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def snapshot_due(self) -> bool:
        """Whether to snapshot now; if so, the caller must take the state at once (see server)."""
        if self.records_since_snapshot < self.snapshot_every_records:
            return False
        self.records_since_snapshot = 0
        return True

    def write(self, batch: bytes) -> None:
        """Write and sync a batch. Blocking: the server calls it from a worker thread."""
        view = memoryview(batch)
        while view:
            view = view[os.write(self._fd, view):]
        if self.fsync:
            os.fsync(self._fd)

    def write_snapshot(self, state: dict) -> None:
        """Write state as the next generation and start its log; state must include every record
        written so far and none that is not. Blocking: called from a worker thread."""
        generation = self.generation + 1
        tmp = self.dir / (SNAPSHOT_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"generation": generation, "state": state}, f, separators=(",", ":"))
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        new_fd = os.open(self.dir / _wal_name(generation), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.replace(tmp, self.dir / SNAPSHOT_FILE)
        if self.fsync:
            dir_fd = os.open(self.dir, os.O_RDONLY)
            os.fsync(dir_fd)
            os.close(dir_fd)
        old_fd, self._fd = self._fd, new_fd
        os.close(old_fd)
        (self.dir / _wal_name(self.generation)).unlink(missing_ok=True)
        self.generation = generation
        log.info("snapshot generation %d written", generation)

    def close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._lock_fd = -1

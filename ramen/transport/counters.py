"""The counters file: labelled int64 counters shared by every process of a site, like Aeron's cnc.dat.

Layout (Aeron's CncFileDescriptor and CountersManager): a 128-byte header, then the counters
metadata buffer (512 bytes a counter), then the values buffer (128 bytes a counter). The to-driver,
to-clients and error-log buffers have length 0: there is no media driver. Allocation and release
take an exclusive flock on the file; updates of a value are plain 8-byte stores by the one process
that owns the counter.

ramen keeps two extra fields in the padding of a value record that Aeron leaves unused: a heartbeat
(monotonic ms) and a state word, so a publication can tell a live subscriber from a dead one.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ramen.processes import pid_alive
from ramen.transport.defaults import (COUNTER_FREE_TO_REUSE_DELAY_S, COUNTERS_DEFAULT_CAPACITY,
                                      COUNTERS_PROCESS_SHARE)
from ramen.transport.errors import TransportError

log = logging.getLogger(__name__)

# cnc.dat header.
CNC_VERSION = (0 << 16) | (2 << 8) | 0  # SemanticVersion.compose(0, 2, 0)
CNC_VERSION_FIELD_OFFSET = 0
TO_DRIVER_BUFFER_LENGTH_FIELD_OFFSET = 4
TO_CLIENTS_BUFFER_LENGTH_FIELD_OFFSET = 8
COUNTERS_METADATA_BUFFER_LENGTH_FIELD_OFFSET = 12
COUNTERS_VALUES_BUFFER_LENGTH_FIELD_OFFSET = 16
ERROR_LOG_BUFFER_LENGTH_FIELD_OFFSET = 20
CLIENT_LIVENESS_TIMEOUT_FIELD_OFFSET = 24
START_TIMESTAMP_FIELD_OFFSET = 32
PID_FIELD_OFFSET = 40
END_OF_METADATA_OFFSET = 128

# Counter metadata record.
METADATA_LENGTH = 512
STATE_OFFSET = 0
TYPE_ID_OFFSET = 4
FREE_FOR_REUSE_DEADLINE_OFFSET = 8
KEY_OFFSET = 16
MAX_KEY_LENGTH = 112
LABEL_LENGTH_OFFSET = 128
LABEL_OFFSET = 132
MAX_LABEL_LENGTH = 380
RECORD_UNUSED, RECORD_ALLOCATED, RECORD_RECLAIMED = 0, 1, -1
NOT_FREE_TO_REUSE = 0x7FFFFFFFFFFFFFFF

# Counter value record.
COUNTER_LENGTH = 128
VALUE_OFFSET = 0
REGISTRATION_ID_OFFSET = 8
OWNER_ID_OFFSET = 16
HEARTBEAT_OFFSET = 32  # ramen: monotonic ms of the owner's last sign of life
STATUS_OFFSET = 40  # ramen: ACTIVE or DROPPED, for subscriber positions
COUNTER_ACTIVE, COUNTER_DROPPED = 0, 1

# Type ids: Aeron's where the meaning is Aeron's, ramen's own from 1000.
SYSTEM_COUNTER_TYPE_ID = 0
PUBLISHER_LIMIT_TYPE_ID = 1
SUBSCRIBER_POSITION_TYPE_ID = 4
PUBLISHER_POSITION_TYPE_ID = 12
RECORDING_POSITION_TYPE_ID = 100  # Aeron Archive's, kept by ramen/archive/recorder.py
BACK_PRESSURE_EVENTS_TYPE_ID = 1001
SUBSCRIBERS_DROPPED_TYPE_ID = 1002
UNBLOCKED_FRAMES_TYPE_ID = 1003
# The UDP agents' (ramen/transport/udp/*_agent.py): Aeron's ids where Aeron has the counter.
SENDER_POSITION_TYPE_ID = 2
RECEIVER_HWM_TYPE_ID = 3
RECEIVER_POSITION_TYPE_ID = 5
SENDER_LIMIT_TYPE_ID = 9
SENDER_BPE_TYPE_ID = 13
NETWORK_COUNTER_TYPE_IDS: dict[str, int] = {
    "naks-received": 1500, "retransmits": 1501, "short-sends": 1502, "heartbeats-sent": 1503,
    "setups-sent": 1504, "sms-received": 1505, "skipped-bytes": 1506, "naks-sent": 1510, "loss-gaps": 1511,
    "sms-sent": 1512, "frames-duplicate": 1513, "frames-over-run": 1514, "images": 1520, "images-ended": 1521,
    "setups-received": 1522, "frames-unsubscribed": 1523, "unreachable": 1524, "images-resumed": 1525,
    "images-overtaken": 1526, "images-rejoined": 1527, "setups-refused": 1528, "images-evicted": 1529,
    "garbage": 1530,
}
"""The UDP agents' own counts, by the name in their label (`naks-received: <session> <stream> ...`);
garbage is one counter per kind, the kind in its label (`garbage short: 127.0.0.1:40123`)."""

SERVICE_COUNTER_TYPE_IDS: dict[str, dict[str, int]] = {
    "supervisor": {"starts": 1100, "restarts": 1101, "crashes": 1102, "stops": 1103, "kills": 1104,
                   "quarantines": 1105, "spares": 1106, "adopted": 1107, "replays_wired": 1108,
                   "replayers_spawned": 1109, "merged_requests": 1110, "replayer_failures": 1111,
                   "replay_errors": 1112, "replays_timed_out": 1113, "teardowns": 1114},
    "choreographer": {"recomputes": 1200, "fast_paths": 1201, "writes": 1202, "deletes": 1203,
                      "bad_programs": 1204},
    "archiver": {"bytes_recorded": 104},  # Aeron's ARCHIVE_RECORDER_TOTAL_WRITE_BYTES_TYPE_ID
    "replayer": {"bytes_read": 1010, "rollups": 1011},
    "worker": {"tuples_in": 1300, "tuples_out": 1301, "late": 1302, "dropped": 1303, "unexpected": 1304,
               "skipped": 1305, "spark_jobs": 1306, "spark_ms": 1307, "rollups": 1308, "gaps": 1309},
    "netd": {"sends": 1400, "receives": 1401, "bad_keys": 1402, "send_failures": 1403},
}
"""The services' counters (ramen/transport/service_counters.py), one type id per thing counted,
by service and attribute name: a service's counter is labelled `<service> <instance> <name>`
(`supervisor s1 merged requests`), so `ramen stat` and tests find it by type or label."""
REPLAYER_BYTES_READ_TYPE_ID = SERVICE_COUNTER_TYPE_IDS["replayer"]["bytes_read"]

TYPE_NAMES = {
    SYSTEM_COUNTER_TYPE_ID: "system",
    PUBLISHER_LIMIT_TYPE_ID: "pub-lmt",
    SUBSCRIBER_POSITION_TYPE_ID: "sub-pos",
    PUBLISHER_POSITION_TYPE_ID: "pub-pos",
    BACK_PRESSURE_EVENTS_TYPE_ID: "back-pressure",
    SUBSCRIBERS_DROPPED_TYPE_ID: "subs-dropped",
    UNBLOCKED_FRAMES_TYPE_ID: "unblocked",
    RECORDING_POSITION_TYPE_ID: "rec-pos",
    SENDER_POSITION_TYPE_ID: "snd-pos",
    RECEIVER_HWM_TYPE_ID: "rcv-hwm",
    RECEIVER_POSITION_TYPE_ID: "rcv-pos",
    SENDER_LIMIT_TYPE_ID: "snd-lmt",
    SENDER_BPE_TYPE_ID: "snd-bpe",
    **{type_id: name for name, type_id in NETWORK_COUNTER_TYPE_IDS.items()},
    **{type_id: f"{service}-{name.replace('_', '-')}"
       for service, ids in SERVICE_COUNTER_TYPE_IDS.items() for name, type_id in ids.items()},
}

STREAM_KEY = struct.Struct("<qiii")
"""Key of a stream counter: log correlation id, session id, stream id, flags (KEY_FLAG_*)."""
KEY_FLAG_TETHERED = 1
KEY_FLAG_NETWORK_SENDER = 2
"""The subscriber is a network sender (udp.sender_agent), not a reader in this host's processes: a
dead one's tether is taken over by the log's next network sender, and never by a recorder."""
TETHER_HOLD_KEY = struct.Struct("<i")
"""After STREAM_KEY in a tethered subscriber's key: how long (ms) its writer waits for it once it
has gone silent, its process dead or stuck; 0 = the transport's default."""


def subscriber_key(correlation_id: int, session_id: int, stream_id: int, *, tether_hold_ms: int | None,
                   network_sender: bool = False) -> bytes:
    """A sub-pos counter's key; `tether_hold_ms` None for an untethered subscriber."""
    flags = (0 if tether_hold_ms is None else KEY_FLAG_TETHERED) | (KEY_FLAG_NETWORK_SENDER if network_sender else 0)
    key = STREAM_KEY.pack(correlation_id, session_id, stream_id, flags)
    return key if tether_hold_ms is None else key + TETHER_HOLD_KEY.pack(tether_hold_ms)


def tether_hold_ms(key: bytes) -> int | None:
    """From a sub-pos counter's key: None if untethered, else its hold in ms (0: the default)."""
    if not STREAM_KEY.unpack_from(key)[3] & KEY_FLAG_TETHERED:
        return None
    return TETHER_HOLD_KEY.unpack_from(key, STREAM_KEY.size)[0]


def is_network_sender(key: bytes) -> bool:
    """From a sub-pos counter's key: whether a network sender holds it (KEY_FLAG_NETWORK_SENDER)."""
    return bool(STREAM_KEY.unpack_from(key)[3] & KEY_FLAG_NETWORK_SENDER)


class CountersFileError(TransportError):
    """A counters file that cannot be used, or that is full."""


class CounterShareExceeded(CountersFileError):
    """This process holds its share of the counters file (COUNTERS_PROCESS_SHARE): refused to it
    alone, while the file has room for the others."""


def monotonic_ms() -> int:
    """CLOCK_MONOTONIC in ms: one clock for all processes of the host, immune to wall-clock steps."""
    return time.monotonic_ns() // 1_000_000


def compute_file_length(capacity: int) -> int:
    return END_OF_METADATA_OFFSET + capacity * (METADATA_LENGTH + COUNTER_LENGTH)


@dataclass(frozen=True)
class CounterInfo:
    """A snapshot of one allocated counter, for tools."""
    id: int
    type_id: int
    label: str
    key: bytes
    value: int
    registration_id: int
    owner_id: int
    heartbeat_ms: int
    status: int

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type_id, str(self.type_id))


class CountersFile:
    """A mapped counters file; many processes map the same one."""

    def __init__(self, path: Path, fd: int, mapped: mmap.mmap, *,
                 process_share: float = COUNTERS_PROCESS_SHARE) -> None:
        self.path = path
        self._fd = fd
        self.mmap = mapped
        header = struct.unpack_from("<iiiiii", mapped, 0)
        self.version = header[0]
        self.metadata_length = header[3]
        self.values_length = header[4]
        self.capacity = self.metadata_length // METADATA_LENGTH
        self.metadata_offset = END_OF_METADATA_OFFSET + header[1] + header[2]
        self.values_offset = self.metadata_offset + self.metadata_length
        self.process_limit = max(1, int(self.capacity * process_share))
        """The most counters this process may hold in the file at once (CounterShareExceeded)."""
        self._buf = memoryview(mapped)
        self._i64 = self._buf.cast("q")

    @classmethod
    def open(cls, path: str | os.PathLike, *, create: bool = True, capacity: int = COUNTERS_DEFAULT_CAPACITY,
             process_share: float = COUNTERS_PROCESS_SHARE) -> "CountersFile":
        """Map the counters file, creating it (race-free across processes) when absent;
        `process_share`: the fraction of its records this process may hold at once."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        except FileNotFoundError:
            raise CountersFileError(f"{path}: no counters file (is anything running?)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                size = os.fstat(fd).st_size
                if size == 0 and create:
                    _initialise(fd, capacity)
                    size = os.fstat(fd).st_size
                elif size == 0:  # its creator has not taken the lock yet: as good as absent
                    raise CountersFileError(f"{path}: no counters file yet (is anything starting?)")
                _validate(path, fd, size)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            mapped = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, mapped, process_share=process_share)

    def close(self) -> None:
        self._i64.release()
        self._buf.release()
        self.mmap.close()
        os.close(self._fd)

    # -- allocation -----------------------------------------------------------------------------

    def allocate(self, type_id: int, label: str, *, key: bytes = b"", registration_id: int = 0,
                 owner_id: int | None = None, heartbeat_ms: int | None = None) -> "Counter":
        """Take a free record, or reclaim one whose owner process is gone, and set it up;
        `heartbeat_ms`: its first heartbeat, on the clock its owner stamps the next ones with (the
        system's monotonic clock unless said: another clock's reading, older than it, would look
        like a subscriber silent for the difference and be dropped)."""
        if len(key) > MAX_KEY_LENGTH:
            raise ValueError(f"counter key of {len(key)} bytes exceeds {MAX_KEY_LENGTH}")
        label_bytes = label.encode()[:MAX_LABEL_LENGTH]
        owner = os.getpid() if owner_id is None else owner_id
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            counter_id, held = self._find_free_record(owner)
            if counter_id is None:
                self._reclaim_orphans()
                counter_id, held = self._find_free_record(owner)
            if counter_id is None:
                raise CountersFileError(f"{self.path}: all {self.capacity} counters are in use")
            if held >= self.process_limit:
                raise CounterShareExceeded(f"{self.path}: process {owner} holds {held} of its {self.capacity} "
                                           f"counters, its share; refused '{label}'")
            meta = self.metadata_offset + counter_id * METADATA_LENGTH
            value = self.values_offset + counter_id * COUNTER_LENGTH
            self._buf[value:value + COUNTER_LENGTH] = bytes(COUNTER_LENGTH)
            struct.pack_into("<qqq", self._buf, value, 0, registration_id, owner)
            struct.pack_into("<q", self._buf, value + HEARTBEAT_OFFSET,
                             monotonic_ms() if heartbeat_ms is None else heartbeat_ms)
            self._buf[meta + KEY_OFFSET:meta + KEY_OFFSET + MAX_KEY_LENGTH] = key.ljust(MAX_KEY_LENGTH, b"\0")
            struct.pack_into("<i", self._buf, meta + LABEL_LENGTH_OFFSET, len(label_bytes))
            self._buf[meta + LABEL_OFFSET:meta + LABEL_OFFSET + MAX_LABEL_LENGTH] = label_bytes.ljust(MAX_LABEL_LENGTH, b"\0")
            struct.pack_into("<iiq", self._buf, meta, RECORD_UNUSED, type_id, NOT_FREE_TO_REUSE)
            # The state goes last: readers skip the record until it is whole.
            struct.pack_into("<i", self._buf, meta + STATE_OFFSET, RECORD_ALLOCATED)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        return Counter(self, counter_id)

    def free(self, counter_id: int) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            meta = self.metadata_offset + counter_id * METADATA_LENGTH
            deadline = monotonic_ms() + int(COUNTER_FREE_TO_REUSE_DELAY_S * 1000)
            struct.pack_into("<q", self._buf, meta + FREE_FOR_REUSE_DEADLINE_OFFSET, deadline)
            struct.pack_into("<i", self._buf, meta + STATE_OFFSET, RECORD_RECLAIMED)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _find_free_record(self, owner: int) -> tuple[int | None, int]:
        """The first record free to take (None if none), and how many `owner` holds."""
        now = monotonic_ms()
        free, held = None, 0
        owner_index = (self.values_offset + OWNER_ID_OFFSET) // 8
        step = COUNTER_LENGTH // 8
        for counter_id in range(self.capacity):
            meta = self.metadata_offset + counter_id * METADATA_LENGTH
            state, _, deadline = struct.unpack_from("<iiq", self._buf, meta)
            if state == RECORD_ALLOCATED:
                held += self._i64[owner_index + counter_id * step] == owner
            elif state == RECORD_UNUSED:
                return counter_id if free is None else free, held  # none was ever taken past it
            elif free is None and deadline <= now:
                free = counter_id
        return free, held

    def _reclaim_orphans(self) -> None:
        """Free the counters of processes that died without freeing them (called under the lock)."""
        for info in self.counters():
            if info.owner_id > 0 and not pid_alive(info.owner_id):
                meta = self.metadata_offset + info.id * METADATA_LENGTH
                struct.pack_into("<q", self._buf, meta + FREE_FOR_REUSE_DEADLINE_OFFSET, 0)
                struct.pack_into("<i", self._buf, meta + STATE_OFFSET, RECORD_RECLAIMED)
                log.info("reclaimed counter %d (%s) of dead process %d", info.id, info.label, info.owner_id)

    # -- reading --------------------------------------------------------------------------------

    def state(self, counter_id: int) -> int:
        return struct.unpack_from("<i", self._buf, self.metadata_offset + counter_id * METADATA_LENGTH)[0]

    def type_id(self, counter_id: int) -> int:
        return struct.unpack_from("<i", self._buf, self.metadata_offset + counter_id * METADATA_LENGTH + TYPE_ID_OFFSET)[0]

    def key(self, counter_id: int) -> bytes:
        meta = self.metadata_offset + counter_id * METADATA_LENGTH + KEY_OFFSET
        return bytes(self._buf[meta:meta + MAX_KEY_LENGTH])

    def label(self, counter_id: int) -> str:
        meta = self.metadata_offset + counter_id * METADATA_LENGTH
        length = struct.unpack_from("<i", self._buf, meta + LABEL_LENGTH_OFFSET)[0]
        length = max(0, min(length, MAX_LABEL_LENGTH))
        return bytes(self._buf[meta + LABEL_OFFSET:meta + LABEL_OFFSET + length]).decode(errors="replace")

    def value_index(self, counter_id: int, field_offset: int = VALUE_OFFSET) -> int:
        """Index into the file viewed as int64s: what a hot path keeps to read or write a field."""
        return (self.values_offset + counter_id * COUNTER_LENGTH + field_offset) // 8

    def get(self, counter_id: int, field_offset: int = VALUE_OFFSET) -> int:
        return self._i64[self.value_index(counter_id, field_offset)]

    def put(self, counter_id: int, field_offset: int, value: int) -> None:
        """Store a field of another process's counter: only for the few cross-process signals,
        such as a writer marking a subscriber DROPPED."""
        self._i64[self.value_index(counter_id, field_offset)] = value

    def counters(self) -> Iterator[CounterInfo]:
        """Every allocated counter, in id order."""
        for counter_id in range(self.capacity):
            meta = self.metadata_offset + counter_id * METADATA_LENGTH
            state, type_id = struct.unpack_from("<ii", self._buf, meta)
            if state == RECORD_UNUSED:
                break  # records are taken in order: nothing was ever allocated past this one
            if state != RECORD_ALLOCATED:
                continue
            value, registration_id, owner_id = struct.unpack_from("<qqq", self._buf, self.values_offset + counter_id * COUNTER_LENGTH)
            heartbeat, status = struct.unpack_from("<qq", self._buf, self.values_offset + counter_id * COUNTER_LENGTH + HEARTBEAT_OFFSET)
            yield CounterInfo(counter_id, type_id, self.label(counter_id), self.key(counter_id), value,
                              registration_id, owner_id, heartbeat, status)

    def free_orphans(self, type_id: int, registration_id: int, keep=lambda counter_id: False) -> list[int]:
        """Free the counters of a type and registration (one log, one recording) whose owners
        died without freeing them, but those `keep(id)` says to leave; returns their ids. What a
        process taking over from a dead one calls: the dead one's counters would mislead readers."""
        freed = []
        for counter_id in self.find(type_id, registration_id):
            owner = self.get(counter_id, OWNER_ID_OFFSET)
            if owner != os.getpid() and not pid_alive(owner) and not keep(counter_id):
                log.info("freed counter %d (%s) at %d of dead process %d", counter_id, self.label(counter_id),
                         self.get(counter_id), owner)
                self.free(counter_id)
                freed.append(counter_id)
        return freed

    def find(self, type_id: int, registration_id: int) -> list[int]:
        """Ids of allocated counters of a type that belong to one log (by its correlation id)."""
        found = []
        for counter_id in range(self.capacity):
            meta = self.metadata_offset + counter_id * METADATA_LENGTH
            state, record_type = struct.unpack_from("<ii", self._buf, meta)
            if state == RECORD_UNUSED:
                break
            if state == RECORD_ALLOCATED and record_type == type_id and \
                    self.get(counter_id, REGISTRATION_ID_OFFSET) == registration_id:
                found.append(counter_id)
        return found

    @property
    def header(self) -> dict:
        version, to_driver, to_clients, meta_len, values_len, err_len = struct.unpack_from("<iiiiii", self._buf, 0)
        liveness, start, pid = struct.unpack_from("<qqq", self._buf, CLIENT_LIVENESS_TIMEOUT_FIELD_OFFSET)
        return {"version": version, "to_driver_buffer_length": to_driver, "to_clients_buffer_length": to_clients,
                "counters_metadata_buffer_length": meta_len, "counters_values_buffer_length": values_len,
                "error_log_buffer_length": err_len, "client_liveness_timeout_ns": liveness,
                "start_timestamp_ms": start, "pid": pid}


class Counter:
    """One counter owned by this process: plain stores into the shared file (single writer)."""

    __slots__ = ("file", "id", "_i64", "_index")

    def __init__(self, counters: CountersFile, counter_id: int) -> None:
        self.file = counters
        self.id = counter_id
        self._i64 = counters._i64
        self._index = counters.value_index(counter_id)

    def slot(self) -> tuple[memoryview, int]:
        """The file's int64 view and this counter's index in it: for hot paths that store the
        value directly (view[index] = value) instead of calling set()."""
        return self._i64, self._index

    def get(self) -> int:
        return self._i64[self._index]

    def set(self, value: int) -> None:
        self._i64[self._index] = value

    def add(self, delta: int = 1) -> None:
        self._i64[self._index] += delta

    def heartbeat(self, now_ms: int) -> None:
        self._i64[self._index + HEARTBEAT_OFFSET // 8] = now_ms

    @property
    def status(self) -> int:
        return self._i64[self._index + STATUS_OFFSET // 8]

    @property
    def label(self) -> str:
        return self.file.label(self.id)

    def close(self) -> None:
        self.file.free(self.id)


class InMemoryCounter:
    """A counter's stand-in without a counters file, or after it was freed: the same get, set and add."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def get(self) -> int:
        return self.value

    def set(self, value: int) -> None:
        self.value = value

    def add(self, delta: int = 1) -> None:
        self.value += delta


def _initialise(fd: int, capacity: int) -> None:
    length = compute_file_length(capacity)
    os.ftruncate(fd, length)
    header = struct.pack("<iiiiiiqqq", 0, 0, 0, capacity * METADATA_LENGTH, capacity * COUNTER_LENGTH, 0,
                         int(10e9), int(time.time() * 1000), os.getpid())
    os.pwrite(fd, header, 0)
    # The version goes last, as in Aeron: a reader that sees it sees a whole header.
    os.pwrite(fd, struct.pack("<i", CNC_VERSION), CNC_VERSION_FIELD_OFFSET)


def _validate(path: Path, fd: int, size: int) -> None:
    if size < END_OF_METADATA_OFFSET:
        raise CountersFileError(f"{path}: {size} bytes is too short for a counters file")
    version, to_driver, to_clients, meta_len, values_len, err_len = struct.unpack("<iiiiii", os.pread(fd, 24, 0))
    if version != CNC_VERSION:
        raise CountersFileError(f"{path}: counters file version {version:#x}, expected {CNC_VERSION:#x}")
    if meta_len % METADATA_LENGTH or values_len != (meta_len // METADATA_LENGTH) * COUNTER_LENGTH:
        raise CountersFileError(f"{path}: inconsistent counters buffer lengths {meta_len} and {values_len}")
    expected = END_OF_METADATA_OFFSET + to_driver + to_clients + meta_len + values_len + err_len
    if size < expected:
        raise CountersFileError(f"{path}: file is {size} bytes, its header needs {expected} (truncated?)")

"""The ramen message: the 32-byte header in front of every (reassembled) Aeron message ramen sends.

    u8 version | u8 kind | u16 flags | u32 channel | u32 source | u32 rollup_offset |
    i64 min_event_time_us | i64 max_event_time_us | body

The event-time bounds let replayers and the archive's time index skip whole messages without
decoding the Arrow body. Channel 0 is the live stream; replays use non-zero channels.
`rollup_offset`: where, from the message's start, the rollup of a TUPLES message's rows follows
its record batch (ramen/rollup.py); 0 when it has none. Readers of the rows never look past their
record batch, so a rollup changes nothing for them.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

MESSAGE_VERSION = 1
HEADER = struct.Struct("<BBHIIIqq")
HEADER_LENGTH = HEADER.size  # 32
VERSION_OFFSET = 0
KIND_OFFSET = 1
CHANNEL_OFFSET = 4
ROLLUP_OFFSET_OFFSET = 12
MIN_EVENT_TIME_OFFSET = 16
MAX_EVENT_TIME_OFFSET = 24

KIND_SCHEMA = 1
"""Body: an Arrow IPC schema."""
KIND_TUPLES = 2
"""Body: an Arrow IPC record batch."""
KIND_END_OF_REPLAY = 3
"""No body; `source` is the replayer id that ends the channel."""
KIND_RESUMED = 4
"""No body; a restarted source's first message. Its bounds (min = max) are where the stream resumes:
it holds every row from that event time on, and none between its previous run's last row and it.
The archive's time index takes it like any message, so the coverage of the recording it starts
touches the previous run's, and a replay across the restart is not refused for a gap that holds no
row (a generator resumes on its grid, the next row a step later). Readers of tuples skip it."""
KIND_GAP = 5
"""No body, channel 0; its bounds [min, max] are event times its function's output may miss rows of:
a windowed function's worker that joined its inputs after rows were written to them (restarted,
or loaded while its parents ran) writes one first, up to its first whole window. The recorder
keeps it beside the recording (ramen/archive/gaps.py), and the archive's coverage leaves it out,
so a replay of those windows computes them from the parents' archives. Readers of tuples skip it."""
KINDS = {KIND_SCHEMA: "SCHEMA", KIND_TUPLES: "TUPLES", KIND_END_OF_REPLAY: "END_OF_REPLAY",
         KIND_RESUMED: "RESUMED", KIND_GAP: "GAP"}

LIVE_CHANNEL = 0
NO_EVENT_TIME = -(1 << 63)
"""Bounds of a message without tuples."""


class MessageHeader(NamedTuple):
    """A named tuple rather than a frozen dataclass: readers decode one per message, and a frozen
    dataclass costs four times as much to build (1.2 µs against 0.3 µs)."""

    kind: int
    channel: int = LIVE_CHANNEL
    source: int = 0
    min_event_time_us: int = NO_EVENT_TIME
    max_event_time_us: int = NO_EVENT_TIME
    flags: int = 0
    rollup_offset: int = 0

    def pack(self) -> bytes:
        return HEADER.pack(MESSAGE_VERSION, self.kind, self.flags, self.channel, self.source, self.rollup_offset,
                           self.min_event_time_us, self.max_event_time_us)


def encode(header: MessageHeader, body: bytes | memoryview = b"") -> bytes:
    return header.pack() + bytes(body)


def decode_header(buffer, offset: int = 0) -> MessageHeader | None:
    """The header at offset, or None when the bytes there are not a ramen message."""
    if len(buffer) - offset < HEADER_LENGTH:
        return None
    version, kind, flags, channel, source, rollup_offset, low, high = HEADER.unpack_from(buffer, offset)
    if version != MESSAGE_VERSION or kind not in KINDS:
        return None
    return MessageHeader(kind, channel, source, low, high, flags, rollup_offset)


def event_time_bounds(buffer, offset: int = 0) -> tuple[int, int] | None:
    """(min, max) event time in µs of the message at offset, without building a header object."""
    if len(buffer) - offset < HEADER_LENGTH:
        return None
    version, kind, _, _, _, _, low, high = HEADER.unpack_from(buffer, offset)
    if version != MESSAGE_VERSION or kind not in KINDS or low == NO_EVENT_TIME:
        return None
    return low, high

"""Arrow record batches in ramen messages: what every worker, replayer and client sends and reads.

A TUPLES message is the 32-byte ramen header (ramen/message.py) followed by one Arrow IPC record
batch without its schema: every function's output schema is known before it runs (ramen/program),
so readers decode with the schema they already hold and no SCHEMA message is needed. The header
carries the batch's event-time bounds, so the time index and the replayers skip whole messages
without decoding them.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.compute as pc

from ramen.message import (CHANNEL_OFFSET, HEADER_LENGTH, KIND_END_OF_REPLAY, KIND_TUPLES, LIVE_CHANNEL, NO_EVENT_TIME,
                           MessageHeader, encode)


_CHANNEL = struct.Struct("<I")


def event_time_bounds(batch: pa.RecordBatch | pa.Table, event_time: str | None) -> tuple[int, int]:
    """(min, max) of the event-time column in µs since the epoch; NO_EVENT_TIME without one."""
    if event_time is None or batch.num_rows == 0:
        return NO_EVENT_TIME, NO_EVENT_TIME
    column = batch.column(event_time)
    bounds = pc.min_max(column.cast(pa.timestamp("us")).cast(pa.int64()))
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None:
        return NO_EVENT_TIME, NO_EVENT_TIME
    return low, high


def encode_tuples(batch: pa.RecordBatch, event_time: str | None, channel: int = LIVE_CHANNEL,
                  source: int = 0) -> bytes:
    low, high = event_time_bounds(batch, event_time)
    header = MessageHeader(KIND_TUPLES, channel, source, low, high)
    return encode(header, batch.serialize())


def decode_tuples(message, schema: pa.Schema) -> pa.RecordBatch:
    """The batch of a TUPLES message (header included), read without copying its buffers."""
    body = pa.py_buffer(message)[HEADER_LENGTH:]
    return pa.ipc.read_record_batch(body, schema)


def end_of_replay(channel: int, source: int) -> bytes:
    """The message that ends `channel` from one input; `source` names who ends it (a replayer id,
    or the worker id forwarding it)."""
    return encode(MessageHeader(KIND_END_OF_REPLAY, channel, source))


def with_channel(message: bytes, channel: int) -> bytes:
    """The same message tagged with another channel (the body is untouched)."""
    return message[:CHANNEL_OFFSET] + _CHANNEL.pack(channel) + message[CHANNEL_OFFSET + _CHANNEL.size:]

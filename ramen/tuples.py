"""Arrow record batches in ramen messages: what every worker, replayer and client sends and reads.

A TUPLES message is the 32-byte ramen header (ramen/message.py) followed by one Arrow IPC record
batch without its schema: every function's output schema is known before it runs (ramen/program),
so readers decode with the schema they already hold and no SCHEMA message is needed. The header
carries the batch's event-time bounds, so the time index and the replayers skip whole messages
without decoding them.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ramen.message import (CHANNEL_OFFSET, HEADER_LENGTH, KIND_END_OF_REPLAY, KIND_GAP, KIND_RESUMED, KIND_TUPLES,
                           LIVE_CHANNEL, NO_EVENT_TIME, MessageHeader, encode)


_CHANNEL = struct.Struct("<I")
_U8, _U16, _U32, _I32, _I64 = (struct.Struct(f) for f in ("<B", "<H", "<I", "<i", "<q"))
_IPC_PREFIX = struct.Struct("<Ii")  # continuation marker, metadata length
_IPC_CONTINUATION = 0xFFFFFFFF
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER = 1, 2  # fields of Message.fbs's Message table
_HEADER_TYPE_RECORD_BATCH = 3
_RECORD_BATCH_LENGTH = 0  # field of its RecordBatch table


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


def event_times_us(batch: pa.RecordBatch | pa.Table, event_time: str) -> np.ndarray:
    """The event-time column as µs since the epoch, UTC (int64, numpy)."""
    column = batch.column(event_time)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("us", tz=column.type.tz))
    return column.cast(pa.int64()).to_numpy(zero_copy_only=False)


def encode_tuples(batch: pa.RecordBatch, event_time: str | None, channel: int = LIVE_CHANNEL,
                  source: int = 0) -> bytes:
    low, high = event_time_bounds(batch, event_time)
    header = MessageHeader(KIND_TUPLES, channel, source, low, high)
    return encode(header, batch.serialize())


def decode_tuples(message, schema: pa.Schema) -> pa.RecordBatch:
    """The batch of a TUPLES message (header included), read without copying its buffers."""
    body = pa.py_buffer(message)[HEADER_LENGTH:]
    return pa.ipc.read_record_batch(body, schema)


def tuple_count(message) -> int | None:
    """The row count of a TUPLES message read from its IPC metadata alone, so that the body may
    be elsewhere (a replayer forwarding a recorded message sees its first fragment); None when the
    metadata is not a record batch's, or does not lie within `message`.

    The metadata is a flatbuffer Message (Arrow's Message.fbs): the root table's field 1 is the
    header type (3: RecordBatch), field 2 the header table, whose field 0 is the row count."""
    try:
        continuation, _ = _IPC_PREFIX.unpack_from(message, HEADER_LENGTH)
        if continuation != _IPC_CONTINUATION:
            return None
        base = HEADER_LENGTH + _IPC_PREFIX.size
        root = base + _U32.unpack_from(message, base)[0]
        if _flatbuffer_field(message, root, _MESSAGE_HEADER_TYPE, _U8) != _HEADER_TYPE_RECORD_BATCH:
            return None
        at = _field_position(message, root, _MESSAGE_HEADER)
        if at is None:
            return None
        batch = at + _U32.unpack_from(message, at)[0]
        return _flatbuffer_field(message, batch, _RECORD_BATCH_LENGTH, _I64)
    except (struct.error, IndexError):
        return None


def _field_position(buffer, table: int, field: int) -> int | None:
    vtable = table - _I32.unpack_from(buffer, table)[0]
    entry = 4 + 2 * field
    if entry >= _U16.unpack_from(buffer, vtable)[0]:
        return None
    offset = _U16.unpack_from(buffer, vtable + entry)[0]
    return table + offset if offset else None


def _flatbuffer_field(buffer, table: int, field: int, kind: struct.Struct) -> int:
    at = _field_position(buffer, table, field)
    return 0 if at is None else kind.unpack_from(buffer, at)[0]  # an absent scalar is its default, 0


def end_of_replay(channel: int, source: int) -> bytes:
    """The message that ends `channel` from one input; `source` names who ends it (a replayer id,
    or the worker id forwarding it)."""
    return encode(MessageHeader(KIND_END_OF_REPLAY, channel, source))


def resumed(event_time_us: int, source: int) -> bytes:
    """The live message a restarted source writes first: its rows go on from `event_time_us`,
    with none missing since its previous run's last (ramen/message.py, KIND_RESUMED)."""
    return encode(MessageHeader(KIND_RESUMED, LIVE_CHANNEL, source, event_time_us, event_time_us))


def gap(since_us: int, until_us: int, source: int) -> bytes:
    """The live message a windowed function writes first when its windows before `until_us`, from
    `since_us` on, may miss rows (ramen/message.py, KIND_GAP). Its bounds are inclusive, as every
    message's: [since_us, until_us - 1]."""
    return encode(MessageHeader(KIND_GAP, LIVE_CHANNEL, source, since_us, until_us - 1))


def with_channel(message: bytes, channel: int) -> bytes:
    """The same message tagged with another channel (the body is untouched)."""
    return message[:CHANNEL_OFFSET] + _CHANNEL.pack(channel) + message[CHANNEL_OFFSET + _CHANNEL.size:]

"""ramen.tuples: the row count read from a TUPLES message's IPC metadata alone."""

import pyarrow as pa
import pytest

from ramen.message import HEADER_LENGTH
from ramen.tuples import encode_tuples, end_of_replay, tuple_count

SCHEMA = pa.schema({"ts": pa.timestamp("us"), "host": pa.string(), "bytes": pa.int64(),
                    "tags": pa.list_(pa.string())})


def batch(rows: int) -> pa.RecordBatch:
    return pa.record_batch({"ts": pa.array(range(rows), pa.timestamp("us")),
                            "host": [f"host-{i % 7}" if i % 5 else None for i in range(rows)],
                            "bytes": pa.array(range(rows), pa.int64()),
                            "tags": [["a"] * (i % 3) for i in range(rows)]}, schema=SCHEMA)


@pytest.mark.parametrize("rows", [0, 1, 3, 4096, 100_000])
def test_the_count_is_the_batchs_and_needs_only_the_messages_start(rows):
    message = encode_tuples(batch(rows), "ts")
    assert tuple_count(message) == rows
    # A recorded message's first fragment (Aeron's smallest MTU) holds the metadata.
    assert tuple_count(memoryview(message)[:1408 - 32]) == rows


def test_what_is_not_a_record_batch_has_no_count():
    message = encode_tuples(batch(10), "ts")
    schema_message = message[:HEADER_LENGTH] + SCHEMA.serialize().to_pybytes()
    assert tuple_count(schema_message) is None
    assert tuple_count(end_of_replay(5, 1)) is None  # no body at all
    assert tuple_count(message[:HEADER_LENGTH + 12]) is None  # metadata cut short
    assert tuple_count(message[:HEADER_LENGTH] + b"\x00" * 64) is None  # no continuation marker

"""Rollups: a TUPLES message carrying its rows' buckets after them, read by summarised replays, and
invisible to every reader of the rows."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ramen.message import decode_header
from ramen.program import loads
from ramen.replay import summary
from ramen.replay.contract import Summary
from ramen.rollup import ROLLUP_STEP_S, Rollup
from ramen.tuples import decode_tuples, encode_tuples, tuple_count, with_channel
from workers import summaries
from workers.outputs import tuple_messages
from workers.summaries import Summariser

PROGRAM = '''[program]
name = "p"

[[function]]
name = "raw"
source = { kind = "generator" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64", ratio = "double", note = "string" }
event_time = "ts"
factors = ["host"]
archive = { retention = "1d" }

[[function]]
name = "plain"
source = { kind = "generator" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
archive = { retention = "1d" }
'''
HOSTS = ["a", "b", "c"]


@pytest.fixture(scope="module")
def program():
    return loads(PROGRAM)


@pytest.fixture(scope="module")
def raw(program):
    return program.function("raw")


def rows(count: int, hosts=HOSTS, start_s: int = 0) -> pa.RecordBatch:
    """`count` rows, 10 ms apart, over the hosts in turn."""
    return pa.RecordBatch.from_pydict({
        "ts": pa.array([start_s * 1_000_000 + i * 10_000 for i in range(count)], pa.timestamp("us")),
        "host": [hosts[i % len(hosts)] for i in range(count)],
        "bytes": pa.array([i for i in range(count)], pa.int64()),
        "ratio": pa.array([None if i % 7 == 0 else i / 4 for i in range(count)], pa.float64()),
        "note": [""] * count})


def test_only_a_function_with_factors_and_numbers_has_a_rollup(program, raw):
    rollup = Rollup.of(raw)
    assert rollup.spec == Summary(ROLLUP_STEP_S, ("host",), ("bytes", "ratio"))
    assert Rollup.of(program.function("plain")) is None


def test_a_message_with_its_rollup_reads_as_the_same_rows_and_carries_their_buckets(raw):
    rollup, batch = Rollup.of(raw), rows(300)
    plain = encode_tuples(batch, "ts", channel=4, source=9)
    message = rollup.appended(plain, batch)
    assert len(message) > len(plain)
    assert decode_header(message).rollup_offset == len(plain)
    assert decode_header(plain).rollup_offset == 0
    assert decode_tuples(message, raw.schema).equals(batch)
    assert tuple_count(message) == 300
    assert decode_header(with_channel(message, 7)).rollup_offset == len(plain)
    buckets = pa.Table.from_batches([rollup.decode(with_channel(message, 7))])
    assert ordered(buckets).equals(ordered(summary.aggregate(rollup.spec, raw, batch)))
    assert rollup.decode(plain) is None


def test_a_rollup_of_other_factors_or_fields_is_not_taken(program, raw):
    """Written when the function had other factors (they change no output, so an archive holds
    both): the reader folds those rows itself."""
    batch = rows(300)
    message = Rollup.of(raw).appended(encode_tuples(batch, "ts"), batch)
    before = loads(PROGRAM.replace('factors = ["host"]', 'factors = ["note"]')).function("raw")
    assert Rollup.of(before).decode(message) is None


def test_a_rollup_as_big_as_its_rows_is_not_written(raw):
    batch = rows(300, hosts=[f"h{i}" for i in range(300)])  # a factor value per row
    plain = encode_tuples(batch, "ts")
    assert Rollup.of(raw).appended(plain, batch) == plain


def test_a_rollup_serves_summaries_of_its_factors_at_a_multiple_of_its_step_over_fields_it_has(raw):
    rollup = Rollup.of(raw)
    assert rollup.serves(Summary(10, ("host",), ("bytes",)))
    assert rollup.serves(Summary(1, ("host",), ("ratio", "bytes")))
    assert not rollup.serves(Summary(10, (), ("bytes",)))
    assert not rollup.serves(Summary(10, ("note",), ("bytes",)))


def test_live_messages_carry_their_rollup_within_the_logs_max_message_length(raw):
    table = pa.Table.from_batches([rows(5000)])
    rollup = Rollup.of(raw)
    for max_length in (1 << 20, 1 << 16, 1 << 13):
        messages = list(tuple_messages(table, max_length, "ts", 0, 1, rollup))
        assert all(decode_header(m).rollup_offset for m, _ in messages)
        assert max(len(m) for m, _ in messages) <= max_length
        assert sum(n for _, n in messages) == 5000


@pytest.mark.parametrize("with_rollups", ["all", "some", "none"])
def test_a_summarised_target_folds_rollups_and_rows_into_the_buckets_of_all_the_rows(raw, monkeypatch, with_rollups):
    monkeypatch.setattr(summaries, "SUMMARY_PARTS", 3)
    spec = Summary(10, ("host",), ("bytes", "ratio"))
    rollup = Rollup.of(raw)
    batches = [rows(240, start_s=7 * i) for i in range(8)]  # over bucket bounds, and several in one
    summariser = Summariser(spec, raw, 5, 1, 1 << 20)
    out = []
    for i, batch in enumerate(batches):
        message = encode_tuples(batch, "ts")
        if with_rollups == "all" or (with_rollups == "some" and i % 2):
            message = rollup.appended(message, batch)
        messages, count = summariser.add_message(message, raw.schema)
        assert count == batch.num_rows
        out += messages
    assert summariser.rollups == {"all": 8, "some": 4, "none": 0}[with_rollups]
    out += summariser.finish()
    partials = [pa.Table.from_batches([decode_tuples(m, summary.schema(spec, raw))]) for m, _ in out]
    assert len(partials) == 3  # after 3 messages, 6, and the last 2
    for partial in partials:  # each one bucket a row: a 10 s step's rows, not its 1 s rollups'
        assert partial.num_rows == partial.group_by([summary.BUCKET, "host"]).aggregate([]).num_rows
    expected = summary.aggregate(spec, raw, pa.Table.from_batches(batches))
    assert ordered(summary.combine(spec, raw, partials)).equals(ordered(expected))


def test_a_message_whose_rollup_is_taken_is_not_decoded(raw, monkeypatch):
    batch = rows(300)
    message = Rollup.of(raw).appended(encode_tuples(batch, "ts"), batch)

    def decoded(*_):
        raise AssertionError("the rows of a message whose rollup was taken were decoded")
    monkeypatch.setattr(summaries, "decode_tuples", decoded)
    summariser = Summariser(Summary(10, ("host",), ("bytes",)), raw, 5, 1, 1 << 20)
    assert summariser.add_message(message, raw.schema) == ([], 300)
    assert summariser.rollups == 1


def ordered(buckets: pa.Table) -> pa.Table:
    return buckets.sort_by([(summary.BUCKET, "ascending"), ("host", "ascending")])


def test_a_rollup_that_does_not_read_has_its_rows_folded_instead(raw, caplog):
    rollup, batch = Rollup.of(raw), rows(300)
    plain = encode_tuples(batch, "ts")
    message = rollup.appended(plain, batch)
    damaged = message[:len(plain) + 8] + b"\xff" * (len(message) - len(plain) - 8)
    assert rollup.decode(damaged) is None
    assert "a rollup that does not read" in caplog.text

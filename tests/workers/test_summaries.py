"""A summarised replay's buckets: what a function can be summarised by, and partial buckets (a
target's flushes) adding up to the buckets of all the rows."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ramen.message import KIND_TUPLES, decode_header
from ramen.program import loads
from ramen.replay import summary
from ramen.replay.contract import Summary
from ramen.tuples import decode_tuples
from workers import summaries
from workers.summaries import Summariser

PROGRAM = '''[program]
name = "p"

[[function]]
name = "raw"
source = { kind = "generator" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64", note = "string" }
event_time = "ts"
archive = { retention = "1d" }
'''
SUMMARY = Summary(10, ("host",), ("bytes",))


@pytest.fixture(scope="module")
def raw():
    return loads(PROGRAM).function("raw")


def rows(times_s, hosts, values) -> pa.Table:
    return pa.table({"ts": pa.array([t * 1_000_000 for t in times_s], pa.timestamp("us")), "host": hosts,
                     "bytes": pa.array(values, pa.int64()), "note": [""] * len(values)})


def test_a_summary_names_factors_and_numbers_the_function_has(raw):
    summary.check(SUMMARY, raw)
    with pytest.raises(summary.SummaryError, match=r"^p/raw has no field 'rack' to summarise$"):
        summary.check(Summary(10, ("rack",)), raw)
    with pytest.raises(summary.SummaryError, match=r"^p/raw.note is string, not a number to summarise$"):
        summary.check(Summary(10, (), ("note",)), raw)


def test_buckets_hold_sums_and_counts_per_step_and_factor_values(raw):
    buckets = summary.aggregate(SUMMARY, raw, rows([0, 5, 12, 13], ["a", "b", "a", "a"], [1, 2, 3, 4]))
    assert buckets.schema == summary.schema(SUMMARY, raw)
    got = sorted(zip(*(buckets.column(c).to_pylist() for c in buckets.column_names)))
    assert got == [(0, "a", 1.0, 1), (0, "b", 2.0, 1), (10, "a", 7.0, 2)]


def test_a_target_writes_partial_buckets_that_add_up_to_those_of_all_its_rows(raw, monkeypatch):
    monkeypatch.setattr(summaries, "SUMMARY_ROWS", 3)
    table = rows(list(range(0, 70, 7)), ["a", "b"] * 5, list(range(10)))
    summariser = Summariser(SUMMARY, raw, 7, 42, 1 << 20)
    messages, returned = [], []
    for batch in table.to_batches(max_chunksize=2):
        messages += summariser.add(batch)
        returned.append(len(messages))
    # Rows 1-4 go to be folded; their buckets come back when rows 5-8 go, those of 5-8 at the end.
    assert returned == [0, 0, 0, 1, 1]
    messages += summariser.finish()
    assert summariser.finish() == []
    schema = summary.schema(SUMMARY, raw)
    headers = [decode_header(m) for m, _ in messages]
    assert {(h.kind, h.channel, h.source) for h in headers} == {(KIND_TUPLES, 7, 42)}
    partials = [pa.Table.from_batches([decode_tuples(m, schema)]) for m, _ in messages]
    assert summary.combine(SUMMARY, raw, partials).equals(
        summary.combine(SUMMARY, raw, [summary.aggregate(SUMMARY, raw, table)]))


def test_null_values_are_not_counted_and_a_bucket_of_nulls_sums_to_null(raw):
    table = rows([0, 1, 2, 12], ["a", "a", "b", "a"], [None, 3, None, 4])
    buckets = summary.aggregate(SUMMARY, raw, table)
    got = sorted(zip(*(buckets.column(c).to_pylist() for c in buckets.column_names)))
    assert got == [(0, "a", 3.0, 1), (0, "b", None, 0), (10, "a", 4.0, 1)]


def test_rows_in_many_small_chunks_make_the_buckets_of_the_same_rows_in_one(raw):
    table = rows(list(range(0, 90, 3)), ["a", "b", "c"] * 10, list(range(30)))
    chunked = pa.Table.from_batches(table.to_batches(max_chunksize=4))
    assert chunked.column("ts").num_chunks > 1
    assert summary.aggregate(SUMMARY, raw, chunked).equals(summary.aggregate(SUMMARY, raw, table))

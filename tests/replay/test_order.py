"""The replay's reorder buffer (ramen/replay/order.py): rows out in event-time order while holding
only those within the disorder bound of the newest; later rows out at once and counted; a window's
rows in one order whatever order they came in; the bound found from the plan."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from ramen.archive.coverage import Interval
from ramen.program import loads
from ramen.replay.order import ReorderBuffer, disorder_bound_us, stable_sort_keys
from ramen.replay.plan import plan_replay

SCHEMA = pa.schema([("ts", pa.timestamp("us")), ("host", pa.string()), ("n", pa.int64())])
MINUTE = 60_000_000


def rows(times: list[int | None], hosts: list[str] | None = None, first: int = 0) -> pa.RecordBatch:
    hosts = hosts or [f"h{i % 3}" for i in range(len(times))]
    return pa.record_batch([pa.array(times, pa.timestamp("us")), pa.array(hosts),
                            pa.array(range(first, first + len(times)), pa.int64())], schema=SCHEMA)


def drain(buffer: ReorderBuffer, batches) -> tuple[pa.Table, int]:
    """Everything out, and the most rows the buffer held after any batch."""
    out, most_held = [], 0
    for batch in batches:
        out += buffer.add(batch)
        most_held = max(most_held, buffer.held_rows)
    out += buffer.finish()
    return pa.concat_tables(out) if out else SCHEMA.empty_table(), most_held


def times_of(table: pa.Table) -> list[int]:
    return table["ts"].cast(pa.int64()).to_pylist()


def test_rows_in_order_go_out_as_they_come_holding_only_the_newest_time():
    batches = [rows([t * 10 + i for i in range(10)], first=t * 10) for t in range(50)]
    out, most_held = drain(ReorderBuffer(SCHEMA, "ts", 0), batches)
    assert times_of(out) == list(range(500))
    assert most_held == 1  # the newest row waits: one of its time could still come


def test_rows_disordered_within_the_bound_come_out_sorted_holding_about_the_bound():
    shuffled = random.Random(7)
    times = list(range(10_000))
    for start in range(0, len(times), 100):  # disorder of under 100 µs: shuffled within runs of 100
        run = times[start:start + 100]
        shuffled.shuffle(run)
        times[start:start + 100] = run
    batches = [rows(times[i:i + 50]) for i in range(0, len(times), 50)]
    buffer = ReorderBuffer(SCHEMA, "ts", 100)
    out, most_held = drain(buffer, batches)
    assert times_of(out) == list(range(10_000)) and buffer.late == 0
    assert most_held <= 250  # the bound (100 rows of µs) and a batch or two, never the whole range


def test_a_row_later_than_the_bound_goes_out_at_once_and_is_counted():
    buffer = ReorderBuffer(SCHEMA, "ts", 10)
    assert buffer.add(rows([100, 200])) != []  # 100 < 200 - 10: out
    out = buffer.add(rows([50]))
    assert buffer.late == 1 and [times_of(t) for t in out] == [[50]]
    assert times_of(pa.concat_tables(buffer.finish())) == [200]


def test_rows_without_an_event_time_go_out_at_once():
    buffer = ReorderBuffer(SCHEMA, "ts", 0)
    out = buffer.add(rows([None, 5, None]))
    assert [t.num_rows for t in out] == [2] and out[0]["ts"].null_count == 2 and buffer.late == 0


def test_a_windows_rows_come_out_in_one_order_whatever_order_they_arrived_in():
    keys = stable_sort_keys(SCHEMA, "ts", windowed=True)
    assert keys == [("ts", "ascending"), ("host", "ascending"), ("n", "ascending")]
    window = [(MINUTE, "b", 1), (MINUTE, "a", 2), (MINUTE, "c", 0), (2 * MINUTE, "a", 3)]
    results = []
    for seed in range(5):
        arrival = window[:3]
        random.Random(seed).shuffle(arrival)
        arrival.append(window[3])
        batch = pa.record_batch([pa.array([t for t, _, _ in arrival], pa.timestamp("us")),
                                 pa.array([h for _, h, _ in arrival]), pa.array([n for _, _, n in arrival])],
                                schema=SCHEMA)
        out, _ = drain(ReorderBuffer(SCHEMA, "ts", MINUTE, keys), [batch.slice(0, 2), batch.slice(2)])
        results.append(out.to_pylist())
    assert all(r == results[0] for r in results)
    assert [(r["host"], r["n"]) for r in results[0]] == [("a", 2), ("b", 1), ("c", 0), ("a", 3)]


PROGRAM = """
[program]
name = "p"

[[function]]
name = "src"
source = { kind = "parquet", path = "src.parquet" }
schema = { ts = "timestamp[us]", bytes = "int64" }
event_time = "ts"
archive = { retention = "7d" }

[[function]]
name = "per_minute"
from = ["src"]
window = { every = "1 minute" }
engine = "spark"
sql = "SELECT window.start AS ts, sum(bytes) AS bytes FROM src GROUP BY window(ts, '1 minute')"
schema = { ts = "timestamp[us]", bytes = "int64" }
event_time = "ts"

[[function]]
name = "big"
from = ["per_minute"]
engine = "spark"
sql = "SELECT ts, bytes FROM per_minute WHERE bytes > 10"
schema = { ts = "timestamp[us]", bytes = "int64" }
event_time = "ts"

[[function]]
name = "filtered"
from = ["src"]
engine = "spark"
sql = "SELECT ts, bytes FROM src WHERE bytes > 10"
schema = { ts = "timestamp[us]", bytes = "int64" }
event_time = "ts"
"""


@pytest.mark.parametrize("target, bound", [("p/src", 1234), ("p/per_minute", MINUTE), ("p/big", MINUTE),
                                           ("p/filtered", 1234)])
def test_the_bound_is_the_sources_recorded_disorder_or_a_window_on_the_way(target, bound):
    programs = {"p": loads(PROGRAM, "p.toml")}
    coverage = {"p/src": [Interval(0, 100 * MINUTE)]}
    plan = plan_replay(target, 10 * MINUTE, 20 * MINUTE, programs, coverage)
    assert disorder_bound_us(plan, programs, {"p/src": 1234}) == bound

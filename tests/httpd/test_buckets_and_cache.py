"""Rows become buckets of sums and counts that combine exactly; the cache keeps settled ranges
per function signature, says what is missing, and stays within its memory bound."""

import numpy as np
import pyarrow as pa
import pytest

from ramen.httpd import buckets
from ramen.httpd.cache import ResultCache
from ramen.program import loads
from ramen.replay import summary

PROGRAM = '''[program]
name = "p"

[[function]]
name = "raw"
source = { kind = "generator" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64", ratio = "float64" }
event_time = "ts"
factors = ["host"]
archive = { retention = "1d" }

[[function]]
name = "per_minute"
from = ["raw"]
window = { every = "1 minute" }
engine = "spark"
sql = "SELECT ts, bytes FROM raw"
schema = { ts = "timestamp[us]", bytes = "int64" }
event_time = "ts"
'''


@pytest.fixture(scope="module")
def program():
    return loads(PROGRAM)


def aggregate(function, table):
    """The function's rows as the buckets a summarised replay of it sends."""
    return summary.aggregate(buckets.summary_of(function), function, table)


def rows(times_s, hosts, values, ratios=None):
    return pa.table({"ts": pa.array([int(t * 1e6) for t in times_s], pa.timestamp("us")),
                     "host": hosts, "bytes": pa.array(values, pa.int64()),
                     "ratio": pa.array(ratios if ratios is not None else [None] * len(values), pa.float64())})


def test_steps_come_from_the_window(program):
    assert buckets.step_s(program.function("raw")) == buckets.DEFAULT_STEP_S
    assert buckets.step_s(program.function("per_minute")) == 60


def test_series_average_each_step_per_factor_value_with_nan_where_empty(program):
    raw = program.function("raw")
    table = aggregate(raw, rows([0, 1, 5, 12, 31], ["a", "a", "b", "a", "a"], [10, 20, 7, 5, 1]))
    a, b = buckets.to_series(raw, table, [(("a",), "bytes", "p.raw.a.bytes"), (("b",), "bytes", "p.raw.b.bytes")],
                             0, 40)
    assert (a.start, a.step, a.name) == (0, 10, "p.raw.a.bytes")
    np.testing.assert_array_equal(a.values, [15.0, 5.0, np.nan, 1.0])
    np.testing.assert_array_equal(b.values, [7.0, np.nan, np.nan, np.nan])
    ratio, = buckets.to_series(raw, table, [(("a",), "ratio", "x")], 0, 20)
    assert np.isnan(ratio.values).all()  # nulls count for nothing, and average to no value


def _hosts_table(raw, hosts: int, seconds: int):
    times = [t for t in range(0, seconds, 10) for _ in range(hosts)]
    names = [f"h{h:02d}" for _ in range(0, seconds, 10) for h in range(hosts)]
    return aggregate(raw, rows(times, names, list(range(len(times)))))


def test_a_series_over_a_range_too_long_for_a_grid_of_every_host_is_computed_alone_and_kept_by_nobody(
        program, monkeypatch):
    raw = program.function("raw")
    table = _hosts_table(raw, 50, 600)
    wanted = [(("h07",), "bytes", "p.raw.h07.bytes")]
    shared, = buckets.to_series(raw, table, wanted, 0, 86400)  # 50 hosts x 8,640 steps: one grid, kept
    assert buckets.derived_bytes() >= 50 * 8640 * 8
    monkeypatch.setattr(buckets, "SHARED_GRID_MAX_BYTES", 50 * 8640 * 8 - 1)
    other = _hosts_table(raw, 50, 600)  # another table: nothing kept for it yet
    before = buckets.derived_bytes()

    alone, = buckets.to_series(raw, other, wanted, 0, 86400)

    np.testing.assert_array_equal(alone.values, shared.values)  # the same averages, by either path
    assert (alone.start, alone.step, len(alone.values)) == (shared.start, shared.step, 8640)
    assert buckets.derived_bytes() == before  # no grid made for it


def test_the_grids_kept_for_all_tables_stay_within_their_bound(program, monkeypatch):
    raw = program.function("raw")
    monkeypatch.setattr(buckets, "DERIVED_MAX_BYTES", 3 * 10 * 8640 * 8)
    for _ in range(6):  # six tables of 10 hosts, a day's grid each (691 KB)
        buckets.to_series(raw, _hosts_table(raw, 10, 60), [(("h00",), "bytes", "x")], 0, 86400)
        assert buckets.derived_bytes() <= buckets.DERIVED_MAX_BYTES


def test_partial_buckets_combine_into_the_same_averages(program):
    raw = program.function("raw")
    times, hosts, values = [0, 1, 2, 11, 13], ["a"] * 5, [1, 2, 3, 4, 5]
    whole = aggregate(raw, rows(times, hosts, values))
    split = buckets.combine(raw, [aggregate(raw, rows(times[:2], hosts[:2], values[:2])),
                                  aggregate(raw, rows(times[2:], hosts[2:], values[2:]))])
    assert split.equals(buckets.combine(raw, [whole]))
    assert buckets.factor_values(raw, whole) == {("a",)}


def test_the_cache_answers_what_it_holds_and_names_the_holes(program):
    raw = program.function("raw")
    cache = ResultCache()
    assert cache.lookup(raw, 0, 100)[1] == [(0, 100)]
    cache.put(raw, 20, 50, aggregate(raw, rows([25, 45, 55], ["a"] * 3, [1, 2, 3])))
    assert cache.lookup(raw, 0, 100)[1] == [(0, 20), (50, 100)]
    assert cache.lookup(raw, 30, 40)[1] == []
    held = cache.lookup(raw, 0, 100)[0]
    assert held.column(buckets.BUCKET).to_pylist() == [20, 40]  # 55 was outside the settled range
    cache.put(raw, 50, 60, aggregate(raw, rows([55], ["a"], [3])))  # touching: one chunk
    assert cache.lookup(raw, 20, 60)[1] == []
    assert cache.lookup(raw, 0, 100)[0].column(buckets.BUCKET).to_pylist() == [20, 40, 50]


def test_a_changed_function_never_gets_the_old_results(program):
    raw = program.function("raw")
    changed = loads(PROGRAM.replace("generator", "csv\", path = \"x.csv")
                    ).function("raw")
    assert changed.signature != raw.signature
    cache = ResultCache()
    cache.put(raw, 0, 60, aggregate(raw, rows([5], ["a"], [1])))
    assert cache.lookup(changed, 0, 60)[1] == [(0, 60)]
    cache.put(changed, 0, 60, buckets.empty(changed))
    assert cache.lookup(raw, 0, 60)[1] == [(0, 60)]  # the old signature's results were dropped


def test_memory_stays_within_the_bound(program):
    raw = program.function("raw")
    per_minute = program.function("per_minute")
    many = aggregate(raw, rows(list(range(0, 100_000, 10)), ["a"] * 10_000, list(range(10_000))))
    cache = ResultCache(max_bytes=many.nbytes + 1000)
    cache.put(raw, 0, 100_000, many)
    cache.put(per_minute, 0, 60_000, aggregate(per_minute, pa.table(
        {"ts": pa.array(list(range(0, 60_000_000_000, 60_000_000)), pa.timestamp("us")),
         "bytes": pa.array(range(1000), pa.int64())})))
    assert cache.nbytes <= cache.max_bytes
    assert cache.lookup(raw, 0, 100_000)[1] == [(0, 100_000)]  # the least recently used went first
    assert cache.lookup(per_minute, 0, 60_000)[1] == []

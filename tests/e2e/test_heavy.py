"""Heavy (Spark) functions end to end: `ramen start --spark` on the session's Spark Connect server,
a generator back-filling ten minutes, and replays checked against Spark run directly over the raw
source replay and against pyarrow; then a bad SQL refused at load time.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from ramen import keyspace
from ramen.replay.client import Replay
from ramen.spark.frames import for_spark
from ramen.spark.session import session
from tests.e2e.test_replay import BACKFILL_MIN, RATE, Stack, minute_range, per_minute_by_pyarrow
from tests.waiting import wait_for

SQL = "SELECT window.start AS start, host, sum(bytes) AS bytes FROM traffic GROUP BY window(ts, '1 minute'), host"
PROGRAM = f"""
[program]
name = "hv"

[[function]]
name = "traffic"
source = {{ kind = "generator", rate = {RATE}, hosts = 20, seed = 7, backfill = "{BACKFILL_MIN}m" }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
archive = {{ retention = "1d" }}

[[function]]
name = "per_minute"
lazy = true
from = ["traffic"]
window = {{ every = "1 minute", lateness = "10s" }}
engine = "spark"
sql = "{SQL}"
schema = {{ start = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "start"

[[function]]
name = "live_minute"
from = ["traffic"]
window = {{ every = "1 minute", lateness = "10s" }}
engine = "spark"
sql = "{SQL}"
schema = {{ start = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "start"
"""
BAD_SQL = PROGRAM.replace('name = "hv"', 'name = "bad"').replace("sum(bytes)", "sum(nope)", 1)


def sorted_rows(table: pa.Table) -> pa.Table:
    table = table.select(["start", "host", "bytes"])
    return table.set_column(0, "start", table["start"].cast(pa.timestamp("us"))).sort_by(
        [("start", "ascending"), ("host", "ascending")])


@pytest.fixture(scope="module")
def stack(tmp_path_factory, spark_remote):
    stack = Stack(tmp_path_factory.mktemp("heavy"))
    try:
        yield stack.start("hv", PROGRAM, "hv/traffic", "--spark", spark_remote)
    finally:
        stack.stop()


def test_a_heavy_replay_matches_spark_over_the_raw_replay_and_pyarrow(stack, spark_remote):
    since, until = minute_range(8, 4)
    traffic = stack.replay_table("hv/traffic", since, until)
    assert traffic.num_rows == 4 * 60 * RATE
    with session(spark_remote) as spark:
        spark.createDataFrame(for_spark(traffic.cast(pa.schema([("ts", pa.timestamp("us")), ("host", pa.string()),
                                                                 ("bytes", pa.int64())])))
                              ).createOrReplaceTempView("traffic")
        by_spark = sorted_rows(spark.sql(SQL).toArrow())
    by_pyarrow = per_minute_by_pyarrow(traffic)
    got = sorted_rows(stack.replay_table("hv/per_minute", since, until))
    assert got.num_rows == 4 * 20
    assert got["bytes"].to_pylist() == by_spark["bytes"].to_pylist() == by_pyarrow["bytes"].to_pylist()
    assert got["host"].to_pylist() == by_spark["host"].to_pylist() == by_pyarrow["host"].to_pylist()


def test_back_to_back_replays_lose_nothing(stack, monkeypatch):
    """Each replay is asked for while the supervisor stops the lazy worker the last one left unused
    (a heavy worker takes a second or two to go): it must reach the next process of that worker,
    whole, not the one on its way out."""
    monkeypatch.setenv("RAMEN_DIR", str(stack.base))
    since, until = minute_range(8, 3)
    expected = per_minute_by_pyarrow(stack.replay_table("hv/traffic", since, until))
    with stack.client("user") as client:
        programs = stack.programs(client)
        for _ in range(3):
            with Replay(client, programs, "hv/per_minute", since, until, site="local", no_merge=True) as replay:
                replay.start()
                got = sorted_rows(pa.Table.from_batches(list(replay.batches()), schema=replay.schema))
            assert got["bytes"].to_pylist() == expected["bytes"].to_pylist()


def test_live_and_replay_channels_of_one_heavy_worker_stay_apart(stack):
    since, until = minute_range(7, 3)
    expected = per_minute_by_pyarrow(stack.replay_table("hv/traffic", since, until))
    got = sorted_rows(stack.replay_table("hv/live_minute", since, until))
    assert got["bytes"].to_pylist() == expected["bytes"].to_pylist()  # no live row mixed in
    with stack.client() as client:
        def channels():
            stats = client.get(keyspace.function_key("local", "hv/live_minute", "stats")).value
            return {int(c): s for c, s in stats["channels"].items()}
        replayed = wait_for(lambda: [s for c, s in channels().items() if c != 0 and s["eor_received"]],
                            "the replay channel's stats")
        assert [s["tuples_in"] for s in replayed] == [3 * 60 * RATE]  # exactly the range, nothing live
        assert channels()[0]["tuples_in"] > 0  # live went on beside it (from where the worker joined)


def test_ps_shows_spark_jobs_and_time_of_heavy_workers(stack):
    since, until = minute_range(6, 2)
    stack.replay_table("hv/per_minute", since, until)
    import json

    def ps_rows():
        ps = stack.ramen("ps", "--json", "--all")
        assert ps.returncode == 0, ps.stderr
        return {r["function"]: r for r in map(json.loads, ps.stdout.splitlines())}
    rows = wait_for(lambda: (rows := ps_rows()) and (rows.get("hv/per_minute") or {}).get("spark_jobs") and rows,
                    "the heavy worker's stats (rewritten every second) to show its job")
    assert rows["hv/per_minute"]["spark_jobs"] >= 1 and rows["hv/per_minute"]["spark_s"] > 0
    assert rows["hv/traffic"]["spark_jobs"] is None  # not heavy
    table = stack.ramen("ps")
    assert "SPARK" in table.stdout.splitlines()[0]


def test_bad_sql_is_refused_at_load_in_one_line_and_nothing_is_stored(stack):
    bad = stack.base / "bad.toml"
    bad.write_text(BAD_SQL)
    result = stack.ramen("run", bad)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ramen: run: bad/per_minute: Spark SQL: [UNRESOLVED_COLUMN"), lines
    assert "Traceback" not in result.stderr
    with stack.client() as client:
        assert client.get_or_none(keyspace.program_key("bad")) is None



def test_a_heavy_windowed_replay_prints_in_event_time_then_column_order(stack):
    """Spark gives a job's rows in any order, over many windows: the job's rows leave the worker in
    event-time order and the client's reorder buffer puts each window's rows in column order, so
    the output is fully sorted, with no row printed out of order."""
    since, until = minute_range(8, 5)
    result = stack.ramen("replay", "--since", f"{since / 1e6}", "--until", f"{until / 1e6}", "--format", "csv",
                         "--with-header", "hv/per_minute")
    assert result.returncode == 0 and "out of event-time order" not in result.stderr, result.stderr
    import io

    import pyarrow.csv as pacsv
    got = pacsv.read_csv(io.BytesIO(result.stdout.encode()))
    assert got.num_rows == 5 * 20
    as_printed = got.set_column(0, "start", got["start"].cast(pa.timestamp("us")))
    assert as_printed.to_pylist() == sorted_rows(got).to_pylist()

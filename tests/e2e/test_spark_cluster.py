"""Heavy replays on a real Spark standalone cluster (a master, one 3 GiB worker, a Spark Connect
server on them with Spark's default 1 GiB driver: tests/spark/standalone.py), as an operator runs
ramen against one: `ramen start --spark sc://... --spark-staging DIR`.

- An hour of traffic (about 10 M tuples) replayed through a heavy per-minute aggregate: rows reach
  the cluster as Parquet in the staging directory, and the result equals the same SQL on the local
  Spark over the same tuples, and pyarrow's.
- Without a staging store, 3 M rows over Spark Connect: as one local relation they ran this
  driver out of heap; in chunks they do not.
- The cluster's only worker killed during a replay: the replay fails in one line naming the
  stalled job instead of waiting out its timeout.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ramen import paths
from ramen.archive.coverage import archive_coverage
from ramen.replay.client import Replay
from ramen.spark.frames import for_spark
from ramen.spark.session import session
from ramen.spark.upload import upload
from tests.e2e.test_heavy import SQL, sorted_rows
from tests.e2e.test_replay import MINUTE_US, STARTUP_S, Stack, per_minute_by_pyarrow, ramen_dir
from tests.spark.standalone import StandaloneCluster
from tests.waiting import wait_for

RATE = 2800  # with the hour's back-fill: about 10 M tuples
HOSTS = 50
MINUTES = 58
STALL_S = 30
"""The stall bound for this test's workers (RAMEN_SPARK_STALL_S), instead of a minute: the lost
executor's replay fails within it, and the hour's replay never meets it (at 10 s, a clean-clone CI
run with the other xdist worker busy saw the hour's job on the cluster stall that long)."""
PROGRAM = f"""
[program]
name = "cl"

[[function]]
name = "traffic"
source = {{ kind = "generator", rate = {RATE}, hosts = {HOSTS}, seed = 3, backfill = "1h" }}
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
"""
TRAFFIC_SCHEMA = pa.schema([("ts", pa.timestamp("us")), ("host", pa.string()), ("bytes", pa.int64())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with StandaloneCluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def stack(tmp_path_factory, cluster):
    base = tmp_path_factory.mktemp("cl")
    staging = base / "staging"
    stack = Stack(base)
    stack.env["RAMEN_SPARK_STALL_S"] = str(STALL_S)
    try:
        path = base / "cl.toml"
        path.write_text(PROGRAM)
        started = stack.ramen("start", "--daemon", "--dir", base, "--spark", cluster.remote, "--spark-staging",
                              staging, path, timeout=STARTUP_S)
        assert started.returncode == 0, started.stderr + started.stdout
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def hour(stack) -> tuple[int, int]:
    """The range every test here replays, once the archive covers it: computed once, since a
    minute boundary passing between the wait and a test moved the range past what the recorder
    had written on a busy machine (a clean-clone CI run: "no archive of cl/traffic after ...")."""
    since, until = hour_range()
    with ramen_dir(stack.base):
        wait_for(lambda: any(i.since_us <= since and i.until_us >= until
                             for i in archive_coverage(paths.archive_dir("local")).get("cl/traffic", [])),
                 "the archive covering the back-filled hour", timeout_s=STARTUP_S * 3)
    return since, until


def hour_range() -> tuple[int, int]:
    """The back-filled hour's whole minutes but its first and last (about 9.7 M tuples)."""
    now_minute = time.time_ns() // 1000 // MINUTE_US * MINUTE_US
    return now_minute - 59 * MINUTE_US, now_minute - MINUTE_US


def replayed(stack: Stack, target: str, since: int, until: int) -> pa.Table:
    with ramen_dir(stack.base), stack.client("user") as client:
        with Replay(client, stack.programs(client), target, since, until, site="local") as replay:
            replay.start()
            return pa.Table.from_batches(list(replay.batches()), schema=replay.schema)


def test_an_hour_replayed_on_the_cluster_through_staging_equals_local_spark_and_pyarrow(
        stack, hour, spark_remote, tmp_path):
    since, until = hour
    traffic = replayed(stack, "cl/traffic", since, until).select(TRAFFIC_SCHEMA.names).cast(TRAFFIC_SCHEMA)
    assert traffic.num_rows >= MINUTES * 60 * RATE  # about 9.7 M (the generator's rate is a mean)

    got = sorted_rows(replayed(stack, "cl/per_minute", since, until))

    pq.write_table(for_spark(traffic), tmp_path / "traffic.parquet")
    with session(spark_remote) as local:
        local.read.parquet(str(tmp_path / "traffic.parquet")).createOrReplaceTempView("traffic")
        by_local_spark = sorted_rows(local.sql(SQL).toArrow())
    by_pyarrow = per_minute_by_pyarrow(traffic)
    assert got.num_rows == MINUTES * HOSTS
    assert got.to_pylist() == by_local_spark.to_pylist()
    assert got["bytes"].to_pylist() == by_pyarrow["bytes"].to_pylist()
    assert not any((stack.base / "staging").iterdir())  # the job's files are gone


def test_rows_without_staging_reach_the_cluster_in_chunks_the_default_driver_holds(cluster):
    rows = 3_000_000  # one local relation of these ran this driver out of heap
    ts = np.arange(rows, dtype=np.int64) * 1_000 + 1_700_000_000_000_000
    table = for_spark(pa.table({"ts": pa.array(ts, pa.timestamp("us")),
                                "host": pa.array([f"h{i % HOSTS}" for i in range(rows)]),
                                "bytes": pa.array(np.arange(rows, dtype=np.int64) % 1_000)}))
    from pyspark.sql.pandas.types import from_arrow_schema
    # A second session, as a worker's after a reconnect: pyspark gave checkpoints to the first ("No
    # DataFrame with id ... is found in the session").
    with session(cluster.remote) as first, session(cluster.remote) as spark:
        first.sql("SELECT 1").collect()
        upload(spark, table, from_arrow_schema(table.schema)).createOrReplaceTempView("traffic")
        got = sorted_rows(spark.sql(SQL).toArrow())
    expected = per_minute_by_pyarrow(table.cast(TRAFFIC_SCHEMA))
    assert got["bytes"].to_pylist() == expected["bytes"].to_pylist()
    assert got.num_rows == expected.num_rows


def test_a_replay_whose_spark_job_lost_its_only_executor_fails_in_one_line(stack, hour, cluster):
    """Last in this module: the cluster has no worker until it is started again."""
    since, until = hour
    cluster.kill("worker")
    try:
        started = time.monotonic()
        result = stack.ramen("replay", "--since", f"{since / 1e6}", "--until", f"{until / 1e6}", "cl/per_minute",
                             timeout=STALL_S * 12)
        took = time.monotonic() - started
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "made no progress" in lines[0], lines
        assert "Traceback" not in result.stderr
        assert took < STALL_S * 6, took  # not the replay's 300 s timeout
    finally:
        cluster.start_worker()

"""Sessions end on the Spark Connect server when ramen is done with them: a lazy heavy function
starts a worker, and so a session, for every replay of it, and the server would otherwise keep
each (its views and their rows) until its idle timeout, an hour later."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pyarrow as pa
import pytest

from ramen.program import loads
from ramen.spark.defaults import SPARK_REMOTE_ENV
from ramen.spark.session import SparkUnavailable, close, connect, session
from tests.spark.test_check import PROGRAM
from workers.heavy import SparkExecutor


def forgotten(remote: str, session_id: str) -> bool:
    """Whether the server forgot the session: a client naming it is refused as closed (a session it
    still knows answers; one it never knew would be made)."""
    from pyspark.sql import SparkSession
    probe = SparkSession.builder.remote(f"{remote}/;session_id={session_id}").create()
    try:
        probe.sql("SELECT 1").collect()
        return False
    except Exception as e:  # noqa: BLE001 - only the server's "closed" counts; anything else is a failure
        if "SESSION_CLOSED" in str(e):
            return True
        raise
    finally:
        close(probe, release=False)


def test_a_released_session_is_forgotten_by_the_server_and_one_only_closed_is_not(spark_remote):
    released, closed = connect(spark_remote), connect(spark_remote)
    for spark in (released, closed):
        spark.range(3).createOrReplaceTempView("rows")
    close(released)
    close(closed, release=False)
    assert forgotten(spark_remote, released.session_id)
    assert not forgotten(spark_remote, closed.session_id)
    assert closed.client.is_closed  # and so pyspark does not call the server again at the process's exit


def test_a_session_for_a_few_calls_is_released_after_them_and_after_a_failed_call(spark_remote):
    with session(spark_remote) as spark:
        spark.sql("SELECT 1").collect()
    with pytest.raises(Exception, match="UNRESOLVED_COLUMN"), session(spark_remote) as failed:
        failed.sql("SELECT nope").collect()
    assert forgotten(spark_remote, spark.session_id) and forgotten(spark_remote, failed.session_id)


def test_a_session_whose_server_went_away_is_only_closed(spark_remote):
    with pytest.raises(SparkUnavailable), session(spark_remote) as spark:
        raise SparkUnavailable("connection refused")
    assert spark.client.is_closed and not forgotten(spark_remote, spark.session_id)


def open_clients() -> int:
    from pyspark.sql.connect.client.core import SparkConnectClient
    return sum(1 for o in gc.get_objects() if isinstance(o, SparkConnectClient) and not o.is_closed)


def test_a_server_that_is_not_there_leaves_no_open_client_behind():
    """Else pyspark calls it again as the process exits, retrying for seconds."""
    before = open_clients()
    with pytest.raises(SparkUnavailable, match="127.0.0.1:1"):
        connect("sc://127.0.0.1:1")
    assert open_clients() == before


def test_a_heavy_workers_executor_releases_its_session_when_the_worker_stops(spark_remote, monkeypatch):
    monkeypatch.setenv(SPARK_REMOTE_ENV, spark_remote)
    function = loads(PROGRAM).function("per_minute")
    executor = SparkExecutor(function, SimpleNamespace(get_or_none=lambda key: None))
    gathered = executor.gathered()
    parent, schema = function.input_schemas[0]
    gathered.add(parent, pa.RecordBatch.from_pydict(
        {"ts": pa.array([0, 1_000_000], pa.timestamp("us")), "host": ["a", "a"], "bytes": [3, 4]}, schema=schema))
    assert executor.run(gathered)["bytes"].to_pylist() == [7]
    session_id = executor._spark.session_id
    executor.close()
    assert forgotten(spark_remote, session_id)
    executor.close()  # a second close (the worker's, after a failed start) is harmless

"""The heavy (engine = "spark") executor: a function's SQL over whole batches of committed windows.

A worker hands it every committed window of one channel that it has gathered (the parents' rows
apart, as Arrow). It runs them as **one** Spark job: each parent's rows become a view named after
the parent, the SQL runs, and the result comes back as Arrow, conformed to the function's schema.
Spark costs 0.1-0.3 s a job whatever its size, so the worker gathers many windows per job
(workers/defaults.py SPARK_JOB_ROWS); the SQL must therefore group by its window itself (as
`GROUP BY window(ts, '1 minute'), ...` does), since rows of several windows arrive together.

How rows reach Spark depends on where it runs (the `spark/server` key):
- a local server (`staging` set): Parquet files in the staging directory, read by Spark, deleted
  after the job. Measured: 1 M rows in 1.4 s this way, 14-22 s through createDataFrame, whose
  local relation the Connect server converts row by row;
- a remote one: `createDataFrame` from the Arrow table, over the Connect channel.

An unreachable Spark raises SparkUnavailable and keeps nothing half-done: the caller keeps the
rows and calls again later, and only a finished job's result is ever emitted.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from confserver import ConfClient
from ramen import keyspace
from ramen.program.model import Function
from ramen.spark.frames import for_spark, view_name
from ramen.spark.session import SparkUnavailable, configured_remote, connect, is_unavailable, one_line
from workers.compute import ComputeError, conform
from workers.defaults import SPARK_STAGING_FILE_ROWS

log = logging.getLogger(__name__)


@dataclass
class SparkServer:
    remote: str
    staging: Path | None = None


def find_server(client: ConfClient) -> SparkServer:
    """Where Spark is: the confserver's `spark/server` key, else $RAMEN_SPARK_REMOTE."""
    entry = client.get_or_none(keyspace.SPARK_SERVER)
    if entry is not None and isinstance(entry.value, dict) and entry.value.get("remote"):
        staging = entry.value.get("staging")
        return SparkServer(entry.value["remote"], Path(staging) if staging else None)
    remote = configured_remote()
    if remote:
        return SparkServer(remote)
    raise SparkUnavailable(f"no Spark yet (no {keyspace.SPARK_SERVER} key, no $RAMEN_SPARK_REMOTE)")


@dataclass
class SparkExecutor:
    function: Function
    client: ConfClient
    jobs: int = 0
    job_s: float = 0.0
    _server: SparkServer | None = None
    _spark: object = None

    def run(self, parts: dict[str, list[pa.RecordBatch]]) -> pa.Table:
        """The SQL over these rows (parent -> its batches; a parent without rows is an empty view).
        SparkUnavailable: nothing ran, call again; ComputeError: the SQL failed on this data."""
        started = time.monotonic()
        spark = self._session()
        staged = None
        try:
            staged = self._register(spark, parts)
            result = spark.sql(self.function.sql).toArrow()
        except Exception as e:  # noqa: BLE001 - classified: Spark gone (retry) or the SQL's error
            if is_unavailable(e):
                self._spark = None
                raise SparkUnavailable(one_line(e)) from None
            raise ComputeError(f"{self.function.qualified_name}: Spark SQL failed: {one_line(e)}") from None
        finally:
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)
        self.jobs += 1
        self.job_s += time.monotonic() - started
        return conform(self.function, result)

    def _session(self):
        if self._spark is None:
            self._server = find_server(self.client)
            self._spark = connect(self._server.remote)
            log.info("%s: Spark at %s (%s)", self.function.qualified_name, self._server.remote,
                     f"staging in {self._server.staging}" if self._server.staging else "rows over Spark Connect")
        return self._spark

    def _register(self, spark, parts: dict[str, list[pa.RecordBatch]]) -> Path | None:
        """Each parent's rows as a temporary view; the staging directory used, if any."""
        from pyspark.sql.pandas.types import from_arrow_schema
        staged = None
        for parent, schema in self.function.input_schemas:
            batches = parts.get(parent) or []
            table = for_spark(pa.Table.from_batches(batches, schema=batches[0].schema) if batches
                              else schema.empty_table())
            if self._server.staging is not None and table.num_rows:
                if staged is None:
                    staged = self._server.staging / f"{self.function.program}.{self.function.name}.{uuid.uuid4().hex}"
                directory = staged / view_name(parent)
                directory.mkdir(parents=True)
                for number, offset in enumerate(range(0, table.num_rows, SPARK_STAGING_FILE_ROWS)):
                    pq.write_table(table.slice(offset, SPARK_STAGING_FILE_ROWS), directory / f"{number:05d}.parquet")
                frame = spark.read.schema(from_arrow_schema(table.schema)).parquet(str(directory))
            else:
                frame = spark.createDataFrame(table, schema=from_arrow_schema(table.schema))
            frame.createOrReplaceTempView(view_name(parent))
        return staged

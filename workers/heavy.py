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
  local relation the Connect server converts row by row. The files are written while the rows
  arrive (Gathered), in a thread, so a long replay holds one file's rows in memory and runs as
  one job whose input is already on disk;
- a remote one: `createDataFrame` from the Arrow table, over the Connect channel.

An unreachable Spark raises SparkUnavailable and keeps nothing half-done: the caller keeps the
rows and calls again later, and only a finished job's result is ever emitted.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from confserver import ConfClient
from ramen import keyspace
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.program.model import Function
from ramen.spark.frames import for_spark, utc_schema, view_name
from ramen.spark.session import SparkUnavailable, configured_remote, connect, is_unavailable, one_line
from workers.compute import ComputeError, conform
from workers.defaults import SPARK_JOB_ROWS, SPARK_STAGED_JOB_ROWS, SPARK_STAGING_FILE_ROWS

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


class Gathered:
    """A channel's committed rows waiting for their Spark job, per parent. With a staging directory
    (a local Spark) every SPARK_STAGING_FILE_ROWS rows of a parent go to a Parquet file, written by
    `writer` while more rows arrive; without one they stay in memory for createDataFrame."""

    def __init__(self, directory: Path | None, writer: ThreadPoolExecutor, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.directory = directory
        self.writer = writer
        self.batches: dict[str, list[pa.RecordBatch]] = {}
        self._unstaged: dict[str, int] = {}
        self._files: dict[str, int] = {}
        self._writes: list[Future] = []
        self.rows = 0
        self.created_s = clock.seconds()

    def __bool__(self) -> bool:
        return self.rows > 0

    @property
    def job_due(self) -> bool:
        """Enough rows for a replay channel's job (more when they wait on disk, not in memory)."""
        return self.rows >= (SPARK_STAGED_JOB_ROWS if self.directory is not None else SPARK_JOB_ROWS)

    def add(self, parent: str, batch: pa.RecordBatch) -> None:
        self.batches.setdefault(parent, []).append(batch)
        self.rows += batch.num_rows
        unstaged = self._unstaged[parent] = self._unstaged.get(parent, 0) + batch.num_rows
        if self.directory is not None and unstaged >= SPARK_STAGING_FILE_ROWS:
            self._stage(parent)

    def _stage(self, parent: str) -> None:
        batches = self.batches.pop(parent, [])
        self._unstaged[parent] = 0
        if not batches:
            return
        directory = self.directory / view_name(parent)
        number = self._files.get(parent, 0)
        self._files[parent] = number + 1
        table = for_spark(pa.Table.from_batches(batches))

        def write() -> None:
            directory.mkdir(parents=True, exist_ok=True)
            # Spark scans every row of these: no compression, and no column statistics (a third
            # of the write time, for a pruning no job of ours can use).
            pq.write_table(table, directory / f"{number:05d}.parquet", compression="none", write_statistics=False)
        self._writes.append(self.writer.submit(write))

    def staged(self) -> dict[str, Path]:
        """Every parent's rows on disk (the rest written now); the directory of each parent."""
        for parent in list(self.batches):
            self._stage(parent)
        for write in self._writes:
            write.result()  # an OSError (disk full) stops the worker: its rows cannot reach Spark
        self._writes.clear()
        return {parent: self.directory / view_name(parent) for parent in self._files}

    def in_memory(self) -> dict[str, pa.Table]:
        """Every parent's rows as one table (what staged files there are read back)."""
        tables = {}
        for parent in set(self.batches) | set(self._files):
            parts = [pq.read_table(self.directory / view_name(parent))] if parent in self._files else []
            parts += [pa.Table.from_batches([b]) for b in self.batches.get(parent, [])]
            tables[parent] = pa.concat_tables([for_spark(t) for t in parts], promote_options="permissive")
        return tables

    def discard(self) -> None:
        """After the job ran (or the channel went): nothing kept, no file left."""
        for write in self._writes:
            write.cancel()
        for write in self._writes:
            if not write.cancelled():
                write.exception()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
        self.batches.clear()
        self._unstaged.clear()
        self._files.clear()
        self._writes.clear()
        self.rows = 0


@dataclass
class SparkExecutor:
    function: Function
    client: ConfClient
    jobs: int = 0
    job_s: float = 0.0
    _server: SparkServer | None = None
    _spark: object = None
    clock: Clock = SYSTEM_CLOCK
    _writer: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "staging"))

    def gathered(self) -> Gathered:
        """An empty Gathered for a channel, staging on disk if Spark is known to be local."""
        staging = None
        if self._server is None:
            try:
                self._server = find_server(self.client)
            except SparkUnavailable:
                pass  # not known yet: in memory
        if self._server is not None and self._server.staging is not None:
            staging = self._server.staging / f"{self.function.program}.{self.function.name}.{uuid.uuid4().hex}"
        return Gathered(staging, self._writer, clock=self.clock)

    def run(self, gathered: Gathered) -> pa.Table:
        """The SQL over these rows (a parent without rows is an empty view). SparkUnavailable:
        nothing ran, call again; ComputeError: the SQL failed on this data. The rows are kept
        either way: the caller discards them once the job's result is out."""
        started = self.clock.seconds()
        spark = self._session()
        try:
            connected = self.clock.seconds()
            self._register(spark, gathered)
            registered = self.clock.seconds()
            result = spark.sql(self.function.sql).toArrow()
        except Exception as e:  # noqa: BLE001 - classified: Spark gone (retry) or the SQL's error
            if is_unavailable(e):
                self._spark = self._server = None
                raise SparkUnavailable(one_line(e)) from None
            raise ComputeError(f"{self.function.qualified_name}: Spark SQL failed: {one_line(e)}") from None
        ended = self.clock.seconds()
        self.jobs += 1
        self.job_s += ended - started
        log.info("%s: Spark job: %.2f s session, %.2f s registering its %d rows, %.2f s SQL",
                 self.function.qualified_name, connected - started, registered - connected, gathered.rows,
                 ended - registered)
        table = conform(self.function, result)
        if self.function.event_time is not None and table.num_rows:
            # A job spans many windows and Spark's row order is any: sorted, its rows reach a replay's
            # client at most a window out of order, the depth of its reorder buffer (ramen/replay/order.py).
            table = table.sort_by(self.function.event_time)
        return table

    def _session(self):
        if self._spark is None:
            self._server = find_server(self.client)
            self._spark = connect(self._server.remote)
            log.info("%s: Spark at %s (%s)", self.function.qualified_name, self._server.remote,
                     f"staging in {self._server.staging}" if self._server.staging else "rows over Spark Connect")
        return self._spark

    def _register(self, spark, gathered: Gathered) -> None:
        """Each parent's rows as a temporary view: its staged files for a local Spark (staged
        before, for a server that has gone remote, are read back), else createDataFrame."""
        from pyspark.sql.pandas.types import from_arrow_schema
        local = self._server.staging is not None and gathered.directory is not None
        directories = gathered.staged() if local else {}
        tables = {} if local else gathered.in_memory()
        for parent, schema in self.function.input_schemas:
            spark_schema = from_arrow_schema(utc_schema(schema))
            if parent in directories:
                frame = spark.read.schema(spark_schema).parquet(str(directories[parent]))
            else:
                table = tables.get(parent, for_spark(schema.empty_table()))
                frame = spark.createDataFrame(table, schema=spark_schema)
            frame.createOrReplaceTempView(view_name(parent))

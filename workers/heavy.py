"""The heavy (engine = "spark") executor: a function's SQL over whole batches of committed windows.

A worker hands it every committed window of one channel that it has gathered (the parents' rows
apart, as Arrow). It runs them as **one** Spark job: each parent's rows become a view named after
the parent, the SQL runs, and the result comes back as Arrow, conformed to the function's schema.
Spark costs 0.1-0.3 s a job whatever its size, so the worker gathers many windows per job
(workers/defaults.py SPARK_JOB_ROWS); the SQL must therefore group by its window itself (as
`GROUP BY window(ts, '1 minute'), ...` does), since rows of several windows arrive together.

How rows reach Spark depends on the `spark/server` key (ramen/spark/contract.py):
- with a staging store (a local server's own directory, or `ramen start --spark-staging` for a
  cluster): Parquet files there, read by Spark, deleted after the job. Measured: 1 M rows in 1.4 s
  this way, 14-22 s through createDataFrame. The files are written while the rows arrive
  (Gathered), in a thread, so a long replay holds one file's rows in memory and runs as one job
  whose input is already there;
- without one: over Spark Connect in bounded chunks (ramen/spark/upload.py), never as one relation
  the Spark driver would have to hold.

An unreachable Spark raises SparkUnavailable and keeps nothing half-done: the caller keeps the
rows and calls again later, and only a finished job's result is ever emitted. A Spark that is up
but fails (out of memory, a dead context) or whose job stops moving (no executor left) raises
ComputeError naming Spark's reason: it would fail again.
"""

from __future__ import annotations

import logging
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from confserver import ConfClient
from ramen import keyspace
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.key_value import ContractError
from ramen.program.model import Function
from ramen.spark import contract
from ramen.spark.contract import SparkServer
from ramen.spark.frames import for_spark, utc_schema, view_name
from ramen.spark.session import SparkUnavailable, close, connect, is_unavailable, reachable, spark_reason
from ramen.spark.staging import StagingError, StagingStore
from ramen.spark.upload import upload
from ramen.spark.watch import JobWatch
from workers.compute import ComputeError, conform
from workers.defaults import SPARK_JOB_ROWS, SPARK_STAGED_JOB_ROWS, SPARK_STAGING_FILE_ROWS

log = logging.getLogger(__name__)


def find_server(client: ConfClient) -> SparkServer:
    """Where Spark is (ramen/spark/contract.py); SparkUnavailable while nobody said yet."""
    try:
        server = contract.find_server(client)
    except ContractError as e:
        raise ComputeError(str(e)) from None
    if server is None:
        raise SparkUnavailable(f"no Spark yet (no {keyspace.SPARK_SERVER} key, no $RAMEN_SPARK_REMOTE)")
    return server


class Gathered:
    """A channel's committed rows waiting for their Spark job, per parent. With a staging store,
    every SPARK_STAGING_FILE_ROWS rows of a parent go to a Parquet file under `name` there, written
    by `writer` while more rows arrive; without one they stay in memory for an upload."""

    def __init__(self, store: StagingStore | None, name: str, writer: ThreadPoolExecutor, *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.name = name
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
        return self.rows >= (SPARK_STAGED_JOB_ROWS if self.store is not None else SPARK_JOB_ROWS)

    def add(self, parent: str, batch: pa.RecordBatch) -> None:
        self.batches.setdefault(parent, []).append(batch)
        self.rows += batch.num_rows
        unstaged = self._unstaged[parent] = self._unstaged.get(parent, 0) + batch.num_rows
        if self.store is not None and unstaged >= SPARK_STAGING_FILE_ROWS:
            self._stage(parent)

    def _stage(self, parent: str) -> None:
        batches = self.batches.pop(parent, [])
        self._unstaged[parent] = 0
        if not batches:
            return
        number = self._files.get(parent, 0)
        self._files[parent] = number + 1
        table = for_spark(pa.Table.from_batches(batches))
        self._writes.append(self.writer.submit(self.store.write, f"{self._directory(parent)}/{number:05d}.parquet",
                                               table))

    def _directory(self, parent: str) -> str:
        return f"{self.name}/{view_name(parent)}"

    def staged(self) -> dict[str, str]:
        """Every parent's rows in the store (the rest written now); the path Spark reads each by."""
        for parent in list(self.batches):
            self._stage(parent)
        for write in self._writes:
            write.result()  # an OSError (disk full) stops the worker: its rows cannot reach Spark
        self._writes.clear()
        return {parent: self.store.spark_path(self._directory(parent)) for parent in self._files}

    def in_memory(self) -> dict[str, pa.Table]:
        """Every parent's rows as one table (what staged files there are read back)."""
        tables = {}
        for parent in set(self.batches) | set(self._files):
            parts = [self.store.read(self._directory(parent))] if parent in self._files else []
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
        if self._files:
            self.store.delete(self.name)
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
    _store: StagingStore | None = None
    _spark: object = None
    clock: Clock = SYSTEM_CLOCK
    _writer: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "staging"))
    _watch: JobWatch | None = None
    _stalled_s: float | None = None

    def gathered(self) -> Gathered:
        """An empty Gathered for a channel, staging its rows if Spark has a staging store."""
        if self._server is None:
            try:
                self._find_server()
            except SparkUnavailable:
                pass  # not known yet: in memory
        name = f"{self.function.program}.{self.function.name}.{uuid.uuid4().hex}"
        return Gathered(self._store, name, self._writer, clock=self.clock)

    def run(self, gathered: Gathered) -> pa.Table:
        """The SQL over these rows (a parent without rows is an empty view). SparkUnavailable:
        nothing ran, call again; ComputeError: the SQL or Spark failed, or the job stalled. The
        rows are kept either way: the caller discards them once the job's result is out."""
        started = self.clock.seconds()
        spark = self._session()
        self._stalled_s = None
        self._watch.begin()
        frames: list = []  # the uploaded chunks' checkpoints live as long as these do
        try:
            connected = self.clock.seconds()
            self._register(spark, gathered, frames)
            registered = self.clock.seconds()
            result = spark.sql(self.function.sql).toArrow()
        except Exception as e:  # noqa: BLE001 - classified: Spark gone (retry), or failed (report)
            name = self.function.qualified_name
            if self._stalled_s is not None:
                raise ComputeError(f"{name}: the Spark job made no progress for {self._stalled_s:.0f} s and was "
                                   "interrupted (no executor left to run it, or a broken driver: see Spark's "
                                   "logs)") from None
            if is_unavailable(e, self._server.remote):
                self._drop_session(release=False)
                raise SparkUnavailable(spark_reason(e)) from None
            raise ComputeError(f"{name}: Spark SQL failed: {spark_reason(e)}") from None
        finally:
            self._watch.end()
            frames.clear()
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

    def check_progress(self) -> None:
        """Called while `run` runs, from another thread: interrupts a job that stopped moving."""
        stalled = self._watch.stalled() if self._watch is not None else None
        if stalled is not None and self._stalled_s is None and self._spark is not None:
            self._stalled_s = stalled
            log.warning("%s: the Spark job made no progress for %.0f s: interrupting it",
                        self.function.qualified_name, stalled)
            try:
                self._spark.interruptAll()
            except Exception as e:  # noqa: BLE001 - the job's own call then reports what is wrong
                log.warning("%s: interrupting the Spark job failed: %s", self.function.qualified_name, e)

    def close(self) -> None:
        """The worker stops: its session is released, so that the server forgets its views now
        (unless the server is gone: then releasing would retry for seconds, and its sessions are gone)."""
        self._drop_session(release=self._server is not None and reachable(self._server.remote))

    def _drop_session(self, *, release: bool) -> None:
        spark, self._spark, self._server = self._spark, None, None
        if spark is not None:
            close(spark, release=release)

    def _find_server(self) -> SparkServer:
        self._server = find_server(self.client)
        try:
            self._store = StagingStore(self._server.staging) if self._server.staging else None
        except StagingError as e:
            raise ComputeError(f"{self.function.qualified_name}: {e}") from None
        return self._server

    def _session(self):
        if self._spark is None:
            server = self._find_server()
            self._spark = connect(server.remote)
            self._watch = JobWatch(self.clock)
            self._spark.registerProgressHandler(self._watch)
            log.info("%s: Spark at %s (%s)", self.function.qualified_name, server.remote,
                     f"staging in {server.staging}" if server.staging else "rows over Spark Connect in chunks")
        return self._spark

    def _register(self, spark, gathered: Gathered, frames: list) -> None:
        """Each parent's rows as a temporary view: its staged files if Spark has a staging store
        (rows staged before the server changed to one without are read back), else uploaded."""
        from pyspark.sql.pandas.types import from_arrow_schema
        staged = self._store is not None and gathered.store is not None
        paths = gathered.staged() if staged else {}
        tables = {} if staged else gathered.in_memory()
        for parent, schema in self.function.input_schemas:
            spark_schema = from_arrow_schema(utc_schema(schema))
            if parent in paths:
                frame = spark.read.schema(spark_schema).parquet(paths[parent])
            else:
                frame = upload(spark, tables.get(parent, for_spark(schema.empty_table())), spark_schema)
            frames.append(frame)
            frame.createOrReplaceTempView(view_name(parent))

"""Rows sent to Spark over Spark Connect, when no staging store is shared with it.

`createDataFrame` of a whole table makes one local relation: the Spark driver holds every row as
JVM objects, its plan cache keeps them, and the scan is one task carrying them all. Measured on
a standalone cluster with the default 1 GiB driver: 3 M rows of (ts, host, bytes) ran the driver
out of heap ("Java heap space"), and 500 k-row chunks with the plan cache on did too, after which
its scheduler was dead and the job never ended. So a big table goes in chunks of at most
UPLOAD_CHUNK_BYTES: each becomes a small local relation that is checkpointed at once onto the
executors (`localCheckpoint`), and the job reads the union of the checkpoints. The driver holds
one chunk at a time, whatever the size of the replay; the checkpoints are released when the job's
frames are dropped.
"""

from __future__ import annotations

import contextlib
import logging

import pyarrow as pa

from ramen.spark.defaults import PLAN_CACHE_CONF, UPLOAD_CHUNK_BYTES

log = logging.getLogger(__name__)


def chunk_rows(table: pa.Table, chunk_bytes: int = UPLOAD_CHUNK_BYTES) -> int:
    """Rows per chunk so that a chunk holds about `chunk_bytes` of Arrow."""
    if table.num_rows == 0:
        return 1
    return max(1, chunk_bytes * table.num_rows // max(1, table.nbytes))


def upload(spark, table: pa.Table, schema, chunk_bytes: int = UPLOAD_CHUNK_BYTES):
    """A DataFrame of `table`'s rows (with Spark `schema`) that never is one big local relation."""
    rows = chunk_rows(table, chunk_bytes)
    if table.num_rows <= rows:
        return spark.createDataFrame(table, schema=schema)
    try:
        spark.conf.set(PLAN_CACHE_CONF, "false")  # else the session keeps every chunk's relation
    except Exception as e:  # noqa: BLE001 - a server without that setting (Spark < 4) has no such cache
        log.debug("cannot turn Spark Connect's plan cache off: %s", e)
    frame = None
    with _active(spark):
        for offset in range(0, table.num_rows, rows):
            part = spark.createDataFrame(table.slice(offset, rows), schema=schema).localCheckpoint(eager=True)
            frame = part if frame is None else frame.unionAll(part)
    return frame


@contextlib.contextmanager
def _active(spark):
    """pyspark (4.3) binds a checkpoint's result to `SparkSession.active()`, not to the session that
    made it: that is the first session created in the thread, else the process's first one. A
    worker runs each job in a thread of its own and reconnects after a Spark restart, so it is
    often another, dead, session, and the job failed with DATAFRAME_NOT_FOUND. So `spark` is made
    this thread's active session for the while."""
    local = type(spark)._active_session
    saved = getattr(local, "session", None)
    local.session = spark
    try:
        yield
    finally:
        local.session = saved

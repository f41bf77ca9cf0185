"""Rows over Spark Connect in bounded chunks, against the session's real Spark Connect server: the
chunks' union is the table, through whichever session, and a small table is one relation."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema

from ramen.spark.session import session
from ramen.spark.upload import chunk_rows, upload

TABLE = pa.table({"n": pa.array(range(5_000), pa.int64()), "s": pa.array([f"row {i}" for i in range(5_000)])})


def test_chunks_hold_about_the_bytes_asked_for():
    rows = chunk_rows(TABLE, chunk_bytes=TABLE.nbytes // 10)
    assert 450 <= rows <= 500
    assert chunk_rows(TABLE.slice(0, 0)) == 1


def test_a_table_over_the_chunk_size_arrives_whole_through_a_later_session(spark_remote):
    """pyspark gives a checkpoint to SparkSession.active(), here the process's first session, not
    to the session that made it: the job then failed with DATAFRAME_NOT_FOUND. A worker that
    reconnected after a Spark restart is in this case."""
    with session(spark_remote) as first, session(spark_remote) as spark:
        first.sql("SELECT 1").collect()  # the first session of this process
        frame = upload(spark, TABLE, from_arrow_schema(TABLE.schema), chunk_bytes=TABLE.nbytes // 10)
        frame.createOrReplaceTempView("uploaded")
        got = spark.sql("SELECT n, s FROM uploaded ORDER BY n").toArrow()
    assert got.num_rows == TABLE.num_rows
    assert got["n"].to_pylist() == TABLE["n"].to_pylist() and got["s"].to_pylist() == TABLE["s"].to_pylist()


def test_a_small_table_is_one_relation(spark_remote):
    with session(spark_remote) as spark:
        frame = upload(spark, TABLE.slice(0, 10), from_arrow_schema(TABLE.schema))
        assert "LocalRelation" in frame._plan.__class__.__name__
        assert frame.count() == 10

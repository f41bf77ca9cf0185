"""The load-time check of Spark SQL, against the session's real Spark Connect server."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from ramen.program import loads
from ramen.spark.check import SparkSqlError, analyse
from ramen.spark.session import SparkUnavailable, session

PROGRAM = """
[program]
name = "chk"

[[function]]
name = "traffic"
source = { kind = "generator" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"

[[function]]
name = "per_minute"
from = ["traffic"]
engine = "spark"
sql = "SELECT window.start AS start, host, sum(bytes) AS bytes FROM traffic GROUP BY window(ts, '1 minute'), host"
schema = { start = "timestamp[us]", host = "string", bytes = "int64" }
"""


@pytest.fixture(scope="module")
def spark(spark_remote):
    with session(spark_remote) as spark:
        yield spark


@pytest.fixture(scope="module")
def per_minute():
    return loads(PROGRAM).function("per_minute")


def test_good_sql_analyses_to_its_output_schema(spark, per_minute):
    schema = analyse(spark, per_minute)
    assert schema.names == ["start", "host", "bytes"]
    assert schema.field("bytes").type == pa.int64() and pa.types.is_timestamp(schema.field("start").type)


@pytest.mark.parametrize("sql, expected", [
    ("SELECT nope FROM traffic", "chk/per_minute: Spark SQL: [UNRESOLVED_COLUMN"),
    ("SELEC host FROM traffic", "chk/per_minute: Spark SQL: [PARSE_SYNTAX_ERROR]"),
    ("SELECT host FROM elsewhere", "chk/per_minute: Spark SQL: [TABLE_OR_VIEW_NOT_FOUND]"),
    ("SELECT ts AS start, host FROM traffic", "chk/per_minute: its SQL outputs (start, host), not bytes of its schema"),
])
def test_bad_sql_is_one_line_naming_the_function_and_sparks_message(spark, per_minute, sql, expected):
    with pytest.raises(SparkSqlError) as raised:
        analyse(spark, dataclasses.replace(per_minute, sql=sql))
    message = str(raised.value)
    assert message.startswith(expected) and "\n" not in message


def test_an_unreachable_spark_is_unavailable_not_a_sql_error(per_minute):
    with pytest.raises(SparkUnavailable, match="Connection refused|failed to connect"):
        with session("sc://127.0.0.1:1") as spark:
            analyse(spark, per_minute)

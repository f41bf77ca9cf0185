"""The local Spark Connect server logs warnings and its own start, not Spark's INFO: that wrote
~2.5 KB to DIR/logs/spark.log for every query a heavy function ran (its plan, each task), so a
dashboard refreshing a Spark-backed chart grew it without bound."""

from __future__ import annotations

import re

from ramen.spark.session import session

LEVEL = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (\w+) (\w+):")


def test_queries_leave_no_info_lines_and_the_servers_start_is_logged(spark_server):
    with session(spark_server.remote) as spark:
        for n in range(3):
            assert spark.sql(f"SELECT id * 2 AS doubled FROM range({n + 1})").count() == n + 1
    lines = spark_server.log_path.read_text().splitlines()
    levels = [match.groups() for match in map(LEVEL.match, lines) if match]
    assert ("INFO", "SparkConnectServer") in levels, lines
    assert [line for line in lines if (m := LEVEL.match(line)) and m.group(1) in ("INFO", "DEBUG")
            and m.group(2) != "SparkConnectServer"] == []

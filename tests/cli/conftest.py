"""The CLI tests load examples/net.toml, whose Spark SQL `ramen run` has Spark check: they use the
run's one Spark Connect server."""

import pytest


@pytest.fixture(autouse=True)
def spark_for_sql_checks(spark_remote, monkeypatch):
    monkeypatch.setenv("RAMEN_SPARK_REMOTE", spark_remote)

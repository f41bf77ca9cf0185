"""Where the deployment's Spark is: the `spark/server` key, which `ramen start` writes and heavy
workers and `ramen run` read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ramen import keyspace
from ramen.key_value import KeyValue
from ramen.spark.session import configured_remote


@dataclass(frozen=True)
class SparkServer(KeyValue):
    """`staging` is where heavy workers write the rows of a job as Parquet for Spark to read: a
    directory, or a URI (hdfs://, s3a://), that the workers and every Spark executor reach under
    the same name (ramen/spark/staging.py). Without it rows travel over Spark Connect in chunks."""

    KEY: ClassVar[str] = keyspace.SPARK_SERVER
    remote: str
    local: bool = False
    staging: str | None = None


def find_server(client) -> SparkServer | None:
    """Where Spark is: the confserver's `spark/server` key, else $RAMEN_SPARK_REMOTE, else None.
    ContractError if the key does not follow its contract."""
    entry = client.get_or_none(keyspace.SPARK_SERVER)
    if entry is not None:
        return SparkServer.from_value(entry.value)
    remote = configured_remote()
    return SparkServer(remote) if remote else None

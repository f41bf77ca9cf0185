"""Spark Connect sessions, and telling "Spark is not there" from "the SQL is wrong".

The difference decides what a heavy worker does: an unavailable server means keep the batch
and retry once it is back; a SQL error is the user's and is reported in one line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from urllib.parse import urlparse

from ramen.listen import accepts
from ramen.spark.defaults import (DEFAULT_CONNECT_PORT, PROBE_TIMEOUT_S, SESSION_TIME_ZONE_CONF, SPARK_REMOTE_ENV,
                                  SPARK_STAGING_ENV, UTC)

log = logging.getLogger(__name__)

UNAVAILABLE_CODES = ("UNAVAILABLE", "CANCELLED", "DEADLINE_EXCEEDED", "UNKNOWN", "INTERNAL")
"""gRPC statuses of a server that is gone or restarting (a killed server can end a call with any
of them); Spark's own errors carry an error class instead. All but UNAVAILABLE are also how a
server that is up reports a broken driver ("Java heap space", "Application error processing
RPC"): those count as unavailable only if the server no longer accepts connections."""
UNREACHABLE_CODE = "UNAVAILABLE"
OUT_OF_MEMORY = ("OutOfMemoryError", "Java heap space", "GC overhead limit exceeded")
PYSPARK_QUERY_LOGGER = "SQLQueryContextLogger"
"""pyspark logs every failed query's JVM stack there; our errors say what matters in one line."""
CLIENT_RETRIES = 4
CLIENT_MAX_BACKOFF_MS = 2000
"""About 3 s of retries (50, 200, 800, 2000 ms) before a call reports the server unreachable."""
SESSION_GONE_CLASSES = ("INVALID_HANDLE",)
"""The server restarted and no longer knows our session (or its operation): reconnect."""


GRPC_DETAILS = re.compile(r'details = "([^"]*)"')


class SparkUnavailable(RuntimeError):
    """The Spark Connect server cannot be reached, or forgot us: retry once it is back."""


def connect(remote: str):
    """A new Spark Connect session (never a cached one: after a server restart the old is dead).
    Its calls give up after a few seconds of an unreachable server, not pyspark's ten minutes:
    the caller decides how long to wait (a worker retries its batch, the CLI reports)."""
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy
    logging.getLogger(PYSPARK_QUERY_LOGGER).setLevel(logging.CRITICAL)  # it logs whole JVM stacks
    warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")  # we say it, in one line
    session = None
    try:
        session = SparkSession.builder.remote(remote).create()
        session.client.set_retry_policies([DefaultPolicy(max_retries=CLIENT_RETRIES, max_backoff=CLIENT_MAX_BACKOFF_MS)])
        # Event times are UTC everywhere in ramen, whatever a cluster's Connect server defaults to.
        session.conf.set(SESSION_TIME_ZONE_CONF, UTC)
        return session
    except Exception as e:  # noqa: BLE001 - a bad URL is the user's; anything else means not there
        if session is not None:
            close(session, release=False)
        raise SparkUnavailable(f"{remote}: {one_line(e)}") from None


def close(spark, *, release: bool = True) -> None:
    """End a session. Released, the server forgets it at once (its views and their rows), not at
    Spark Connect's idle timeout an hour later: a lazy heavy function starts a worker, and so a
    session, for every replay of it. A session whose server is gone is not released (that call would
    only retry for seconds); its channel is closed all the same, else pyspark calls the server once
    more as the process exits."""
    if release:
        spark.stop()  # best effort: pyspark logs a failure and goes on
    else:
        spark.client.close()


@contextlib.contextmanager
def session(remote: str):
    """A session for a few calls, closed on the way out (released unless the server went away)."""
    spark = connect(remote)
    gone = False
    try:
        yield spark
    except BaseException as e:
        gone = isinstance(e, SparkUnavailable) or is_unavailable(e, remote)
        raise
    finally:
        close(spark, release=not gone)


def is_unavailable(error: BaseException, remote: str | None = None) -> bool:
    """Whether the error says the server is not there (retry later) rather than that Spark failed
    (report it). With `remote`, an ambiguous status counts as unavailable only if the server does
    not accept connections now: a reachable server that fails will fail again."""
    import grpc
    from pyspark.errors import PySparkException
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException
    if isinstance(error, (ConnectionError, grpc.RpcError)):
        return True
    if isinstance(error, PySparkException):
        error_class = error.getCondition() or ""
        if error_class.startswith(SESSION_GONE_CLASSES):
            return True
        if isinstance(error, SparkConnectGrpcException) and not error_class:
            text = str(error)
            if f"StatusCode.{UNREACHABLE_CODE}" in text or "failed to connect" in text.lower():
                return True
            if any(f"StatusCode.{code}" in text for code in UNAVAILABLE_CODES):
                return remote is None or not reachable(remote)
    return False


def reachable(remote: str) -> bool:
    """Whether the Connect server at sc://host:port accepts a TCP connection now."""
    address = urlparse(remote.replace("sc://", "http://", 1))
    return accepts(address.hostname or "localhost", address.port or DEFAULT_CONNECT_PORT, PROBE_TIMEOUT_S)


def spark_reason(error: BaseException) -> str:
    """one_line, saying so when the cause is a JVM out of memory (whose message says only "Java
    heap space")."""
    line = one_line(error)
    if any(mark in str(error) for mark in OUT_OF_MEMORY):
        return f"Spark ran out of memory ({line}); give its driver or executors more, or a staging store"
    return line


def one_line(error: BaseException) -> str:
    """Spark's message without its stack, JVM frames or hints: the first meaningful line."""
    text = str(error)
    found = GRPC_DETAILS.search(text)  # a gRPC error's text is its repr; its details say why
    if found:
        text = found.group(1)
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line
    return type(error).__name__


def configured_remote() -> str | None:
    return os.environ.get(SPARK_REMOTE_ENV) or None


def configured_staging() -> str | None:
    return os.environ.get(SPARK_STAGING_ENV) or None

"""Spark constants, with their units."""

from pathlib import Path

SPARK_REMOTE_ENV = "RAMEN_SPARK_REMOTE"
"""An existing Spark Connect endpoint (sc://host:port): ramen then starts no Spark of its own."""
SPARK_STAGING_ENV = "RAMEN_SPARK_STAGING"
"""The staging store shared with that Spark (ramen/spark/staging.py)."""

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
LOCAL_HOST = "127.0.0.1"
SESSION_TIME_ZONE_CONF = "spark.sql.session.timeZone"
UTC = "UTC"
LOGGING_CONFIG = Path(__file__).with_name("log4j2.properties")
"""The local server's logging: warnings and its start only (Spark's INFO writes ~2.5 KB a query)."""
DRIVER_MEMORY = "4g"
"""The local server's heap: Spark's own default (1 GiB) runs out on a replay of 10 M tuples."""

SERVER_CONF = {
    "spark.connect.grpc.binding.address": LOCAL_HOST,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    SESSION_TIME_ZONE_CONF: UTC,
    # Results of one job come back as Arrow in one piece; the default 4 MiB message cap is too small.
    "spark.connect.grpc.maxInboundMessageSize": str(256 * 1024 * 1024),
}
"""Loopback only, no UI (ENVIRONMENT.md), and UTC: event times are UTC everywhere in ramen."""

READY_TIMEOUT_S = 120.0
"""How long a cold local server may take to accept connections (measured: 10-12 s on 2 cores)."""
READY_POLL_S = 0.25

UPLOAD_CHUNK_BYTES = 8 * 1024 * 1024
"""Arrow bytes per chunk of rows sent over Spark Connect without a staging store (upload.py):
about 250 k rows of (ts, host, bytes), each a task of about 7 MiB, which Spark's default 1 GiB
driver takes one at a time."""
PLAN_CACHE_CONF = "spark.connect.session.planCache.enabled"

STALL_S = 30.0
"""A Spark job whose progress (tasks started or done, bytes read) has not moved for this long is
interrupted and fails: no executor is left to run it, or the driver is broken (an
OutOfMemoryError in its scheduler leaves every job waiting for ever)."""
STALL_ENV = "RAMEN_SPARK_STALL_S"
"""Overrides STALL_S (seconds), for a cluster whose jobs may queue behind others for longer."""
PROBE_TIMEOUT_S = 1.0
"""How long a TCP connect to the Connect server may take to count as reachable."""
DEFAULT_CONNECT_PORT = 15002

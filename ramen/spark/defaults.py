"""Spark constants, with their units."""

SPARK_REMOTE_ENV = "RAMEN_SPARK_REMOTE"
"""An existing Spark Connect endpoint (sc://host:port): ramen then starts no Spark of its own."""

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
LOCAL_HOST = "127.0.0.1"
DRIVER_MEMORY = "4g"
"""The local server's heap: Spark's own default (1 GiB) runs out on a replay of 10 M tuples."""

SERVER_CONF = {
    "spark.connect.grpc.binding.address": LOCAL_HOST,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # Results of one job come back as Arrow in one piece; the default 4 MiB message cap is too small.
    "spark.connect.grpc.maxInboundMessageSize": str(256 * 1024 * 1024),
}
"""Loopback only, no UI (ENVIRONMENT.md), and UTC: event times are UTC everywhere in ramen."""

READY_TIMEOUT_S = 120.0
"""How long a cold local server may take to accept connections (measured: 10-12 s on 2 cores)."""
READY_POLL_S = 0.25

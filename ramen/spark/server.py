"""The local Spark Connect server: its command line, and knowing when it accepts clients.

It runs in the foreground (`spark-submit --class SparkConnectServer`, not the daemonizing sbin
script) so that whoever started it sees it die and can restart it on the same port: clients then
keep their URL and only reconnect.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ramen import listen
from ramen.spark.defaults import (CONNECT_SERVER_CLASS, DRIVER_MEMORY, LOCAL_HOST, LOGGING_CONFIG, PROBE_TIMEOUT_S,
                                  READY_POLL_S, READY_TIMEOUT_S, SERVER_CONF)


class SparkServerError(RuntimeError):
    """The local server cannot start; the message is one line and names its log."""


def spark_home() -> Path:
    """The Spark that ships inside the pyspark package (its jars include Spark Connect's)."""
    import pyspark
    return Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOCAL_HOST, 0))
        return s.getsockname()[1]


def remote_url(port: int) -> str:
    return f"sc://{LOCAL_HOST}:{port}"


def server_command(port: int, *, driver_memory: str | None = DRIVER_MEMORY, master: str | None = None) -> list[str]:
    """spark-submit of the Connect server; `master` (spark://...) runs its jobs on a cluster, and
    driver_memory None leaves Spark's default."""
    home = spark_home()
    command = [str(home / "bin" / "spark-submit"), "--class", CONNECT_SERVER_CLASS, "--name", "ramen-spark",
               "--driver-java-options", f"-Dlog4j2.configurationFile={LOGGING_CONFIG}",
               "--conf", f"spark.connect.grpc.binding.port={port}"]
    if driver_memory is not None:
        command += ["--driver-memory", driver_memory]
    if master is not None:
        command += ["--master", master]
    for key, value in SERVER_CONF.items():
        command += ["--conf", f"{key}={value}"]
    return command + ["spark-internal"]


def server_env(base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    env["SPARK_HOME"] = str(spark_home())
    env["SPARK_LOCAL_IP"] = LOCAL_HOST  # else Spark binds (and advertises) a non-loopback address
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


def java_missing() -> str | None:
    """Why Spark cannot run here, or None."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java found (install a JRE >= 17, e.g. apt-get install default-jre-headless)"
    return None


def accepts(port: int) -> bool:
    """Whether the local Connect server's port accepts connections."""
    return listen.accepts(LOCAL_HOST, port, PROBE_TIMEOUT_S)


def wait_ready(port: int, process: subprocess.Popen, log_path: Path, timeout_s: float = READY_TIMEOUT_S,
               cancelled: Callable[[], bool] = lambda: False) -> None:
    """Return once the server accepts connections; SparkServerError if it exits or takes too long;
    KeyboardInterrupt as soon as `cancelled()` says so (Ctrl-C caught by `ramen start`'s handler
    must not wait out a cold start of 10-20 s)."""
    deadline = time.monotonic() + timeout_s
    while not accepts(port):
        if cancelled():
            raise KeyboardInterrupt
        status = process.poll()
        if status is not None:
            raise SparkServerError(f"the Spark Connect server exited with status {status}: see {log_path}")
        if time.monotonic() > deadline:
            raise SparkServerError(f"the Spark Connect server did not accept connections within {timeout_s:g} s: "
                                   f"see {log_path}")
        time.sleep(READY_POLL_S)

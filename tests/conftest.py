"""Fixtures shared by every suite."""

import os
from pathlib import Path

import pytest

VECTORS_ENV = "RAMEN_AERON_VECTORS"
DEFAULT_VECTORS = Path(__file__).resolve().parent.parent.parent / "shared" / "aeron-vectors"


@pytest.fixture(scope="session")
def aeron_vectors() -> Path:
    """Files written by real Aeron; skipped, saying so, only where the folder is absent."""
    path = Path(os.environ.get(VECTORS_ENV, DEFAULT_VECTORS))
    if not path.is_dir():
        pytest.skip(f"Aeron vectors not found at {path} (set {VECTORS_ENV})")
    return path


@pytest.fixture(scope="session")
def builtin_server(tmp_path_factory):
    """One real built-in confserver process for the whole run; tests keep to keys of their own."""
    from tests.confserver.builtin import BuiltinServer
    server = BuiltinServer(tmp_path_factory.mktemp("confserver") / "data").start()
    yield server
    server.stop()


@pytest.fixture
def fresh_confserver(tmp_path):
    """A built-in confserver of the test's own, for tests that need the whole key space empty."""
    from tests.confserver.builtin import BuiltinServer
    server = BuiltinServer(tmp_path / "conf").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark_remote(spark_server) -> str:
    """The URL of the run's Spark Connect server."""
    return spark_server.remote


@pytest.fixture(scope="session")
def spark_server(tmp_path_factory):
    """One real local Spark Connect server for the whole run (2 GB of JVM: never one per test),
    started as `ramen start` starts its own: its `remote` URL and its `log_path`."""
    import subprocess
    from types import SimpleNamespace

    from ramen.spark.server import free_port, remote_url, server_command, server_env, wait_ready
    log_path = tmp_path_factory.mktemp("spark") / "spark.log"
    port = free_port()
    with open(log_path, "ab") as log:
        process = subprocess.Popen(server_command(port), env=server_env(), stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT)
    try:
        wait_ready(port, process, log_path)
        yield SimpleNamespace(remote=remote_url(port), log_path=log_path)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

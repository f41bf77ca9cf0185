"""Fixtures shared by every suite."""

import os
import sys
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
    started as `ramen start` starts its own: its `remote` URL and its `log_path`. Under pytest-xdist
    the workers share one: the first to ask starts it, with a watchdog that stops it when the run's
    controller process exits (a worker's own end may come while another still uses it)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        yield _shared_spark_server(tmp_path_factory.getbasetemp().parent)
        return
    process, server = _start_spark_server(tmp_path_factory.mktemp("spark"))
    try:
        yield server
    finally:
        _stop(process)


def _start_spark_server(directory: Path):
    import subprocess
    from types import SimpleNamespace

    from ramen.spark.server import free_port, remote_url, server_command, server_env, wait_ready
    log_path = directory / "spark.log"
    port = free_port()
    env = server_env()
    env.pop("RAMEN_DIR", None)  # one test's, perhaps: the run's server is no instance's (pytest_sessionfinish)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(server_command(port), env=env, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT)
    try:
        wait_ready(port, process, log_path)
    except BaseException:
        _stop(process)
        raise
    return process, SimpleNamespace(remote=remote_url(port), log_path=log_path, port=port)


def _stop(process) -> None:
    import subprocess
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


SPARK_WATCHDOG = """
import os, signal, sys, time
controller, server = int(sys.argv[1]), int(sys.argv[2])
def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
while alive(controller) and alive(server):
    time.sleep(0.5)
if alive(server):
    os.kill(server, signal.SIGTERM)
    for _ in range(60):
        time.sleep(0.5)
        if not alive(server):
            break
    else:
        os.kill(server, signal.SIGKILL)
"""
"""Stops the shared Spark server once the pytest controller (the workers' parent) has exited."""


def _shared_spark_server(shared: Path):
    """The run's one Spark server, for every xdist worker: started by the first to ask (under a
    lock in the run's shared temporary directory), or again if the one written down stopped."""
    import fcntl
    import json
    import subprocess
    from types import SimpleNamespace

    from ramen.listen import accepts
    from ramen.spark.server import remote_url
    with open(shared / "spark.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        known = shared / "spark.json"
        if known.exists():
            found = json.loads(known.read_text())
            if accepts("127.0.0.1", found["port"], timeout_s=2.0):
                return SimpleNamespace(remote=remote_url(found["port"]), log_path=Path(found["log_path"]),
                                       port=found["port"])
        directory = shared / "spark"
        directory.mkdir(exist_ok=True)
        process, server = _start_spark_server(directory)
        subprocess.Popen([sys.executable, "-c", SPARK_WATCHDOG, str(os.getppid()), str(process.pid)],
                         env={name: value for name, value in os.environ.items() if name != "RAMEN_DIR"},
                         stdin=subprocess.DEVNULL, start_new_session=True)
        known.write_text(json.dumps({"port": server.port, "log_path": str(server.log_path)}))
        return server


HEAVY_MODULES = frozenset({
    "tests.e2e.test_chaos", "tests.e2e.test_heavy", "tests.e2e.test_heavy_restart", "tests.e2e.test_sites",
    "tests.e2e.test_spark_cluster",
})
"""The modules that load the machine most (a chaos soak, Spark's JVMs, two sites): under pytest-xdist
(`-n 2 --dist loadgroup`, the README's test command) they run one after the other on one worker,
so that none runs beside another and the timings they check keep their margin (a job on the
standalone cluster made no progress for 10 s while the chaos soak ran beside it). Measured on 2
cores: 12.0 min with one such group and two workers, 12.9 min and two timing failures with two
groups and three workers, 20 min on one worker."""


def pytest_sessionfinish(session, exitstatus):
    """What the tests left running under this session's temporary directory is killed, whatever
    their outcome: a test that timed out left a whole `ramen start` of 8 processes for 54 minutes,
    two `confclient watch` and a `tail -f`."""
    from tests.processes import kill_left_under
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    try:
        base = factory.getbasetemp()
    except (OSError, ValueError):
        return
    left = kill_left_under(base)
    if left:
        print(f"\nkilled {len(left)} processes tests left under {base}: " + "; ".join(
            f"{pid} {args[:80]}" for pid, args in sorted(left.items())), file=sys.stderr)


def pytest_collection_modifyitems(config, items):
    """Each module's tests stay together on one xdist worker (its module fixtures, a ramen stack,
    are made once), the heavy modules all on the same one."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            module = item.module.__name__
            item.add_marker(pytest.mark.xdist_group("heavy" if module in HEAVY_MODULES else module))

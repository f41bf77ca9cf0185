"""`ramen stat` shows what the services counted: the supervisor and choreographer run as their own
processes, write their counters into the site's counters file, and free them when they stop."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import confserver
from ramen import keyspace
from ramen.transport.counters import SERVICE_COUNTER_TYPE_IDS, CountersFile
from tests.choreographer.programs import program
from tests.waiting import wait_for

SITE = "s1"
RECOMPUTES = SERVICE_COUNTER_TYPE_IDS["choreographer"]["recomputes"]


@pytest.fixture(autouse=True)
def spark_for_sql_checks():
    """No program here is run or checked by Spark: none is needed (tests/cli/conftest.py)."""


@pytest.fixture
def env(fresh_confserver, tmp_path):
    return dict(os.environ, RAMEN_DIR=str(tmp_path), RAMEN_CONFSERVER=fresh_confserver.url,
                RAMEN_CONFSERVER_AUTH=str(fresh_confserver.auth_file))


@pytest.fixture
def services(env):
    """services(module, *args) -> the running service; all stopped at the end."""
    started = []

    def start(module, *args):
        process = subprocess.Popen([sys.executable, "-m", module, "--site", SITE, *args], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def stat(env, *args):
    return subprocess.run([sys.executable, "-m", "ramen.cli.main", "stat", *args], capture_output=True, text=True,
                          env=env, check=True, timeout=60).stdout


def counters_of(env, pid) -> dict[str, int]:
    """The counters a process owns, by type name, from `ramen stat --json` (none before the first
    service has made the counters file)."""
    path = Path(env["RAMEN_DIR"]) / "counters.dat"
    if not path.exists() or not path.stat().st_size:
        return {}
    snapshot = json.loads(stat(env, "--json"))
    return {c["type"]: c["value"] for c in snapshot["counters"] if c["owner_pid"] == pid}


def stop(process):
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err


def test_the_supervisor_and_choreographer_counters_show_in_ramen_stat_and_go_with_them(env, services, fresh_confserver):
    supervisor = services("supervisor.service", "--no-spares")
    choreographer = services("choreographer.service")
    mine = wait_for(lambda: (c := counters_of(env, choreographer.pid)) and c.get("choreographer-recomputes") and c,
                    "the choreographer's first recompute in counters.dat")
    assert mine["choreographer-recomputes"] == 1 and mine["choreographer-writes"] == 0
    theirs = wait_for(lambda: counters_of(env, supervisor.pid), "the supervisor's counters")
    assert set(theirs) == {f"supervisor-{name.replace('_', '-')}" for name in SERVICE_COUNTER_TYPE_IDS["supervisor"]}

    with confserver.connect(fresh_confserver.url, identity="admin", auth_file=fresh_confserver.auth_file) as admin:
        admin.set(keyspace.program_key("p"), program("p", [("a", True, []), ("b", True, ["p/a"])]).to_dict())
    mine = wait_for(lambda: (c := counters_of(env, choreographer.pid)) and c["choreographer-writes"] == 2 and c,
                    "the choreographer's worker keys counted")
    assert mine["choreographer-recomputes"] == 2

    human = stat(env)
    assert f"pid {supervisor.pid}: supervisor {SITE}\n" in human
    assert f"pid {choreographer.pid}: choreographer {SITE}\n" in human
    assert "2 - choreographer s1 recomputes" in human and "0 - supervisor s1 merged requests" in human

    stop(supervisor)
    stop(choreographer)
    assert json.loads(stat(env, "--json"))["counters"] == []


def test_a_killed_service_counters_are_freed_by_its_next_run(env, services):
    first = services("choreographer.service")
    wait_for(lambda: counters_of(env, first.pid).get("choreographer-recomputes"), "the first run's counters")
    first.kill()
    first.wait(30)
    assert f"pid {first.pid}: choreographer {SITE} (exited)\n" in stat(env)

    second = services("choreographer.service")
    wait_for(lambda: counters_of(env, second.pid).get("choreographer-recomputes"), "the second run's counters")
    assert counters_of(env, first.pid) == {}
    file = CountersFile.open(env["RAMEN_DIR"] + "/counters.dat", create=False)
    try:
        assert [c.owner_id for c in file.counters() if c.type_id == RECOMPUTES] == [second.pid]
    finally:
        file.close()

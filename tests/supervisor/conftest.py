"""A supervisor running in a thread of the test, against a confserver of the test's own, with
tests/supervisor/fake_process.py standing in for workers and replayers."""

from __future__ import annotations

import os
import functools
import sys
import threading
from pathlib import Path

import pytest

import confserver
from ramen import keyspace
from ramen.clocks import ManualClock
from tests import waiting
from supervisor.service import Supervisor
from supervisor.workers import RestartPolicy

FAKE = str(Path(__file__).with_name("fake_process.py"))
SITE = "s1"
EVENTUALLY_S = 15.0
wait_for = functools.partial(waiting.wait_for, timeout_s=EVENTUALLY_S)


def fake_command(mode: str) -> list[str]:
    return [sys.executable, FAKE, mode]


@pytest.fixture
def ramen_dir(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "ramen"
    monkeypatch.setenv("RAMEN_DIR", str(path))
    return path


@pytest.fixture
def admin(fresh_confserver):
    with confserver.connect(fresh_confserver.url, identity="admin", auth_file=fresh_confserver.auth_file) as c:
        yield c


@pytest.fixture
def start_supervisor(fresh_confserver, ramen_dir):
    """start_supervisor(**options) -> Supervisor running in a thread (or, with `thread=False`, for
    the test to drive: see drive); all stopped at the end."""
    running = []
    env = dict(os.environ, RAMEN_DIR=str(ramen_dir), RAMEN_CONFSERVER=fresh_confserver.url,
               RAMEN_CONFSERVER_AUTH=str(fresh_confserver.auth_file))

    def start(*, worker_mode="by-name", replayer_mode="sleep", policy=None, stop_children=True, thread=True,
              **options):
        client = confserver.connect(fresh_confserver.url, identity="supervisor", auth_file=fresh_confserver.auth_file)
        options.setdefault("delay_before_replay_s", 0.3)
        options.setdefault("stop_grace_s", 2.0)
        options.setdefault("spares", False)  # the fake stands in for a spare only where a test says
        options.setdefault("linger_s", 0.0)  # unused workers stop at once, unless a test says
        service = Supervisor(client, SITE, env=env, worker_command=fake_command(worker_mode),
                             replayer_command=fake_command(replayer_mode),
                             restart_policy=policy or RestartPolicy(initial_s=0.05), **options)
        service.stop_thread = lambda: None
        if thread:
            stop = threading.Event()
            runner = threading.Thread(target=service.run, args=(stop,), daemon=True)
            runner.start()
            service.stop_thread = lambda: (stop.set(), runner.join(10))
        running.append((service, client, stop_children))
        return service

    try:
        yield start
    finally:
        for service, client, stop_children in running:
            service.stop_thread()
            if isinstance(service.clock, ManualClock):  # its grace never ends: nothing may outlive SIGTERM
                kill_children(service)
            service.close(stop_children=stop_children, timeout_s=5)
            client.close()
        for service, _, _ in running:  # what a "dead" supervisor left and nobody adopted
            kill_children(service)


def kill_children(service: Supervisor) -> None:
    for child in [*service.workers.running().values(), service.workers.spare, service.replays.warm]:
        if child is not None:
            child.kill()
    for replayer in service.replays.replayers.values():
        if replayer.child is not None:
            replayer.child.kill()


def drive(supervisor: Supervisor, condition, what: str = "condition"):
    """Run the duty cycle of a supervisor started with `thread=False` until condition() holds
    (the events of its watches arrive on their own threads); returns its value."""
    return wait_for(lambda: (supervisor.do_work(), condition())[1], what=what)


def set_worker(admin, name: str, *, is_used: bool = True, signature: str = "sig1") -> None:
    program, _, function = name.partition("/")
    admin.set(keyspace.worker_key(SITE, name),
              {"program": program, "function": function, "is_used": is_used, "live": is_used, "replays": [],
               "lazy": False, "kind": "python", "archived": False, "parents": [], "children": [],
               "signature": signature, "program_version": "v1"})


def value_of(admin, key: str):
    entry = admin.get_or_none(key)
    return None if entry is None else entry.value


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie of ours counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False

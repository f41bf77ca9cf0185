"""`ramen start`'s keeper: restarts the dead with backoff, kills and restarts the stuck.

The agent is driven by the test's own clock over fake processes; the last tests run it over real
processes (a real confserver and its probe, a real heartbeat) stopped with SIGSTOP.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import sys
import time

import pytest

import confserver
from confserver.probe import Prober
from ramen import liveness
from ramen.cli.keeper import (HEALTHY_PERIOD_S, HEARTBEAT_STUCK_AFTER_S, RESTART_BACKOFF_S, STARTUP_GRACE_S,
                              Keeper, Service)


@pytest.fixture(autouse=True)
def spark_for_sql_checks():
    """No program is loaded here: no Spark (this overrides tests/cli/conftest.py's fixture)."""


_pids = itertools.count(100_000)


class FakeProcess:
    def __init__(self):
        self.pid = next(_pids)
        self.returncode: int | None = None
        self.kills = 0

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.kills += 1  # it dies when the test says (a killed process is reaped a little later)


class Launcher:
    def __init__(self):
        self.processes: list[FakeProcess] = []

    def __call__(self, argv, **kwargs) -> FakeProcess:
        self.processes.append(FakeProcess())
        return self.processes[-1]

    @property
    def current(self) -> FakeProcess:
        return self.processes[-1]


class Signs:
    """Signs of life per pid, as the test gives them."""

    def __init__(self):
        self.last: dict[int, float] = {}

    def last_sign_of_life(self, pid: int) -> float | None:
        return self.last.get(pid)


class Harness:
    def __init__(self, tmp_path, *, with_liveness: bool = True, stuck_after_s: float = HEARTBEAT_STUCK_AFTER_S):
        self.launcher = Launcher()
        self.signs = Signs() if with_liveness else None
        self.service = Service("svc", ["svc.module"], log_path=tmp_path / "svc.log", liveness=self.signs,
                               stuck_after_s=stuck_after_s, launch=self.launcher)
        self.reports: list[str] = []
        self.keeper = Keeper([self.service], {}, report=self.reports.append)
        self.now = 0.0
        self.service.start({}, self.now)

    def at(self, now: float) -> int:
        self.now = now
        return self.keeper.do_work(now)

    def sign(self, now: float) -> None:
        self.signs.last[self.launcher.current.pid] = now

    def crash(self) -> None:
        self.launcher.current.returncode = 1

    def restart_delay_after_crash(self) -> float:
        """Crash the current process now; how long until the keeper starts the next one."""
        self.crash()
        started = len(self.launcher.processes)
        crashed_at = self.now
        self.at(crashed_at)
        step = 0.05
        t = crashed_at
        while len(self.launcher.processes) == started:
            t = round(t + step, 2)
            assert t - crashed_at < 60, "never restarted"
            self.at(t)
        return round(t - crashed_at, 2)


def test_a_service_that_exits_is_restarted_after_the_first_backoff_step(tmp_path):
    h = Harness(tmp_path)
    h.at(5.0)
    h.crash()
    h.at(5.0)
    assert h.reports == [f"svc exited (status 1), restarting in {RESTART_BACKOFF_S[0]:g} s; see {tmp_path / 'svc.log'}"]
    h.at(5.0 + RESTART_BACKOFF_S[0] - 0.01)
    assert len(h.launcher.processes) == 1
    h.at(5.0 + RESTART_BACKOFF_S[0])
    assert len(h.launcher.processes) == 2 and h.service.started_at == 5.0 + RESTART_BACKOFF_S[0]


def test_each_restart_waits_one_step_longer_up_to_the_longest(tmp_path):
    h = Harness(tmp_path)
    delays = [h.restart_delay_after_crash() for _ in range(len(RESTART_BACKOFF_S) + 2)]
    assert delays == [*RESTART_BACKOFF_S, RESTART_BACKOFF_S[-1], RESTART_BACKOFF_S[-1]]


@pytest.mark.parametrize("with_liveness", [True, False], ids=["signs of life", "no liveness"])
def test_the_backoff_starts_over_after_a_healthy_period(tmp_path, with_liveness):
    h = Harness(tmp_path, with_liveness=with_liveness)
    for _ in range(len(RESTART_BACKOFF_S)):
        h.restart_delay_after_crash()
    started = h.service.started_at
    for t in range(1, int(HEALTHY_PERIOD_S) + 1):
        if with_liveness:
            h.sign(started + t)
        h.at(started + t)
    assert h.restart_delay_after_crash() == RESTART_BACKOFF_S[0]


def test_a_service_stuck_soon_after_its_start_keeps_its_backoff(tmp_path):
    h = Harness(tmp_path, stuck_after_s=10.0)
    for _ in range(3):
        h.restart_delay_after_crash()
    started = h.service.started_at
    h.sign(started + 1.0)
    h.at(started + 1.0)
    h.at(started + 11.5)  # killed as stuck: it was healthy for 1 s, far from a healthy period
    h.launcher.current.returncode = -signal.SIGKILL
    assert h.restart_delay_after_crash() == RESTART_BACKOFF_S[3]


def test_a_running_service_silent_past_its_bound_is_killed_once_then_restarted(tmp_path):
    h = Harness(tmp_path, stuck_after_s=15.0)
    for t in range(1, 11):
        h.sign(float(t))
        h.at(float(t))
    h.at(25.0)  # 15 s after its last sign: still within the bound
    assert h.launcher.current.kills == 0
    h.at(25.2)
    first = h.launcher.current
    assert first.kills == 1
    assert h.reports[-1].startswith(f"svc (pid {first.pid}) is running but has shown no sign of life for 15 s "
                                    "(bound 15 s): killing it to restart it")
    h.at(25.4)  # not reaped yet: no second kill
    assert first.kills == 1 and len(h.launcher.processes) == 1
    first.returncode = -signal.SIGKILL
    h.at(25.6)
    assert h.reports[-1].startswith(f"svc exited (status {-signal.SIGKILL}), restarting in")
    h.at(25.6 + RESTART_BACKOFF_S[0])
    assert len(h.launcher.processes) == 2 and h.launcher.current.kills == 0


def test_a_service_that_keeps_showing_life_is_never_killed(tmp_path):
    h = Harness(tmp_path, stuck_after_s=15.0)
    for t in range(1, 3600):
        h.sign(t - 14.0 if t > 14 else 0.5)  # its signs arrive late, but within the bound
        h.at(float(t))
    assert h.launcher.current.kills == 0 and len(h.launcher.processes) == 1 and h.reports == []


def test_until_its_first_sign_of_life_a_started_service_has_its_startup_grace(tmp_path):
    h = Harness(tmp_path, stuck_after_s=15.0)
    h.at(STARTUP_GRACE_S)
    assert h.launcher.current.kills == 0
    h.at(STARTUP_GRACE_S + 0.2)
    assert h.launcher.current.kills == 1
    assert f"for {STARTUP_GRACE_S + 0.2:.0f} s since its start (bound {STARTUP_GRACE_S:g} s)" in h.reports[-1]


def test_a_service_without_liveness_is_only_restarted_when_it_dies(tmp_path):
    h = Harness(tmp_path, with_liveness=False)
    for t in range(1, 10_000, 7):
        h.at(float(t))
    assert h.launcher.current.kills == 0 and h.reports == []


def test_a_heartbeat_counts_only_for_the_process_that_wrote_it(tmp_path):
    path = tmp_path / "svc.heartbeat"
    assert liveness.last_beat(path, os.getpid()) is None
    path.write_bytes(liveness.STAMP.pack(123_000_000_000, os.getpid() + 1))
    assert liveness.last_beat(path, os.getpid()) is None
    path.write_bytes(liveness.STAMP.pack(123_000_000_000, os.getpid()))
    assert liveness.last_beat(path, os.getpid()) == 123.0


# -- real processes -----------------------------------------------------------------------------

#: Short bounds, so the real tests take seconds; what they check does not depend on them.
REAL_STUCK_AFTER_S = 2.0
REAL_PROBE_INTERVAL_S = 0.2
REAL_TIMEOUT_S = 60.0


def keep_until(keeper: Keeper, condition, what: str) -> None:
    deadline = time.monotonic() + REAL_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {REAL_TIMEOUT_S:g} s: {what}"
        keeper.do_work(time.monotonic())
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_confserver_stopped_with_sigstop_is_killed_restarted_and_answers_again(tmp_path):
    port = free_port()
    data = tmp_path / "conf"
    service = Service("confserver", ["confserver.server", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data)],
                      log_path=tmp_path / "confserver.log", stuck_after_s=REAL_STUCK_AFTER_S)
    prober = Prober("127.0.0.1", port, interval_s=REAL_PROBE_INTERVAL_S, timeout_s=REAL_PROBE_INTERVAL_S).start()
    service.liveness = prober
    reports: list[str] = []
    keeper = Keeper([service], dict(os.environ), report=reports.append)
    service.start(dict(os.environ))
    try:
        keep_until(keeper, lambda: service.last_sign > service.started_at, "the first probe answered")
        url = f"ramen://127.0.0.1:{port}"
        with confserver.connect(url, identity="admin", auth_file=data / "auth.json", session_timeout_s=5) as client:
            client.set("before", 1)
            client.create("mine", 1, ephemeral=True)
            stuck = service.process
            stuck.send_signal(signal.SIGSTOP)
            keep_until(keeper, lambda: service.process is not stuck and service.last_sign > service.started_at,
                       "a new confserver answering its probe")
            assert stuck.returncode == -signal.SIGKILL
            assert any(r.startswith(f"confserver (pid {stuck.pid}) is running but has shown no sign of life")
                       for r in reports), reports
            with confserver.connect(url, identity="admin", auth_file=data / "auth.json") as other:
                assert other.get("before").value == 1
                other.set("after", 2)
            keep_until(keeper, lambda: _answers(client), "the first client, its session resumed")
            assert client.get("mine").ephemeral  # its session outlived the server's restart
    finally:
        prober.close()
        service.stop()


def _answers(client) -> bool:
    try:
        return client.get("after").value == 2
    except confserver.Disconnected:
        return False


BEATING = ("import time\nfrom ramen import liveness\nwhile True:\n    liveness.beat()\n    time.sleep(0.05)\n")


def test_a_service_whose_heartbeat_stops_is_killed_and_restarted(tmp_path):
    service = Service("beating", [], command=[sys.executable, "-c", BEATING], log_path=tmp_path / "beating.log",
                      heartbeat_path=tmp_path / "beating.heartbeat", stuck_after_s=REAL_STUCK_AFTER_S)
    reports: list[str] = []
    keeper = Keeper([service], dict(os.environ), report=reports.append)
    service.start(dict(os.environ))
    try:
        keep_until(keeper, lambda: service.last_sign > service.started_at, "a first heartbeat")
        stuck = service.process
        stuck.send_signal(signal.SIGSTOP)
        keep_until(keeper, lambda: service.process is not stuck and service.last_sign > service.started_at,
                   "a new process beating")
        assert stuck.returncode == -signal.SIGKILL
        assert any(f"beating (pid {stuck.pid}) is running but has shown no sign of life" in r for r in reports)
    finally:
        service.stop()

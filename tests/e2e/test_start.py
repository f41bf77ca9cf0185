"""`ramen start` in the foreground: it serves until interrupted, then stops every service."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from tests.processes import processes_with

STARTUP_S = 60.0
IGNORE_SIGINT_AND_EXEC = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                          "os.execv(sys.argv[1], sys.argv[1:])")


def test_start_stops_everything_on_sigint_even_when_started_with_sigint_ignored(tmp_path):
    """A shell's background job starts with SIGINT ignored; Ctrl-C or `kill -INT` must still stop it."""
    env = dict(os.environ, RAMEN_DIR=str(tmp_path))
    env.pop("RAMEN_CONFSERVER", None)
    # Ignored, then exec'ed: the disposition survives the exec, as a shell's does. Not preexec_fn:
    # that forks this process, whose gRPC threads (another test's Spark session) abort the child.
    process = subprocess.Popen([sys.executable, "-c", IGNORE_SIGINT_AND_EXEC, sys.executable, "-m", "ramen.cli.main",
                                "start", "--dir", str(tmp_path)], env=env, stderr=subprocess.PIPE, text=True)
    ready = tmp_path / "run" / "ready"
    deadline = time.monotonic() + STARTUP_S
    while not ready.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.1)
    pids = [int(p) for p in subprocess.run(["pgrep", "-f", f"--dir {tmp_path}|{tmp_path}/confserver"],
                                           capture_output=True, text=True).stdout.split()]
    process.send_signal(signal.SIGINT)
    assert process.wait(STARTUP_S) == 0
    assert process.stderr.read().strip().endswith("ramen: stopped")
    assert not (tmp_path / "run" / "ramen.pid").exists()
    assert all(not os.path.exists(f"/proc/{pid}") for pid in pids if pid != process.pid)


@pytest.mark.parametrize("daemon", [[], ["--daemon"]], ids=["foreground", "daemon"])
def test_start_with_the_confserver_port_taken_says_so_in_one_line(tmp_path, daemon):
    from confserver.url import DEFAULT_HOST, DEFAULT_PORT
    env = dict(os.environ, RAMEN_DIR=str(tmp_path))
    env.pop("RAMEN_CONFSERVER", None)
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind((DEFAULT_HOST, DEFAULT_PORT))
    holder.listen()
    try:
        result = subprocess.run([sys.executable, "-m", "ramen.cli.main", "start", *daemon, "--dir", str(tmp_path),
                                 "--listen", f"{DEFAULT_HOST}:{DEFAULT_PORT}"],
                                env=env, capture_output=True, text=True, timeout=STARTUP_S)
    finally:
        holder.close()
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot listen on {DEFAULT_HOST}:{DEFAULT_PORT}" in lines[0] and "in use" in lines[0], lines[0]
    assert not (tmp_path / "run" / "ramen.pid").exists()


PROGRAM = """
[program]
name = "left"

[[function]]
name = "ticks"
source = { kind = "generator", rate = 10, hosts = 2, seed = 1 }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
"""


def test_start_stops_the_workers_of_a_supervisor_that_had_died(tmp_path):
    """The supervisor is SIGKILLed and ramen is stopped before it is restarted: the worker it ran,
    in a session of its own, must not outlive the site."""
    (tmp_path / "left.toml").write_text(PROGRAM)
    env = dict(os.environ, RAMEN_DIR=str(tmp_path))
    env.pop("RAMEN_CONFSERVER", None)
    process = subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "start", "--dir", str(tmp_path),
                                str(tmp_path / "left.toml")], env=env, stderr=subprocess.PIPE, text=True)
    worker_log = tmp_path / "logs" / "workers" / "left" / "ticks.log"
    deadline = time.monotonic() + STARTUP_S
    while not (worker_log.exists() and " running" in worker_log.read_text()):
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.1)
    ours = processes_with(f"RAMEN_DIR={tmp_path}")
    workers = [pid for pid, args in ours.items() if "workers.worker" in args]
    supervisor = [pid for pid, args in ours.items() if "supervisor.service" in args]
    assert workers and len(supervisor) == 1, ours
    os.kill(supervisor[0], signal.SIGKILL)
    process.send_signal(signal.SIGINT)
    assert process.wait(STARTUP_S) == 0
    left = processes_with(f"RAMEN_DIR={tmp_path}")
    for pid in left:  # not to outlive the test
        os.kill(pid, signal.SIGKILL)
    assert left == {}
    stderr = process.stderr.read()
    assert "stopping what it left running" in stderr and stderr.strip().endswith("ramen: stopped"), stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=["ctrl-c", "terminal-closed"])
def test_a_signal_to_the_terminals_whole_group_stops_the_services_in_order(tmp_path, signum):
    """A terminal's Ctrl-C, or its closing, signals its whole foreground process group. `ramen start`
    alone must act on it and stop its services in order, the confserver last: none finds the
    confserver gone on its way out (when each stopped on the signal itself, the confserver went
    first, the supervisor was killed waiting on it, and its workers were left for a successor)."""
    (tmp_path / "left.toml").write_text(PROGRAM)
    env = dict(os.environ, RAMEN_DIR=str(tmp_path))
    env.pop("RAMEN_CONFSERVER", None)
    process = subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "start", "--dir", str(tmp_path), "--no-httpd",
                                str(tmp_path / "left.toml")], env=env, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # a group of its own, as a terminal's foreground job
    worker_log = tmp_path / "logs" / "workers" / "left" / "ticks.log"
    deadline = time.monotonic() + STARTUP_S
    while not (worker_log.exists() and " running" in worker_log.read_text()):
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.1)
    os.killpg(process.pid, signum)
    assert process.wait(STARTUP_S) == 0
    stderr = process.stderr.read()
    left = processes_with(f"RAMEN_DIR={tmp_path}")
    for pid in left:  # not to outlive the test
        os.kill(pid, signal.SIGKILL)
    assert left == {}
    assert stderr.strip().endswith("ramen: stopped") and "died" not in stderr and "unreachable" not in stderr, stderr
    troubled = {str(p.relative_to(tmp_path)): p.read_text() for p in (tmp_path / "logs").rglob("*.log")
                if re.search("Traceback|lost; reconnecting|unreachable", p.read_text())}
    assert troubled == {}


def test_stop_after_ramen_start_was_killed_stops_everything_it_had_started(tmp_path):
    """`ramen start` itself killed with -9: its services, the supervisor's workers and the result
    log of a replay client killed too are left. `ramen stop` stops them all and removes the log."""
    (tmp_path / "left.toml").write_text(PROGRAM)
    env = dict(os.environ, RAMEN_DIR=str(tmp_path))
    env.pop("RAMEN_CONFSERVER", None)
    started = subprocess.run([sys.executable, "-m", "ramen.cli.main", "start", "--daemon", "--dir", str(tmp_path),
                              str(tmp_path / "left.toml")], env=env, capture_output=True, text=True, timeout=STARTUP_S)
    assert started.returncode == 0, started.stderr
    worker_log = tmp_path / "logs" / "workers" / "left" / "ticks.log"
    deadline = time.monotonic() + STARTUP_S
    while not (worker_log.exists() and " running" in worker_log.read_text()):
        assert time.monotonic() < deadline, "the worker never ran"
        time.sleep(0.1)
    result_log = tmp_path / "replays" / "7.logbuffer"
    result_log.parent.mkdir(parents=True, exist_ok=True)
    result_log.write_bytes(b"a killed client's result")
    start_pid = int((tmp_path / "run" / "ramen.pid").read_text())
    ours = processes_with(f"RAMEN_DIR={tmp_path}")
    assert any("workers.worker" in args for args in ours.values()), ours
    os.kill(start_pid, signal.SIGKILL)

    stopped = subprocess.run([sys.executable, "-m", "ramen.cli.main", "stop", "--dir", str(tmp_path)], env=env,
                             capture_output=True, text=True, timeout=STARTUP_S)
    left = processes_with(f"RAMEN_DIR={tmp_path}")
    for pid in left:  # not to outlive the test
        os.kill(pid, signal.SIGKILL)
    assert stopped.returncode == 0, stopped.stderr
    assert left == {}, stopped.stderr
    # Every process it had started, named; the supervisor may have started a spare since the list.
    stopping = re.search(r"stopping (\d+) processes left running", stopped.stderr)
    assert stopping and int(stopping[1]) >= len(ours) - 1, stopped.stderr
    assert all(f"pid {pid} " in stopped.stderr for pid in ours if pid != start_pid), stopped.stderr
    assert "killed" not in stopped.stderr  # SIGTERM did: the confserver went last, as `ramen start` stops it
    assert not result_log.exists() and not (tmp_path / "run" / "ramen.pid").exists()


RESTART_PROGRAM = """
[program]
name = "again"

[[function]]
name = "ticks"
source = { kind = "generator", rate = 100, hosts = 3, seed = 2, backfill = "20s" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
archive = { retention = "1d" }
"""


def test_a_replay_across_a_restart_of_ramen_has_every_tuple_once(tmp_path, monkeypatch):
    """`ramen stop`, then `ramen start` again: the generator resumes after its last archived row and
    says so first (a RESUMED message), so its two recordings cover the range without a gap (the
    step to its next row is none), and a replay across the restart gets every row of the grid once.
    Without the RESUMED message the replay was refused: `no archive of again/ticks covers ...`.
    And `tail -n` of an archive younger than its minute of look-back shows its last rows (it was
    refused: `no archive ... before ...`)."""
    import numpy as np

    from ramen import paths
    from ramen.archive.coverage import archive_coverage
    from tests.e2e.test_replay import Stack
    from tests.waiting import wait_for
    from workers.sources import step_of

    program = tmp_path / "again.toml"
    program.write_text(RESTART_PROGRAM)
    stack = Stack(tmp_path)
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path))

    def archived_until() -> int:
        intervals = archive_coverage(paths.archive_dir("local")).get("again/ticks", [])
        return max((i.until_us for i in intervals), default=0)

    def archived_since() -> int:
        return min(i.since_us for i in archive_coverage(paths.archive_dir("local"))["again/ticks"])

    def start_and_archive_a_second() -> int:
        started = stack.ramen("start", "--daemon", "--dir", tmp_path, program, timeout=STARTUP_S)
        assert started.returncode == 0, started.stderr
        live_us = time.time_ns() // 1000 + 1_000_000
        wait_for(lambda: archived_until() > live_us, "a second of live rows archived", timeout_s=STARTUP_S)
        return live_us

    since_us = time.time_ns() // 1000 - 15_000_000  # inside the first run's back-fill
    try:
        start_and_archive_a_second()
        # However long start took (a loaded CI took over 5 s: the back-fill began after since_us)
        since_us = max(since_us, archived_since() + 1_000_000)
        assert stack.ramen("stop", "--dir", tmp_path).returncode == 0
        until_us = start_and_archive_a_second()
        table = stack.replay_table("again/ticks", since_us, until_us)
        # The archive is younger than `tail -n`'s look-back of a minute: its last rows are all there is.
        tail = stack.ramen("tail", "-n", "3", "again/ticks")
    finally:
        stack.ramen("stop", "--dir", tmp_path)
    times = table.column("ts").cast(pa.timestamp("us")).cast(pa.int64()).to_numpy()
    step = step_of(100)
    assert len(times) > 1500 and (np.diff(times) == step).all(), np.unique(np.diff(times))
    assert times[0] - since_us < step and until_us - times[-1] <= step
    assert tail.returncode == 0 and len(tail.stdout.strip().splitlines()) == 3, tail.stderr + tail.stdout


def test_start_kills_and_restarts_a_confserver_stopped_with_sigstop_and_its_services_beat(tmp_path):
    """A confserver alive but stuck (SIGSTOP) answers no probe: `ramen start` kills and restarts it
    (the keeper's bound is 15 s), and it answers again. The choreographer, supervisor and archiver
    beat into their heartbeat files meanwhile."""
    from ramen import liveness
    from ramen.cli.keeper import PROBE_STUCK_AFTER_S
    env = dict(os.environ, RAMEN_DIR=str(tmp_path))
    env.pop("RAMEN_CONFSERVER", None)
    stderr_path = tmp_path / "start.stderr"
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "start", "--dir", str(tmp_path)],
                                   env=env, stderr=stderr, text=True)
    try:
        deadline = time.monotonic() + STARTUP_S
        while not (tmp_path / "run" / "ready").exists():
            assert process.poll() is None and time.monotonic() < deadline, stderr_path.read_text()
            time.sleep(0.1)
        ours = processes_with(f"RAMEN_DIR={tmp_path}")
        for name, module in (("choreographer", "choreographer.service"), ("supervisor", "supervisor.service"),
                             ("archiver", "workers.archiver")):
            (pid,) = [p for p, args in ours.items() if f"-m {module}" in args]
            heartbeat = tmp_path / "run" / f"{name}.heartbeat"
            first = liveness.last_beat(heartbeat, pid)
            while first is None or (liveness.last_beat(heartbeat, pid) or 0) <= first:
                assert time.monotonic() < deadline, f"{name} does not beat"
                time.sleep(0.1)
                first = first or liveness.last_beat(heartbeat, pid)
        (stuck,) = [p for p, args in ours.items() if "-m confserver.server" in args]
        os.kill(stuck, signal.SIGSTOP)
        deadline = time.monotonic() + PROBE_STUCK_AFTER_S + STARTUP_S
        client_env = dict(env, RAMEN_CONFSERVER_AUTH=str(tmp_path / "confserver" / "auth.json"))
        while True:
            assert process.poll() is None and time.monotonic() < deadline, stderr_path.read_text()
            if not os.path.exists(f"/proc/{stuck}"):
                answer = subprocess.run([sys.executable, "-m", "ramen.cli.main", "confclient", "set", "after", "1"],
                                        env=client_env, capture_output=True, text=True, timeout=STARTUP_S)
                if answer.returncode == 0:
                    break
            time.sleep(0.2)
        said = stderr_path.read_text()
        assert f"ramen: confserver (pid {stuck}) is running but has shown no sign of life for" in said, said
        assert f"ramen: confserver exited (status {-signal.SIGKILL}), restarting in" in said, said
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(STARTUP_S) == 0
    assert stderr_path.read_text().strip().endswith("ramen: stopped")


def test_a_command_rides_through_a_restart_of_its_instances_confserver_and_without_one_fails_at_once(tmp_path):
    """While `ramen start` runs, a command whose confserver does not answer (it died, and is being
    restarted) waits for it, saying so, instead of failing; with no `ramen start` running there, it
    fails at once in one line. `ramen start` is frozen meanwhile, so that the command surely finds
    the confserver gone, and then let go to restart it."""
    env = dict(os.environ, RAMEN_DIR=str(tmp_path))
    env.pop("RAMEN_CONFSERVER", None)
    stderr_path = tmp_path / "start.stderr"
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "start", "--dir", str(tmp_path),
                                    "--no-httpd"], env=env, stderr=stderr, text=True)
    command = [sys.executable, "-m", "ramen.cli.main", "confclient", "set", "rode-through", "1"]
    try:
        deadline = time.monotonic() + STARTUP_S
        while not (tmp_path / "run" / "ready").exists():
            assert process.poll() is None and time.monotonic() < deadline, stderr_path.read_text()
            time.sleep(0.1)
        (confserver,) = [p for p, args in processes_with(f"RAMEN_DIR={tmp_path}").items()
                         if "-m confserver.server" in args]
        os.kill(process.pid, signal.SIGSTOP)
        try:
            os.kill(confserver, signal.SIGKILL)
            waiting = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            said = waiting.stderr.readline()
            assert "does not answer; its `ramen start` runs (and restarts it): waiting up to" in said, said
        finally:
            os.kill(process.pid, signal.SIGCONT)
        _, err = waiting.communicate(timeout=STARTUP_S)
        assert waiting.returncode == 0, err
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(STARTUP_S) == 0
    failed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=STARTUP_S)
    assert failed.returncode != 0 and "is ramen running?" in failed.stderr and failed.stderr.count("\n") == 1, \
        failed.stderr
    assert "waiting" not in failed.stderr

"""`python -m supervisor.service` as its own process: it reports its stats and exits on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import confserver
from ramen import supervisor_stats
from tests.supervisor.conftest import pid_alive, wait_for


def test_the_service_writes_its_stats_and_exits_cleanly_on_sigterm(fresh_confserver, ramen_dir):
    env = dict(os.environ, RAMEN_DIR=str(ramen_dir), RAMEN_CONFSERVER=fresh_confserver.url,
               RAMEN_CONFSERVER_AUTH=str(fresh_confserver.auth_file))
    process = subprocess.Popen([sys.executable, "-m", "supervisor.service", "--site", "svc"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with confserver.connect(fresh_confserver.url, identity="admin", auth_file=fresh_confserver.auth_file) as c:
            stats = wait_for(lambda: supervisor_stats.read(c, "svc"), what="the supervisor's stats")
            assert stats.counters["starts"] == 0 and stats.replayers == ()
            assert c.get("sites/svc/supervisor/stats").owner == "supervisor"
            stats = wait_for(lambda: (s := supervisor_stats.read(c, "svc")) and s.spare_worker and s.warm_replayer
                             and s, what="a spare worker and a warm replayer started ahead")
            ahead = [stats.spare_worker.pid, stats.warm_replayer.pid]
            assert all(pid_alive(pid) for pid in ahead)
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
        assert not any(pid_alive(pid) for pid in ahead)  # they go with the supervisor
        assert not list((ramen_dir / "logs" / "workers").glob("spare-*.log"))  # and the spare's log, unused
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()


def test_bad_options_get_a_one_line_error(fresh_confserver, ramen_dir):
    result = subprocess.run([sys.executable, "-m", "supervisor.service", "--stop-grace", "-1"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ramen: supervisor: --delay-before-replay and --stop-grace must not be negative"]


def test_a_second_supervisor_of_a_site_is_refused_naming_the_first(fresh_confserver, ramen_dir):
    env = dict(os.environ, RAMEN_DIR=str(ramen_dir), RAMEN_CONFSERVER=fresh_confserver.url,
               RAMEN_CONFSERVER_AUTH=str(fresh_confserver.auth_file))
    first = subprocess.Popen([sys.executable, "-m", "supervisor.service", "--site", "svc", "--no-spares"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with confserver.connect(fresh_confserver.url, identity="admin", auth_file=fresh_confserver.auth_file) as c:
            wait_for(lambda: supervisor_stats.read(c, "svc"), what="the first supervisor running")
        second = subprocess.run([sys.executable, "-m", "supervisor.service", "--site", "svc"], env=env,
                                capture_output=True, text=True, timeout=30)
        assert second.returncode == 1
        assert second.stderr.strip().splitlines()[-1] == \
            f"ramen: supervisor: site svc has a supervisor already (pid {first.pid})"
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(15)

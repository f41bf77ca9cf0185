"""Two ramen on one host, each found through its --dir; a stale pid file is never taken for ramen."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ramen.archive.coverage import archive_coverage
from tests.processes import kill_left_under, processes_with
from tests.waiting import wait_for

STARTUP_S = 60.0
SECOND_US = 1_000_000
TWIN = """
[program]
name = "twin"

[[function]]
name = "ticks"
source = {{ kind = "generator", rate = 100, hosts = {hosts}, seed = 3, backfill = "30s" }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
archive = {{ retention = "1d" }}
"""


def _env() -> dict:
    """No RAMEN_DIR nor RAMEN_CONFSERVER: --dir alone says which instance a command is for."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    for name in ("RAMEN_DIR", "RAMEN_CONFSERVER", "RAMEN_CONFSERVER_AUTH", "RAMEN_SITE"):
        env.pop(name, None)
    return env


def ramen(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ramen.cli.main", *map(str, args)], capture_output=True, text=True,
                          env=_env(), timeout=timeout)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def test_two_instances_side_by_side_each_found_through_its_dir(tmp_path):
    """Each instance has its own confserver on a free port, written into its directory; `ramen
    --dir A replay` and `ramen replay --dir B` each reach their own (A's program has 2 hosts, B's
    3, under the same name: a replay of the other instance would show it). Before, the second
    start failed with "Address already in use", and a replay without RAMEN_DIR found no archive."""
    bases = {"a": (tmp_path / "a", 2), "b": (tmp_path / "b", 3)}
    try:
        for base, hosts in bases.values():
            base.mkdir()
            (base / "twin.toml").write_text(TWIN.format(hosts=hosts))
            started = ramen("start", "--daemon", "--dir", base, base / "twin.toml", timeout=STARTUP_S)
            assert started.returncode == 0, started.stderr + started.stdout
            page = (base / "run" / "httpd.url").read_text().strip()
            assert f"ramen: dashboards at {page}" in started.stdout.splitlines(), started.stdout
        addresses = {name: (base / "confserver" / "address").read_text().strip() for name, (base, _) in bases.items()}
        assert addresses["a"] != addresses["b"] and not any(a.endswith(":29340") for a in addresses.values())
        # Each its own httpd too: the second takes a free port when the first holds the default one.
        pages = {name: (base / "run" / "httpd.url").read_text().strip() for name, (base, _) in bases.items()}
        assert pages["a"] != pages["b"]
        for page in pages.values():
            with urllib.request.urlopen(f"{page}version", timeout=STARTUP_S) as answer:
                assert answer.read().startswith(b"1.1.")
        # B's httpd killed comes back on its port: its page's URL stays right (it took a free one each time).
        base_b = bases["b"][0]
        httpd = [pid for pid, args in processes_with(f"RAMEN_DIR={base_b}").items() if "ramen.httpd.service" in args]
        assert len(httpd) == 1
        os.kill(httpd[0], 9)
        wait_for(lambda: [pid for pid, args in processes_with(f"RAMEN_DIR={base_b}").items()
                          if "ramen.httpd.service" in args and pid != httpd[0]], "httpd restarted", timeout_s=STARTUP_S)
        wait_for(lambda: _answers(f"{pages['b']}version"), "the restarted httpd answering its page", timeout_s=STARTUP_S)
        assert (base_b / "run" / "httpd.url").read_text().strip() == pages["b"]

        now_us = time.time_ns() // 1000
        since_us, until_us = now_us - 20 * SECOND_US, now_us - 10 * SECOND_US
        for base, _ in bases.values():
            wait_for(lambda: any(i.since_us <= since_us and i.until_us >= until_us for i in
                                 archive_coverage(base / "sites" / "local" / "archive").get("twin/ticks", [])),
                     f"the archive of {base} covering the range", timeout_s=STARTUP_S)
        range_args = ["--since", f"{since_us / 1e6:.6f}", "--until", f"{until_us / 1e6:.6f}", "--format", "csv",
                      "twin/ticks", "host"]
        for before, (base, hosts) in zip((True, False), bases.values()):
            where = ["--dir", base, "replay", *range_args] if before else ["replay", "--dir", base, *range_args]
            result = ramen(*where)
            assert result.returncode == 0, result.stderr
            rows = result.stdout.split()
            assert len(rows) >= 1000 and len(set(rows)) == hosts, (base, len(rows), set(rows))

        # A confserver killed comes back where every service and worker of its instance knows it.
        base_a = bases["a"][0]
        killed = [pid for pid, args in processes_with(f"RAMEN_DIR={base_a}").items() if "confserver.server" in args]
        assert len(killed) == 1
        os.kill(killed[0], 9)
        wait_for(lambda: [pid for pid, args in processes_with(f"RAMEN_DIR={base_a}").items()
                          if "confserver.server" in args and pid != killed[0]], "the confserver restarted",
                 timeout_s=STARTUP_S)
        wait_for(lambda: ramen("--dir", base_a, "confclient", "get", "programs/twin").returncode == 0,
                 "the restarted confserver answering", timeout_s=STARTUP_S)
        assert (base_a / "confserver" / "address").read_text().strip() == addresses["a"]

        stopped_a = ramen("--dir", bases["a"][0], "stop")
        stopped_b = ramen("stop", "--dir", bases["b"][0])
        assert stopped_a.returncode == 0 and stopped_b.returncode == 0, stopped_a.stderr + stopped_b.stderr
        assert not (base_a / "confserver" / "address").exists()

        # Its confserver alone (its programs and archive still there), no supervisor: the replay
        # says so within seconds; it waited out its 300 s timeout, then blamed the replay.
        confserver_alone = subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "--dir", base_a, "confserver",
                                             "--listen", "127.0.0.1:0"],
                                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: (base_a / "confserver" / "address").exists(), "the confserver alone listening")
            alone = ramen("--dir", base_a, "replay", *range_args, timeout=STARTUP_S)
        finally:
            confserver_alone.terminate()
            confserver_alone.wait(STARTUP_S)
        assert alone.returncode == 1 and alone.stderr.strip().splitlines() == [
            "ramen: replay: no supervisor of site local is running: start ramen with `ramen start`"], alone.stderr
    finally:
        left = {name: kill_left_under(base) for name, (base, _) in bases.items()}
    assert left == {"a": {}, "b": {}}


@pytest.fixture
def stranger():
    """A live process that is not ramen's, whose pid a stale pid file names."""
    process = subprocess.Popen(["sleep", "300"])
    yield process
    process.kill()
    process.wait()


def _stale_pid_file(base: Path, pid: int) -> Path:
    pid_file = base / "run" / "ramen.pid"
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(f"{pid}\n")
    return pid_file


def test_stop_with_a_stale_pid_file_signals_nobody(tmp_path, stranger):
    """The pid was reused by a stranger's `sleep`: `ramen stop` sent it SIGTERM. Now nobody holds
    the pid file's lock, so nothing runs: one line, a non-zero exit (as `pg_ctl stop`), and the
    sleep lives on."""
    _stale_pid_file(tmp_path, stranger.pid)
    result = ramen("stop", "--dir", tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ramen: stop: ramen is not running from {tmp_path}"), lines
    assert f"pid {stranger.pid} is not ramen's" in lines[0]
    assert stranger.poll() is None


def test_start_with_a_stale_pid_file_goes_ahead(tmp_path, stranger):
    """`ramen start` refused ("already running") because the stale file's pid was alive; the file
    is not locked, so it starts, and its own `ramen stop` stops it, never the stranger."""
    pid_file = _stale_pid_file(tmp_path, stranger.pid)
    try:
        started = ramen("start", "--daemon", "--no-httpd", "--dir", tmp_path, timeout=STARTUP_S)
        assert started.returncode == 0, started.stderr + started.stdout
        assert int(pid_file.read_text()) != stranger.pid
        # --no-httpd reached the detached start: no httpd, no URL.
        assert "dashboards" not in started.stdout and not (tmp_path / "run" / "httpd.url").exists()
        again = ramen("start", "--daemon", "--dir", tmp_path, timeout=STARTUP_S)
        assert again.returncode == 1 and "already running" in again.stderr, again.stderr
        stopped = ramen("--dir", tmp_path, "stop")
        assert stopped.returncode == 0, stopped.stderr
    finally:
        left = kill_left_under(tmp_path)
    assert left == {}
    assert stranger.poll() is None

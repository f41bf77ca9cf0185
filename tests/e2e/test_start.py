"""`ramen start` in the foreground: it serves until interrupted, then stops every service."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

STARTUP_S = 60.0


def test_start_stops_everything_on_sigint_even_when_started_with_sigint_ignored(tmp_path):
    """A shell's background job starts with SIGINT ignored; Ctrl-C or `kill -INT` must still stop it."""
    env = dict(os.environ, RAMEN_DIR=str(tmp_path))
    env.pop("RAMEN_CONFSERVER", None)
    process = subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "start", "--dir", str(tmp_path)], env=env,
                               stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
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
        result = subprocess.run([sys.executable, "-m", "ramen.cli.main", "start", *daemon, "--dir", str(tmp_path)],
                                env=env, capture_output=True, text=True, timeout=STARTUP_S)
    finally:
        holder.close()
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot listen on {DEFAULT_HOST}:{DEFAULT_PORT}" in lines[0] and "in use" in lines[0], lines[0]
    assert not (tmp_path / "run" / "ramen.pid").exists()

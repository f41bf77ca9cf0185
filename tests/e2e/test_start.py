"""`ramen start` in the foreground: it serves until interrupted, then stops every service."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

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

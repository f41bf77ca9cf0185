"""`ramen kill` on a site started by `ramen start`: once the program's worker is stopped, `ramen ps
--all` no longer lists its functions, though the supervisor keeps the stats of their last run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

STARTUP_S = 60.0
POLL_S = 0.1
PROGRAM = """
[program]
name = "gone"

[[function]]
name = "ticks"
source = { kind = "generator", rate = 10, hosts = 2, seed = 1 }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
"""
STATS_KEY = "sites/local/workers/gone/ticks/stats"
RUNS_PATTERN = "sites/local/workers/gone/ticks/instances/*"


def ramen(env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "ramen.cli.main", *args], env=env, capture_output=True, text=True,
                            timeout=STARTUP_S)
    assert not check or result.returncode == 0, result.stderr
    return result


def ps_all(env: dict) -> list[dict]:
    return [json.loads(line) for line in ramen(env, "ps", "--all", "--json").stdout.splitlines()]


def wait_for(condition, what: str):
    deadline = time.monotonic() + STARTUP_S
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(POLL_S)
    return value


def test_ps_all_does_not_list_the_functions_of_a_killed_program(tmp_path: Path):
    (tmp_path / "gone.toml").write_text(PROGRAM)
    env = dict(os.environ, RAMEN_DIR=str(tmp_path))
    env.pop("RAMEN_CONFSERVER", None)
    ramen(env, "start", "--daemon", "--dir", str(tmp_path), str(tmp_path / "gone.toml"))
    try:
        [row] = wait_for(lambda: [r for r in ps_all(env) if r["function"] == "gone/ticks" and r["running"]],
                         "the worker to run")
        assert ramen(env, "kill", "gone").stdout.strip() == "killed gone"

        def last_run():
            got = ramen(env, "confclient", "list", "--json", RUNS_PATTERN, check=False)
            runs = [run for line in got.stdout.splitlines() for run in json.loads(line)["value"]["runs"]]
            return got.returncode == 0 and runs and runs[-1]
        # The supervisor stopped the worker and recorded its run: the stats that made ps list it stay.
        run = wait_for(last_run, "the supervisor to record the stopped worker's run")
        assert run["pid"] == row["pid"]
        assert ramen(env, "confclient", "get", STATS_KEY, check=False).returncode == 0
        try:
            os.kill(row["pid"], 0)
            raise AssertionError(f"worker pid {row['pid']} still runs")
        except ProcessLookupError:
            pass
        # What is left are the processes the supervisor keeps started ahead (a warm replayer, a spare).
        rows = ps_all(env)
        assert rows and all(r["function"].endswith("(waiting)") for r in rows), rows
        table = ramen(env, "ps", "--all").stdout
        assert "gone/" not in table, table
    finally:
        stopped = ramen(env, "stop", "--dir", str(tmp_path), check=False)
        assert stopped.returncode == 0, stopped.stderr

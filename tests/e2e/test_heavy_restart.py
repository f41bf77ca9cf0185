"""`ramen start` without --spark: it starts its own local Spark Connect server for a heavy program,
restarts it when it dies, and a replay running through it loses and doubles nothing.

A module of its own: `ramen start` stacks share the confserver's default port, so this one must
not run while test_heavy.py's is up.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys

import pyarrow.csv as pacsv

from ramen import keyspace
from tests.e2e.test_heavy import PROGRAM, sorted_rows
from tests.e2e.test_replay import STARTUP_S, Stack, minute_range, per_minute_by_pyarrow, wait_for_backfill
from tests.waiting import wait_for


def test_ramen_start_runs_its_own_spark_and_a_replay_survives_killing_it(tmp_path):
    """Without --spark, `ramen start` starts a local Spark for the heavy program and restarts it
    when it dies; the heavy worker keeps its gathered windows and retries: nothing lost or doubled."""
    program = tmp_path / "hv.toml"
    program.write_text(PROGRAM.replace("live_minute", "other_minute").replace(
        'name = "other_minute"', 'name = "other_minute"\nlazy = true'))
    stack = Stack(tmp_path)
    stack.env.pop("RAMEN_SPARK_REMOTE", None)
    started = stack.ramen("start", "--daemon", "--dir", tmp_path, program, timeout=3 * STARTUP_S)
    assert started.returncode == 0, started.stderr + started.stdout
    try:
        wait_for_backfill(tmp_path, "hv/traffic")
        with stack.client() as client:
            remote = client.get(keyspace.SPARK_SERVER).value["remote"]
        port = remote.rsplit(":", 1)[1]
        since, until = minute_range(8, 6)
        expected = per_minute_by_pyarrow(stack.replay_table("hv/traffic", since, until))
        replay = subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "replay", "--since", f"{since / 1e6}",
                                   "--until", f"{until / 1e6}", "--format", "csv", "--with-header", "hv/per_minute"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=stack.env)
        # Killed as the replay starts: its lazy worker comes up, gathers the rows, and finds Spark
        # gone or restarting (a cold start takes 10-20 s) when it runs its job.
        java = subprocess.run(["pgrep", "-f", f"binding.port={port}"], capture_output=True, text=True).stdout.split()
        assert java, "the local Spark server's process"
        for pid in java:
            os.kill(int(pid), signal.SIGKILL)
        out, err = replay.communicate(timeout=240)
        assert replay.returncode == 0, err
        got = sorted_rows(pacsv.read_csv(io.BytesIO(out.encode())))
        assert got.num_rows == expected.num_rows == 6 * 20  # every window once: none lost, none twice
        assert got["bytes"].to_pylist() == expected["bytes"].to_pylist()
        wait_for(lambda: "spark exited" in (tmp_path / "logs" / "start.log").read_text(), "ramen start to see it")
        # One job over all the rows, whether the worker met the dead server (and retried its
        # batch: "Spark unavailable" in its log) or its calls' own retries (about 3 s each) lasted
        # until the new server was up, which a fast machine's restart allows; the worker's retry
        # itself is tested in tests/workers.
        worker_log = (tmp_path / "logs" / "workers" / "hv" / "per_minute.log").read_text()
        assert worker_log.count("one Spark job over 360000 rows") == 1, worker_log
    finally:
        stack.ramen("stop", "--dir", tmp_path)

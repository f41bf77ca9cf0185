"""`ramen tail`: the next tuples of a function that keeps no archive; bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from ramen import paths
from ramen.program import load
from ramen.transport import CountersFile, ExclusivePublication, LogBuffer, LogBufferParams
from ramen.tuples import encode_tuples

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "net.toml"
DEADLINE_S = 60.0


def test_tail_n_of_a_function_without_archive_prints_the_next_tuples(fresh_confserver, tmp_path, monkeypatch):
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path / "ramen"))
    env = dict(os.environ, RAMEN_CONFSERVER=fresh_confserver.url, RAMEN_CONFSERVER_AUTH=str(fresh_confserver.auth_file),
               RAMEN_SITE="local")
    run = [sys.executable, "-m", "ramen.cli.main"]
    assert subprocess.run([*run, "run", EXAMPLE], env=env, capture_output=True).returncode == 0
    schema = load(EXAMPLE).function("top_talkers").schema
    path = paths.output_log("local", "net/top_talkers")
    path.parent.mkdir(parents=True)
    log = LogBuffer.create(path, LogBufferParams(term_length=64 * 1024))
    counters = CountersFile.open(paths.counters_path())
    publication = ExclusivePublication(log, counters)
    tail = subprocess.Popen([*run, "tail", "-n", "3", "net/top_talkers"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    n = 0
    deadline = time.monotonic() + DEADLINE_S
    while tail.poll() is None and time.monotonic() < deadline:  # write until it has its three tuples
        batch = pa.record_batch([pa.array([n * 60_000_000], pa.timestamp("us")), pa.array([f"h{n}"]),
                                 pa.array([n], pa.int64())], schema=schema)
        if publication.offer(encode_tuples(batch, "start")) > 0:
            n += 1
        time.sleep(0.01)
    out, err = tail.communicate(timeout=10)
    assert tail.returncode == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 3 and [r["bytes"] for r in rows] == sorted(r["bytes"] for r in rows)
    assert all(datetime.fromisoformat(r["start"]) for r in rows)
    publication.close()
    log.close()
    counters.close()


def test_tail_of_an_unknown_function_is_one_line(fresh_confserver, tmp_path):
    env = dict(os.environ, RAMEN_CONFSERVER=fresh_confserver.url, RAMEN_DIR=str(tmp_path),
               RAMEN_CONFSERVER_AUTH=str(fresh_confserver.auth_file))
    result = subprocess.run([sys.executable, "-m", "ramen.cli.main", "tail", "net/nope"], capture_output=True,
                            text=True, env=env, timeout=60)
    assert result.returncode == 1 and result.stderr.strip() == "ramen: tail: unknown function net/nope"

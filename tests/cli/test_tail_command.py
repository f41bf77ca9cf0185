"""`ramen tail -n`: the last tuples still in a function's live log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from ramen import paths
from ramen.program import load
from ramen.transport import ADMIN_ACTION, ExclusivePublication, LogBuffer, LogBufferParams
from ramen.tuples import encode_tuples

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "net.toml"


def test_tail_prints_the_last_tuples_of_the_live_log(fresh_confserver, tmp_path, monkeypatch):
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path / "ramen"))
    env = dict(os.environ, RAMEN_CONFSERVER=fresh_confserver.url, RAMEN_CONFSERVER_AUTH=str(fresh_confserver.auth_file),
               RAMEN_SITE="local")

    def ramen(*args):
        return subprocess.run([sys.executable, "-m", "ramen.cli.main", *map(str, args)], capture_output=True,
                              text=True, env=env, timeout=60)
    assert ramen("run", EXAMPLE).returncode == 0
    schema = load(EXAMPLE).function("traffic").schema
    path = paths.output_log("local", "net/traffic")
    path.parent.mkdir(parents=True)
    log = LogBuffer.create(path, LogBufferParams(term_length=64 * 1024))
    publication = ExclusivePublication(log)
    for start in range(0, 5000, 100):  # more than two terms: the oldest are gone, the last are there
        batch = pa.record_batch([pa.array(range(start, start + 100), pa.timestamp("us")),
                                 pa.array([f"h{i % 7}" for i in range(start, start + 100)]),
                                 pa.array(range(start, start + 100), pa.int64())], schema=schema)
        while (position := publication.offer(encode_tuples(batch, "ts"))) == ADMIN_ACTION:
            pass  # the term rotated: offer again
        assert position > 0
    result = ramen("tail", "-n", "3", "net/traffic")
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["bytes"] for line in result.stdout.splitlines()] == [4997, 4998, 4999]
    publication.close()
    log.close()


def test_tail_of_an_unknown_function_is_one_line(fresh_confserver, tmp_path):
    env = dict(os.environ, RAMEN_CONFSERVER=fresh_confserver.url, RAMEN_DIR=str(tmp_path),
               RAMEN_CONFSERVER_AUTH=str(fresh_confserver.auth_file))
    result = subprocess.run([sys.executable, "-m", "ramen.cli.main", "tail", "net/nope"], capture_output=True,
                            text=True, env=env, timeout=60)
    assert result.returncode == 1 and result.stderr.strip() == "ramen: tail: unknown function net/nope"

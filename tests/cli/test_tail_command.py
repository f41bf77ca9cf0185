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


RAMEN = [sys.executable, "-m", "ramen.cli.main"]


def _ran_example(confserver, tmp_path, monkeypatch) -> dict:
    """examples/net.toml run on a fresh confserver, with its top_talkers' live log yet to be made;
    the environment of a ramen command of that instance."""
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path / "ramen"))
    env = dict(os.environ, RAMEN_CONFSERVER=confserver.url, RAMEN_CONFSERVER_AUTH=str(confserver.auth_file),
               RAMEN_SITE="local")
    assert subprocess.run([*RAMEN, "run", EXAMPLE], env=env, capture_output=True).returncode == 0
    return env


def test_tail_n_of_a_function_without_archive_prints_the_next_tuples(fresh_confserver, tmp_path, monkeypatch):
    env = _ran_example(fresh_confserver, tmp_path, monkeypatch)
    schema = load(EXAMPLE).function("top_talkers").schema
    path = paths.output_log("local", "net/top_talkers")
    path.parent.mkdir(parents=True)
    log = LogBuffer.create(path, LogBufferParams(term_length=64 * 1024))
    counters = CountersFile.open(paths.counters_path())
    publication = ExclusivePublication(log, counters)
    tail = subprocess.Popen([*RAMEN, "tail", "-n", "3", "net/top_talkers"], env=env, stdout=subprocess.PIPE,
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


def test_tail_n_of_a_damaged_live_log_is_one_line(fresh_confserver, tmp_path, monkeypatch):
    env = _ran_example(fresh_confserver, tmp_path, monkeypatch)
    path = paths.output_log("local", "net/top_talkers")
    path.parent.mkdir(parents=True)
    path.write_bytes(bytes(3 * 64 * 1024 + 4096))  # a log's size, its metadata zeros

    result = subprocess.run([*RAMEN, "tail", "-n", "3", "net/top_talkers"], env=env, capture_output=True, text=True,
                            timeout=60)

    assert result.returncode == 1
    assert result.stderr.startswith(f"ramen: tail: {path}: term length 0 is outside")
    assert len(result.stderr.splitlines()) == 1


def test_a_follow_cuts_past_the_latest_row_written_before_it_joined(tmp_path, monkeypatch):
    """Rows before the cut come from the archives, the others live: the cut lies past everything
    written before the live log was joined (a windowed function: at the next window), or, in a
    log that held nothing, past the first live row."""
    from ramen.cli.tail import _LiveRows, _Tail
    from ramen.transport import BackoffIdleStrategy, Image
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path))
    program = load(EXAMPLE)
    minute = 60_000_000
    t0 = 1_795_168_800 * 1_000_000  # 2026-11-20T10:00Z

    def rows_at(function, start_us):
        schema = program.function(function).schema
        times = pa.array([start_us], pa.timestamp("us"))
        return encode_tuples(pa.record_batch([times, pa.array(["h"]), pa.array([1], pa.int64())], schema=schema),
                             program.function(function).event_time)

    for function, written_before, expected_cut in (("per_minute", t0 + 3 * minute, t0 + 4 * minute),
                                                    ("top_talkers", t0 + 3 * minute, t0 + 3 * minute + 1)):
        log = LogBuffer.create(tmp_path / f"{function}.logbuffer", LogBufferParams(term_length=64 * 1024))
        publication = ExclusivePublication(log)
        publication.offer(rows_at(function, t0 + minute))
        publication.offer(rows_at(function, written_before))
        tail = _Tail(None, {"net": program}, program.function(function), "local", [], [])
        image = Image(log, join_position=publication.position)
        assert tail._cut(log, _LiveRows(image, tail.function.schema), BackoffIdleStrategy()) == (expected_cut, [])
        image.close()

    class FirstRowWhenIdle:
        """The idle strategy of the wait for a first live row: the row is written while it waits."""
        def __init__(self, publication):
            self.publication = publication

        def idle(self, work):
            if not work:
                assert self.publication.offer(rows_at("per_minute", t0 + 7 * minute)) > 0

    empty = LogBuffer.create(tmp_path / "empty.logbuffer", LogBufferParams(term_length=64 * 1024))
    image = Image(empty, join_position=0)
    cut, pending = _Tail(None, {"net": program}, program.function("per_minute"), "local", [], [])._cut(
        empty, _LiveRows(image, program.function("per_minute").schema), FirstRowWhenIdle(ExclusivePublication(empty)))
    assert cut == t0 + 8 * minute and sum(b.num_rows for b in pending) == 1


def test_a_live_message_whose_end_is_not_committed_yet_comes_whole_at_the_next_read(tmp_path):
    """A batch larger than the MTU is several fragments: one read may find only the first ones."""
    from ramen.cli.tail import _LiveRows
    from ramen.transport import Image
    from ramen.transport.defaults import IPC_MTU_LENGTH
    schema = load(EXAMPLE).function("top_talkers").schema
    rows = 3000  # ~ 80 KB: fragmented at the 64 KiB MTU ramen's logs have
    batch = pa.record_batch([pa.array(range(rows), pa.timestamp("us")), pa.array([f"host{i}" for i in range(rows)]),
                             pa.array(range(rows), pa.int64())], schema=schema)
    log = LogBuffer.create(tmp_path / "live.logbuffer", LogBufferParams(term_length=1024 * 1024,
                                                                        mtu_length=IPC_MTU_LENGTH))
    ExclusivePublication(log).offer(encode_tuples(batch, "start"))
    first_length = int.from_bytes(log.terms[0][0:4], "little")
    last = (first_length + 31) & ~31  # the second fragment: as if its writer had not committed it yet
    committed = log.terms[0][last:last + 4].tobytes()
    log.terms[0][last:last + 4] = bytes(4)
    live = _LiveRows(Image(log, join_position=0), schema)
    assert live.read() == []
    log.terms[0][last:last + 4] = committed
    [whole] = live.read()
    assert whole.num_rows == rows

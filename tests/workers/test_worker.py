"""The worker process (python -m workers.worker), with a real confserver and real log buffers:
a generator source, a python function reading a parent's log, windows, a replay channel wired by
hand, SIGTERM and the one-line errors."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import confserver
from ramen import keyspace, paths
from ramen.message import KIND_END_OF_REPLAY, KIND_GAP, KIND_RESUMED, KIND_TUPLES, decode_header
from ramen.program import loads
from ramen.spark.session import SparkUnavailable
from examples.net import per_minute
from ramen.transport import counters as ctr
from ramen.transport import (CountersFile, ExclusivePublication, FragmentAssembler, Image, LogBuffer,
                             LogBufferError, LogBufferParams)
from ramen.tuples import decode_tuples, encode_tuples, end_of_replay
from tests.waiting import wait_for
from workers.sources import generate_rows, step_of
from ramen.clocks import SYSTEM_CLOCK, ManualClock
from workers.dispatch import heartbeating
from workers.stats import WorkerCounters

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0
SECOND_US = 1_000_000
MINUTE_US = 60 * SECOND_US
TRAFFIC = pa.schema([("ts", pa.timestamp("us")), ("host", pa.string()), ("bytes", pa.int64())])

PROGRAM = """
[program]
name = "{name}"

[[function]]
name = "traffic"
source = {{ kind = "generator", rate = 1000, hosts = 7, seed = 5 }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
archive = {{ retention = "1d" }}

[[function]]
name = "per_minute"
lazy = true
from = ["traffic"]
window = {{ every = "1 minute", lateness = "10s" }}
engine = "python"
call = "examples.net:per_minute"
event_time = "start"

[[function]]
name = "wrong"
from = ["traffic"]
engine = "python"
call = "tests.workers.test_worker:wrong_output"
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"

[[function]]
name = "gated"
from = ["traffic"]
window = {{ every = "1 minute" }}
engine = "python"
call = "tests.workers.test_worker:gated_per_minute"
event_time = "start"

[[function]]
name = "heavy"
from = ["traffic"]
engine = "spark"
sql = "SELECT * FROM traffic"
"""


def wrong_output(table: pa.Table) -> pa.Table:
    """A callable whose output does not have its function's schema."""
    return pa.table({"ts": table.column("ts"), "oops": pa.array([1] * table.num_rows)})


GATE = threading.Event()
"""gated_per_minute's calls wait for it (the tests that use it run their worker in this process)."""


def gated_per_minute(table: pa.Table) -> pa.Table:
    """per_minute, once GATE is open: a call that takes as long as the test wants."""
    if table.num_rows:  # not the call that learns the schema
        assert GATE.wait(WAIT_S), "the test never opened the gate"
    return per_minute(table)


def expected_per_minute(table: pa.Table) -> pa.Table:
    """per_minute computed straight with pyarrow, as the anchor."""
    start = pc.floor_temporal(table.column("ts"), unit="minute")
    grouped = pa.table({"start": start, "host": table.column("host"), "bytes": table.column("bytes")}) \
        .group_by(["start", "host"]).aggregate([("bytes", "sum")])
    return grouped.rename_columns({"bytes_sum": "bytes"}).select(["start", "host", "bytes"]) \
        .sort_by([("start", "ascending"), ("host", "ascending")])


class Rig:
    """A site of the test's own on the shared confserver, and the worker processes it started."""

    def __init__(self, server, tmp_path: Path, monkeypatch) -> None:
        self.server = server
        self.site = f"w{uuid.uuid4().hex[:8]}"
        self.program = f"p{uuid.uuid4().hex[:8]}"
        self.dir = tmp_path / "ramen"
        self.dir.mkdir()
        monkeypatch.setenv("RAMEN_DIR", str(self.dir))
        self.env = {**os.environ, "RAMEN_DIR": str(self.dir), "RAMEN_CONFSERVER": server.url,
                    "RAMEN_CONFSERVER_AUTH": str(server.auth_file), "PYTHONPATH": str(ROOT)}
        self.admin = confserver.connect(server.url, identity="admin", auth_file=server.auth_file)
        self.counters = CountersFile.open(paths.counters_path())
        self.processes: list[subprocess.Popen] = []
        self.closables: list = []
        text = PROGRAM.format(name=self.program)
        self.loaded = loads(text, "test.toml", path=str(ROOT / "tests" / "workers" / "test.toml"))

    def load(self, backfill: str | None = None) -> None:
        data = self.loaded.to_dict()
        if backfill:
            traffic = next(f for f in data["functions"] if f["name"] == "traffic")
            traffic["source"]["backfill"] = backfill
        self.admin.set(keyspace.program_key(self.program), data)

    def qualified(self, function: str) -> str:
        return f"{self.program}/{function}"

    def worker_key(self, function: str, **value) -> None:
        name = self.qualified(function)
        f = self.loaded.function(function)
        record = {"program": self.program, "function": function, "is_used": True, "live": True, "replays": [],
                  "lazy": f.lazy, "kind": f.kind, "archived": f.archived, "parents": list(f.parents),
                  "children": [], "signature": f.signature, "program_version": self.loaded.version, **value}
        self.admin.set(keyspace.worker_key(self.site, name), record)

    def start(self, function: str) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-m", "workers.worker", "--site", self.site,
                                    "--function", self.qualified(function)], cwd=ROOT, env=self.env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.processes.append(process)
        return process

    def stop(self, process: subprocess.Popen) -> int:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=WAIT_S)
        return process.returncode

    @staticmethod
    def error_of(process: subprocess.Popen) -> tuple[int, str]:
        """Exit status and the last line on stderr (above it: the worker's log)."""
        _, err = process.communicate(timeout=WAIT_S)
        return process.returncode, err.rstrip("\n").rpartition("\n")[2]

    def log_of(self, path: Path) -> LogBuffer:
        opened = []

        def try_open() -> bool:  # the file appears before its writer has written the metadata
            try:
                opened.append(LogBuffer.open(path))
            except LogBufferError:
                return False
            return True

        wait_for(try_open, f"{path} to appear")
        self.closables.append(opened[0])
        return opened[0]

    def reader(self, path: Path, schema: pa.Schema, join_position: int | None = None) -> Reader:
        """A tethered reader: the recorder's stand-in, which an archived output waits for."""
        buffer = self.log_of(path)
        image = Image(buffer, self.counters, join_position=join_position, tethered=True, name=f"test <- {path.name}")
        self.closables.insert(0, image)
        return Reader(image, schema)

    def publication(self, path: Path, term_offset: int = 0) -> ExclusivePublication:
        """A writer of a new log at `path` (the stream from `term_offset` of its first term on)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = LogBuffer.create(path, LogBufferParams(term_length=1 << 20, term_offset=term_offset))
        publication = ExclusivePublication(buffer, self.counters)
        self.closables[:0] = [publication, buffer]
        return publication

    def stats(self, function: str) -> dict | None:
        entry = self.admin.get_or_none(keyspace.function_key(self.site, self.qualified(function), "stats"))
        return None if entry is None else entry.value

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
        for item in self.closables:
            item.close()
        self.counters.close()
        self.admin.delete_tree(f"sites/{self.site}")
        self.admin.delete_tree(keyspace.program_key(self.program))
        self.admin.close()


class Reader:
    """Reads ramen messages from one log: batches and END_OF_REPLAYs, with their channels."""

    def __init__(self, image: Image, schema: pa.Schema) -> None:
        self.image = image
        self.schema = schema
        self.batches: list[pa.RecordBatch] = []
        self.channels: list[int] = []
        self.ends: list[tuple[int, int]] = []
        self.bounds: list[tuple[int, int]] = []
        self.resumed: list[tuple[int, int]] = []
        """(rows read before it, event time) of each RESUMED message."""
        self.gaps: list[tuple[int, int, int]] = []
        """(rows read before it, since, until) of each GAP message."""
        self.assembler = FragmentAssembler(self._on_message)

    def _on_message(self, buffer, offset, length, header) -> None:
        message = bytes(buffer[offset:offset + length])
        ramen = decode_header(message)
        if ramen.kind == KIND_TUPLES:
            self.batches.append(decode_tuples(message, self.schema))
            self.channels.append(ramen.channel)
            self.bounds.append((ramen.min_event_time_us, ramen.max_event_time_us))
        elif ramen.kind == KIND_END_OF_REPLAY:
            self.ends.append((ramen.channel, ramen.source))
        elif ramen.kind == KIND_RESUMED:
            assert ramen.min_event_time_us == ramen.max_event_time_us
            self.resumed.append((self.rows, ramen.min_event_time_us))
        elif ramen.kind == KIND_GAP:
            self.gaps.append((self.rows, ramen.min_event_time_us, ramen.max_event_time_us + 1))

    def poll(self) -> int:
        return self.image.poll(self.assembler.on_fragment, 1 << 20)

    @property
    def rows(self) -> int:
        return sum(b.num_rows for b in self.batches)

    def table(self) -> pa.Table:
        return pa.Table.from_batches(self.batches, schema=self.schema)

    def read_until(self, condition, what: str) -> None:
        wait_for(lambda: self.poll() >= 0 and condition(), what)


def offer(publication: ExclusivePublication, message: bytes) -> None:
    wait_for(lambda: publication.offer(message) > 0, "the worker to read its input")


def test_an_archived_output_waits_for_its_recorder_even_when_another_reader_came_first(rig):
    """A downstream worker may subscribe before the archiver does: the archived output still holds
    its first message until a tethered reader (the recorder) comes, which then, joining wherever
    the writer is, reads everything the downstream reader (joined at 0) reads, from the first row."""
    rig.load(backfill="5s")
    rig.worker_key("traffic")
    path = paths.output_log(rig.site, rig.qualified("traffic"))
    worker = rig.start("traffic")
    image = Image(rig.log_of(path), rig.counters, join_position=0, name="downstream")  # untethered, first
    rig.closables.insert(0, image)
    downstream = Reader(image, TRAFFIC)
    wait_for(lambda: rig.stats("traffic"), "the worker running, with a reader")
    recorder = rig.reader(path, TRAFFIC)  # tethered, joining at the writer's position
    recorder.read_until(lambda: recorder.rows >= 5000, "the back-filled rows")
    downstream.read_until(lambda: downstream.rows >= 5000, "the back-filled rows downstream")
    assert rig.stop(worker) == 0
    first = [r.table().column("ts").cast(pa.int64())[0].as_py() for r in (recorder, downstream)]
    assert first[0] == first[1]


def test_generator_source_backfills_rows_equal_to_a_recomputation_and_a_restart_continues(rig):
    rig.load(backfill="5s")
    rig.worker_key("traffic")  # archived: the worker waits for its reader, so nothing is dropped
    worker = rig.start("traffic")
    reader = rig.reader(paths.output_log(rig.site, rig.qualified("traffic")), TRAFFIC, join_position=0)
    reader.read_until(lambda: reader.rows >= 6000, "the backfill and a second of real time")
    assert rig.stop(worker) == 0

    restarted = rig.start("traffic")
    first_run_rows = reader.rows
    reader.read_until(lambda: reader.rows >= first_run_rows + 500, "rows of the restarted worker")
    assert rig.stop(restarted) == 0
    reader.poll()

    table = reader.table()
    times = table.column("ts").cast(pa.int64()).to_numpy()
    step = step_of(1000)
    gaps = times[1:] - times[:-1]
    assert (gaps == step).all(), f"one grid, no gap and no duplicate across the restart: {gaps[gaps != step][:5]} " \
                                 f"at {(gaps != step).nonzero()[0][:5]} of {len(times)}, {first_run_rows} before"
    recomputed = generate_rows(TRAFFIC, "ts", seed=5, hosts=7, step_us=step, first_index=int(times[0]) // step,
                               count=len(times))
    assert table.equals(pa.Table.from_batches([recomputed]))
    assert all(low == b.column("ts")[0].value and high == b.column("ts")[-1].value
               for (low, high), b in zip(reader.bounds, reader.batches))
    assert set(reader.channels) == {0}
    # The restarted run says first where it resumes: 1 µs past the first run's last row, so the
    # archive's coverage of the two runs touches (the next row is a grid step later).
    assert reader.resumed == [(first_run_rows, int(times[first_run_rows - 1]) + 1)]
    wait_for(lambda: (rig.stats("traffic") or {}).get("tuples_out", 0) > 0, "the stats key")


def test_windowed_python_function_commits_on_the_watermark_and_counts_late_rows(rig):
    rig.load()
    rig.worker_key("per_minute")
    worker = rig.start("per_minute")
    parent = rig.publication(paths.output_log(rig.site, rig.qualified("traffic")))
    output = rig.reader(paths.output_log(rig.site, rig.qualified("per_minute")), rig.loaded.function(
        "per_minute").schema, join_position=0)
    base = 1_000 * MINUTE_US  # aligned to the minute
    rows = generate_rows(TRAFFIC, "ts", seed=9, hosts=4, step_us=10 * SECOND_US, first_index=base // (10 * SECOND_US),
                         count=18)  # minutes 0, 1 and 2, a row every 10 s
    for start in range(0, 18, 5):
        offer(parent, encode_tuples(rows.slice(start, 5), "ts"))
    # The watermark is 2:50 − 10 s: minutes 0 and 1 commit, minute 2 stays open.
    output.read_until(lambda: output.rows == len(expected_per_minute(pa.Table.from_batches([rows.slice(0, 12)]))),
                      "minutes 0 and 1")
    late = generate_rows(TRAFFIC, "ts", seed=9, hosts=4, step_us=10 * SECOND_US,
                         first_index=base // (10 * SECOND_US), count=3)
    offer(parent, encode_tuples(late, "ts"))
    wait_for(lambda: (rig.stats("per_minute") or {}).get("late") == 3, "the late rows counted")
    assert rig.stop(worker) == 0
    output.poll()
    assert output.table().equals(expected_per_minute(pa.Table.from_batches([rows.slice(0, 12)])))
    assert output.bounds[0] == (base, base) and output.bounds[-1] == (base + MINUTE_US, base + MINUTE_US)


def test_a_windowed_worker_joining_inputs_that_held_rows_says_where_its_whole_windows_begin(rig):
    """Restarted (or loaded) while its parent ran, it joins the parent's log at its tail: the window
    it joins in missed the rows written before. Its first live message, a RESUMED at the next
    window, makes its archive cover from there; the partial window was archived as if whole (a
    window of 7,892 of 30,030 rows, replayed with exit 0 even with --strict)."""
    rig.load()
    rig.worker_key("per_minute")
    traffic_log = paths.output_log(rig.site, rig.qualified("traffic"))
    parent = rig.publication(traffic_log)
    rig.reader(traffic_log, TRAFFIC)  # another reader of the parent's, there before the worker
    base = 1_000 * MINUTE_US
    rows = generate_rows(TRAFFIC, "ts", seed=9, hosts=4, step_us=10 * SECOND_US, first_index=base // (10 * SECOND_US),
                         count=18)
    offer(parent, encode_tuples(rows.slice(0, 3), "ts"))  # 0:00-0:20 of minute 0, before the worker reads
    worker = rig.start("per_minute")
    output = rig.reader(paths.output_log(rig.site, rig.qualified("per_minute")), rig.loaded.function(
        "per_minute").schema, join_position=0)
    wait_for(lambda: any(c.type_name == "sub-pos" and f"{rig.qualified('per_minute')} <- " in c.label
                         for c in rig.counters.counters()), "the worker reading its parent's log")
    for start in range(3, 18, 5):
        offer(parent, encode_tuples(rows.slice(start, 5), "ts"))
    output.read_until(lambda: output.rows == len(expected_per_minute(pa.Table.from_batches([rows.slice(3, 9)]))),
                      "minutes 0 (without its first rows) and 1")
    assert rig.stop(worker) == 0
    # First, before any row: minute 0 may miss rows (its lateness reaches no further back).
    assert output.gaps == [(0, base, base + MINUTE_US)]
    assert output.table().equals(expected_per_minute(pa.Table.from_batches([rows.slice(3, 9)])))


def test_a_windowed_worker_killed_mid_window_resumes_where_the_window_begins_and_writes_it_whole(rig):
    """Killed with -9 while minute 2 was open, it wrote minutes 0 and 1: restarted, it joins its
    parent's log where the rows of minute 2 (less its lateness) begin, since the log still holds
    them, rather than at its tail, and writes minute 2 whole, once, with no gap: the rows of minute
    1 it reads again are dropped without counting as late. (Once, it joined at the tail, and the
    minute was archived with a quarter of its rows.)"""
    rig.load()
    rig.worker_key("per_minute")
    traffic_log = paths.output_log(rig.site, rig.qualified("traffic"))
    parent = rig.publication(traffic_log)
    rig.reader(traffic_log, TRAFFIC)  # another reader of the parent's, so that it writes on while the worker is down
    base = 1_000 * MINUTE_US
    rows = generate_rows(TRAFFIC, "ts", seed=9, hosts=4, step_us=10 * SECOND_US, first_index=base // (10 * SECOND_US),
                         count=30)  # minutes 0 to 4, a row every 10 s
    worker = rig.start("per_minute")
    output = rig.reader(paths.output_log(rig.site, rig.qualified("per_minute")), rig.loaded.function(
        "per_minute").schema, join_position=0)
    wait_for(lambda: any(c.type_name == "sub-pos" and f"{rig.qualified('per_minute')} <- " in c.label
                         for c in rig.counters.counters()), "the worker reading its parent's log")
    for start in range(0, 15, 5):  # up to 2:20: minutes 0 and 1 commit, minute 2 is open
        offer(parent, encode_tuples(rows.slice(start, 5), "ts"))
    output.read_until(lambda: output.rows == len(expected_per_minute(pa.Table.from_batches([rows.slice(0, 12)]))),
                      "minutes 0 and 1")
    worker.kill()
    worker.wait()
    offer(parent, encode_tuples(rows.slice(15, 5), "ts"))  # the rest of minute 2, while the worker is down
    restarted = rig.start("per_minute")
    for start in range(20, 30, 5):
        offer(parent, encode_tuples(rows.slice(start, 5), "ts"))
    whole = expected_per_minute(pa.Table.from_batches([rows.slice(0, 24)]))  # minutes 0 to 3
    output.read_until(lambda: output.rows == len(whole), "minutes 2 and 3 from the restarted worker")
    stats = wait_for(lambda: (s := rig.stats("per_minute")) and s.get("tuples_in", 0) > 0 and s, "its stats")
    assert rig.stop(restarted) == 0
    output.poll()
    assert output.gaps == []
    assert output.table().equals(whole)
    assert stats["late"] == 0


def test_a_worker_its_writer_dropped_for_stalling_reads_on_from_where_it_was(rig):
    """The writer drops a reader silent past the subscriber liveness timeout (a worker whose duty
    cycle a confserver call blocked through a reconnection: seen in the chaos soak). The worker's
    image closed, and it read nothing more, for good: its function stopped without a word. It reads
    on from where it was, while the log still holds it, and its windows are whole."""
    rig.load()
    rig.worker_key("per_minute")
    traffic_log = paths.output_log(rig.site, rig.qualified("traffic"))
    parent = rig.publication(traffic_log)
    base = 1_000 * MINUTE_US
    rows = generate_rows(TRAFFIC, "ts", seed=9, hosts=4, step_us=10 * SECOND_US, first_index=base // (10 * SECOND_US),
                         count=30)
    worker = rig.start("per_minute")
    output = rig.reader(paths.output_log(rig.site, rig.qualified("per_minute")), rig.loaded.function(
        "per_minute").schema, join_position=0)

    def reader_counter() -> int | None:
        return next((c.id for c in rig.counters.counters() if c.type_name == "sub-pos"
                     and f"{rig.qualified('per_minute')} <- " in c.label), None)
    wait_for(reader_counter, "the worker reading its parent's log")
    for start in range(0, 15, 5):
        offer(parent, encode_tuples(rows.slice(start, 5), "ts"))
    output.read_until(lambda: output.rows == len(expected_per_minute(pa.Table.from_batches([rows.slice(0, 12)]))),
                      "minutes 0 and 1")
    rig.counters.put(reader_counter(), ctr.STATUS_OFFSET, ctr.COUNTER_DROPPED)  # as the writer drops it
    for start in range(15, 30, 5):
        offer(parent, encode_tuples(rows.slice(start, 5), "ts"))
    whole = expected_per_minute(pa.Table.from_batches([rows.slice(0, 24)]))  # minutes 0 to 3
    output.read_until(lambda: output.rows == len(whole), "minutes 2 and 3 after the drop")
    assert rig.stop(worker) == 0
    output.poll()
    assert output.table().equals(whole)


def test_a_live_input_that_goes_on_past_where_the_worker_was_makes_a_gap_over_the_windows_it_may_miss(rig):
    """A remote parent's stream, rebuilt by netd in a new log after its sender skipped what its
    writer overtook (netd away past the writer's tether hold): the new log goes on at a later
    position of the same stream, and what lay between never comes. The worker read on without a
    word, its windows archived as if whole. It writes a GAP from the window of the last row it read
    (less the lateness) to the window the rows that came again begin in, and counts it."""
    rig.load()
    rig.worker_key("per_minute")
    traffic_log = paths.output_log(rig.site, rig.qualified("traffic"))
    parent = rig.publication(traffic_log)
    base = 1_000 * MINUTE_US
    rows = generate_rows(TRAFFIC, "ts", seed=9, hosts=4, step_us=10 * SECOND_US, first_index=base // (10 * SECOND_US),
                         count=36)  # minutes 0 to 5, a row every 10 s
    worker = rig.start("per_minute")
    output = rig.reader(paths.output_log(rig.site, rig.qualified("per_minute")), rig.loaded.function(
        "per_minute").schema, join_position=0)
    wait_for(lambda: any(c.type_name == "sub-pos" and f"{rig.qualified('per_minute')} <- " in c.label
                         for c in rig.counters.counters()), "the worker reading its parent's log")
    for start in range(0, 12, 4):  # minutes 0 and 1, up to 1:50
        offer(parent, encode_tuples(rows.slice(start, 4), "ts"))
    output.read_until(lambda: output.rows == len(expected_per_minute(pa.Table.from_batches([rows.slice(0, 6)]))),
                      "minute 0")
    went_on_at = parent.position + 64 * 1024  # what minutes 2 and 3 held never comes
    traffic_log.unlink()
    parent = rig.publication(traffic_log, term_offset=went_on_at)
    for start in range(24, 36, 4):  # minutes 4 and 5
        offer(parent, encode_tuples(rows.slice(start, 4), "ts"))
    minutes = expected_per_minute(pa.Table.from_batches([rows.slice(0, 12), rows.slice(24, 6)]))  # 0, 1, 4
    output.read_until(lambda: output.rows == len(minutes), "minutes 1 and 4")
    gaps_counted = worker_counter(rig, "per_minute", "gaps")
    assert rig.stop(worker) == 0
    output.poll()
    assert output.table().equals(minutes)
    # From minute 1 (its last row read at 1:50, 10 s late at most) to minute 4, where rows came again.
    assert [gap[1:] for gap in output.gaps] == [(base + MINUTE_US, base + 5 * MINUTE_US)]
    assert gaps_counted == 1


def test_a_worker_its_writer_dropped_and_overtook_makes_a_gap_over_the_windows_it_may_miss(rig):
    """Stopped (as a duty cycle a confserver call blocks) past the subscriber liveness timeout, the
    worker is dropped by its writer, which writes on for its other reader until the log no longer
    holds where the worker was: it reads on from the tail, and its output says which windows may
    miss what it never read (once, nothing did: a window of a quarter of its rows, archived as whole)."""
    rig.load()
    rig.worker_key("per_minute")
    traffic_log = paths.output_log(rig.site, rig.qualified("traffic"))
    parent = rig.publication(traffic_log)
    other = rig.reader(traffic_log, TRAFFIC)  # the reader the writer writes on for
    base = 1_000 * MINUTE_US
    rows = generate_rows(TRAFFIC, "ts", seed=9, hosts=4, step_us=10 * SECOND_US, first_index=base // (10 * SECOND_US),
                         count=36)  # minutes 0 to 5, a row every 10 s
    worker = rig.start("per_minute")
    output = rig.reader(paths.output_log(rig.site, rig.qualified("per_minute")), rig.loaded.function(
        "per_minute").schema, join_position=0)

    def reader_counter() -> int | None:
        return next((c.id for c in rig.counters.counters() if c.type_name == "sub-pos" and c.status != ctr.COUNTER_DROPPED
                     and f"{rig.qualified('per_minute')} <- " in c.label), None)

    def write(batch: pa.RecordBatch) -> None:
        message = encode_tuples(batch, "ts")
        wait_for(lambda: other.poll() >= 0 and parent.offer(message) > 0, "the parent's log to take a message")

    wait_for(reader_counter, "the worker reading its parent's log")
    for start in range(0, 12, 4):  # minutes 0 and 1, up to 1:50
        write(rows.slice(start, 4))
    output.read_until(lambda: output.rows == len(expected_per_minute(pa.Table.from_batches([rows.slice(0, 6)]))),
                      "minute 0")
    worker.send_signal(signal.SIGSTOP)
    rig.counters.put(reader_counter(), ctr.STATUS_OFFSET, ctr.COUNTER_DROPPED)  # as the writer drops it
    overtaken = generate_rows(TRAFFIC, "ts", seed=3, hosts=4, step_us=2_000, first_index=(base + 2 * MINUTE_US) // 2_000,
                              count=60_000)  # minutes 2 and 3: over a term past where the worker was
    for start in range(0, 60_000, 3_000):
        write(overtaken.slice(start, 3_000))
    assert parent.position > (1 << 20) + 4096
    worker.send_signal(signal.SIGCONT)
    wait_for(reader_counter, "the worker reading its parent's log again")
    for start in range(24, 36, 4):  # minutes 4 and 5
        write(rows.slice(start, 4))
    minutes = expected_per_minute(pa.Table.from_batches([rows.slice(0, 12), rows.slice(24, 6)]))  # 0, 1, 4
    output.read_until(lambda: output.rows == len(minutes), "minutes 1 and 4")
    assert rig.stop(worker) == 0
    output.poll()
    assert output.table().equals(minutes)
    assert [gap[1:] for gap in output.gaps] == [(base + MINUTE_US, base + 5 * MINUTE_US)]


def worker_counter(rig, function: str, name: str) -> int:
    label = f"worker {rig.qualified(function)} {name}"
    return next(c.value for c in rig.counters.counters() if c.label == label)


def test_replay_channel_ends_in_the_recipient_after_every_end_of_replay_and_leaves_live_alone(rig):
    rig.load()
    channel = 9_000 + int(uuid.uuid4().int % 1000)
    replayer_log = paths.replayer_log(rig.site, 77)
    recipient_path = paths.recipient_log(channel)
    recipient_path.parent.mkdir(parents=True, exist_ok=True)
    LogBuffer.create(recipient_path, LogBufferParams(term_length=1 << 20)).close()
    schema = rig.loaded.function("per_minute").schema
    recipient = rig.reader(recipient_path, schema)
    rig.admin.set(keyspace.replay_key(channel), {"target": rig.qualified("per_minute")})
    rig.admin.set(keyspace.worker_replay_key(rig.site, rig.qualified("per_minute"), channel), {
        "channel": channel, "since_us": 0, "until_us": 1, "inputs": [str(replayer_log)],
        "parents": [rig.qualified("traffic")], "pass_through": False, "expect_eor": 2, "recipient": str(recipient_path)})
    rig.worker_key("per_minute", replays=[channel])
    worker = rig.start("per_minute")
    live = rig.reader(paths.output_log(rig.site, rig.qualified("per_minute")), schema, join_position=0)
    replayer = rig.publication(replayer_log)

    rows = generate_rows(TRAFFIC, "ts", seed=2, hosts=5, step_us=SECOND_US, first_index=500 * 60, count=150)
    for start in range(0, 150, 40):
        offer(replayer, encode_tuples(rows.slice(start, 40), "ts", channel=channel, source=77))
        # A merged replayer's log also carries the replays of its other readers: skipped here.
        offer(replayer, encode_tuples(rows.slice(start, 40), "ts", channel=channel + 1, source=77))
    offer(replayer, end_of_replay(channel + 1, 77))
    offer(replayer, end_of_replay(channel, 77))
    wait_for(lambda: (rig.stats("per_minute") or {}).get("channels", {}).get(str(channel), {})
             .get("eor_received") == 1, "the first END_OF_REPLAY")
    recipient.poll()
    assert recipient.ends == []  # one of two: windows still open, nothing ended
    offer(replayer, end_of_replay(channel, 78))

    recipient.read_until(lambda: recipient.ends, "the target's END_OF_REPLAY")
    assert recipient.table().equals(expected_per_minute(pa.Table.from_batches([rows])))  # all 3 minutes, flushed
    assert set(recipient.channels) == {channel} and len(recipient.ends) == 1 and recipient.ends[0][0] == channel
    wait_for(lambda: rig.admin.get_or_none(keyspace.replay_key(channel)) is None, "the target to delete the replay")
    stats = wait_for(lambda: (s := rig.stats("per_minute")) and s.get("skipped") == 4 and s, "the skipped messages")
    assert stats["unexpected"] == 0
    assert rig.stop(worker) == 0
    live.poll()
    assert live.batches == [] and live.ends == []


def test_bad_worker_key_or_program_is_one_line_and_exit_1(rig):
    assert rig.error_of(rig.start("traffic")) == (  # no worker key
        1, f"ramen: worker {rig.qualified('traffic')}: no worker key "
           f"{keyspace.worker_key(rig.site, rig.qualified('traffic'))}")
    rig.worker_key("traffic")
    assert rig.error_of(rig.start("traffic")) == (  # no program
        1, f"ramen: worker {rig.qualified('traffic')}: program {rig.program} is not loaded "
           f"(no key {keyspace.program_key(rig.program)})")


def test_a_callable_returning_the_wrong_schema_stops_the_worker_with_one_line(rig):
    rig.load()
    rig.worker_key("wrong")
    worker = rig.start("wrong")
    parent = rig.publication(paths.output_log(rig.site, rig.qualified("traffic")))
    rows = generate_rows(TRAFFIC, "ts", seed=1, hosts=2, step_us=SECOND_US, first_index=0, count=10)
    wait_for(lambda: parent.offer(encode_tuples(rows, "ts")) > 0 or worker.poll() is not None, "the worker to read")
    status, err = rig.error_of(worker)
    assert status == 1
    assert err.startswith(f"ramen: worker {rig.qualified('wrong')}: {rig.qualified('wrong')}: call "
                          "'tests.workers.test_worker:wrong_output' returned (ts: timestamp[us], oops: int64)")


def test_a_plan_source_passes_replayed_tuples_through_to_its_replay_log_and_forwards_the_end(rig):
    rig.load()
    channel = 8_000 + int(uuid.uuid4().int % 1000)
    replayer_log = paths.replayer_log(rig.site, 5)
    rig.admin.set(keyspace.worker_replay_key(rig.site, rig.qualified("traffic"), channel), {
        "channel": channel, "since_us": 0, "until_us": 1, "inputs": [str(replayer_log)], "pass_through": True,
        "expect_eor": 1, "recipient": None})
    rig.worker_key("traffic", live=False, replays=[channel])  # running for the replay only: no generation
    worker = rig.start("traffic")
    replayer = rig.publication(replayer_log)
    rows = generate_rows(TRAFFIC, "ts", seed=3, hosts=3, step_us=SECOND_US, first_index=0, count=100)
    offer(replayer, encode_tuples(rows, "ts", channel=channel, source=5))
    replay_out = rig.reader(paths.replay_output_log(rig.site, rig.qualified("traffic")), TRAFFIC)
    offer(replayer, end_of_replay(channel, 5))
    replay_out.read_until(lambda: replay_out.ends, "the forwarded END_OF_REPLAY")
    assert replay_out.table().equals(pa.Table.from_batches([rows])) and set(replay_out.channels) == {channel}
    assert replay_out.ends[0][0] == channel and replay_out.ends[0][1] != 5  # forwarded under the worker's id
    assert rig.stop(worker) == 0
    live = rig.reader(paths.output_log(rig.site, rig.qualified("traffic")), TRAFFIC, join_position=0)
    live.poll()
    assert live.batches == []


def test_a_long_job_keeps_heartbeating_and_its_error_reaches_the_caller():
    """A Spark job can outlast the writers' liveness timeout: the inputs must hear from us meanwhile."""
    beats = []
    release = threading.Event()

    def job() -> pa.Table:
        wait_for(lambda: len(beats) >= 3, "heartbeats during the job")
        release.set()
        return pa.table({"n": [1]})

    table = heartbeating(job, lambda: beats.append(1), interval_s=0.01)
    assert release.is_set() and table.column("n").to_pylist() == [1]

    def failing() -> pa.Table:
        raise SparkUnavailable("Spark unavailable: connection refused")
    with pytest.raises(SparkUnavailable, match="connection refused"):
        heartbeating(failing, lambda: None, interval_s=0.01)


def test_a_torn_down_replay_leaves_no_pending_message_in_a_shared_output(rig, tmp_path):
    """A worker feeding replays downstream shares one replay output among their channels: when a
    replay is torn down (its target died), its held-back messages go, or, counted as pending,
    they would stop the worker reading for every later replay."""
    from ramen.tuples import encode_tuples
    from workers.outputs import Output
    output = Output.open(tmp_path / "shared.logbuffer", rig.counters, create=True)
    batch = pa.RecordBatch.from_pydict({"ts": pa.array([1], pa.timestamp("us")), "v": [1]})
    for channel in (5, 6, 5, 6):
        output.send(encode_tuples(batch, "ts", channel=channel), rows=1)
    output.discard(5)
    assert [decode_header(m).channel for m, _, _ in output.pending] == [6, 6]
    output.close()


def test_a_replay_input_not_there_yet_is_looked_for_every_millisecond_a_live_one_less_often(rig):
    """A replayer creates its log a moment after the worker's replay key names it: the worker looks
    again within REPLAY_LOG_WAIT_INTERVAL_S, where a live parent that does not run yet (and may not
    for a long while) is looked for every LOG_WAIT_INTERVAL_S. At the live interval, half of
    bench/replay.py's replays waited 50 ms for a log that was there."""
    from workers.defaults import LOG_WAIT_INTERVAL_S, REPLAY_LOG_WAIT_INTERVAL_S
    from workers.worker import Worker
    rig.load()
    rig.worker_key("per_minute")  # live: it waits for its parent's output log, which nobody writes
    from ramen.replay.contract import WorkerReplay
    worker = Worker(rig.admin, rig.site, rig.qualified("per_minute"), rig.counters).open()
    try:
        assert worker.inputs.open_waiting() == LOG_WAIT_INTERVAL_S
        replayer_log = paths.replayer_log(rig.site, 78)
        worker.channels.start(5, WorkerReplay.from_value({
            "channel": 5, "since_us": 0, "until_us": 1, "inputs": [str(replayer_log)],
            "parents": [rig.qualified("traffic")], "expect_eor": 1}, "test"))
        assert worker.inputs.next_look_s == 0.0  # looked for in the same duty cycle as the key
        assert worker.inputs.open_waiting() == REPLAY_LOG_WAIT_INTERVAL_S
        rig.publication(replayer_log)
        assert worker.inputs.open_waiting() == LOG_WAIT_INTERVAL_S  # the live parent's still missing
        assert worker.inputs.found[replayer_log].image is not None
    finally:
        worker.close(flush_timeout_s=0)


def test_a_source_resumes_after_what_is_in_its_log_not_after_what_it_only_queued(rig):
    """An archived source holds its rows until its recorder reads the log: rows only queued do not
    count as written (killed then, it would resume after them, and its archive would miss them
    while its RESUMED message said nothing was missing)."""
    rig.load(backfill="5s")
    rig.worker_key("traffic")
    worker = rig.start("traffic")
    stats = wait_for(lambda: (s := rig.stats("traffic")) and s.get("tuples_out", 0) > 0 and s,
                     "rows generated and queued")
    assert stats.get("live_event_time_us") is None  # no recorder yet: nothing is in the log
    reader = rig.reader(paths.output_log(rig.site, rig.qualified("traffic")), TRAFFIC, join_position=0)
    reader.read_until(lambda: reader.rows >= 5000, "the back-fill, once a recorder reads")
    assert rig.stop(worker) == 0
    reader.poll()
    last_written = reader.table().column("ts").cast(pa.int64())[-1].as_py()
    assert rig.stats("traffic")["live_event_time_us"] == last_written


def test_a_killed_source_resumes_right_after_the_last_row_in_its_log_whatever_its_stats_say(rig):
    """Killed with -9 once its reader has read everything (so readers' cleaning has passed its last
    rows) and with stats a second behind: the restart goes on right after the last row in the log,
    and the stream has every row of the grid once."""
    rig.load(backfill="5s")
    rig.worker_key("traffic")
    worker = rig.start("traffic")
    reader = rig.reader(paths.output_log(rig.site, rig.qualified("traffic")), TRAFFIC, join_position=0)
    reader.read_until(lambda: reader.rows >= 6000, "the backfill and a second of real time")
    worker.kill()
    worker.communicate(timeout=WAIT_S)
    reader.poll()
    first_run_rows = reader.rows
    last_written = reader.table().column("ts").cast(pa.int64())[-1].as_py()
    rig.admin.set(keyspace.function_key(rig.site, rig.qualified("traffic"), "stats"),
                  {"live_event_time_us": last_written - SECOND_US})  # as stale as stats may be

    restarted = rig.start("traffic")
    reader.read_until(lambda: reader.rows >= first_run_rows + 500, "rows of the restarted worker")
    assert rig.stop(restarted) == 0
    reader.poll()

    times = reader.table().column("ts").cast(pa.int64()).to_numpy()
    gaps = times[1:] - times[:-1]
    assert (gaps == step_of(1000)).all(), f"no duplicate and no gap: {gaps[gaps != step_of(1000)][:5]}"
    assert reader.resumed == [(first_run_rows, last_written + 1)]


class GatedWorker:
    """An in-process worker of `gated`, fed a minute per message, whose duty cycle the test drives
    (on a clock that moves only when told): what the worker did not do in a cycle, it did not do."""

    def __init__(self, rig, clock=None) -> None:
        from workers.worker import Worker
        GATE.clear()
        rig.load()
        rig.worker_key("gated")
        self.parent = rig.publication(paths.output_log(rig.site, rig.qualified("traffic")))
        self.worker = Worker(rig.admin, rig.site, rig.qualified("gated"), rig.counters,
                             clock=clock or ManualClock()).open()
        self.output = rig.reader(paths.output_log(rig.site, rig.qualified("gated")),
                                 rig.loaded.function("gated").schema, join_position=0)
        self.rows = generate_rows(TRAFFIC, "ts", seed=4, hosts=3, step_us=10 * SECOND_US,
                                  first_index=2_000 * MINUTE_US // (10 * SECOND_US), count=60)  # 6 a minute

    def until(self, condition, what: str) -> None:
        """Duty cycles until `condition`."""
        wait_for(lambda: self.worker.do_work() >= 0 and condition(), what)

    def minutes(self, first: int, end: int) -> pa.Table:
        return pa.Table.from_batches([self.rows.slice(6 * first, 6 * (end - first))])

    def offer_minute(self, minute: int) -> None:
        message = encode_tuples(self.rows.slice(6 * minute, 6), "ts")
        self.until(lambda: self.parent.offer(message) > 0, "the worker to read its input")

    def read_all(self) -> bool:
        return self.worker.inputs.subscription.images[0].position == self.parent.position

    def in_flight(self) -> int:
        return self.worker.dispatch.in_flight

    def close(self) -> None:
        GATE.set()
        self.worker.close(flush_timeout_s=0)


def test_a_slow_call_lets_the_worker_read_on_until_max_calls_wait_and_results_keep_their_order(rig):
    """A window's call runs off the duty cycle: the worker reads its inputs meanwhile (a replay's
    writer is not held up by each window's group-by), up to MAX_CALLS_IN_FLIGHT calls; then it
    stops reading until one returns. Results come out in window order."""
    from workers.defaults import MAX_CALLS_IN_FLIGHT
    gated = GatedWorker(rig)
    try:
        for minute in range(MAX_CALLS_IN_FLIGHT + 1):  # minute m's rows commit minute m - 1
            gated.offer_minute(minute)
            # The image's position moves before the poll's windows are submitted: wait for both.
            gated.until(lambda: gated.read_all() and gated.in_flight() == minute,
                        f"minute {minute} read while {minute} calls wait")
        assert gated.worker.dispatch.full
        gated.offer_minute(MAX_CALLS_IN_FLIGHT + 1)
        for _ in range(10):  # each cycle would read it, were the worker still reading
            gated.worker.do_work()
        assert not gated.read_all() and gated.in_flight() == MAX_CALLS_IN_FLIGHT
        gated.output.poll()
        assert gated.output.rows == 0
        GATE.set()
        gated.until(gated.read_all, "the last minute read once calls returned")
        expected = expected_per_minute(gated.minutes(0, MAX_CALLS_IN_FLIGHT + 1))
        gated.until(lambda: gated.output.poll() >= 0 and gated.output.rows == expected.num_rows,
                    "every committed minute")
        assert gated.output.table().equals(expected)
    finally:
        gated.close()


def test_a_stopped_worker_writes_the_windows_whose_calls_were_running(rig):
    gated = GatedWorker(rig, clock=SYSTEM_CLOCK)  # close() waits for the writes on it
    try:
        for minute in range(3):
            gated.offer_minute(minute)
        gated.until(lambda: gated.in_flight() == 2, "minutes 0 and 1 computing")
        threading.Timer(0.1, GATE.set).start()
        gated.worker.close(flush_timeout_s=WAIT_S)  # waits for the calls, writes their results
        expected = expected_per_minute(gated.minutes(0, 2))
        gated.output.read_until(lambda: gated.output.rows == expected.num_rows, "minutes 0 and 1")
        assert gated.output.table().equals(expected)
    finally:
        GATE.set()


def test_a_stopped_worker_closes_its_dispatch_once_the_windows_it_computed_are_written(rig):
    """A heavy dispatch's close releases its Spark session: a call to a server that may be slow."""
    gated = GatedWorker(rig, clock=SYSTEM_CLOCK)
    written_at_close = []
    dispatch_close = gated.worker.dispatch.close

    def close() -> None:
        gated.output.poll()
        written_at_close.append(gated.output.rows)
        dispatch_close()
    gated.worker.dispatch.close = close
    try:
        for minute in range(3):
            gated.offer_minute(minute)
        gated.until(lambda: gated.in_flight() == 2, "minutes 0 and 1 computing")
        GATE.set()
        gated.worker.close(flush_timeout_s=WAIT_S)
        assert written_at_close == [expected_per_minute(gated.minutes(0, 2)).num_rows]
    finally:
        GATE.set()


def test_a_source_down_longer_than_its_backfill_resumes_backfill_ago_and_says_so(rig):
    """Its last row is an hour old and its backfill 5 s: it makes the last 5 s, not the hour, and
    its RESUMED message says where it starts (the archive's coverage then shows the hour's gap)."""
    import time
    rig.load(backfill="5s")
    rig.worker_key("traffic")
    hour_ago_us = time.time_ns() // 1000 - 3600 * SECOND_US
    rig.admin.set(keyspace.function_key(rig.site, rig.qualified("traffic"), "stats"), dataclasses.replace(
        WorkerCounters(rig.qualified("traffic")).record(0, 0), live_event_time_us=hour_ago_us).to_value())
    before_us = time.time_ns() // 1000
    worker = rig.start("traffic")
    reader = rig.reader(paths.output_log(rig.site, rig.qualified("traffic")), TRAFFIC, join_position=0)
    reader.read_until(lambda: reader.rows >= 1000, "rows of the resumed source")
    after_us = time.time_ns() // 1000
    assert rig.stop(worker) == 0
    assert len(reader.resumed) == 1 and reader.resumed[0][0] == 0
    resumed_us = reader.resumed[0][1]
    assert before_us - 5 * SECOND_US <= resumed_us <= after_us - 5 * SECOND_US
    first_us = reader.table().column("ts").cast(pa.int64())[0].as_py()
    assert resumed_us <= first_us < resumed_us + step_of(1000)


def test_constructing_a_worker_does_no_io(tmp_path, monkeypatch):
    """Opening logs, reading keys, watching and counting wait for open(): a Worker is built from
    nothing but its names (a client and counters that fail at any use)."""
    from workers.worker import Worker

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"construction used .{name}")
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path))
    worker = Worker(Untouchable(), "site", "prog/func", Untouchable(), clock=ManualClock())
    assert worker.function is None and worker.channels is None
    assert list(tmp_path.iterdir()) == []

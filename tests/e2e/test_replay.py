"""`ramen replay` end to end: `ramen start` (confserver, choreographer, supervisor, archiver, workers,
replayers, all real processes) over a generator that back-fills ten minutes, then replays checked
against the same computation done here with pyarrow over the raw tuples.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import confserver
from ramen import keyspace, paths, supervisor_stats
from ramen.archive.coverage import archive_coverage
from ramen.program import Program
from ramen.replay.client import Replay, ReplayFailed
from ramen.replay.contract import WorkerReplay
from tests.processes import processes_with
from tests.waiting import quiet_supervisor_stats, wait_for

RATE = 1000
BACKFILL_MIN = 10
PROGRAM = f"""
[program]
name = "e2e"

[[function]]
name = "traffic"
source = {{ kind = "generator", rate = {RATE}, hosts = 20, seed = 7, backfill = "{BACKFILL_MIN}m" }}
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
name = "top_talkers"
lazy = true
from = ["per_minute"]
engine = "python"
call = "examples.net:top_talkers"
event_time = "start"
"""
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STARTUP_S = 60.0
EVENTUALLY_S = 30.0
MINUTE_US = 60_000_000


class Stack:
    """`ramen start` in a directory of its own, and what tests need to talk to it."""

    def __init__(self, base: Path):
        self.base = base
        self.env = dict(os.environ, RAMEN_DIR=str(base), RAMEN_SITE="local", PYTHONPATH=str(EXAMPLES.parent))
        self.env.pop("RAMEN_CONFSERVER", None)
        self.env.pop("RAMEN_CONFSERVER_AUTH", None)

    def ramen(self, *args, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ramen.cli.main", *map(str, args)], capture_output=True,
                              text=True, env=self.env, timeout=timeout)

    def start(self, name: str, program: str, source: str, *options: str) -> Stack:
        """`ramen start --daemon [options]` with `program` (a program file's text) loaded, once the
        archive holds the back-filled range of `source`."""
        path = self.base / f"{name}.toml"
        path.write_text(program)
        started = self.ramen("start", "--daemon", "--dir", self.base, *options, path, timeout=STARTUP_S)
        assert started.returncode == 0, started.stderr + started.stdout
        wait_for_backfill(self.base, source)
        return self

    def stop(self) -> None:
        self.ramen("stop", "--dir", self.base)

    def client(self, identity: str = "admin"):
        url = (self.base / "run" / "ready").read_text().strip()
        return confserver.connect(url, identity=identity, auth_file=self.base / "confserver" / "auth.json")

    def programs(self, client) -> dict[str, Program]:
        return {e.key.split("/", 1)[1]: Program.from_dict(e.value) for e in client.glob("programs/*")}

    def replay_table(self, target: str, since_us: int, until_us: int) -> pa.Table:
        result = self.ramen("replay", "--since", f"{since_us / 1e6:.6f}", "--until", f"{until_us / 1e6:.6f}",
                            "--format", "csv", "--with-header", target)
        assert result.returncode == 0, result.stderr
        import io

        import pyarrow.csv as pacsv
        if not result.stdout.strip():
            return pa.table({})
        return pacsv.read_csv(io.BytesIO(result.stdout.encode()))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(tmp_path_factory.mktemp("e2e"))
    try:
        yield stack.start("e2e", PROGRAM, "e2e/traffic")
    finally:
        stack.stop()


def wait_for_backfill(base: Path, source: str) -> None:
    """Until the archive under `base` covers the back-filled range of `source` but its last minute."""
    now_us = time.time_ns() // 1000
    want_since, want_until = now_us - (BACKFILL_MIN - 1) * MINUTE_US, now_us - MINUTE_US
    with ramen_dir(base):
        wait_for(lambda: any(i.since_us <= want_since and i.until_us >= want_until
                             for i in archive_coverage(paths.archive_dir("local")).get(source, [])),
                 "the archive covering the back-filled range", timeout_s=STARTUP_S)


@contextlib.contextmanager
def ramen_dir(base: Path):
    """RAMEN_DIR naming a stack's directory, for what reads its files in this process."""
    os.environ["RAMEN_DIR"], saved = str(base), os.environ.get("RAMEN_DIR")
    try:
        yield
    finally:
        os.environ.pop("RAMEN_DIR") if saved is None else os.environ.__setitem__("RAMEN_DIR", saved)


def minute_range(minutes_ago: int, minutes: int) -> tuple[int, int]:
    now_minute = time.time_ns() // 1000 // MINUTE_US * MINUTE_US
    since = now_minute - minutes_ago * MINUTE_US
    return since, since + minutes * MINUTE_US


def per_minute_by_pyarrow(traffic: pa.Table) -> pa.Table:
    start = pc.floor_temporal(traffic["ts"], unit="minute")
    summed = pa.table({"start": start, "host": traffic["host"], "bytes": traffic["bytes"]}) \
        .group_by(["start", "host"]).aggregate([("bytes", "sum")])
    return summed.rename_columns(["start", "host", "bytes"]).sort_by([("start", "ascending"), ("host", "ascending")])


def test_replay_of_the_source_has_every_tuple_of_the_range_once(stack):
    since, until = minute_range(8, 3)
    traffic = stack.replay_table("e2e/traffic", since, until)
    assert traffic.num_rows == 3 * 60 * RATE
    ts = traffic["ts"].cast(pa.timestamp("us")).cast(pa.int64())
    assert pc.min(ts).as_py() >= since and pc.max(ts).as_py() < until
    assert pc.count_distinct(ts).as_py() == traffic.num_rows  # one row per grid point: no duplicate


def test_replay_of_a_lazy_function_matches_pyarrow_over_the_raw_tuples(stack):
    since, until = minute_range(8, 4)
    expected = per_minute_by_pyarrow(stack.replay_table("e2e/traffic", since, until))
    got = stack.replay_table("e2e/per_minute", since, until).sort_by([("start", "ascending"), ("host", "ascending")])
    assert got.num_rows == expected.num_rows == 4 * 20
    assert got["bytes"].to_pylist() == expected["bytes"].to_pylist()
    assert got["host"].to_pylist() == expected["host"].to_pylist()


def test_windows_are_cut_by_since_and_until(stack):
    since, until = minute_range(8, 3)
    since, until = since + 20_000_000, until - 15_000_000  # partial first and last minutes
    expected = per_minute_by_pyarrow(stack.replay_table("e2e/traffic", since, until))
    got = stack.replay_table("e2e/per_minute", since, until).sort_by([("start", "ascending"), ("host", "ascending")])
    assert got["bytes"].to_pylist() == expected["bytes"].to_pylist()


def test_a_lazy_chain_of_two_and_different_functions_at_once(stack):
    since, until = minute_range(7, 2)
    processes = [subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "replay", "--since", f"{since / 1e6}",
                                   "--until", f"{until / 1e6}", "--format", "jsonl", target],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=stack.env)
                 for target in ("e2e/top_talkers", "e2e/per_minute", "e2e/traffic")]
    outputs = [p.communicate(timeout=120) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0], [o[1] for o in outputs]
    lines = [len(out.splitlines()) for out, _ in outputs]
    assert lines == [2 * 10, 2 * 20, 2 * 60 * RATE]  # top 10 hosts a minute, 20 hosts a minute, every tuple


def test_concurrent_replays_of_one_range_are_merged_and_read_the_archive_once(stack, monkeypatch):
    monkeypatch.setenv("RAMEN_DIR", str(stack.base))
    since, until = minute_range(9, 5)
    with stack.client() as client:
        before = quiet_supervisor_stats(client, "local").counters["replayers_spawned"]
        programs = stack.programs(client)
        replays = [Replay(client, programs, "e2e/per_minute", since, until, site="local") for _ in range(3)]
        for replay in replays:  # all three within the merge delay
            replay.start()
        channels = {replay.channel for replay in replays}
        merged = wait_for(lambda: [e.value for e in client.glob("sites/local/replayers/*")
                                   if {c["channel"] for c in e.value.get("channels", [])} & channels],
                          what="the replayer")
        tables = [pa.Table.from_batches(list(replay.batches())) for replay in replays]
        for replay in replays:
            replay.close()
        assert [t.num_rows for t in tables] == [5 * 20] * 3
        assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])
        # Identical requests ride on the first one's channel: one replayer, one channel through the workers.
        assert len(merged) == 1 and [c["channel"] for c in merged[0]["channels"]] == [min(channels)]
        # The supervisor's stats key is rewritten every second: wait for the spawn to show in it.
        spawned = wait_for(lambda: supervisor_stats.read(client, "local").counters["replayers_spawned"] - before,
                           what="the spawn in the supervisor's stats")
        assert spawned == 1  # three requests, one read of the archive
        for name in ("e2e/traffic", "e2e/per_minute"):  # no replayed tuple came before its wiring
            assert client.get(keyspace.function_key("local", name, "stats")).value.get("unexpected", 0) == 0


def _top_talkers_by_pyarrow(per_minute: pa.Table) -> pa.Table:
    from examples.net import top_talkers
    return top_talkers(per_minute).sort_by([("start", "ascending"), ("host", "ascending")])


@pytest.mark.parametrize("abandon", [None, "after its replayer", "at once"],
                         ids=["both-read", "middle-abandoned", "middle-abandoned-at-once"])
def test_a_replay_through_another_ones_target_goes_on_from_its_output(stack, monkeypatch, abandon):
    """per_minute and top_talkers (computed from per_minute) over one range at once, as a dashboard
    asks them: per_minute is computed once, for both. Should per_minute's client go first, its
    worker goes on for top_talkers: even before that worker, starting for the replay, read the key
    of per_minute's replay (the supervisor keeps it, carried)."""
    monkeypatch.setenv("RAMEN_DIR", str(stack.base))
    since, until = minute_range(8, 4)
    expected = per_minute_by_pyarrow(stack.replay_table("e2e/traffic", since, until))
    with stack.client() as client:
        programs = stack.programs(client)
        middle = Replay(client, programs, "e2e/per_minute", since, until, site="local")
        top = Replay(client, programs, "e2e/top_talkers", since, until, site="local")
        middle.start()
        top.start()
        via = wait_for(lambda: client.get_or_none(keyspace.worker_replay_key("local", "e2e/per_minute", top.channel)),
                       what="top_talkers' replay going on from per_minute's")
        assert WorkerReplay.from_value(via.value) == WorkerReplay(top.channel, since, until, (), expect_eor=0,
                                                                  via=middle.channel)
        if abandon == "at once":
            middle.close()
        replayers = wait_for(lambda: [e.value for e in client.glob("sites/local/replayers/*")
                                      if {c["channel"] for c in e.value.get("channels", [])}
                                      & {middle.channel, top.channel}], what="the replayer")
        assert [[c["channel"] for c in r["channels"]] for r in replayers] == [[middle.channel]]
        if abandon == "after its replayer":
            middle.close()
        elif abandon is None:
            got = pa.Table.from_batches(list(middle.batches())).sort_by([("start", "ascending"), ("host", "ascending")])
            middle.close()
            assert got["bytes"].to_pylist() == expected["bytes"].to_pylist()
        top_got = pa.Table.from_batches(list(top.batches())).sort_by([("start", "ascending"), ("host", "ascending")])
        top.close()
    want = _top_talkers_by_pyarrow(expected)
    assert top_got.num_rows == 4 * 10
    assert top_got["host"].to_pylist() == want["host"].to_pylist()
    assert top_got["bytes"].to_pylist() == want["bytes"].to_pylist()


def test_lazy_workers_stop_after_the_replay(stack):
    since, until = minute_range(6, 1)
    stack.replay_table("e2e/per_minute", since, until)

    def per_minute_stopped():
        with stack.client() as client:
            return client.get_or_none(keyspace.function_key("local", "e2e/per_minute", "instance")) is None
    wait_for(per_minute_stopped, what="per_minute stopped")
    with stack.client() as client:
        assert client.get(keyspace.worker_key("local", "e2e/per_minute")).value["is_used"] is False


def _stalled_replay(stack, client, target: str) -> Replay:
    """A replay whose client does not read yet: back pressure holds every process of it mid-way."""
    since, until = minute_range(9, 8)
    replay = Replay(client, stack.programs(client), target, since, until, site="local")
    replay.start()
    return replay


def _replayer_pid(client, channel: int) -> int:
    def find():
        for entry in client.glob("sites/local/replayers/*"):
            if channel in [c["channel"] for c in entry.value.get("channels", [])] and entry.value.get("pid"):
                return entry.value["pid"]
        return None
    return wait_for(find, what="the replayer")


def test_a_killed_replayer_fails_the_replay_with_a_clear_error(stack, monkeypatch):
    monkeypatch.setenv("RAMEN_DIR", str(stack.base))
    with stack.client("user") as client, _stalled_replay(stack, client, "e2e/traffic") as replay:
        os.kill(_replayer_pid(client, replay.channel), signal.SIGKILL)
        with pytest.raises(ReplayFailed, match=r"replayer \d+ of e2e/traffic died \(killed by signal 9\)"):
            for _ in replay.batches():
                pass


def test_a_killed_target_fails_the_replay_with_a_clear_error(stack, monkeypatch):
    monkeypatch.setenv("RAMEN_DIR", str(stack.base))
    with stack.client("user") as client, _stalled_replay(stack, client, "e2e/per_minute") as replay:
        _replayer_pid(client, replay.channel)
        instance = wait_for(lambda: client.get_or_none(keyspace.function_key("local", "e2e/per_minute", "instance")))
        os.kill(instance.value["pid"], signal.SIGKILL)
        with pytest.raises(ReplayFailed, match="worker e2e/per_minute died"):
            for _ in replay.batches():
                pass


def test_a_killed_client_leaves_nothing_behind(stack):
    since, until = minute_range(9, 8)
    client_process = subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "replay", "--since",
                                       f"{since / 1e6}", "--until", f"{until / 1e6}", "e2e/traffic"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=stack.env)
    with stack.client() as client:
        wait_for(lambda: client.glob("replays/*"), what="the replay request")
        client_process.kill()
        client_process.wait()
        wait_for(lambda: not client.glob("replays/*") and not client.glob("sites/local/replayers/*"),
                 what="the replay torn down")


def test_a_supervisor_restart_during_a_replay(stack, monkeypatch):
    monkeypatch.setenv("RAMEN_DIR", str(stack.base))
    with stack.client("user") as client, _stalled_replay(stack, client, "e2e/traffic") as replay:
        _replayer_pid(client, replay.channel)
        (supervisor_pid,) = [pid for pid, args in processes_with(f"RAMEN_DIR={stack.base}").items()
                             if "supervisor.service --site local" in args]
        os.kill(supervisor_pid, signal.SIGKILL)  # `ramen start` restarts it; the new one adopts the replay
        rows = sum(batch.num_rows for batch in replay.batches())
        assert rows == 8 * 60 * RATE


def test_live_output_is_unchanged_by_the_replays(stack):
    """The replays above ran while traffic went on live: its archive of those minutes is still one
    tuple per grid point, no replayed tuple mixed in and none missing."""
    since, until = minute_range(4, 3)
    traffic = stack.replay_table("e2e/traffic", since, until)
    ts = traffic["ts"].cast(pa.timestamp("us")).cast(pa.int64())
    assert traffic.num_rows == 3 * 60 * RATE == pc.count_distinct(ts).as_py()


@pytest.mark.parametrize("until", [[], ["--until", "now"], ["--until", "+1h"]], ids=["none", "now", "later"])
def test_a_range_that_ends_now_or_later_goes_as_far_as_the_archive(stack, until):
    result = stack.ramen("replay", "--since", "-3min", *until, "--format", "jsonl", "e2e/traffic", "ts")
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()
    assert len(rows) > 2 * 60 * RATE  # most of three minutes, up to the last archived tuple


def test_tail_n_of_an_archived_function_reads_its_archive(stack):
    result = stack.ramen("tail", "-n", "5", "e2e/traffic")
    assert result.returncode == 0, result.stderr
    import json
    from datetime import datetime
    times = [datetime.fromisoformat(json.loads(line)["ts"]) for line in result.stdout.splitlines()]
    assert len(times) == 5 and times == sorted(times)


def test_tail_since_replays_then_goes_live_without_gap_or_duplicate(stack):
    import json
    from datetime import datetime, timezone
    tail = subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "tail", "-f", "--since", "-1min", "e2e/traffic"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=stack.env)
    times = []
    try:
        deadline = time.monotonic() + EVENTUALLY_S
        while len(times) < 70 * RATE and time.monotonic() < deadline:  # the replayed minute, then live ones
            line = tail.stdout.readline()
            if not line:
                break
            times.append(datetime.fromisoformat(json.loads(line)["ts"]).replace(tzinfo=timezone.utc))
    finally:
        tail.send_signal(signal.SIGINT)
        tail.wait(30)
    assert len(times) >= 65 * RATE, tail.stderr.read()
    steps = {round((b - a).total_seconds() * 1e6) for a, b in zip(times, times[1:])}
    assert steps == {1_000_000 // RATE}  # every grid point once, in order, across the switch to live


def test_tail_n_of_a_lazy_windowed_function_replays_enough_past(stack):
    """-n of a function that never runs: computed by a replay looking back far enough, at once."""
    import json
    result = stack.ramen("tail", "-n", "3", "--json", "e2e/per_minute", "start", "bytes", timeout=60)
    assert result.returncode == 0, result.stderr
    found = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(found) == 3 and [r["start"] for r in found] == sorted(r["start"] for r in found)
    assert list(found[0]) == ["start", "bytes"] and found[-1]["start"].endswith(":00Z")
    from datetime import datetime
    open_window_us = time.time_ns() // 1000 // MINUTE_US * MINUTE_US
    assert datetime.fromisoformat(found[-1]["start"]).timestamp() * 1e6 < open_window_us  # whole windows only


def test_tail_of_a_range_honours_n_where_fields_and_format(stack):
    since, until = minute_range(4, 2)
    common = ["--since", f"{since / 1e6:.0f}", "--until", f"{until / 1e6:.0f}", "--where", "bytes > 0"]
    every = stack.ramen("tail", *common, "--format", "csv", "--with-header", "e2e/traffic", "ts", "bytes")
    assert every.returncode == 0, every.stderr
    lines = every.stdout.splitlines()
    assert lines[0] == '"ts","bytes"' and len(lines) - 1 > 60 * RATE  # most of two minutes (bytes > 0)
    last = stack.ramen("tail", *common, "-n", "4", "--format", "csv", "e2e/traffic", "ts", "bytes")
    assert last.returncode == 0, last.stderr
    assert last.stdout.splitlines() == lines[-4:]


def test_tail_follow_from_the_last_rows_stops_at_until(stack):
    import json
    until = time.time_ns() // 1000 + 3_000_000
    result = stack.ramen("tail", "-f", "-n", "5", "--until", f"{until / 1e6:.6f}", "e2e/traffic", "ts", timeout=60)
    assert result.returncode == 0, result.stderr
    from datetime import datetime
    times = [datetime.fromisoformat(json.loads(line)["ts"]) for line in result.stdout.splitlines()]
    steps = {round((b - a).total_seconds() * 1e6) for a, b in zip(times, times[1:])}
    assert len(times) > 5 and steps == {1_000_000 // RATE}  # the last rows, then live, once each
    assert times[-1].timestamp() * 1e6 < until


def test_no_merge_replays_at_once_and_alone(stack):
    since, until = minute_range(7, 2)
    expected = per_minute_by_pyarrow(stack.replay_table("e2e/traffic", since, until))
    result = stack.ramen("replay", "--no-merge", "--since", f"{since / 1e6}", "--until", f"{until / 1e6}",
                         "--format", "csv", "--with-header", "e2e/per_minute")
    assert result.returncode == 0, result.stderr
    import io

    import pyarrow.csv as pacsv
    got = pacsv.read_csv(io.BytesIO(result.stdout.encode())).sort_by([("start", "ascending"), ("host", "ascending")])
    assert got["bytes"].to_pylist() == expected["bytes"].to_pylist()


def _torn_down(stack) -> None:
    """The request withdrawn (the client's close), so the supervisor stops the replayers."""
    with stack.client() as client:
        wait_for(lambda: not client.glob("replays/*") and not client.glob("sites/local/replayers/*"),
                 what="the replay torn down")


def test_a_closed_pipe_ends_the_replay_at_once_and_tears_it_down(stack, tmp_path):
    since, until = minute_range(9, 8)
    errors = tmp_path / "stderr"
    command = (f"{sys.executable} -m ramen.cli.main --debug replay --since {since / 1e6} --until {until / 1e6} "
               f"--format csv e2e/traffic 2>{errors} | head -3; exit ${{PIPESTATUS[0]}}")
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=stack.env, timeout=120)
    assert result.returncode == 0, errors.read_text()[-2000:]
    assert len(result.stdout.splitlines()) == 3 and result.stdout.startswith('"')
    log = errors.read_text()
    assert "Traceback" not in log
    written = re.search(r"the reader of the output went away after (\d+) rows", log)
    assert written is not None, log[-2000:]
    assert int(written.group(1)) < 8 * 60 * RATE  # it stopped writing at the broken pipe, not at the end
    _torn_down(stack)


@pytest.mark.parametrize("command", [["replay", "--since", "{since}", "--until", "{until}", "e2e/traffic"],
                                     ["tail", "-n", "50000", "e2e/traffic"], ["tail", "-n", "3", "e2e/per_minute"]])
def test_an_output_that_fills_up_is_a_one_line_error_and_the_replay_is_torn_down(stack, command):
    since, until = minute_range(9, 8)
    args = [a.format(since=since / 1e6, until=until / 1e6) for a in command]
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "ramen.cli.main", *args, "--format", "csv"], stdout=full,
                                stderr=subprocess.PIPE, text=True, env=stack.env, timeout=120)
    assert (result.returncode, result.stderr) == (1, f"ramen: {command[0]}: cannot write the output: No space left "
                                                     f"on device\n")
    _torn_down(stack)


def test_an_output_file_that_cannot_be_made_is_a_one_line_error(stack, tmp_path):
    since, until = minute_range(3, 1)
    target = tmp_path / "missing" / "rows.csv"
    result = stack.ramen("replay", "--since", f"{since / 1e6}", "--until", f"{until / 1e6}", "--output", target,
                         "e2e/traffic")
    assert (result.returncode, result.stderr) == (1, f"ramen: replay: cannot write {target}: No such file or "
                                                     f"directory\n")


def test_limit_stops_after_n_rows_in_event_time_order_and_tears_the_replay_down(stack):
    since, until = minute_range(9, 8)
    result = stack.ramen("replay", "--since", f"{since / 1e6}", "--until", f"{until / 1e6}", "--limit", "5",
                         "--json", "e2e/traffic")
    assert result.returncode == 0, result.stderr
    import json
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", r["ts"]) for r in rows)
    from datetime import datetime
    times = [datetime.fromisoformat(r["ts"]) for r in rows]  # (as text, "…00Z" sorts after "…00.001Z")
    assert len(rows) == 5 and times == sorted(times) and times[0].timestamp() * 1e6 >= since
    _torn_down(stack)


def test_arrow_format_reads_back_with_pyarrow_in_event_time_order(stack, tmp_path):
    since, until = minute_range(6, 1)
    result = subprocess.run([sys.executable, "-m", "ramen.cli.main", "replay", "--since", f"{since / 1e6}",
                             "--until", f"{until / 1e6}", "--format", "arrow", "e2e/traffic"],
                            capture_output=True, env=stack.env, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    table = pa.ipc.open_stream(result.stdout).read_all()
    assert table.schema.field("ts").type == pa.timestamp("us") and table.num_rows == 60 * RATE
    ts = table["ts"].cast(pa.int64()).to_pylist()
    assert ts == sorted(ts) and ts[0] >= since and ts[-1] < until
    parquet = tmp_path / "minute.parquet"
    result = stack.ramen("replay", "--since", f"{since / 1e6}", "--until", f"{until / 1e6}", "--format", "parquet",
                         "--output", parquet, "e2e/traffic")
    assert result.returncode == 0 and result.stdout == "", result.stderr
    import pyarrow.parquet as pq
    assert pq.read_table(parquet).equals(table)


def test_partial_windows_are_named_on_stderr_and_whole_windows_leaves_them_out(stack):
    since, until = minute_range(8, 3)
    since, until = since + 20_000_000, until - 15_000_000
    window = [f"--since={since / 1e6}", f"--until={until / 1e6}", "--format", "csv", "e2e/per_minute"]
    cut = stack.ramen("replay", *window)
    assert cut.returncode == 0, cut.stderr
    warning = [line for line in cut.stderr.splitlines() if "warning" in line]
    first, last = (since // MINUTE_US * MINUTE_US) / 1e6, (until // MINUTE_US * MINUTE_US) / 1e6
    from ramen.times import format_time
    assert len(warning) == 1 and format_time(int(first * 1e6)) in warning[0] and "--whole-windows" in warning[0]
    assert format_time(int(last * 1e6))[-6:] in warning[0]
    assert len(cut.stdout.splitlines()) == 3 * 20  # three windows, the first and last cut
    whole = stack.ramen("replay", *window, "--whole-windows")
    assert whole.returncode == 0 and "warning" not in whole.stderr, whole.stderr
    starts = {line.split(",")[0] for line in whole.stdout.splitlines()}
    assert len(whole.stdout.splitlines()) == 20 and len(starts) == 1  # the one whole minute
    assert starts == {f'"{format_time(since // MINUTE_US * MINUTE_US + MINUTE_US)[:-1]}:00Z"'}

    # Downstream of the windows, without a window of its own: top_talkers' first and last minutes
    # came of cut windows, silently, and --whole-windows was ignored.
    talkers = [*window[:-1], "e2e/top_talkers"]
    cut = stack.ramen("replay", *talkers)
    assert cut.returncode == 0, cut.stderr
    warning = [line for line in cut.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and format_time(int(first * 1e6)) in warning[0] and "e2e/top_talkers" in warning[0]
    assert len({line.split(",")[0] for line in cut.stdout.splitlines()}) == 3
    whole = stack.ramen("replay", *talkers, "--whole-windows")
    assert whole.returncode == 0 and "warning" not in whole.stderr, whole.stderr
    assert {line.split(",")[0] for line in whole.stdout.splitlines()} == starts


def test_where_fields_and_local_times_still_apply_to_the_streamed_rows(stack):
    import json
    since, until = minute_range(6, 1)
    result = subprocess.run([sys.executable, "-m", "ramen.cli.main", "replay", "--since", f"{since / 1e6}",
                             "--until", f"{until / 1e6}", "--where", "bytes > 1000", "--local", "--json",
                             "e2e/traffic", "ts", "bytes"], capture_output=True, text=True,
                            env=dict(stack.env, TZ="Europe/Paris"), timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows and all(r.keys() == {"ts", "bytes"} and r["bytes"] > 1000 for r in rows)
    from datetime import datetime
    from zoneinfo import ZoneInfo
    paris = ZoneInfo("Europe/Paris")
    for r in rows[:100]:
        shown = datetime.fromisoformat(r["ts"])
        assert shown.utcoffset() == shown.astimezone(paris).utcoffset() and since <= shown.timestamp() * 1e6 < until


def test_a_range_partly_archived_replays_the_part_covered_with_a_warning_and_strict_refuses_it(stack):
    since, until = minute_range(BACKFILL_MIN + 20, 22)  # starts 20 minutes before the back-fill
    args = ["--since", f"{since / 1e6:.0f}", "--until", f"{until / 1e6:.0f}", "--format", "csv", "e2e/traffic", "ts"]
    lenient = stack.ramen("replay", *args)
    assert lenient.returncode == 0, lenient.stderr
    [warning] = [line for line in lenient.stderr.splitlines() if "no archive covers" in line]
    assert warning.startswith("ramen: replay: warning: no archive covers ") and "(e2e/traffic)" in warning
    assert len(lenient.stdout.splitlines()) > 60 * RATE  # the covered minute(s) at the range's end
    strict = stack.ramen("replay", "--strict", *args)
    assert strict.returncode == 1 and strict.stdout == ""
    assert strict.stderr.startswith("ramen: replay: no archive of e2e/traffic before ") and \
        len(strict.stderr.splitlines()) == 1


def test_explain_prints_the_plan_without_replaying_even_when_nothing_is_covered(stack):
    import json
    since, until = minute_range(5, 3)
    found = stack.ramen("replay", "--explain", "--json", "--since", f"{since / 1e6:.0f}",
                        "--until", f"{until / 1e6:.0f}", "e2e/per_minute")
    assert found.returncode == 0, found.stderr
    plan = json.loads(found.stdout)
    assert plan["requested"] == plan["covered"] and plan["requested"]["since"].endswith(":00Z")
    [source] = plan["sources"]
    assert source["function"] == "e2e/traffic" and source["recordings"]
    assert all(r["start_position"] < (r["stop_position"] or 1 << 62) for r in source["recordings"])
    assert plan["functions"] == ["e2e/per_minute"] and plan["problem"] is None
    nothing = stack.ramen("replay", "--explain", "--since", "-3d", "--until", "-2d", "e2e/per_minute")
    assert nothing.returncode == 0, nothing.stderr
    assert "covered    nothing" in nothing.stdout and "note       no archive of e2e/traffic" in nothing.stdout


def test_a_replay_whose_replayer_is_killed_before_any_row_is_asked_again(stack):
    """The warm replayer `ramen replay` will take is frozen, then killed once the replay is assigned
    to it: nothing was printed yet, so the command asks again, says so, and prints the same rows
    as an undisturbed replay, once each."""
    since, until = minute_range(8, 3)
    undisturbed = stack.replay_table("e2e/per_minute", since, until)
    with stack.client() as client:
        warm = wait_for(lambda: quiet_supervisor_stats(client, "local").warm_replayer, what="a warm replayer").pid
        os.kill(warm, signal.SIGSTOP)
        command = subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "replay", "--since", f"{since / 1e6:.6f}",
                                    "--until", f"{until / 1e6:.6f}", "--format", "csv", "--with-header",
                                    "e2e/per_minute"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=stack.env)
        wait_for(lambda: any(e.value.get("pid") == warm for e in client.glob("sites/local/replayers/*")),
                 what="the replay assigned to the frozen replayer")
        os.kill(warm, signal.SIGKILL)
        out, err = command.communicate(timeout=120)
    assert command.returncode == 0, err
    assert f"died (killed by signal {signal.SIGKILL})" in err and ": asking again" in err, err
    import io

    import pyarrow.csv as pacsv
    assert pacsv.read_csv(io.BytesIO(out.encode())).equals(undisturbed)

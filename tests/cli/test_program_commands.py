"""`ramen run`, `ramen kill` and `ramen ps` against a real built-in confserver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import confserver
from ramen import keyspace
from ramen.archive.catalog import Catalog, RecordingState
from ramen.archive.coverage import function_channel
from ramen.archive.segment import segment_file_name
from ramen.replay.contract import ChannelRange, ReplayerAssignment, ReplayerStats
from ramen.supervisor_stats import Standby, SupervisorStats
from ramen.worker_keys import ChannelCounts, WorkerInstance, WorkerRun, WorkerRuns, WorkerSpec, WorkerStats

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "net.toml"
READER = """
[program]
name = "report"

[[function]]
name = "daily"
from = ["net/traffic"]
engine = "spark"
sql = "SELECT * FROM traffic WHERE bytes > 0"
event_time = "ts"
"""


@pytest.fixture
def ramen(fresh_confserver, tmp_path):
    env = dict(os.environ, RAMEN_CONFSERVER=fresh_confserver.url, RAMEN_CONFSERVER_AUTH=str(fresh_confserver.auth_file),
               RAMEN_DIR=str(tmp_path / "ramen"), RAMEN_SITE="local")

    def run(*args):
        return subprocess.run([sys.executable, "-m", "ramen.cli.main", *map(str, args)], capture_output=True,
                              text=True, env=env, timeout=60)
    return run


def admin(fresh_confserver):
    return confserver.connect(fresh_confserver.url, identity="admin", auth_file=fresh_confserver.auth_file)


def one_line_error(result) -> str:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_run_loads_a_program_once_and_replaces_it_only_when_asked(ramen, fresh_confserver):
    result = ramen("run", EXAMPLE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("loaded net: 3 functions, version ")
    with admin(fresh_confserver) as c:
        stored = c.get(keyspace.program_key("net"))
        assert [f["name"] for f in stored.value["functions"]] == ["traffic", "per_minute", "top_talkers"]
    assert one_line_error(ramen("run", EXAMPLE)) == \
        "ramen: run: program net is already loaded: use --replace to replace it"
    replaced = ramen("run", EXAMPLE, "--replace", "--json")
    assert json.loads(replaced.stdout)["outcome"] == "unchanged"


def test_run_of_an_invalid_program_writes_nothing(ramen, fresh_confserver, tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text('[program]\nname = "bad"\n\n[[function]]\nname = "f"\nfrom = ["nope"]\n'
                      'engine = "spark"\nsql = "SELECT 1"\nevent_time = "ts"\n')
    line = one_line_error(ramen("run", broken))
    assert line.startswith(f"ramen: run: {broken}: f: ") and "nope" in line
    with admin(fresh_confserver) as c:
        assert c.glob(keyspace.PROGRAMS) == []


def test_kill_refuses_while_another_program_reads_it_then_unloads(ramen, fresh_confserver, tmp_path):
    reader = tmp_path / "report.toml"
    reader.write_text(READER)
    assert ramen("run", EXAMPLE).returncode == 0
    assert ramen("run", reader).returncode == 0, ramen("run", reader).stderr
    assert one_line_error(ramen("kill", "net")) == "ramen: kill: report/daily reads net/traffic: kill report first"
    assert ramen("kill", "report").returncode == 0
    assert ramen("kill", "net").stdout.strip() == "killed net"
    assert one_line_error(ramen("kill", "net")) == "ramen: kill: no program named net is loaded"


def test_kill_purge_deletes_the_programs_recordings_only(ramen, tmp_path):
    archive = tmp_path / "ramen" / "sites" / "local" / "archive"
    archive.mkdir(parents=True)
    segment_length = 64 * 1024
    with Catalog.create(archive) as catalog:
        ids = {}
        for name in ("net/traffic", "other/x"):
            ids[name] = catalog.add_recording(
                start_position=0, initial_term_id=0, segment_file_length=segment_length, term_buffer_length=65536,
                mtu_length=1408, session_id=1, stream_id=1, stripped_channel=function_channel(name),
                original_channel=function_channel(name), source_identity="test")
            (archive / segment_file_name(ids[name], 0)).write_bytes(bytes(segment_length))
            catalog.recording_stopped(ids[name], 0)
    assert ramen("run", EXAMPLE).returncode == 0
    result = ramen("kill", "net", "--purge")
    assert result.returncode == 0, result.stderr
    assert "purged 1 recording of net" in result.stdout
    with Catalog.open(archive) as catalog:
        assert catalog.get(ids["net/traffic"]).state == RecordingState.DELETED
        assert catalog.get(ids["other/x"]).state == RecordingState.VALID
    assert not (archive / segment_file_name(ids["net/traffic"], 0)).exists()
    assert (archive / segment_file_name(ids["other/x"], 0)).exists()


def spec(name: str, used: bool) -> dict:
    program, _, function = name.partition("/")
    return WorkerSpec(program, function, is_used=used, live=used, replays=(), lazy=not used, kind="python",
                      archived=False, parents=(), children=(), signature="s", program_version="v").to_value()


def stats(tuples_out: int, *, tuples_in: int = 0, cpu_s: float = 0.0, rss_bytes: int = 0) -> dict:
    return WorkerStats(pid=1, updated_us=0, tuples_in=tuples_in, tuples_out=tuples_out, late=0, dropped=0,
                       unexpected=0, skipped=0, cpu_s=cpu_s, rss_bytes=rss_bytes, position_in=0, position_out=0,
                       channels={}).to_value()


def test_ps_shows_used_or_running_workers_and_all_with_all(ramen, fresh_confserver):
    assert ramen("run", EXAMPLE).returncode == 0
    with confserver.connect(fresh_confserver.url, identity="choreographer", auth_file=fresh_confserver.auth_file) as c:
        for name, used in (("net/traffic", True), ("net/top_talkers", False)):
            c.set(keyspace.worker_key("local", name), spec(name, used))
        c.set(keyspace.function_key("local", "net/traffic", "instance"), WorkerInstance(4242, 1).to_value())
        c.set(keyspace.function_key("local", "net/traffic", "stats"),
              stats(1200, cpu_s=0.5, rss_bytes=50 * 1024 * 1024))
        # Of the runs that ended, of any signature, the latest says how the last one ended.
        c.set(keyspace.function_key("local", "net/traffic", "instances/old"),
              WorkerRuns((WorkerRun(10, 1, 5, -9, 4.0), WorkerRun(11, 6, 9, 1, 3.0))).to_value())
        c.set(keyspace.function_key("local", "net/traffic", "instances/s"),
              WorkerRuns((WorkerRun(12, 10, 20, 0, 10.0),)).to_value())
    rows = [json.loads(line) for line in ramen("ps", "--json").stdout.splitlines()]
    assert [(r["function"], r["used"], r["running"], r["pid"], r["tuples_out"], r["last_exit"]) for r in rows] == [
        ("net/traffic", True, True, 4242, 1200, 0)]
    everything = ramen("ps", "--all").stdout.splitlines()
    assert everything[0].split() == ["FUNCTION", "LAZY", "USED", "RUNNING", "PID", "IN", "OUT", "REPLAYED", "CPU_S",
                                     "RSS_MB", "SPARK", "LAST_EXIT"]
    assert everything[1].split() == ["net/top_talkers", "yes", "no", "no", "-", "-", "-", "-", "-", "-", "-", "-"]
    assert everything[2].split() == ["net/traffic", "no", "yes", "yes", "4242", "0", "1200", "0", "0.5", "50", "-",
                                     "0"]

    # Live and replayed apart: a source passes a replay's tuples through (13 M generated read 26.8 M).
    with confserver.connect(fresh_confserver.url, identity="choreographer", auth_file=fresh_confserver.auth_file) as c:
        c.set(keyspace.function_key("local", "net/traffic", "stats"), WorkerStats(
            pid=1, updated_us=0, tuples_in=0, tuples_out=2500, late=0, dropped=0, unexpected=0, skipped=0, cpu_s=0.5,
            rss_bytes=50 * 1024 * 1024, position_in=0, position_out=0,
            channels={0: ChannelCounts(tuples_out=1200), 9: ChannelCounts(tuples_out=1300)}).to_value())
    (row,) = [json.loads(line) for line in ramen("ps", "--json").stdout.splitlines()]
    assert (row["tuples_out"], row["replayed_out"]) == (1200, 1300)
    assert ramen("ps").stdout.splitlines()[1].split()[5:8] == ["0", "1200", "1300"]


def test_ps_all_leaves_out_the_functions_of_a_program_no_longer_loaded(ramen, fresh_confserver):
    """After `ramen kill`, the supervisor keeps a stopped worker's stats, and the worker key stays
    while the choreographer is down: neither makes a row. A process still running does."""
    assert ramen("run", EXAMPLE).returncode == 0
    with confserver.connect(fresh_confserver.url, identity="choreographer", auth_file=fresh_confserver.auth_file) as c:
        for name in ("net/traffic", "net/top_talkers", "net/per_minute"):
            c.set(keyspace.worker_key("local", name), spec(name, False))
            c.set(keyspace.function_key("local", name, "stats"), stats(5))
            c.set(keyspace.function_key("local", name, "instances/s"),
                  WorkerRuns((WorkerRun(17, 1, 2, -15, 1.0),)).to_value())
        c.set(keyspace.function_key("local", "net/per_minute", "instance"), WorkerInstance(4243, 1).to_value())
    assert ramen("kill", "net").returncode == 0
    rows = [json.loads(line) for line in ramen("ps", "--all", "--json").stdout.splitlines()]
    assert [(r["function"], r["running"], r["pid"]) for r in rows] == [("net/per_minute", True, 4243)]
    with confserver.connect(fresh_confserver.url, identity="choreographer", auth_file=fresh_confserver.auth_file) as c:
        for name in ("net/traffic", "net/top_talkers", "net/per_minute"):
            c.discard(keyspace.worker_key("local", name))
        c.discard(keyspace.function_key("local", "net/per_minute", "instance"))
    assert ramen("ps", "--all", "--json").stdout == ""


def test_ps_shows_replayers(ramen, fresh_confserver):
    with confserver.connect(fresh_confserver.url, identity="supervisor", auth_file=fresh_confserver.auth_file) as c:
        c.set(keyspace.replayer_key("local", 3), ReplayerAssignment(3, "net/traffic", "/r/3.logbuffer", "/archive",
                                                                    (ChannelRange(7, 0, 1),), pid=99).to_value())
        c.set(keyspace.replayer_stats_key("local", 3), ReplayerStats(100, 1, 10, {7: 10}, False).to_value())
    rows = [json.loads(line) for line in ramen("ps", "--json").stdout.splitlines()]
    assert [(r["function"], r["pid"], r["replayed_out"], r["replays"]) for r in rows] == [
        ("replayer 3 of net/traffic", 99, 10, [7])]  # what it wrote is replayed, not live


def test_ps_all_shows_the_processes_the_supervisor_keeps_started_ahead(ramen, fresh_confserver):
    with confserver.connect(fresh_confserver.url, identity="supervisor", auth_file=fresh_confserver.auth_file) as c:
        c.set(keyspace.supervisor_stats_key("local"), SupervisorStats(
            {}, running_workers=0, updated_us=1, spare_worker=Standby(71, 1), warm_replayer=Standby(72, 1)).to_value())
    assert ramen("ps", "--json").stdout == ""  # nothing used or running a function
    rows = [json.loads(line) for line in ramen("ps", "--json", "--all").stdout.splitlines()]
    assert [(r["function"], r["pid"], r["running"]) for r in rows] == [
        ("spare worker (waiting)", 71, True), ("warm replayer (waiting)", 72, True)]

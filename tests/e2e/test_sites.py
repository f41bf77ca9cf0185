"""Two sites on this host, each a `ramen start` in its own directory, sharing the first one's
confserver: a live chain across them, through the two netds, and replays across them (issue 23,
section 4).

The edge is the default site, whose `ramen start` runs no netd until the choreographer gives it a
stream to send. The source runs on the edge only, its totals per 10 s on the core only: the core's
worker reads the source's output as rebuilt by the core's netd from the edge's netd's UDP stream. Its rows must be
those of the source's grid, window by window; a netd killed with SIGKILL is restarted by its `ramen
start`, and the window it was killed in arrives whole; the receiving netd killed, the chain goes on
from its new image.

The source is archived on the edge; a lazy function of it runs on the core, archived nowhere: its
replay, asked on the core, is computed there from the edge's archive, which the edge's replayer
reads and its netd sends to the core's."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ramen.transport import LogBuffer, TransportError
from ramen.transport.udp.defaults import PUBLICATION_CONNECTION_TIMEOUT_NS
from tests.e2e.site_calls import WINDOW_S, per_window
from tests.processes import kill_left_under, processes_with
from tests.waiting import wait_for
from workers.inputs import first_frame_position
from workers.sources import generate_rows, rows_between, step_of

RATE, HOSTS, SEED = 200, 5, 11
BACKFILL_S = 600
"""The replays' program: the edge's archive holds ten minutes from the start."""
TRAFFIC = """
[[function]]
name = "traffic"
site = "local"
source = {{ kind = "generator", rate = %d, hosts = %d, seed = %d, backfill = "{backfill}" }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
{archive}
""" % (RATE, HOSTS, SEED)
PER_WINDOW = f"""
[[function]]
name = "per_window"
site = "core"
from = ["traffic"]
window = {{ every = "{WINDOW_S}s", lateness = "2s" }}
engine = "python"
call = "tests.e2e.site_calls:per_window"
event_time = "start"
archive = {{ retention = "1d" }}     # on the core: `ramen tail -n` reads the windows it closed there
"""
LAZY_ON_THE_CORE = "".join(f"""
[[function]]
name = "{name}"
site = "core"
lazy = true
from = ["traffic"]
window = {{ every = "{WINDOW_S}s", lateness = "2s" }}
engine = "python"
call = "tests.e2e.site_calls:{call}"
event_time = "start"
""" for name, call in (("on_demand", "per_window"), ("slowly", "slowly")))  # slowly: 0.1 ms a row, for a netd to die in
LIVE_PROGRAM = '[program]\nname = "x"\n' + TRAFFIC.format(backfill="30s", archive="") + PER_WINDOW
"""The live chain's: the source archived nowhere, so `ramen tail -n` on the core reads its own archive."""
REPLAY_PROGRAM = '[program]\nname = "x"\n' + TRAFFIC.format(
    backfill=f"{BACKFILL_S}s", archive='archive = { retention = "1d" }') + PER_WINDOW + LAZY_ON_THE_CORE
"""The replays': the source archived on the edge, lazy functions of it on the core."""
STARTUP_S = 60.0
REPLAYED_WINDOWS = 30
REPLAY_ENDS_WITHIN_S = 90.0
"""A replay a netd's death fails ends within the replayer's 30 s wait for a reader, and more."""
WINDOW_US = WINDOW_S * 1_000_000
ROOT = Path(__file__).resolve().parents[2]
TRAFFIC_SCHEMA = pa.schema([("ts", pa.timestamp("us")), ("host", pa.string()), ("bytes", pa.int64())])


class Site:
    def __init__(self, base: Path, name: str, env: dict) -> None:
        self.base, self.name = base, name
        self.env = dict(env, RAMEN_DIR=str(base), RAMEN_SITE=name, PYTHONPATH=str(ROOT))

    def ramen(self, *args, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ramen.cli.main", *map(str, args)], capture_output=True,
                              text=True, env=self.env, timeout=timeout)

    def start(self, *options) -> None:
        started = self.ramen("start", "--daemon", "--dir", self.base, "--site", self.name, "--no-httpd", *options,
                             timeout=STARTUP_S)
        assert started.returncode == 0, started.stderr + started.stdout

    def netd_log(self) -> str:
        return (self.base / "logs" / "netd.log").read_text()

    def netd_pids(self) -> list[int]:
        return [pid for pid, args in processes_with(f"RAMEN_DIR={self.base}").items() if "ramen.netd.service" in args]

    def windows(self, count: int = 2) -> dict[int, pa.Table]:
        """The totals of the last `count` windows the core's worker wrote, by window start, as
        `ramen tail` prints them."""
        tailed = self.ramen("tail", "-n", count * HOSTS, "--format", "jsonl", "x/per_window", timeout=STARTUP_S)
        assert tailed.returncode == 0, tailed.stderr
        by_window: dict[int, list[dict]] = {}
        for row in map(json.loads, tailed.stdout.splitlines()):
            by_window.setdefault(_us(row["start"]), []).append(row)
        return {start: pa.table({"host": [r["host"] for r in rows], "bytes": [r["bytes"] for r in rows]})
                for start, rows in by_window.items()}


def _us(text: str) -> int:
    from datetime import datetime
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1_000_000)


def expected_window(start_us: int) -> pa.Table:
    step = step_of(RATE)
    first, count = rows_between(start_us, start_us + WINDOW_US, step)
    rows = pa.Table.from_batches([generate_rows(TRAFFIC_SCHEMA, "ts", seed=SEED, hosts=HOSTS, step_us=step,
                                                first_index=first, count=count)])
    return per_window(rows).select(["host", "bytes"])


def windows_right(site: Site, after_us: int) -> list[int]:
    """The windows starting after `after_us` that the core closed, each equal to the source grid's
    totals (the stream's first window may be partial: the core joins the stream where it is)."""
    right = []
    for start, table in sorted(site.windows().items()):
        if start > after_us:
            expected = expected_window(start)
            assert table.sort_by("host").equals(expected.sort_by("host")), (start, table, expected)
            right.append(start)
    return right


@contextlib.contextmanager
def started_sites(base: Path, program: str) -> Iterator[tuple[Site, Site]]:
    """The edge (running `program`) and the core, sharing the edge's confserver, each a `ramen
    start --daemon` in its own directory under `base`; stopped at the end, and nothing left running."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAMEN_DIR", "RAMEN_CONFSERVER", "RAMEN_CONFSERVER_AUTH", "RAMEN_SITE")}
    edge = Site(base / "edge", "local", env)
    edge.base.mkdir(parents=True)
    (edge.base / "x.toml").write_text(program)
    core = Site(base / "core", "core", dict(env, RAMEN_CONFSERVER_AUTH=str(edge.base / "confserver" / "auth.json")))
    try:
        edge.start(edge.base / "x.toml")
        core.start("--confserver", (edge.base / "run" / "ready").read_text().strip())
        yield edge, core
    finally:
        for site in (core, edge):
            stopped = site.ramen("stop", "--dir", site.base)
            left = kill_left_under(site.base)
            assert stopped.returncode == 0 and not left, (stopped.stderr, left)


@pytest.fixture
def two_sites(tmp_path, request):
    """The edge and the core, running LIVE_PROGRAM or the program given as the fixture's param."""
    with started_sites(tmp_path, getattr(request, "param", LIVE_PROGRAM)) as sites:
        yield sites


def test_a_live_chain_across_two_sites_and_a_netd_killed_on_the_way(two_sites):
    edge, core = two_sites
    assert len(core.netd_pids()) == 1
    wait_for(lambda: len(edge.netd_pids()) == 1, "the edge's netd, started on demand", timeout_s=STARTUP_S)
    # A command given the core's --dir serves the core's site, with the edge's confserver's tokens,
    # without --site, $RAMEN_SITE or $RAMEN_CONFSERVER_AUTH.
    env = {k: v for k, v in core.env.items() if k not in ("RAMEN_SITE", "RAMEN_CONFSERVER_AUTH")}

    def ramen_dir_core(*args) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ramen.cli.main", "--dir", core.base, *map(str, args)], env=env,
                              capture_output=True, text=True, timeout=STARTUP_S)

    def functions_ps_shows() -> list[str]:
        ps = ramen_dir_core("ps", "--json")
        assert ps.returncode == 0, ps.stderr
        return [json.loads(line)["function"] for line in ps.stdout.splitlines()]
    wait_for(lambda: functions_ps_shows() == ["x/per_window"], "ramen --dir CORE ps showing the core's worker",
             timeout_s=STARTUP_S)
    # The core joins the edge's stream where it is when the edge's netd (started on demand) sets it
    # up: once a first window (perhaps partial) came through, the windows after now are whole.
    wait_for(lambda: core.windows() or None, "a first window of the edge's traffic on the core", timeout_s=STARTUP_S)
    tailed = ramen_dir_core("tail", "-n", 1, "--format", "jsonl", "x/per_window")  # a replay: it writes keys
    assert tailed.returncode == 0 and len(tailed.stdout.splitlines()) == 1, tailed.stderr
    joined_us = time.time_ns() // 1000
    first = wait_for(lambda: windows_right(core, joined_us) or None,
                     "a window of the edge's traffic, whole, on the core", timeout_s=STARTUP_S)[0]

    # From the edge's host, a replay of the core's function, served by the core's site: planned from
    # the coverage its archiver publishes, the result relayed through the confserver.
    # The archive covers event times up to the newest window's start (the range is that instant), as
    # its archiver publishes it, a second or so after `ramen tail` shows the window.
    def replay_from_the_edge():
        replayed = edge.ramen("replay", "--site", "core", "--via-confserver", "--since", f"{first / 1e6:.6f}",
                              "--until", f"{(first + 1) / 1e6:.6f}", "--format", "jsonl", "x/per_window",
                              timeout=STARTUP_S)
        assert replayed.returncode == 0 or "no archive of" in replayed.stderr, replayed.stderr
        return replayed if replayed.returncode == 0 else None
    replayed = wait_for(replay_from_the_edge, "the core's archive covering the window", timeout_s=STARTUP_S)
    rows = [json.loads(line) for line in replayed.stdout.splitlines()]
    assert {_us(r["start"]) for r in rows} == {first}
    assert sorted((r["host"], r["bytes"]) for r in rows) == \
        sorted(zip(*expected_window(first).to_pydict().values()))

    (killed,) = edge.netd_pids()
    kill_window_us = time.time_ns() // 1000 // WINDOW_US * WINDOW_US
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: [p for p in edge.netd_pids() if p != killed], "the edge's netd restarted", timeout_s=STARTUP_S)
    # The window of the kill closes on the core whole and right: what the dead netd had not sent,
    # the new one sent (the core's NAKs of the gap are answered from the edge's log).
    wait_for(lambda: kill_window_us in windows_right(core, kill_window_us - 1) or None,
             "the window of the kill, whole, on the core", timeout_s=STARTUP_S)

    # The core's netd frozen for longer than the edge's sender waits for a status message (as one
    # restarting slowly, after a few deaths), then killed: the edge's writer, which drops what nobody
    # reads (the source is archived nowhere), waits for it meanwhile; the new one goes on rebuilding
    # the stream in the log the dead one left, which the core's worker still reads; what was on its
    # way when it died the edge sends again. The window of the kill closes on the core whole and right.
    (killed,) = core.netd_pids()
    kill_window_us = time.time_ns() // 1000 // WINDOW_US * WINDOW_US
    os.kill(killed, signal.SIGSTOP)
    time.sleep(PUBLICATION_CONNECTION_TIMEOUT_NS / 1e9 + 1)
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: [p for p in core.netd_pids() if p != killed], "the core's netd restarted", timeout_s=STARTUP_S)
    wait_for(lambda: kill_window_us in windows_right(core, kill_window_us - 1) or None,
             "the window of the core's netd kill, whole, on the core", timeout_s=STARTUP_S)
    assert "resumed: the log an earlier receiver left" in core.netd_log()


def replay(site: Site, since_us: int, until_us: int, target: str, output: Path, *options) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "replay", "--strict", "--since",
                             f"{since_us / 1e6:.6f}", "--until", f"{until_us / 1e6:.6f}", "--format", "parquet",
                             "--output", output, *options, target], env=site.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen, timeout_s: float = REPLAY_ENDS_WITHIN_S) -> tuple[int, str]:
    """The replay's exit status and error output; it must end, one way or the other, in time."""
    try:
        _, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"the replay did not end within {timeout_s:g} s: {process.communicate()[1]}")
    return process.returncode, stderr


def streaming(core: Site) -> bool:
    """Whether a lent replayer's stream is coming in on the core (frames in its rebuilt log)."""
    for path in core.base.glob("sites/*/received/replayers/*.logbuffer"):
        try:
            with LogBuffer.open(path) as log:
                if log.producer_position() > first_frame_position(log):
                    return True
        except (OSError, TransportError):
            continue  # being placed, or gone
    return False


def expected_windows(since_us: int, until_us: int) -> pa.Table:
    starts = range(since_us, until_us, WINDOW_US)
    tables = [expected_window(start).add_column(0, "start", pa.array([start] * HOSTS, pa.timestamp("us")))
              for start in starts]
    return pa.concat_tables(tables).sort_by([("start", "ascending"), ("host", "ascending")])


def windows_of(path: Path) -> pa.Table:
    table = pq.read_table(path).select(["start", "host", "bytes"])
    return table.cast(pa.schema([("start", pa.timestamp("us")), ("host", pa.string()), ("bytes", pa.int64())])) \
        .sort_by([("start", "ascending"), ("host", "ascending")])


@pytest.mark.parametrize("two_sites", [REPLAY_PROGRAM], indirect=True)
def test_a_replay_on_the_core_computed_from_the_edges_archive_and_netds_killed_during_replays(two_sites, tmp_path):
    edge, core = two_sites
    # Whole windows of the edge's back-filled traffic, which its archive holds from the start.
    since_us = (time.time_ns() // 1000 - (BACKFILL_S - 2 * WINDOW_S) * 1_000_000) // WINDOW_US * WINDOW_US
    until_us = since_us + REPLAYED_WINDOWS * WINDOW_US
    expected = expected_windows(since_us, until_us)

    def replay_on_the_core():
        code, stderr = finished(replay(core, since_us, until_us, "x/on_demand", tmp_path / "core.parquet"))
        assert code == 0 or "publishes no archive coverage" in stderr or "no archive of x/traffic" in stderr, stderr
        return code == 0 or None
    wait_for(replay_on_the_core, "the edge's archiver publishing its coverage of the range", timeout_s=STARTUP_S)
    assert windows_of(tmp_path / "core.parquet").equals(expected)
    # The same computed from a local replay of the source, on the edge.
    code, stderr = finished(replay(edge, since_us, until_us, "x/traffic", tmp_path / "edge.parquet"))
    assert code == 0, stderr
    local = per_window(pq.read_table(tmp_path / "edge.parquet"))
    assert windows_of(tmp_path / "core.parquet").equals(local.sort_by([("start", "ascending"), ("host", "ascending")]))

    # A netd killed with SIGKILL while the edge's replayer streams to the core: the replay ends
    # whole. The edge's (sending) netd is followed by one that sends the replayer's log on from
    # where the core's receiver has it; the core's (receiving) one by one that goes on in the log
    # the dead one left.
    for site in (edge, core):
        (killed,) = site.netd_pids()
        process = replay(core, since_us, until_us, "x/slowly", tmp_path / f"kill-{site.name}.parquet")
        wait_for(lambda: streaming(core) or process.poll() is not None or None, "the replay streaming to the core",
                 timeout_s=STARTUP_S)
        os.kill(killed, signal.SIGKILL)
        code, stderr = finished(process)
        assert code == 0, stderr
        assert windows_of(tmp_path / f"kill-{site.name}.parquet").equals(expected)
        wait_for(lambda: [p for p in site.netd_pids() if p != killed], f"{site.name}'s netd restarted",
                 timeout_s=STARTUP_S)
    # And after them, a replay as the first.
    code, stderr = finished(replay(core, since_us, until_us, "x/on_demand", tmp_path / "again.parquet"))
    assert code == 0, stderr
    assert windows_of(tmp_path / "again.parquet").equals(expected)

    # Torn down on both sides: the lent replayers' keys, their streams' and their logs.
    def left_over() -> list[str]:
        listed = edge.ramen("confclient", "list", "sites/**", timeout=STARTUP_S)
        assert listed.returncode == 0, listed.stderr
        keys = [line for line in listed.stdout.splitlines() if "lent-replayers" in line or "replayer-" in line]
        logs = [str(p) for base in (edge.base, core.base) for p in base.glob("sites/*/*replayers/*.logbuffer")]
        logs += [str(p) for p in core.base.glob("sites/*/received/replayers/*")]
        return keys + logs
    wait_for(lambda: not left_over(), "the cross-site replays' keys and logs gone", timeout_s=STARTUP_S)

"""`ramen start` on a three-server ZooKeeper ensemble (`--confserver zk://a,b,c/ramen`, with an auth
file), whose leader is killed (SIGKILL) while a live source runs: the worker keeps running (same
pid, its instance key, which is ephemeral, still there), its output keeps growing, and a replay of
a past range afterwards succeeds; so does a replay during which the next leader is killed. Run under
`flock /tmp/ramen-e2e.lock`, as every e2e test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import confserver
from confserver import EventKind, auth
from ramen import keyspace
from tests.confserver.zkensemble import ZooKeeperEnsemble
from tests.confserver.zkserver import missing_prerequisite
from tests.waiting import wait_for

RATE = 200
BACKFILL_MIN = 2
PROGRAM = f"""
[program]
name = "zke"

[[function]]
name = "traffic"
source = {{ kind = "generator", rate = {RATE}, hosts = 5, seed = 3, backfill = "{BACKFILL_MIN}m" }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
archive = {{ retention = "1d" }}
"""
SOURCE = "zke/traffic"
STARTUP_S = 60.0
#: The worker's stats reach the confserver every few seconds; a few rounds of them after the kill.
GROWTH_S = 30.0
COMMAND_S = 60.0
SECOND_US = 1_000_000
#: What confserver/zk.py logs when ZooKeeper ends a client's session.
SESSION_LOST_LOG = "zookeeper session of"


@pytest.fixture
def ensemble(tmp_path_factory):
    reason = missing_prerequisite()
    if reason:
        pytest.skip(f"no ZooKeeper ensemble: {reason}")
    with ZooKeeperEnsemble(tmp_path_factory.mktemp("zk-ensemble")) as ensemble:
        yield ensemble


def ramen(env: dict, *args, timeout_s: float = COMMAND_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ramen.cli.main", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout_s)


def source_row(env: dict) -> dict | None:
    """The source's row of `ramen ps --json` once it runs and has reported output, else None."""
    got = ramen(env, "ps", "--json")
    if got.returncode != 0:
        return None
    rows = [json.loads(line) for line in got.stdout.splitlines()]
    return next((r for r in rows if r["function"] == SOURCE and r["running"] and r["tuples_out"]),
                None)


def test_a_site_on_an_ensemble_keeps_its_worker_and_replays_when_the_leader_dies(
        ensemble, tmp_path: Path):
    base = tmp_path / "site"
    auth.load_or_create(base / "confserver" / auth.AUTH_FILE_NAME)  # every service's token
    url = ensemble.url("ramen")
    env = dict(os.environ, RAMEN_DIR=str(base), RAMEN_CONFSERVER=url)
    env.pop("RAMEN_CONFSERVER_AUTH", None)
    (tmp_path / "zke.toml").write_text(PROGRAM)
    started = ramen(env, "start", "--daemon", "--dir", base, "--confserver", url,
                    tmp_path / "zke.toml", timeout_s=STARTUP_S)
    assert started.returncode == 0, started.stderr + started.stdout
    try:
        before = wait_for(lambda: source_row(env), "the source to run and report output",
                          timeout_s=STARTUP_S)

        leader = ensemble.leader()
        assert leader is not None
        ensemble.kill(leader)

        # The first stats read after the kill may have been written before it; growth past them
        # was written after.
        at_kill = wait_for(lambda: source_row(env), "the source's row after the leader's death",
                           timeout_s=GROWTH_S)
        after = wait_for(lambda: (row := source_row(env)) and row["tuples_out"] > at_kill["tuples_out"]
                         and row, "the source's output to grow after the leader's death",
                         timeout_s=GROWTH_S)
        assert at_kill["pid"] == after["pid"] == before["pid"]  # the same worker: never stopped
        os.kill(before["pid"], 0)
        new_leader = ensemble.leader()
        assert new_leader is not None and new_leader is not leader

        # A past range, back-filled before the kill: one tuple every 1/RATE s.
        now_us = int(started_at_us(base))
        since_us = now_us - 90 * SECOND_US
        until_us = since_us + 10 * SECOND_US
        replay = ramen(env, "replay", "--since", f"{since_us / 1e6:.6f}",
                       "--until", f"{until_us / 1e6:.6f}", "--format", "jsonl", SOURCE)
        assert replay.returncode == 0, replay.stderr
        assert len(replay.stdout.splitlines()) == 10 * RATE

        # The killed server back, then the new leader killed while a replay is under way: once
        # its request is written, during the supervisor's merge delay.
        ensemble.heal()
        since_us, until_us = now_us - 110 * SECOND_US, now_us - 50 * SECOND_US
        with confserver.connect(url, identity="admin",
                                auth_file=base / "confserver" / auth.AUTH_FILE_NAME) as client:
            requests = client.watch(keyspace.REPLAYS)
            replaying = subprocess.Popen(
                [sys.executable, "-m", "ramen.cli.main", "replay", "--since", f"{since_us / 1e6:.6f}",
                 "--until", f"{until_us / 1e6:.6f}", "--format", "jsonl", SOURCE],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                wait_for(lambda: any(e.kind is EventKind.CREATED for e in requests.drain()),
                         "the replay's request", timeout_s=COMMAND_S)
                ensemble.kill(ensemble.leader())
                out, err = replaying.communicate(timeout=COMMAND_S)
            finally:
                replaying.kill()
        assert replaying.returncode == 0, err
        assert len(out.splitlines()) == 60 * RATE
        # Every service and worker moved to another server within its session (confserver/zk.py
        # logs a lost session): none had to start over.
        expired = [p.name for p in (base / "logs").rglob("*.log") if SESSION_LOST_LOG in p.read_text()]
        assert expired == []
    finally:
        stopped = ramen(env, "stop", "--dir", base)
        assert stopped.returncode == 0, stopped.stderr


def started_at_us(base: Path) -> float:
    """When `ramen start` became ready: the back-fill reaches this far back from then."""
    return (base / "run" / "ready").stat().st_mtime * SECOND_US

"""`ramen stat` says which counters belong to a process that is gone: one that exited (reaped or
not yet), or whose pid now belongs to a process started after the counters' last sign of life."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ramen.transport.counters import SUBSCRIBER_POSITION_TYPE_ID, CountersFile, monotonic_ms

ALLOCATE_THEN_WAIT = """
import sys
from ramen.transport.counters import CountersFile, SUBSCRIBER_POSITION_TYPE_ID
counters = CountersFile.open(sys.argv[1])
counters.allocate(SUBSCRIBER_POSITION_TYPE_ID, sys.argv[2]).set(7)
print("allocated", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""
BEFORE_THE_PROCESS_MS = 60_000
"""How long before the process started a reused pid's counters last showed a sign of life."""


@pytest.fixture
def owners(tmp_path):
    """owners(label) -> a running process that allocated one counter labelled so; reaped at the end."""
    started = []

    def start(label: str) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", ALLOCATE_THEN_WAIT, str(tmp_path / "counters.dat"), label],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout.readline() == "allocated\n"
        return process

    yield start
    for process in started:
        process.stdin.close()
        process.wait(30)


def stat(counters: Path, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "ramen.cli.main", "stat", "--counters", str(counters), *args],
                          capture_output=True, text=True, check=True, timeout=60).stdout


def owner_alive(counters: Path) -> dict[str, bool]:
    return {c["label"]: c["owner_alive"] for c in json.loads(stat(counters, "--json"))["counters"]}


def test_the_counters_of_a_process_that_exited_unreaped_are_marked(owners, tmp_path):
    live, gone = owners("live one"), owners("gone one")
    gone.stdin.close()
    os.waitid(os.P_PID, gone.pid, os.WEXITED | os.WNOWAIT)  # it has exited; left a zombie until the fixture reaps it
    counters = tmp_path / "counters.dat"
    human = stat(counters)
    assert f"pid {gone.pid} (exited)\n" in human and f"pid {live.pid}\n" in human, human
    assert owner_alive(counters) == {"live one": True, "gone one": False}


def test_the_counters_of_a_pid_reused_by_a_later_process_are_marked(owners, tmp_path):
    """The owner pid names a running process, but one that started after the counter's last
    heartbeat: not the process that counted."""
    newcomer = owners("its own")
    counters = CountersFile.open(tmp_path / "counters.dat", create=False)
    try:
        counter = counters.allocate(SUBSCRIBER_POSITION_TYPE_ID, "older", owner_id=newcomer.pid)
        counter.heartbeat(monotonic_ms() - BEFORE_THE_PROCESS_MS)
    finally:
        counters.close()
    human = stat(tmp_path / "counters.dat")
    # One pid, two processes: the newcomer's own counter (allocated after it started) is its, alive.
    assert f"pid {newcomer.pid}\n" in human and f"pid {newcomer.pid} (exited; its pid is now another process's)\n" \
        in human, human
    assert owner_alive(tmp_path / "counters.dat") == {"its own": True, "older": False}


ALLOCATE_AS_A_REPLAYER = """
import sys
from ramen.transport.counters import CountersFile
from ramen.transport.service_counters import allocate_service_counter
counters = CountersFile.open(sys.argv[1])
allocate_service_counter(counters, "replayer", "bytes_read", sys.argv[2]).set(4096)
"""


def test_the_figures_replayers_that_ended_left_are_one_line_unless_all(owners, tmp_path):
    """A dashboard makes dozens of replayers an hour, each leaving its figures on purpose: `ramen
    stat` listed 56 exited replayers after 30 minutes."""
    counters = tmp_path / "counters.dat"
    live = owners("a reader")
    for replayer in ("7", "8"):
        subprocess.run([sys.executable, "-c", ALLOCATE_AS_A_REPLAYER, str(counters), replayer], check=True, timeout=60)
    human = stat(counters)
    assert f"pid {live.pid}\n" in human and "replayer 7" not in human
    assert human.rstrip().endswith("(2 replayers that ended left their figures: --all lists them)")
    everything = stat(counters, "--all")
    assert "replayer 7 bytes read" in everything and "replayer 8 bytes read" in everything
    assert "(exited)" in everything and "left their figures" not in everything

"""How a child's end is described: a failed child's last one-line error goes with its exit status,
so that a replay through a worker that failed says why."""

from __future__ import annotations

import sys

from supervisor.processes import last_error, spawn
from tests.waiting import wait_for


def test_a_failed_child_is_described_with_its_last_one_line_error(tmp_path):
    script = ("import sys; print('INFO: working', file=sys.stderr); "
              "print('ramen: worker p/f: p/f: the Spark job made no progress', file=sys.stderr); "
              "print('a last word', file=sys.stderr); sys.exit(1)")
    child = spawn("worker p/f", [sys.executable, "-c", script], {}, tmp_path / "f.log")
    wait_for(child.poll, "the child to exit")
    assert child.describe_exit() == "exit 1: p/f: the Spark job made no progress"


def test_a_child_that_succeeded_or_said_nothing_is_described_by_its_status_alone(tmp_path):
    ok = spawn("worker p/ok", [sys.executable, "-c", "print('ramen: worker p/ok: not an error')"], {},
               tmp_path / "ok.log")
    silent = spawn("worker p/silent", [sys.executable, "-c", "raise SystemExit(3)"], {}, tmp_path / "silent.log")
    wait_for(lambda: ok.poll() and silent.poll(), "both children to exit")
    assert ok.describe_exit() == "exit 0"
    assert silent.describe_exit() == "exit 3"
    assert last_error(tmp_path / "missing.log") is None


def test_an_ended_childs_empty_log_is_dropped_and_a_log_with_anything_in_it_kept(tmp_path):
    silent = spawn("replayer 1", [sys.executable, "-c", "pass"], {}, tmp_path / "1.log")
    said = spawn("replayer 2", [sys.executable, "-c", "print('WARNING: recording 3 ends early')"], {},
                 tmp_path / "2.log")
    running = spawn("replayer 3", [sys.executable, "-c", "import time; time.sleep(600)"], {}, tmp_path / "3.log")
    try:
        wait_for(lambda: silent.poll() and said.poll(), "both children to exit")
        for child in (silent, said, running):
            child.drop_empty_log()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["2.log", "3.log"]  # a running child may still write
    finally:
        running.kill()
        wait_for(running.poll, "the running child to be killed")

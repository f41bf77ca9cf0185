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

"""A live stream across two sites while their netds are killed again and again: what reaches the
other site, window by window, against the source's grid.

Two `ramen start --daemon` on loopback share the first one's confserver (tests/e2e/test_sites.py's
live chain): the edge's source (200 tuples/s, 5 hosts, archived nowhere) feeds the core's totals
per 10 s window, through the edge's netd, UDP and the core's netd. Once a first window came whole,
a netd is killed with SIGKILL every `--every` seconds, the receiving (core's) and the sending
(edge's) in turn, each frozen (SIGSTOP) for `--freeze` seconds first: a netd that restarts slowly,
as `ramen start`'s back-off makes it after repeated deaths (0.5, 1, 2, 5 s). Then every window the
core closed from the first kill on is compared with the source grid's totals.

Run: `.venv/bin/python bench/netd_kills.py [--kills 8] [--freeze 6] [--every 15]` (a few
minutes). Goal: no window wrong, the windows of the kills included.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.replay import progress  # noqa: E402
from tests.e2e.test_sites import (LIVE_PROGRAM, STARTUP_S, WINDOW_US, Site, expected_window,  # noqa: E402
                                  started_sites)
from tests import waiting  # noqa: E402

DEFAULT_KILLS = 8
DEFAULT_FREEZE_S = 6.0
"""Past the sender's connection timeout (5 s): the case a live stream's tether is for."""
DEFAULT_EVERY_S = 15.0
SETTLE_S = 2 * WINDOW_US / 1e6 + 5
"""After the last kill: the window it fell in and the next closed (10 s windows, 2 s lateness)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=DEFAULT_KILLS, help="netds killed (default %(default)s)")
    parser.add_argument("--freeze", type=float, default=DEFAULT_FREEZE_S, metavar="S",
                        help="seconds each netd is frozen before its kill (default %(default)s; 0: killed at once)")
    parser.add_argument("--every", type=float, default=DEFAULT_EVERY_S, metavar="S",
                        help="seconds from one kill to the next (default %(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ramen-bench-netd-kills-") as tmp:
        progress("starting two sites, the edge's source live to the core")
        with started_sites(Path(tmp), LIVE_PROGRAM) as (edge, core):
            return measure(edge, core, args.kills, args.freeze, args.every)


def wait_for(condition, what: str):
    return waiting.wait_for(condition, what, timeout_s=STARTUP_S, poll_s=0.5)


def measure(edge: Site, core: Site, kills: int, freeze_s: float, every_s: float) -> int:
    wait_for(lambda: len(edge.netd_pids()) == 1, "the edge's netd, started on demand")
    wait_for(lambda: len(core.windows()) >= 2, "two windows on the core (the first may be partial)")
    first_kill_us = time.time_ns() // 1000
    restarts = []
    for kill in range(kills):
        site = (core, edge)[kill % 2]
        (pid,) = wait_for(lambda: site.netd_pids() or None, f"the {site.name} site's netd")
        progress(f"kill {kill + 1}/{kills}: the {'receiving' if site is core else 'sending'} netd (pid {pid}), "
                 f"frozen {freeze_s:g} s first")
        started = time.monotonic()
        if freeze_s:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(freeze_s)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: [p for p in site.netd_pids() if p != pid], f"the {site.name} site's netd restarted")
        restarts.append(time.monotonic() - started)
        time.sleep(max(0.0, every_s - (time.monotonic() - started)))
    time.sleep(SETTLE_S)
    closed = core.windows(count=round(kills * every_s * 1e6 / WINDOW_US) + 10)  # every one since the first kill
    windows = {start: table for start, table in closed.items() if start >= first_kill_us // WINDOW_US * WINDOW_US}
    wrong = []
    for start, table in sorted(windows.items()):
        expected = expected_window(start).sort_by("host")
        if not table.sort_by("host").equals(expected):
            got, want = sum(table.column("bytes").to_pylist()), sum(expected.column("bytes").to_pylist())
            wrong.append(f"{time.strftime('%H:%M:%S', time.gmtime(start / 1e6))} bytes {got:,} against {want:,}")
    print(f"{kills} netd kills, each frozen {freeze_s:g} s first, {every_s:g} s apart; no stream for "
          f"{min(restarts):.1f}-{max(restarts):.1f} s at each (the freeze, the kill, ramen start's back-off)")
    print(f"windows closed on the core from the first kill on: {len(windows)}; wrong: {len(wrong)}")
    for line in wrong:
        print(f"  {line}")
    return 1 if wrong or not windows else 0


if __name__ == "__main__":
    sys.exit(main())

"""A replay across sites against the same replay on one site: an hour of the demo traffic.

Two `ramen start --daemon` in temporary directories share the first one's confserver: the edge
(the default site) runs the demo's source (examples/replay.toml's traffic: 3,000 tuples/s, an hour
back-filled, archived); `per_minute` is placed twice, lazy, on the edge and on the core. The
bench waits for the edge's archive to cover the hour, then times `ramen replay --no-merge` of the
58 whole minutes (the CLI's start included) of the edge's `per_minute` (a local replay: the
edge's replayer, log and worker) and of the core's (across sites: the edge's replayer reads its
archive, its netd sends the log over UDP to the core's netd, the core's worker computes),
interleaved, a few times each, each from a stopped lazy worker and the supervisors' spare worker and
warm replayer started (as bench/replay.py), and checks both print the same rows.

Run: `.venv/bin/python bench/cross_site.py [--runs N]` (about three minutes). Goal: the cross-site
replay within 1.5x the local one.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.test_sites import Site, started_sites  # noqa: E402

RATE = 3000
PROGRAM = """
[program]
name = "demo"

[[function]]
name = "traffic"
site = "local"
source = { kind = "generator", rate = %d, hosts = 50, seed = 1, backfill = "1h" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
archive = { retention = "1d" }
""" % RATE + "".join(f"""
[[function]]
name = "{name}"
site = "{site}"
lazy = true
from = ["traffic"]
window = {{ every = "1 minute", lateness = "10s" }}
engine = "python"
call = "examples.net:per_minute"
event_time = "start"
""" for name, site in (("per_minute", "local"), ("per_minute_core", "core")))
MINUTE_US = 60_000_000
MINUTES = 58
DEFAULT_RUNS = 3
STARTUP_TIMEOUT_S = 300.0
GOAL_FACTOR = 1.5
WORKER_STOP_WAIT_S = 15.0
SPARE_SETTLE_S = 1.5
"""After a lazy worker stopped, or a replay ended: the next spare worker and warm replayer start in about 1 s."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="timed runs of each (default %(default)s)")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="run in DIR and keep it (logs), not in a temporary one")
    args = parser.parse_args()
    with (contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory(prefix="ramen-bench-sites-")) as tmp:
        print("starting two sites and back-filling an hour of demo/traffic on the edge", file=sys.stderr)
        with started_sites(Path(tmp), PROGRAM) as (edge, core):
            return measure(edge, core, args.runs)


def settle(*sites: Site) -> None:
    """Untimed, before each replay: the lazy workers of the last one stopped, and the supervisors'
    spare worker and warm replayer started, as a replay finds them when replays are seconds apart."""
    import json
    deadline = time.monotonic() + WORKER_STOP_WAIT_S
    for site in sites:
        while time.monotonic() < deadline:
            ps = site.ramen("ps", "--json")
            if not any(json.loads(line)["running"] for line in ps.stdout.splitlines()
                       if json.loads(line)["function"].startswith("demo/per_minute")):
                break
            time.sleep(0.1)
    time.sleep(SPARE_SETTLE_S)


def measure(edge: Site, core: Site, runs: int) -> int:
    until = time.time_ns() // 1000 // MINUTE_US * MINUTE_US
    since = until - MINUTES * MINUTE_US
    modes = {"local (edge)": (edge, "demo/per_minute"), "cross-site (core)": (core, "demo/per_minute_core")}

    def replay(site: Site, target: str, *options: str):
        return site.ramen("replay", "--no-merge", "--strict", "--since", f"{since / 1e6:.6f}",
                          "--until", f"{until / 1e6:.6f}", "--format", "csv", *options, target,
                          timeout=STARTUP_TIMEOUT_S)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while (result := replay(edge, "demo/traffic", "--limit", "1")).returncode != 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"the edge's archive did not cover the hour: {result.stderr.strip()}")
        time.sleep(2)
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    outputs: dict[str, str] = {}
    for _ in range(runs):
        for mode, (site, target) in modes.items():  # interleaved: both meet the same warm caches
            settle(edge, core)
            started = time.perf_counter()
            result = replay(site, target)
            seconds[mode].append(time.perf_counter() - started)
            if result.returncode != 0:
                raise SystemExit(f"{mode}: {result.stderr.strip()}")
            outputs[mode] = result.stdout
    rows = len(outputs["local (edge)"].splitlines())
    print(f"{MINUTES} minutes of demo/traffic ({MINUTES * 60 * RATE:,} tuples) through per_minute ({rows:,} rows), "
          f"the CLI's start included:")
    for mode, times in seconds.items():
        print(f"  {mode:18} {', '.join(f'{s:.2f}' for s in times)} s; median {statistics.median(times):.2f} s")
    factor = statistics.median(seconds["cross-site (core)"]) / statistics.median(seconds["local (edge)"])
    same = outputs["cross-site (core)"] == outputs["local (edge)"]
    print(f"cross-site / local: {factor:.2f}x (goal <= {GOAL_FACTOR}x: {'pass' if factor <= GOAL_FACTOR else 'FAIL'}); "
          f"same rows: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

"""A replay's result through the confserver (`ramen replay --via-confserver`) against the same
replay through a local log.

It runs `ramen start --daemon` in a temporary directory with the e2e program (a generator
back-filling ten minutes at 1,000 tuples/s, archived), then times `ramen replay --format csv` of
three minutes of the source (180,000 rows), the CLI's start included, through a local log and
relayed, interleaved, a few times each, and checks both print the same rows.

Run: `.venv/bin/python bench/relay.py [--runs N]` (about a minute).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.test_replay import PROGRAM, Stack, minute_range  # noqa: E402

SOURCE = "e2e/traffic"
MINUTES = 3
DEFAULT_RUNS = 3
MODES = {"local log": (), "relayed": ("--via-confserver",)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="timed runs of each (default %(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ramen-bench-relay-") as tmp:
        stack = Stack(Path(tmp))
        print(f"starting ramen and back-filling ten minutes of {SOURCE}", file=sys.stderr)
        stack.start("e2e", PROGRAM, SOURCE)
        try:
            since, until = minute_range(8, MINUTES)
            seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
            outputs: dict[str, str] = {}
            for _ in range(args.runs):
                for mode, options in MODES.items():  # interleaved: both meet the same warm caches
                    started = time.perf_counter()
                    result = stack.ramen("replay", "--since", f"{since / 1e6:.6f}", "--until", f"{until / 1e6:.6f}",
                                         "--format", "csv", *options, SOURCE)
                    seconds[mode].append(time.perf_counter() - started)
                    if result.returncode != 0:
                        raise SystemExit(f"{mode}: {result.stderr.strip()}")
                    outputs[mode] = result.stdout
        finally:
            stack.stop()
    rows = len(outputs["local log"].splitlines())
    for mode, times in seconds.items():
        print(f"{mode:10} {', '.join(f'{s:.2f}' for s in times)} s; median {statistics.median(times):.2f} s "
              f"({rows:,} rows)")
    factor = statistics.median(seconds["relayed"]) / statistics.median(seconds["local log"])
    print(f"relayed / local log: {factor:.2f}x; same rows: {'yes' if outputs['relayed'] == outputs['local log'] else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replay output benchmark: how fast `ramen replay`'s writers (ramen/cli/output.py) turn rows into
csv and jsonl, and how much memory they hold, beside pyarrow.csv.write_csv of the same rows.

10 M rows of a simple schema (a timestamp, an int, a float, a short string), in batches of the
size a replay's client receives (--batch-rows; a replay's ~100 KB messages hold about 3,000 of
these rows), are written into /dev/null by the writer the CLI uses, each format in a process of its
own so that its peak RSS (ru_maxrss) is its own. Rows are made batch by batch from a few
templates (their timestamps moved on), as a replay's arrive, so the writer's memory is what is
measured; the anchor, write_csv, is given the whole table, as the old `ramen replay` built it.

Also measured: making the rows alone (the other figures but the anchor's include it), and csv
through the reorder buffer (ramen/replay/order.py) then the writer, as the CLI does for a source
(rows already in order, disorder 0).

Run: `.venv/bin/python bench/replay_output.py [--rows N] [--batch-rows N] [--json]`
(about a minute). With --cli, instead: `ramen replay` itself over an hour of generated traffic
(examples/replay.toml, as bench/replay.py starts it) into /dev/null, and into `| head -3`.
Goals printed beside the figures: csv >= 2 M rows/s, peak RSS <= 400 MB.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_ROWS = 10_000_000
DEFAULT_BATCH_ROWS = 3_000
TEMPLATES = 16
HOSTS = 50
START_US = 1_795_608_900_000_000  # 2026-11-25T12:15:00Z
STEP_US = 333  # about 3,000 rows a second, with fractional seconds, as the generator's
GOAL_CSV_ROWS_S = 2_000_000
GOAL_PEAK_RSS_MB = 400
MODES = ("rows only", "csv", "jsonl", "table", "csv+reorder", "anchor write_csv")
KB_PER_MB = 1024


def templates(batch_rows: int) -> list[pa.RecordBatch]:
    import numpy as np
    rng = np.random.default_rng(1)
    out = []
    for t in range(TEMPLATES):
        first = t * batch_rows
        out.append(pa.record_batch({
            "ts": pa.array(START_US + (first + np.arange(batch_rows)) * STEP_US, pa.timestamp("us")),
            "bytes": pa.array(rng.integers(40, 1500, batch_rows), pa.int64()),
            "ratio": pa.array(rng.random(batch_rows), pa.float64()),
            "host": pa.array([f"host-{i % HOSTS}" for i in rng.integers(0, HOSTS, batch_rows)], pa.string()),
        }))
    return out


def batches(rows: int, batch_rows: int):
    """`rows` rows in event-time order, batch by batch."""
    import pyarrow.compute as pc
    pool = templates(batch_rows)
    period_us = TEMPLATES * batch_rows * STEP_US
    made = 0
    round_ = 0
    while made < rows:
        for template in pool:
            if made >= rows:
                return
            batch = template.slice(0, min(batch_rows, rows - made))
            shifted = pc.add(batch.column(0).cast(pa.int64()), round_ * period_us).cast(pa.timestamp("us"))
            yield pa.RecordBatch.from_arrays([shifted, *batch.columns[1:]], names=batch.schema.names)
            made += batch.num_rows
        round_ += 1


def measure(mode: str, rows: int, batch_rows: int) -> dict:
    """One mode, in this process: seconds of writing (making the rows excluded for the anchor only,
    which is handed a whole table) and this process's peak RSS."""
    from ramen.cli.output import open_writer
    from ramen.memory import retain_freed_memory
    retain_freed_memory()  # as `ramen replay` does (ramen/cli/main.py): its peak RSS is what is measured
    schema = next(batches(1, 1)).schema
    with open("/dev/null", "wb") as sink:
        if mode == "anchor write_csv":
            import pyarrow.csv as pacsv
            table = pa.Table.from_batches(list(batches(rows, batch_rows)), schema=schema)
            started = time.perf_counter()
            pacsv.write_csv(table, pa.PythonFile(sink, mode="w"))
        elif mode == "rows only":  # making the batches, which every other mode but the anchor's includes
            started = time.perf_counter()
            for _ in batches(rows, batch_rows):
                pass
        elif mode == "csv+reorder":
            from ramen.replay.order import ReorderBuffer
            reorder = ReorderBuffer(schema, "ts", 0)
            writer = open_writer("csv", sink, schema)
            started = time.perf_counter()
            for batch in batches(rows, batch_rows):
                for table in reorder.add(batch):
                    for out in table.to_batches():
                        writer.write(out)
            for table in reorder.finish():
                for out in table.to_batches():
                    writer.write(out)
            writer.close()
        else:
            writer = open_writer(mode, sink, schema)
            started = time.perf_counter()
            for batch in batches(rows, batch_rows):
                writer.write(batch)
            writer.close()
        elapsed = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KB_PER_MB
    return {"mode": mode, "rows": rows, "batch_rows": batch_rows, "seconds": elapsed, "rows_per_s": rows / elapsed,
            "peak_rss_mb": peak_mb}


def cli_end_to_end(formats: list[str]) -> list[dict]:
    """`ramen replay` of an hour of the source (examples/replay.toml, as bench/replay.py) into
    /dev/null, each format once: wall time and the client's peak RSS (os.wait4, its own); then
    `| head -3`: time to the 3rd line and to the client's exit after the pipe closed."""
    import importlib.util
    import os
    spec = importlib.util.spec_from_file_location("replay_bench", ROOT / "bench" / "replay.py")
    replay_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay_bench)
    results = []
    with replay_bench.running_ramen("output", replay_bench.PROGRAM) as (_, env):
        since, until = replay_bench.wait_for_the_hour()
        command = [*replay_bench.RAMEN, "replay", "--since", f"{since / 1e6}", "--until", f"{until / 1e6}", "demo/traffic"]
        for output_format in formats:
            started = time.perf_counter()
            with open("/dev/null", "wb") as sink:
                child = subprocess.Popen([*command, "--format", output_format], stdout=sink, env=env)
                _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
            results.append({"mode": f"ramen replay --format {output_format}", "exit": child.returncode,
                            "seconds": time.perf_counter() - started, "peak_rss_mb": usage.ru_maxrss / KB_PER_MB,
                            "rows": None})
        started = time.perf_counter()
        child = subprocess.Popen([*command, "--format", "csv"], stdout=subprocess.PIPE, env=env)
        for _ in range(3):
            child.stdout.readline()
        third_line_s = time.perf_counter() - started
        child.stdout.close()  # as head does after its 3rd line
        _, status, usage = os.wait4(child.pid, 0)
        results.append({"mode": "ramen replay | head -3", "exit": os.waitstatus_to_exitcode(status),
                        "seconds": time.perf_counter() - started, "third_line_s": third_line_s,
                        "peak_rss_mb": usage.ru_maxrss / KB_PER_MB, "rows": None})
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--batch-rows", type=int, default=DEFAULT_BATCH_ROWS)
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cli", action="store_true",
                        help="instead: `ramen replay` end to end over an hour of examples/replay.toml (~2 min)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child measuring one mode
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.rows, args.batch_rows)))
        return 0
    if args.cli:
        results = cli_end_to_end(["csv", "jsonl", "table"])
        if args.json:
            print(json.dumps(results))
            return 0
        print(f"{'command':<30} {'exit':>4} {'seconds':>8} {'peak RSS MB':>12}")
        for r in results:
            extra = f"   3rd line after {r['third_line_s']:.2f} s" if "third_line_s" in r else ""
            print(f"{r['mode']:<30} {r['exit']:>4} {r['seconds']:>8.2f} {r['peak_rss_mb']:>12.0f}{extra}")
        return 0
    results = []
    for mode in args.modes:
        child = subprocess.run([sys.executable, __file__, "--one", mode, "--rows", str(args.rows), "--batch-rows",
                                str(args.batch_rows)], capture_output=True, text=True, check=True)
        results.append(json.loads(child.stdout))
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"{args.rows:,} rows in batches of {args.batch_rows:,}, into /dev/null "
          f"(goals: csv >= {GOAL_CSV_ROWS_S / 1e6:g} M rows/s, peak RSS <= {GOAL_PEAK_RSS_MB} MB)")
    print(f"{'writer':<18} {'seconds':>8} {'M rows/s':>9} {'peak RSS MB':>12}")
    for r in results:
        print(f"{r['mode']:<18} {r['seconds']:>8.2f} {r['rows_per_s'] / 1e6:>9.2f} {r['peak_rss_mb']:>12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

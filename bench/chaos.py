"""Chaos soak: ramen under kill -9, checked for lost, duplicated and wrong rows, hangs and leaks.

It runs `ramen start --daemon` in a directory of its own with a deterministic generator
(`chaos/traffic`, archived), a lazy windowed aggregate over it (`chaos/per_minute`) and the same
aggregate archived, running all the time (`chaos/minutes`), keeps
`ramen replay` clients running all the time over random past ranges of either, and kills a random
process with SIGKILL at even intervals: the source's worker, the lazy worker, the archived
aggregate's worker, replayers, replay clients, the archiver, the supervisor, the choreographer,
the confserver. Then it lets ramen settle, stops it, and checks:

- the archive, on the generator's grid: every row of [first, last] once (no duplicate, none
  missing but in gaps the archive's coverage shows, reported apart), each row equal to the
  generator's recomputation;
- the archived aggregate, window by window: each minute its archive covers (outside the gaps it
  records: a window its worker may have missed rows of) once, and equal to the aggregate of the
  generator's rows of that minute;
- every replay: exit 0 with a result equal to pyarrow over the generator's rows of its range, or a
  non-zero exit with a one-line error, within its timeout (else: a hang). Replays are --strict: a
  range the archive does not cover whole yet (the source lagging after a kill) is a one-line
  error, where a lenient replay would give its covered part with a warning, which the check could
  not tell from a short result;
- leaks, once ramen is stopped: processes of the instance, result logs, replayer logs.

Run: `.venv/bin/python bench/chaos.py [--kills 100] [--minutes 10] [--seed S] [--json]`.
Exit status 1 if any check fails (so the test suite runs a short soak with it).
The goal is 100 kills over 10 minutes with nothing lost, duplicated or wrong, no hang, no leak.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.csv as pacsv

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.net import per_minute  # noqa: E402
from ramen import paths  # noqa: E402
from ramen.archive.catalog import CATALOG_FILE_NAME, NULL_POSITION, Catalog  # noqa: E402
from ramen.archive.coverage import archive_coverage, function_channel  # noqa: E402
from ramen.archive.segment import SegmentReader  # noqa: E402
from ramen.message import KIND_TUPLES, decode_header  # noqa: E402
from ramen.processes import command_line, instance_processes  # noqa: E402
from ramen.transport.frame import BEGIN_FLAG, END_FLAG  # noqa: E402
from ramen.transport.writer_lock import writer_pids  # noqa: E402
from ramen.tuples import decode_tuples  # noqa: E402
from workers.sources import generate_rows, rows_between, step_of  # noqa: E402

RATE = 1000
HOSTS = 20
SEED = 7
BACKFILL_S = 120
SOURCE, AGGREGATE, DERIVED = "chaos/traffic", "chaos/per_minute", "chaos/minutes"
SCHEMA = pa.schema([("ts", pa.timestamp("us")), ("host", pa.string()), ("bytes", pa.int64())])
DERIVED_SCHEMA = pa.schema([("start", pa.timestamp("us")), ("host", pa.string()), ("bytes", pa.int64())])
MINUTE_US = 60_000_000
PROGRAM = f"""
[program]
name = "chaos"

[[function]]
name = "traffic"
source = {{ kind = "generator", rate = {RATE}, hosts = {HOSTS}, seed = {SEED}, backfill = "{BACKFILL_S}s" }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
archive = {{ retention = "1d" }}

[[function]]
name = "per_minute"
lazy = true
from = ["traffic"]
window = {{ every = "1 minute", lateness = "10s" }}
engine = "python"
call = "examples.net:per_minute"
event_time = "start"

[[function]]
name = "minutes"
from = ["traffic"]
window = {{ every = "1 minute", lateness = "10s" }}
engine = "python"
call = "examples.net:per_minute"
event_time = "start"
archive = {{ retention = "1d" }}
"""
STEP_US = step_of(RATE)
SECOND_US = 1_000_000
STARTUP_TIMEOUT_S = 120.0
REPLAY_TIMEOUT_S = 60.0
"""A replay's own timeout (`ramen replay --timeout`): past it and a grace, it counts as a hang."""
HANG_GRACE_S = 30.0
REPLAY_CLIENTS = 2
RANGE_S = (5, 40)
"""A replay covers between these many seconds of the archived past."""
SETTLE_S = 30.0
"""After the last kill (default): longer than ramen start's longest restart backoff and a service's start."""
VICTIMS = ("source worker", "lazy worker", "derived worker", "replayer", "replay client", "archiver", "supervisor", "choreographer",
           "confserver")


@dataclass
class ReplayOutcome:
    target: str
    since_us: int
    until_us: int
    seconds: float
    status: str
    """ok, wrong, failed (a clear one-line error), unclear (an error that is not one line), hang,
    killed (the client was a victim)."""
    detail: str = ""


@dataclass
class Report:
    kills: dict[str, int] = field(default_factory=dict)
    minutes: float = 0.0
    archived_rows: int = 0
    duplicated_rows: int = 0
    missing_rows: int = 0
    rows_in_recorded_gaps: int = 0
    wrong_rows: int = 0
    derived_windows: int = 0
    """Minutes of the archived aggregate checked against the generator's rows."""
    derived_windows_wrong: int = 0
    derived_windows_duplicated: int = 0
    derived_windows_in_gaps: int = 0
    derived_failures: list[str] = field(default_factory=list)
    first_row_us: int = 0
    """The source's first row (its back-fill's): the aggregate's first minute begins before it."""
    """Minutes its archive holds inside a gap it records (maybe partial, and said so): not checked."""
    replays: dict[str, int] = field(default_factory=dict)
    replay_failures: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not (self.duplicated_rows or self.missing_rows or self.wrong_rows or self.leaks or
                    self.derived_windows_wrong or self.derived_windows_duplicated or
                    self.replays.get("wrong") or self.replays.get("hang") or self.replays.get("unclear"))


def progress(text: str) -> None:
    print(f"chaos: {text}", file=sys.stderr, flush=True)


def now_us() -> int:
    return time.time_ns() // 1000


class Ramen:
    """A ramen of the soak's own: its directory, its commands, its processes."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.env = dict(os.environ, RAMEN_DIR=str(base), PYTHONPATH=str(ROOT))
        self.env.pop("RAMEN_CONFSERVER", None)
        self.token: str | None = None

    def run(self, *args, timeout: float = STARTUP_TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ramen.cli.main", *map(str, args)], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def start(self, program: Path) -> None:
        started = self.run("start", "--daemon", "--dir", self.base, program)
        if started.returncode != 0:
            raise SystemExit(f"chaos: ramen start failed: {started.stderr.strip()}")
        self.token = (self.base / "run" / "instance").read_text().strip()

    def stop(self) -> subprocess.CompletedProcess:
        return self.run("stop", "--dir", self.base)

    def processes(self) -> dict[str, list[int]]:
        """Victims by kind, read from the processes themselves (and who writes which log)."""
        found: dict[str, list[int]] = {kind: [] for kind in VICTIMS}
        writers = {pid: name for name, pid in self.log_writers().items()}
        for pid in instance_processes(self.token):
            args = command_line(pid)
            if "workers.worker" in args:
                name = writers.get(pid)
                if name == SOURCE:
                    found["source worker"].append(pid)
                elif name == AGGREGATE:
                    found["lazy worker"].append(pid)
                elif name == DERIVED:
                    found["derived worker"].append(pid)
            elif "workers.replayer" in args and "--wait-for-key" not in args:
                found["replayer"].append(pid)
            else:
                for kind, module in (("archiver", "workers.archiver"), ("supervisor", "supervisor.service"),
                                     ("choreographer", "choreographer.service"), ("confserver", "confserver.server")):
                    if module in args:
                        found[kind].append(pid)
        return found

    def log_writers(self) -> dict[str, int]:
        logs = paths.output_logs("local")  # $RAMEN_DIR is ours (soak)
        pids = writer_pids(logs.values())
        return {name: pids[path] for name, path in logs.items() if path in pids}

    @property
    def archive_dir(self) -> Path:
        return self.base / "sites" / "local" / "archive"


def expected_rows(since_us: int, until_us: int) -> pa.Table:
    first, count = rows_between(since_us, until_us, STEP_US)
    batch = generate_rows(SCHEMA, "ts", seed=SEED, hosts=HOSTS, step_us=STEP_US, first_index=first, count=count)
    return pa.Table.from_batches([batch])


def sorted_table(table: pa.Table) -> pa.Table:
    return table.sort_by([(name, "ascending") for name in table.column_names])


class ReplayClients:
    """REPLAY_CLIENTS threads, each running `ramen replay` over random past ranges until stopped."""

    def __init__(self, ramen: Ramen, rng: random.Random, archived_since_us: int) -> None:
        self.ramen = ramen
        self.rng = rng
        self.archived_since_us = archived_since_us
        self.outcomes: list[ReplayOutcome] = []
        self.running: dict[int, subprocess.Popen] = {}
        self.killed: set[int] = set()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, name=f"replay client {i}", daemon=True)
                        for i in range(REPLAY_CLIENTS)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(REPLAY_TIMEOUT_S + 2 * HANG_GRACE_S)

    def _loop(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                target = self.rng.choice((SOURCE, AGGREGATE))
                length_us = self.rng.randint(*RANGE_S) * SECOND_US
                latest_us = now_us() - 5 * SECOND_US - length_us
                since_us = self.rng.randint(self.archived_since_us + SECOND_US, max(latest_us,
                                                                                  self.archived_since_us + SECOND_US))
            self.outcomes.append(self._replay(target, since_us, since_us + length_us))

    def _replay(self, target: str, since_us: int, until_us: int) -> ReplayOutcome:
        argv = [sys.executable, "-m", "ramen.cli.main", "replay", "--since", f"{since_us / 1e6:.6f}",
                "--until", f"{until_us / 1e6:.6f}", "--format", "csv", "--with-header",
                "--timeout", f"{REPLAY_TIMEOUT_S:g}", "--strict", target]
        started = time.monotonic()
        process = subprocess.Popen(argv, env=self.ramen.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        with self.lock:
            self.running[process.pid] = process
        try:
            out, err = process.communicate(timeout=REPLAY_TIMEOUT_S + HANG_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            return ReplayOutcome(target, since_us, until_us, time.monotonic() - started, "hang")
        finally:
            with self.lock:
                self.running.pop(process.pid, None)
        seconds = time.monotonic() - started
        if process.pid in self.killed:
            return ReplayOutcome(target, since_us, until_us, seconds, "killed")
        errors = err.decode(errors="replace").strip().splitlines()
        # Progress and warnings (a cut window, a part not archived) are not the error line.
        errors = [line for line in errors if not line.startswith("\rreplay:") and not line.startswith("replay:")
                  and not line.startswith("ramen: replay: warning:")]
        if process.returncode != 0:
            one_line = len(errors) == 1 and "Traceback" not in err.decode(errors="replace")
            return ReplayOutcome(target, since_us, until_us, seconds, "failed" if one_line else "unclear",
                                 " | ".join(errors[-3:]))
        try:
            # Times print as RFC 3339 in UTC (`…Z`): read as UTC, compared as the naive UTC of the rows.
            got = pacsv.read_csv(io.BytesIO(out), convert_options=pacsv.ConvertOptions(column_types={
                "ts": pa.timestamp("us", "UTC"), "start": pa.timestamp("us", "UTC"), "host": pa.string(),
                "bytes": pa.int64()}))
        except pa.ArrowInvalid as e:
            return ReplayOutcome(target, since_us, until_us, seconds, "wrong", f"unreadable output: {e}")
        rows = expected_rows(since_us, until_us)
        expected = rows if target == SOURCE else per_minute(rows)
        if got.num_rows == 0 and expected.num_rows == 0:
            return ReplayOutcome(target, since_us, until_us, seconds, "ok")
        same = got.num_rows == expected.num_rows and \
            sorted_table(got.select(expected.column_names).cast(expected.schema)).equals(sorted_table(expected))
        return ReplayOutcome(target, since_us, until_us, seconds, "ok" if same else "wrong",
                             "" if same else f"{got.num_rows} rows, expected {expected.num_rows}")

    def kill_one(self) -> int | None:
        with self.lock:
            if not self.running:
                return None
            pid = self.rng.choice(sorted(self.running))
            self.killed.add(pid)
        os.kill(pid, signal.SIGKILL)
        return pid


def archived_rows(archive_dir: Path, function: str = SOURCE, schema: pa.Schema = SCHEMA) -> pa.Table:
    """Every row of every recording of a function, straight from the segment files."""
    batches = []
    with Catalog.open(archive_dir) as catalog:
        descriptors = [d for d in catalog if d.stripped_channel == function_channel(function)]
    for descriptor in descriptors:
        stop = None if descriptor.stop_position == NULL_POSITION else descriptor.stop_position
        fragments: list[bytes] = []
        with SegmentReader.for_recording(archive_dir, descriptor) as reader:
            for frame in reader.frames(None, stop):
                if not frame.is_data:
                    continue
                if frame.flags & BEGIN_FLAG:
                    fragments = []
                fragments.append(frame.payload())
                if frame.flags & END_FLAG:
                    message = b"".join(fragments)
                    header = decode_header(message)
                    if header is not None and header.kind == KIND_TUPLES:
                        batches.append(decode_tuples(message, schema))
    return pa.Table.from_batches(batches, schema)


def check_archive(ramen: Ramen, report: Report) -> None:
    table = archived_rows(ramen.archive_dir).sort_by("ts")
    report.archived_rows = table.num_rows
    times = table.column("ts").cast(pa.int64()).to_numpy()
    first_of_each = np.ones(len(times), dtype=bool)
    first_of_each[1:] = times[1:] != times[:-1]
    unique = times[first_of_each]
    report.duplicated_rows = int(len(times) - len(unique))
    first, last = int(unique[0]), int(unique[-1])
    grid = np.arange(first, last + 1, STEP_US)
    missing = np.setdiff1d(grid, unique, assume_unique=True)
    coverage = archive_coverage(ramen.archive_dir).get(SOURCE, [])
    gaps = [(a.until_us, b.since_us) for a, b in zip(coverage, coverage[1:])]
    in_gaps = np.zeros(len(missing), dtype=bool)
    for low, high in gaps:
        in_gaps |= (missing >= low) & (missing < high)
    report.rows_in_recorded_gaps = int(in_gaps.sum())
    report.missing_rows = int((~in_gaps).sum())
    # Each row (a duplicate too) against the generator's row of its time: same host, same bytes.
    recomputed = expected_rows(first, last + 1)
    at = (times - first) // STEP_US
    off_grid = (times - first) % STEP_US != 0
    at[off_grid] = 0
    wrong = off_grid | (table.column("bytes").to_numpy() != recomputed.column("bytes").to_numpy()[at])
    wrong |= ~np.asarray(pa.compute.equal(table.column("host"), recomputed.column("host").take(pa.array(at))))
    report.wrong_rows = int(wrong.sum())
    report.first_row_us = first


def check_derived(ramen: Ramen, report: Report) -> None:
    """The archived aggregate, minute by minute, against the aggregate of the generator's rows."""
    table = archived_rows(ramen.archive_dir, DERIVED, DERIVED_SCHEMA)
    coverage = archive_coverage(ramen.archive_dir).get(DERIVED, [])
    starts = table.column("start").cast(pa.int64()).to_numpy()
    for start in np.unique(starts).tolist():
        if not any(i.since_us <= start < i.until_us for i in coverage):
            report.derived_windows_in_gaps += 1
            continue
        report.derived_windows += 1
        got = table.filter(pa.array(starts == start))
        if len(set(got.column("host").to_pylist())) < got.num_rows:
            report.derived_windows_duplicated += 1
        expected = per_minute(expected_rows(max(start, report.first_row_us), start + MINUTE_US))
        if not sorted_table(got).equals(sorted_table(expected.cast(DERIVED_SCHEMA))):
            report.derived_windows_wrong += 1
            report.derived_failures.append(
                f"minute {start}: {got.num_rows} hosts, {pa.compute.sum(got['bytes'])} bytes; expected "
                f"{expected.num_rows} hosts, {pa.compute.sum(expected['bytes'])} bytes")


def check_leaks(ramen: Ramen, report: Report) -> None:
    left = instance_processes(ramen.token)
    report.leaks += [f"process {pid}: {command_line(pid)[:100]}" for pid in left]
    report.leaks += [f"result log {p}" for p in sorted((ramen.base / "replays").glob("*.logbuffer"))]
    report.leaks += [f"replayer log {p}" for p in sorted((ramen.base / "sites" / "local" / "replayers")
                                                          .glob("*.logbuffer"))]
    for pid in left:
        os.kill(pid, signal.SIGKILL)


def wait_archived(ramen: Ramen, until_us: int, what: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if (ramen.archive_dir / CATALOG_FILE_NAME).exists():
            coverage = archive_coverage(ramen.archive_dir).get(SOURCE, [])
            if coverage and coverage[-1].until_us >= until_us:
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"chaos: {what} not archived within {STARTUP_TIMEOUT_S:g} s")
        time.sleep(0.5)


def soak(base: Path, kills: int, minutes: float, seed: int, settle_s: float = SETTLE_S) -> Report:
    rng = random.Random(seed)
    os.environ["RAMEN_DIR"] = str(base)
    report = Report(kills={kind: 0 for kind in VICTIMS}, minutes=minutes)
    base.mkdir(parents=True, exist_ok=True)
    program = base / "chaos.toml"
    program.write_text(PROGRAM)
    ramen = Ramen(base)
    progress(f"starting ramen in {base}")
    started_us = now_us()
    ramen.start(program)
    try:
        wait_archived(ramen, started_us, "the back-fill")
        clients = ReplayClients(ramen, rng, started_us - BACKFILL_S * SECOND_US + 5 * SECOND_US)
        clients.start()
        interval_s = minutes * 60 / max(kills, 1)
        progress(f"{kills} kills, one every {interval_s:.1f} s")
        for i in range(kills):
            time.sleep(interval_s)
            kind, pid = _kill_someone(ramen, clients, rng)
            report.kills[kind] += 1
            progress(f"kill {i + 1}/{kills}: {kind} (pid {pid})")
        progress(f"settling for {settle_s:g} s")
        time.sleep(settle_s)
        wait_archived(ramen, now_us() - 5 * SECOND_US, "the last seconds")
        clients.close()
        for outcome in clients.outcomes:
            report.replays[outcome.status] = report.replays.get(outcome.status, 0) + 1
            if outcome.status not in ("ok", "killed"):
                report.replay_failures.append(f"{outcome.status}: {outcome.target} "
                                              f"[{outcome.since_us}, {outcome.until_us}) after {outcome.seconds:.1f} s"
                                              f"{': ' + outcome.detail if outcome.detail else ''}")
    finally:
        stopped = ramen.stop()
        if stopped.returncode != 0:
            report.leaks.append(f"ramen stop: {stopped.stderr.strip()}")
    check_archive(ramen, report)
    check_derived(ramen, report)
    check_leaks(ramen, report)
    return report


def _kill_someone(ramen: Ramen, clients: ReplayClients, rng: random.Random) -> tuple[str, int]:
    """SIGKILL a process of a random kind among those running now."""
    processes = ramen.processes()
    kinds = [kind for kind in VICTIMS if processes.get(kind)] + (["replay client"] if clients.running else [])
    for _ in range(len(VICTIMS)):
        kind = rng.choice(kinds)
        if kind == "replay client":
            pid = clients.kill_one()
            if pid is not None:
                return kind, pid
            continue
        pid = rng.choice(processes[kind])
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        return kind, pid
    return "nobody", 0


def print_report(report: Report) -> None:
    print(f"chaos soak: {sum(report.kills.values())} kills over {report.minutes:g} min "
          f"({', '.join(f'{k} {n}' for k, n in report.kills.items() if n)})")
    print(f"archive: {report.archived_rows:,} rows; duplicated {report.duplicated_rows}, missing "
          f"{report.missing_rows}, wrong {report.wrong_rows}; in gaps the archive shows: "
          f"{report.rows_in_recorded_gaps}")
    print(f"archived aggregate: {report.derived_windows} minutes checked; wrong {report.derived_windows_wrong}, "
          f"duplicated {report.derived_windows_duplicated}; in gaps it records: {report.derived_windows_in_gaps}")
    for failure in report.derived_failures:
        print(f"  {failure}")
    print(f"replays: {', '.join(f'{k} {n}' for k, n in sorted(report.replays.items()))}")
    for failure in report.replay_failures:
        print(f"  {failure}")
    print(f"leaks: {len(report.leaks)}")
    for leak in report.leaks:
        print(f"  {leak}")
    print("PASS" if report.passed else "FAIL")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--settle", type=float, default=SETTLE_S, metavar="S",
                        help="after the last kill, wait this long before the checks (default %(default)g)")
    parser.add_argument("--dir", help="run ramen here (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    progress(f"seed {args.seed}")
    if args.dir:
        report = soak(Path(args.dir).resolve(), args.kills, args.minutes, args.seed, args.settle)
    else:
        with tempfile.TemporaryDirectory(prefix="ramen-chaos-") as base:
            report = soak(Path(base), args.kills, args.minutes, args.seed, args.settle)
    if args.json:
        print(json.dumps(dict(asdict(report), passed=report.passed)))
    else:
        print_report(report)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())

"""Spark benchmark: a heavy per-minute aggregate replayed, beside the same SQL as one Parquet batch query.

An hour of generated traffic is replayed through the heavy aggregate, and the same SQL runs as one
Spark batch query over that traffic exported to Parquet, in the same run.

It runs `ramen start --daemon` in a temporary directory with a program of its own (a generator that
back-fills the last hour at 2,800 tuples/s: about 10 M tuples, archived; a lazy heavy function
`per_minute` on top, `engine = "spark"`, on the local Spark Connect server that `ramen start`
starts), waits for the archive to cover the hour, then measures:
- a replay of the heavy aggregate over the hour, a few times: rows/s counted in source tuples (the
  worker runs it as a few Spark jobs of SPARK_JOB_ROWS rows, and one at END_OF_REPLAY);
- the baseline, what a user would write instead: the source's tuples over the same range (replayed
  from the archive) written to Parquet, then `spark.read.parquet(dir)` as the view `traffic` and the
  same SQL `.toArrow()`, on the same Spark server, a few times (the first may warm the JVM up);
- the per_minute worker's Spark jobs and their time (what `ramen ps --json` shows).

With `--cluster`, the same again on a Spark standalone cluster started from pyspark's jars (a
master, one 3 GiB worker, a Connect server with the default 1 GiB driver: tests/spark/standalone.py)
with `ramen start --spark sc://... --spark-staging DIR`, the Parquet query on that cluster, one
replay with no staging store (rows over Spark Connect in chunks), and the Connect driver's peak RSS.

Run: `.venv/bin/python bench/spark.py [--runs N] [--cluster] [--json]` (about 4-6 minutes on 2 cores,
twice that with --cluster).
Goals printed beside the figures: the replay within 2x the Parquet batch query (medians); with
--cluster, the cluster's replay within 1.5x the local one and 2x the cluster's Parquet query.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import confserver  # noqa: E402
from bench.replay import SPARE_SETTLE_S, progress, run_replays, wait_worker_stopped  # noqa: E402
from ramen import keyspace, paths  # noqa: E402
from ramen.archive.coverage import archive_coverage  # noqa: E402
from ramen.cli.ps import collect  # noqa: E402
from ramen.program import Program  # noqa: E402
from ramen.replay.client import Replay  # noqa: E402
from ramen.spark.contract import SparkServer  # noqa: E402
from ramen.spark.defaults import CONNECT_SERVER_CLASS  # noqa: E402
from ramen.spark.session import connect  # noqa: E402
from tests.spark.standalone import StandaloneCluster  # noqa: E402
from workers.defaults import SPARK_JOB_ROWS  # noqa: E402

PROGRAM_NAME = "bench"
SOURCE, AGGREGATE = f"{PROGRAM_NAME}/traffic", f"{PROGRAM_NAME}/per_minute"
RATE_PER_S = 2800  # with the 1 h back-fill: about 10 M tuples
HOSTS = 50
SQL = ("SELECT window.start AS start, host, sum(bytes) AS bytes "
       "FROM traffic GROUP BY window(ts, '1 minute'), host")
PROGRAM = f"""\
[program]
name = "{PROGRAM_NAME}"

[[function]]
name = "traffic"
source = {{ kind = "generator", rate = {RATE_PER_S}, hosts = {HOSTS}, seed = 1, backfill = "1h" }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
archive = {{ retention = "1d" }}

[[function]]
name = "per_minute"
lazy = true
from = ["traffic"]
window = {{ every = "1 minute", lateness = "10s" }}
engine = "spark"
sql = "{SQL}"
schema = {{ start = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "start"
"""
DEFAULT_RUNS = 3
HOUR_US = 3_600_000_000
MINUTE_US = 60_000_000
RANGE_US = HOUR_US - 2 * MINUTE_US  # the back-filled hour in whole minutes, as bench/replay.py replays it
STARTUP_TIMEOUT_S = 300.0
SPARK_TIMEOUT_S = 180.0
REPLAY_TIMEOUT_S = 300.0
PARQUET_FILE_ROWS = 1_000_000  # a few files, as an export would leave them; Spark reads them in parallel
STATS_WAIT_S = 5.0
STATS_POLL_S = 0.1
STOP_GRACE_S = 10.0
GOAL_PARQUET_FACTOR = 2.0
GOAL_CLUSTER_FACTOR = 1.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS,
                        help="timed runs of the replay and of the Parquet query (default %(default)s)")
    parser.add_argument("--cluster", action="store_true",
                        help="also on a Spark standalone cluster with a staging directory (started here)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    report = {"local": run_bench(args.runs)}
    if args.cluster:
        with tempfile.TemporaryDirectory(prefix="ramen-bench-cluster-") as tmp:
            progress("starting a Spark standalone cluster (master, one worker, Connect with a 1 GiB driver)")
            with StandaloneCluster(Path(tmp)) as cluster:
                report["cluster"] = run_bench(args.runs, cluster)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print_report(report["local"])
    if "cluster" in report:
        print()
        print_cluster_report(report["local"], report["cluster"])
    return 0


def run_bench(runs: int, cluster: StandaloneCluster | None = None) -> dict:
    """`ramen start` of the bench's program on its local Spark, or on `cluster` with a staging
    directory, and the figures."""
    with tempfile.TemporaryDirectory(prefix="ramen-bench-spark-") as tmp:
        base = Path(tmp)
        program = base / "bench-spark.toml"
        program.write_text(PROGRAM)
        env = dict(os.environ, RAMEN_DIR=str(base), PYTHONPATH=str(ROOT))
        env.pop("RAMEN_CONFSERVER", None)
        env.pop("RAMEN_SPARK_REMOTE", None)
        os.environ["RAMEN_DIR"] = str(base)
        ramen = [sys.executable, "-m", "ramen.cli.main"]
        spark = ["--spark", cluster.remote, "--spark-staging", str(base / "staging")] if cluster else []
        progress(f"starting ramen ({'on the cluster' if cluster else 'and its Spark'}) and back-filling an hour")
        subprocess.run([*ramen, "start", "--daemon", "--dir", str(base), *spark, str(program)], env=env, check=True)
        spark_pids: list[int] = []
        try:
            report = measure(base, runs, spark_pids if cluster is None else [])
            result = report.pop("result")
            if cluster is not None:
                report["chunks_seconds"], report["chunks_same"] = replay_without_staging(base, cluster, report,
                                                                                         result)
                report["driver_peak_rss_mb"] = peak_rss_mb(cluster.processes["connect"].pid)
        finally:
            subprocess.run([*ramen, "stop", "--dir", str(base)], env=env, check=False)
            kill_leftovers(spark_pids)
    return report


def replay_without_staging(base: Path, cluster: StandaloneCluster, report: dict,
                           result: pa.Table) -> tuple[float, str]:
    """One replay with the `spark/server` key naming no staging store, as `ramen start --spark`
    without --spark-staging writes it: rows go over Spark Connect in chunks."""
    url = (base / "run" / "ready").read_text().strip()
    with confserver.connect(url, identity="admin", auth_file=base / "confserver" / "auth.json") as client:
        client.set(keyspace.SPARK_SERVER, SparkServer(cluster.remote).to_value())
        programs = {e.key.split("/", 1)[1]: Program.from_dict(e.value) for e in client.glob("programs/*")}
        progress("replaying the heavy aggregate on the cluster without a staging store")
        seconds, table = heavy_replay(client, programs, report["since_us"], report["until_us"], SparkJobs(client))
    progress(f"  {seconds:.1f} s, {table.num_rows:,} rows out")
    return seconds, same_totals(table, result)


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set (VmHWM), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def measure(base: Path, runs: int, spark_pids: list[int]) -> dict:
    load_before = os.getloadavg()
    url = (base / "run" / "ready").read_text().strip()
    with confserver.connect(url, identity="user", auth_file=base / "confserver" / "auth.json") as client:
        remote = wait_spark(client)
        spark_pids.extend(spark_server_pids(remote))
        progress(f"Spark Connect at {remote} (pid {', '.join(map(str, spark_pids)) or '?'})")
        since, until = wait_archive()
        programs = {e.key.split("/", 1)[1]: Program.from_dict(e.value) for e in client.glob("programs/*")}

        progress("replaying the source, for the Parquet export")
        source = run_replays(client, programs, SOURCE, since, until, 1, no_merge=True)
        traffic = source.pop("table")
        tuples = traffic.num_rows
        parquet_dir = base / "parquet"
        export_s, files = export_parquet(traffic, parquet_dir)
        del traffic
        progress(f"{tuples:,} tuples in {files} Parquet files ({export_s:.1f} s)")

        jobs = SparkJobs(client)
        replays, queries, query_table = [], [], None
        spark = connect(remote)
        try:
            # Interleaved, so that both see the JVM as warm (its JIT keeps improving over the first
            # few queries: run back to back, the later kind would look faster than it is).
            for i in range(runs):
                progress(f"replaying the heavy aggregate over the hour ({i + 1}/{runs})")
                replays.append(heavy_replay(client, programs, since, until, jobs))
                progress(f"  {replays[-1][0]:.1f} s, {replays[-1][1].num_rows:,} rows out")
                progress(f"Spark batch query over Parquet ({i + 1}/{runs})")
                seconds, query_table = parquet_query(spark, parquet_dir)
                queries.append(seconds)
                progress(f"  {seconds:.1f} s, {query_table.num_rows:,} rows out")
        finally:
            spark.stop()
        replay_table = replays[-1][1]
        spark_jobs, spark_s = jobs.totals()
        workers = {r["function"]: r for r in collect(client, keyspace.DEFAULT_SITE)}  # what `ramen ps --json` says
        worker = workers.get(AGGREGATE, {})
    return {"source_tuples": tuples, "since_us": since, "until_us": until, "parquet_files": files,
            "export_seconds": export_s, "spark_job_rows": SPARK_JOB_ROWS,
            "replay_seconds": [seconds for seconds, _ in replays], "replay_rows": replay_table.num_rows,
            "parquet_seconds": queries, "parquet_rows": query_table.num_rows,
            "same_result": same_totals(replay_table, query_table), "result": replay_table,
            "spark_jobs": spark_jobs, "spark_s": spark_s,
            "ps": {k: worker.get(k) for k in ("pid", "spark_jobs", "spark_s", "cpu_s")},
            "load_before": load_before, "load_after": os.getloadavg()}


class SparkJobs:
    """The per_minute worker's Spark jobs and time over our replays, from its stats key. The key
    holds one worker process's totals, and a replay may get a new process (the supervisor stops an
    unused worker): totals are kept per pid, minus what a process had done before we counted."""

    def __init__(self, client) -> None:
        self.client = client
        self.key = keyspace.function_key(keyspace.DEFAULT_SITE, AGGREGATE, "stats")
        self.before: dict[int, tuple[int, float]] = {}
        self.latest: dict[int, tuple[int, float]] = {}
        record = self._record()
        if record is not None:
            self.before[record["pid"]] = (record.get("spark_jobs") or 0, record.get("spark_s") or 0.0)

    def _record(self) -> dict | None:
        entry = self.client.get_or_none(self.key)
        return entry.value if entry is not None and isinstance(entry.value, dict) else None

    def after_replay(self, ended_us: int) -> None:
        """Wait for the worker's first stats record written after this replay ended (it writes one a
        second, and when it stops), and take its totals."""
        deadline = time.monotonic() + STATS_WAIT_S
        while time.monotonic() < deadline:
            record = self._record()
            if record is not None and record.get("updated_us", 0) >= ended_us:
                self.latest[record["pid"]] = (record.get("spark_jobs") or 0, record.get("spark_s") or 0.0)
                return
            time.sleep(STATS_POLL_S)
        progress(f"no stats from the per_minute worker within {STATS_WAIT_S:g} s: its Spark jobs are not counted")

    def totals(self) -> tuple[int, float]:
        jobs = sum(j - self.before.get(pid, (0, 0.0))[0] for pid, (j, _) in self.latest.items())
        seconds = sum(t - self.before.get(pid, (0, 0.0))[1] for pid, (_, t) in self.latest.items())
        return jobs, seconds


def heavy_replay(client, programs, since: int, until: int, jobs: SparkJobs) -> tuple[float, pa.Table]:
    """One replay of the heavy aggregate: its time (the waits for the worker to stop and for its
    stats afterwards, and for the supervisor's next spare worker, are not counted) and its rows."""
    time.sleep(SPARE_SETTLE_S)
    started = time.perf_counter()
    with Replay(client, programs, AGGREGATE, since, until, site=keyspace.DEFAULT_SITE, timeout_s=REPLAY_TIMEOUT_S,
                no_merge=True) as replay:
        replay.start()
        table = pa.Table.from_batches(list(replay.batches()), schema=replay.schema)
    elapsed = time.perf_counter() - started
    ended_us = time.time_ns() // 1000
    wait_worker_stopped(client, AGGREGATE)
    jobs.after_replay(ended_us)
    return elapsed, table


def wait_spark(client) -> str:
    """The remote of the Spark Connect server `ramen start` started, once it is announced."""
    started = time.monotonic()
    while True:
        entry = client.get_or_none(keyspace.SPARK_SERVER)
        if entry is not None:
            progress(f"Spark ready after {time.monotonic() - started:.0f} s")
            return SparkServer.from_value(entry.value).remote
        if time.monotonic() - started > SPARK_TIMEOUT_S:
            raise SystemExit(f"no {keyspace.SPARK_SERVER} key after {SPARK_TIMEOUT_S:g} s: see the spark log")
        time.sleep(1)


def wait_archive() -> tuple[int, int]:
    """The back-filled range, in whole minutes, once the archive covers it: from the first minute the
    back-fill has whole (it starts an hour before the source does, which is after Spark is up),
    RANGE_US long, which ends about a minute before the source started."""
    started = time.monotonic()
    since = until = None
    while True:
        intervals = archive_coverage(paths.archive_dir("local")).get(SOURCE, [])
        if intervals and since is None:
            first_us = min(i.since_us for i in intervals)
            since = -(-first_us // MINUTE_US) * MINUTE_US
            until = since + RANGE_US
        if since is not None and any(i.since_us <= since and i.until_us >= until for i in intervals):
            progress(f"archive ready after {time.monotonic() - started:.0f} s more")
            return since, until
        if time.monotonic() - started > STARTUP_TIMEOUT_S:
            raise SystemExit("the archive did not cover the hour in time")
        time.sleep(1)


def export_parquet(traffic: pa.Table, directory: Path) -> tuple[float, int]:
    """The tuples as Parquet files, timestamps in UTC (as a user's export would be)."""
    started = time.perf_counter()
    directory.mkdir()
    ts_type = pa.timestamp("us", tz="UTC")
    table = traffic.set_column(traffic.schema.get_field_index("ts"), pa.field("ts", ts_type),
                               pc.cast(traffic["ts"], ts_type))
    files = 0
    for offset in range(0, table.num_rows, PARQUET_FILE_ROWS):
        pq.write_table(table.slice(offset, PARQUET_FILE_ROWS), directory / f"part-{files:05d}.parquet")
        files += 1
    return time.perf_counter() - started, files


def parquet_query(spark, directory: Path) -> tuple[float, pa.Table]:
    started = time.perf_counter()
    spark.read.parquet(str(directory)).createOrReplaceTempView("traffic")
    result = spark.sql(SQL).toArrow()
    return time.perf_counter() - started, result


def same_totals(a: pa.Table | None, b: pa.Table | None) -> str:
    """Whether both results have the same (start, host) groups and bytes per group, and if not how
    they differ (Spark hands strings over as large_string and timestamps marked UTC: both are cast)."""
    if a is None or b is None:
        return "-"

    def normal(t: pa.Table) -> pa.Table:
        start = t["start"]
        if start.type.tz is not None:
            start = pc.cast(start, pa.timestamp("us", tz="UTC")).cast(pa.timestamp("us"))
        return pa.table({"start": pc.cast(start, pa.timestamp("us")), "host": pc.cast(t["host"], pa.string()),
                         "bytes": pc.cast(t["bytes"], pa.int64())}) \
            .sort_by([("start", "ascending"), ("host", "ascending")])
    a, b = normal(a), normal(b)
    if a.equals(b):
        return "yes"
    joined = a.join(b, ["start", "host"], join_type="full outer", left_suffix="_replay", right_suffix="_parquet")
    differ = joined.filter(pc.invert(pc.fill_null(pc.equal(joined["bytes_replay"], joined["bytes_parquet"]), False)))
    return (f"NO: {differ.num_rows:,} of {joined.num_rows:,} groups differ; bytes total "
            f"{pc.sum(a['bytes']).as_py():,} (replay) vs {pc.sum(b['bytes']).as_py():,} (Parquet)")


def spark_server_pids(remote: str) -> list[int]:
    """The java processes of the Spark Connect server on this remote's port (ours: the port is ours)."""
    port = remote.rsplit(":", 1)[1]
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if CONNECT_SERVER_CLASS in words and f"spark.connect.grpc.binding.port={port}" in words:
            pids.append(int(proc.name))
    return pids


def kill_leftovers(pids: list[int]) -> None:
    """Whatever of our Spark server `ramen stop` left running: TERM, then KILL."""
    deadline = time.monotonic() + STOP_GRACE_S
    alive = [p for p in pids if _alive(p)]
    for pid in alive:
        progress(f"Spark server {pid} still running after ramen stop: terminating it")
        os.kill(pid, signal.SIGTERM)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if _alive(p)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def print_report(r: dict) -> None:
    tuples = r["source_tuples"]
    replay_med, query_med = statistics.median(r["replay_seconds"]), statistics.median(r["parquet_seconds"])
    print(f"{tuples:,} tuples of traffic (one hour), {r['parquet_files']} Parquet files "
          f"(export {r['export_seconds']:.1f} s, not timed below)")
    print(f"load average before {r['load_before'][0]:.2f}, after {r['load_after'][0]:.2f} (2 cores)")
    for i, s in enumerate(r["replay_seconds"], 1):
        print(f"heavy replay {i}      {s:6.1f} s  {tuples / s:>12,.0f} source rows/s   ({r['replay_rows']:,} rows out)")
    print(f"heavy replay median {replay_med:6.1f} s  {tuples / replay_med:>12,.0f} source rows/s")
    for i, s in enumerate(r["parquet_seconds"], 1):
        print(f"Parquet query {i}     {s:6.1f} s  {tuples / s:>12,.0f} rows/s   ({r['parquet_rows']:,} rows out)")
    print(f"Parquet median      {query_med:6.1f} s  {tuples / query_med:>12,.0f} rows/s")
    runs = len(r["replay_seconds"])
    print(f"per_minute worker   {r['spark_jobs']} Spark jobs, {r['spark_s']:.1f} s in Spark (staging included) "
          f"over the {runs} timed runs: {r['spark_jobs'] / runs:.1f} jobs, {r['spark_s'] / runs:.1f} s a run")
    ps = r["ps"]
    if ps.get("spark_jobs") is not None:
        print(f"  ramen ps --json   pid {ps['pid'] or '-'}: spark_jobs {ps['spark_jobs']}, spark_s {ps['spark_s']:.1f}, "
              f"cpu_s {ps['cpu_s']:.1f} (the last worker process only)")
    print(f"same result as the Parquet query: {r['same_result']}")
    factor = replay_med / query_med
    print(f"goal: heavy replay <= {GOAL_PARQUET_FACTOR:g}x the Parquet batch query: {factor:.2f}x "
          f"{'pass' if factor <= GOAL_PARQUET_FACTOR else 'MISS'}")


def print_cluster_report(local: dict, cluster: dict) -> None:
    local_med = statistics.median(local["replay_seconds"])
    cluster_med = statistics.median(cluster["replay_seconds"])
    query_med = statistics.median(cluster["parquet_seconds"])
    tuples = cluster["source_tuples"]
    print(f"cluster: {tuples:,} tuples; replays {', '.join(f'{s:.1f}' for s in cluster['replay_seconds'])} s "
          f"(median {cluster_med:.1f} s, {tuples / cluster_med:,.0f} source rows/s, staging directory); "
          f"Parquet query median {query_med:.1f} s; same result: {cluster['same_result']}")
    print(f"cluster without staging (chunks over Spark Connect): {cluster['chunks_seconds']:.1f} s, "
          f"same result: {cluster['chunks_same']}")
    rss = cluster.get("driver_peak_rss_mb")
    print(f"Connect driver peak RSS: {f'{rss:,.0f} MiB' if rss is not None else 'unknown'} (default 1 GiB heap)")
    to_local, to_query = cluster_med / local_med, cluster_med / query_med
    print(f"goal: cluster replay <= {GOAL_CLUSTER_FACTOR:g}x the local one: {to_local:.2f}x "
          f"{'pass' if to_local <= GOAL_CLUSTER_FACTOR else 'MISS'}")
    print(f"goal: cluster replay <= {GOAL_PARQUET_FACTOR:g}x the cluster's Parquet query: {to_query:.2f}x "
          f"{'pass' if to_query <= GOAL_PARQUET_FACTOR else 'MISS'}")


if __name__ == "__main__":
    sys.exit(main())

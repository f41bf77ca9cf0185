"""`ramen ps [--json] [--all]`: the workers of a site, as the choreographer and supervisor see them.

Reads the worker keys (what the choreographer decided), the instance keys (the process the
supervisor runs), the stats keys (counts, CPU, memory) and the runs that ended (the last exit) of
one site (ramen/worker_keys.py). A value that does not follow its contract shows as unknown.
"""

from __future__ import annotations

import json

from ramen import keyspace, supervisor_stats
from ramen.cli import conf
from ramen.message import LIVE_CHANNEL
from ramen.worker_keys import ContractError, WorkerInstance, WorkerRuns, WorkerSpec, WorkerStats

IDENTITY = "user"
NONE = "-"
COLUMNS = ("FUNCTION", "LAZY", "USED", "RUNNING", "PID", "IN", "OUT", "REPLAYED", "CPU_S", "RSS_MB", "SPARK",
           "LAST_EXIT")
"""IN and OUT: live tuples; REPLAYED: the tuples it wrote for replays (a source passes a replay's
through: counted with the live ones, its generated 13 M read 26.8 M)."""
BYTES_PER_MB = 1024 * 1024


def add_parser(sub) -> None:
    parser = sub.add_parser("ps",
                            description="List the workers of a site. Without --all, only those used or running.")
    parser.add_argument("--all", action="store_true",
                        help="also unused workers that are not running, and the processes the supervisor keeps "
                             "started ahead")
    parser.add_argument("--json", action="store_true", help="one JSON object per worker")
    conf.add_arguments(parser, IDENTITY, site=True)
    parser.set_defaults(run=run)


def collect(client, site: str) -> list[dict]:
    """One row per function of a loaded program that the choreographer knows (its worker key), and
    per function still running, sorted by name. The stats and defunct runs the supervisor keeps of a
    killed program's workers stay in the confserver, but those functions are gone: no row."""
    rows: dict[str, dict] = {}
    for entry in client.glob(f"{keyspace.workers_prefix(site)}/*/*/*"):
        name = keyspace.qualified_name_of(entry.key)
        leaf = entry.key.rsplit("/", 1)[1]
        row = rows.setdefault(name, {"function": name, "worker": None, "instance": None, "stats": None,
                                     "last_run": None})
        if leaf in _LEAVES:
            row[leaf] = _typed(_LEAVES[leaf], entry)
    for entry in client.glob(keyspace.function_key(site, "*/*", "instances/*")):
        runs = _typed(WorkerRuns, entry)
        row = rows.get(keyspace.qualified_name_of(entry.key))
        if row is not None and runs is not None and runs.runs:
            last = runs.runs[-1]
            if row["last_run"] is None or (last.ended_us or 0) > (row["last_run"].ended_us or 0):
                row["last_run"] = last
    loaded = set(client.children(keyspace.PROGRAMS))
    # The worker key lingers while the choreographer is down after a kill: the program key decides.
    return [_row(r) for name, r in sorted(rows.items())
            if r["instance"] or (r["worker"] is not None and name.split("/", 1)[0] in loaded)]


_LEAVES = {"worker": WorkerSpec, "instance": WorkerInstance, "stats": WorkerStats}


def _typed(kind, entry):
    try:
        return kind.from_value(entry.value, entry.key)
    except ContractError:
        return None


def _row(r: dict) -> dict:
    worker, instance, stats, last_run = r["worker"], r["instance"], r["stats"], r["last_run"]
    live = _live_counts(stats)
    return {"function": r["function"], "lazy": worker.lazy if worker else None,
            "used": worker.is_used if worker else False, "running": instance is not None,
            "pid": instance.pid if instance else None, "tuples_in": live[0], "tuples_out": live[1],
            "replayed_in": stats.tuples_in - live[0] if stats else None,
            "replayed_out": stats.tuples_out - live[1] if stats else None, "cpu_s": stats.cpu_s if stats else None,
            "rss_bytes": stats.rss_bytes if stats else None, "spark_jobs": stats.spark_jobs if stats else None,
            "spark_s": stats.spark_s if stats else None,
            "last_exit": last_run.exit_status if last_run else None,
            "replays": list(worker.replays) if worker else []}


def _live_counts(stats) -> tuple[int | None, int | None]:
    """(in, out) of the live channel; a record without channels (an older worker's) has only totals."""
    if stats is None:
        return None, None
    if not stats.channels:
        return stats.tuples_in, stats.tuples_out
    live = stats.channels.get(LIVE_CHANNEL)
    return (live.tuples_in, live.tuples_out) if live is not None else (0, 0)


def collect_replayers(client, site: str) -> list[dict]:
    """One row per replayer of the site (they run while they have channels to serve)."""
    from ramen.replay.contract import ReplayerAssignment, ReplayerStats
    rows = []
    for entry in client.glob(f"{keyspace.replayers_prefix(site)}/*"):
        try:
            spec = ReplayerAssignment.from_value(entry.value, entry.key)
        except ContractError:
            continue  # not a replayer's assignment: nothing runs for it
        stats = client.get_or_none(keyspace.replayer_stats_key(site, spec.id))
        try:
            rows_out = ReplayerStats.from_value(stats.value).rows_out if stats is not None else None
        except ContractError:
            rows_out = None
        rows.append({"function": f"replayer {spec.id} of {spec.source}",
                     "lazy": None, "used": True, "running": True, "pid": spec.pid, "tuples_in": None,
                     "tuples_out": None, "replayed_in": None, "replayed_out": rows_out, "cpu_s": None,
                     "rss_bytes": None, "spark_jobs": None, "spark_s": None, "last_exit": None,
                     "replays": [c.channel for c in spec.channels]})
    return rows


def collect_standby(client, site: str) -> list[dict]:
    """The processes the supervisor keeps started ahead of need (shown with --all: they run, unused)."""
    try:
        stats = supervisor_stats.read(client, site)
    except ContractError:
        return []
    if stats is None:
        return []
    rows = []
    for standby, what in ((stats.spare_worker, "spare worker (waiting)"),
                          (stats.warm_replayer, "warm replayer (waiting)")):
        if standby is not None:
            rows.append({"function": what, "lazy": None, "used": False, "running": True, "pid": standby.pid,
                         "tuples_in": None, "tuples_out": None, "replayed_in": None, "replayed_out": None,
                         "cpu_s": None, "rss_bytes": None,
                         "spark_jobs": None, "spark_s": None, "last_exit": None, "replays": []})
    return rows


def _spark(row: dict) -> str:
    """A heavy worker's Spark jobs and their total time: `3 jobs 1.2s`."""
    if row["spark_jobs"] is None:
        return NONE
    return f"{row['spark_jobs']} jobs {row['spark_s'] or 0:.1f}s"


def run(args) -> int:
    with conf.connected(args) as client:
        rows = collect(client, args.site) + collect_replayers(client, args.site)
        standby = collect_standby(client, args.site) if args.all else []
    if not args.all:
        rows = [r for r in rows if r["used"] or r["running"]]
    rows += standby
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    table = [COLUMNS] + [(r["function"], _flag(r["lazy"]), _flag(r["used"]), _flag(r["running"]), _show(r["pid"]),
                          _show(r["tuples_in"]), _show(r["tuples_out"]), _show(r["replayed_out"]),
                          _show(r["cpu_s"], "{:.1f}"),
                          _show(r["rss_bytes"] and r["rss_bytes"] / BYTES_PER_MB, "{:.0f}"), _spark(r),
                          _show(r["last_exit"]))
                         for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def _flag(value) -> str:
    return NONE if value is None else ("yes" if value else "no")


def _show(value, fmt: str = "{}") -> str:
    return NONE if value is None else fmt.format(value)

"""`ramen stat`: the counters of this host, like AeronStat: positions, bytes, back pressure and drops
of the logs, and what the services did (supervisor restarts, merged requests, choreographer
recomputes, bytes recorded and read), grouped by the process that owns them. The counters of a
process that is gone stay until a later allocation reclaims them: its heading says `(exited)`, and
`--json` gives each counter's `owner_alive`. Replayers that ended leave their figures (bytes read,
rollups) on purpose; a dashboard makes dozens an hour, so they are one line unless `--all`."""

from __future__ import annotations

import json
import sys
import time

from ramen import paths
from ramen.cli.errors import UserError
from ramen.processes import running, start_lower_bound_ms
from ramen.transport.counters import (COUNTER_DROPPED, SERVICE_COUNTER_TYPE_IDS, CounterInfo, CountersFile,
                                      CountersFileError)

WATCH_INTERVAL_S = 1.0
_SERVICE_OF_TYPE = {type_id: service for service, ids in SERVICE_COUNTER_TYPE_IDS.items() for type_id in ids.values()}


def add_parser(sub) -> None:
    parser = sub.add_parser("stat",
                            description="Print every allocated counter of the counters file, by process.")
    parser.add_argument("--counters", metavar="FILE", default=None,
                        help=f"counters file (default: $RAMEN_DIR/{paths.COUNTERS_FILE_NAME}, now {paths.counters_path()})")
    parser.add_argument("--json", action="store_true", help="one JSON object per snapshot (every counter)")
    parser.add_argument("--all", action="store_true",
                        help="list the counters replayers that ended left too (else counted in one line)")
    parser.add_argument("--watch", action="store_true", help="print again every --interval seconds until interrupted")
    parser.add_argument("--interval", type=float, default=WATCH_INTERVAL_S, metavar="S",
                        help=f"seconds between snapshots with --watch (default {WATCH_INTERVAL_S})")
    parser.set_defaults(run=run)


def run(args) -> int:
    path = args.counters or paths.counters_path()
    try:
        counters = CountersFile.open(path, create=False)
    except CountersFileError as e:
        raise UserError(str(e)) from None
    try:
        while True:
            _print_snapshot(counters, args.json, args.all)
            if not args.watch:
                return 0
            sys.stdout.flush()
            time.sleep(args.interval)
    finally:
        counters.close()


def _print_snapshot(counters: CountersFile, as_json: bool, everything: bool = False) -> None:
    rows = list(counters.counters())
    gone = _owners_gone(rows)
    if as_json:
        print(json.dumps({
            "file": str(counters.path), "timestamp": time.time(), **counters.header,
            "counters": [{"id": c.id, "type_id": c.type_id, "type": c.type_name, "label": c.label, "value": c.value,
                          "registration_id": c.registration_id, "owner_pid": c.owner_id,
                          "owner_alive": not gone[c.id], "dropped": c.status == COUNTER_DROPPED}
                         for c in rows],
        }))
        return
    header = counters.header
    print(f"{time.strftime('%H:%M:%S')} - {counters.path}: {len(rows)} counters of {counters.capacity}, "
          f"file created by pid {header['pid']}")
    print("=" * 80)
    ended_replayers = 0
    for (pid, reason), group in _by_process(rows, gone).items():
        if reason and not everything and all(_SERVICE_OF_TYPE.get(c.type_id) == "replayer" for c in group):
            ended_replayers += 1
            continue
        print(_process_heading(pid, group, reason))
        for c in group:
            note = " (dropped)" if c.status == COUNTER_DROPPED else ""
            print(f"{c.id:>6}: {c.value:>20,} - {c.label}{note}")
    if ended_replayers:
        print(f"({ended_replayers} replayers that ended left their figures: --all lists them)")


def _by_process(rows: list[CounterInfo], gone: dict[int, str]) -> dict[tuple[int, str], list[CounterInfo]]:
    """The counters by owner pid and whether that owner is gone (a reused pid holds the counters of
    two processes), processes in the order of their first counter."""
    groups: dict[tuple[int, str], list[CounterInfo]] = {}
    for c in rows:
        groups.setdefault((c.owner_id, gone[c.id]), []).append(c)
    return groups


def _owners_gone(rows: list[CounterInfo]) -> dict[int, str]:
    """By counter id, why the process that owned it is gone ("" while it runs): it exited (a zombie
    not yet reaped counts, it counts nothing more), or its pid now belongs to a process that started
    after the counter's last sign of life (its heartbeat). An owner pid <= 0 (none recorded), or a
    heartbeat of 0 (not written by ramen), is not judged."""
    runs: dict[int, bool] = {}
    starts: dict[int, int | None] = {}
    gone = {}
    for c in rows:
        pid = c.owner_id
        reason = ""
        if pid > 0:
            if pid not in runs:
                runs[pid] = running(pid)
                starts[pid] = start_lower_bound_ms(pid) if runs[pid] else None
            start_ms = starts[pid]
            if not runs[pid]:
                reason = "exited"
            elif start_ms is not None and 0 < c.heartbeat_ms < start_ms:
                reason = "exited; its pid is now another process's"
        gone[c.id] = reason
    return gone


def _process_heading(pid: int, group: list[CounterInfo], gone: str) -> str:
    """`pid 4242: supervisor s1`: the process, the services it runs (by their counters' keys), and
    whether it has exited (its counters wait for the next run to free them)."""
    services = []
    for c in group:
        if c.type_id in _SERVICE_OF_TYPE:
            instance = c.key.rstrip(b"\0").decode(errors="replace")
            name = f"{_SERVICE_OF_TYPE[c.type_id]} {instance}".rstrip()
            if name not in services:
                services.append(name)
    return f"pid {pid}" + (f": {', '.join(services)}" if services else "") + (f" ({gone})" if gone else "")

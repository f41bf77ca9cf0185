"""`ramen stat`: the counters of this host (positions, bytes, back pressure, drops), like AeronStat."""

from __future__ import annotations

import json
import sys
import time

from ramen import paths
from ramen.cli.errors import UserError
from ramen.transport.counters import COUNTER_DROPPED, CountersFile, CountersFileError

WATCH_INTERVAL_S = 1.0


def add_parser(sub) -> None:
    parser = sub.add_parser("stat",
                            description="Print every allocated counter of the counters file.")
    parser.add_argument("--counters", metavar="FILE", default=None,
                        help=f"counters file (default: $RAMEN_DIR/{paths.COUNTERS_FILE_NAME}, now {paths.counters_path()})")
    parser.add_argument("--json", action="store_true", help="one JSON object per snapshot")
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
            _print_snapshot(counters, args.json)
            if not args.watch:
                return 0
            sys.stdout.flush()
            time.sleep(args.interval)
    finally:
        counters.close()


def _print_snapshot(counters: CountersFile, as_json: bool) -> None:
    rows = list(counters.counters())
    if as_json:
        print(json.dumps({
            "file": str(counters.path), "timestamp": time.time(), **counters.header,
            "counters": [{"id": c.id, "type_id": c.type_id, "type": c.type_name, "label": c.label, "value": c.value,
                          "registration_id": c.registration_id, "owner_pid": c.owner_id,
                          "dropped": c.status == COUNTER_DROPPED} for c in rows],
        }))
        return
    header = counters.header
    print(f"{time.strftime('%H:%M:%S')} - {counters.path}: {len(rows)} counters of {counters.capacity}, "
          f"file created by pid {header['pid']}")
    print("=" * 80)
    for c in rows:
        note = " (dropped)" if c.status == COUNTER_DROPPED else ""
        print(f"{c.id:>4}: {c.value:>20,} - {c.label} [pid {c.owner_id}]{note}")

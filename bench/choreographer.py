"""Choreographer benchmark: how soon a new replay's functions are marked used, and a recompute's cost.

A real built-in confserver and the choreographer service (in this process, on its own thread) over a
program of --functions lazy functions in a chain. For each of --replays replays it measures, from
the `set` of `replays/<channel>` to the arrival of the last worker key it changes at a watching
client (the fast path); then deletes the replay and measures the recompute that unmarks them.

Run: `.venv/bin/python bench/choreographer.py [--functions N] [--replays N] [--json]`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import confserver  # noqa: E402
from choreographer.service import Choreographer, run  # noqa: E402
from ramen import keyspace  # noqa: E402
from ramen.replay.contract import ReplayRequest  # noqa: E402
from ramen.replay.plan import ReplayPlan  # noqa: E402
from tests.choreographer.programs import program  # noqa: E402
from tests.confserver.builtin import BuiltinServer  # noqa: E402

SITE = "bench"


def percentiles(values_ms: list[float]) -> dict:
    ordered = sorted(values_ms)
    return {"p50_ms": ordered[len(ordered) // 2], "p99_ms": ordered[int(len(ordered) * 0.99)], "max_ms": ordered[-1]}


def wait_for_keys(watch, keys: set[str], want_used: bool) -> None:
    pending = set(keys)
    while pending:
        event = watch.next(30)
        if event is None:
            raise RuntimeError(f"worker keys never changed: {sorted(pending)[:3]}")
        if event.key in pending and event.entry is not None and event.entry.value["is_used"] is want_used:
            pending.discard(event.key)


def request_along(path: list[str]) -> dict:
    """A replay of path[-1] answered from path[0]'s archive, through the rest of the path."""
    plan = ReplayPlan(path[-1], 0, 1, (path[0],), tuple(sorted(zip(path, path[1:]))), tuple(sorted(path)))
    return ReplayRequest(plan.target, plan.since_us, plan.until_us, plan, "/nowhere", created_us=0,
                         timeout_s=300.0, no_merge=False, site=SITE).to_value()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=200, help="functions in the chain (default %(default)s)")
    parser.add_argument("--replays", type=int, default=50, help="replays measured (default %(default)s)")
    parser.add_argument("--path", type=int, default=5, help="functions on each replay's path (default %(default)s)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chain = [("f0", False, [])] + [(f"f{i}", True, [f"bench/f{i - 1}"]) for i in range(1, args.functions)]
    with tempfile.TemporaryDirectory(prefix="ramen-bench-chor-") as tmp:
        server = BuiltinServer(Path(tmp) / "conf").start()
        try:
            def connect(identity):
                return confserver.connect(server.url, identity=identity, auth_file=server.auth_file)
            admin, chor_client = connect("admin"), connect("choreographer")
            service = Choreographer(chor_client, SITE)
            stop = threading.Event()
            threading.Thread(target=run, args=(service, stop), daemon=True).start()
            watch = admin.watch(keyspace.worker_pattern(SITE))
            admin.set(keyspace.program_key("bench"), program("bench", chain).to_dict())
            wait_for_keys(watch, {keyspace.worker_key(SITE, "bench/f0")}, True)
            while watch.next(1.0) is not None:
                pass
            marks, unmarks = [], []
            for n in range(args.replays):
                start_at = 1 + (n * args.path) % (args.functions - args.path)
                path = [f"bench/f{i}" for i in range(start_at, start_at + args.path)]
                keys = {keyspace.worker_key(SITE, f) for f in path}
                channel = admin.next_sequence(keyspace.REPLAY_CHANNEL_SEQUENCE)
                t0 = time.perf_counter()
                admin.set(keyspace.replay_key(channel), request_along(path))
                wait_for_keys(watch, keys, True)
                marks.append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                admin.delete(keyspace.replay_key(channel))
                wait_for_keys(watch, keys, False)
                unmarks.append((time.perf_counter() - t0) * 1e3)
            stop.set()
            report = {"functions": args.functions, "replays": args.replays, "path": args.path,
                      "mark_used": percentiles(marks), "unmark_after_delete": percentiles(unmarks),
                      "counters": vars(service.counters)}
            watch.close()
            service.close()
            admin.close()
            chor_client.close()
        finally:
            server.stop()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{args.functions} functions, {args.replays} replays of {args.path} functions each")
    for what in ("mark_used", "unmark_after_delete"):
        r = report[what]
        print(f"{what:20} p50 {r['p50_ms']:6.1f} ms   p99 {r['p99_ms']:6.1f} ms   max {r['max_ms']:6.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

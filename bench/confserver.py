"""Confserver benchmark: set, get and watch latency for both backends, in one run.

For each backend (a real built-in server process, and a real ZooKeeper server if this machine has
one) it measures, from one client in this process:
- set: one `set` at a time (each acknowledged only once it is on disk); p50, p99, ops/s;
- set x4: four clients setting at once (the built-in server commits them in shared fsyncs);
- get: one `get` at a time;
- watch: from the call of `set` in one client to the event's arrival at another client's watch.

Run: `.venv/bin/python bench/confserver.py [--ops N] [--json]`.
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
from confserver import auth  # noqa: E402
from tests.confserver.builtin import BuiltinServer  # noqa: E402
from tests.confserver.zkserver import ZooKeeperServer, missing_prerequisite  # noqa: E402

PARALLEL_CLIENTS = 4
VALUE = {"is_used": True, "parents": ["net/traffic"], "signature": "0123456789abcdef"}


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def summary(latencies_ns: list[int], elapsed_s: float, ops: int) -> dict:
    ordered = sorted(latencies_ns)
    return {"p50_us": ordered[len(ordered) // 2] / 1e3, "p99_us": ordered[int(len(ordered) * 0.99)] / 1e3,
            "ops_per_s": ops / elapsed_s}


def timed(call, count: int) -> dict:
    latencies = []
    start = time.perf_counter()
    for i in range(count):
        t0 = time.perf_counter_ns()
        call(i)
        latencies.append(time.perf_counter_ns() - t0)
    return summary(latencies, time.perf_counter() - start, count)


def parallel_sets(connect, count: int) -> dict:
    clients = [connect() for _ in range(PARALLEL_CLIENTS)]
    latencies: list[int] = []
    lock = threading.Lock()

    def run(client, n):
        mine = []
        for i in range(count // PARALLEL_CLIENTS):
            t0 = time.perf_counter_ns()
            client.set(f"bench/par/{n}/{i % 100}", VALUE)
            mine.append(time.perf_counter_ns() - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=run, args=(c, n)) for n, c in enumerate(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for c in clients:
        c.close()
    return summary(latencies, elapsed, len(latencies))


def watch_latency(connect, count: int) -> dict:
    with connect() as writer, connect() as reader:
        watch = reader.watch("bench/watch")
        while watch.next(10).kind is not confserver.EventKind.SYNCED:
            pass
        latencies = []
        start = time.perf_counter()
        for i in range(count):
            t0 = time.perf_counter_ns()
            writer.set("bench/watch/k", i)
            while True:
                event = watch.next(10)
                if event is None:
                    raise RuntimeError("a watch event never arrived")
                if event.entry is not None and event.entry.value == i:
                    break
            latencies.append(time.perf_counter_ns() - t0)
        elapsed = time.perf_counter() - start
        watch.close()
    return summary(latencies, elapsed, count)


def measure(name: str, connect, ops: int) -> dict:
    results = {}
    with connect() as client:
        for i in range(100):  # warm up connections, the JIT of ZooKeeper, the page cache
            client.set(f"bench/warm/{i}", VALUE)
        progress(f"{name}: set")
        results["set"] = timed(lambda i: client.set(f"bench/keys/{i % 500}", VALUE), ops)
        progress(f"{name}: get")
        results["get"] = timed(lambda i: client.get(f"bench/keys/{i % 500}"), ops)
    progress(f"{name}: set x{PARALLEL_CLIENTS}")
    results[f"set x{PARALLEL_CLIENTS}"] = parallel_sets(connect, ops)
    progress(f"{name}: watch")
    results["watch"] = watch_latency(connect, max(ops // 4, 50))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="operations per measurement (default %(default)s)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = {}
    with tempfile.TemporaryDirectory(prefix="ramen-bench-conf-") as tmp:
        tmp = Path(tmp)
        server = BuiltinServer(tmp / "builtin").start()
        try:
            report["builtin"] = measure("builtin", lambda: confserver.connect(
                server.url, identity="admin", auth_file=server.auth_file), args.ops)
        finally:
            server.stop()
        reason = missing_prerequisite()
        if reason:
            progress(f"zookeeper: skipped, {reason}")
        else:
            auth_file = tmp / "zk-auth.json"
            auth.load_or_create(auth_file)
            with ZooKeeperServer(tmp / "zk") as zk:
                report["zookeeper"] = measure("zookeeper", lambda: confserver.connect(
                    zk.url("bench"), identity="admin", auth_file=auth_file), args.ops)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{'backend':10} {'operation':10} {'p50 µs':>9} {'p99 µs':>9} {'ops/s':>9}")
    for backend, results in report.items():
        for operation, r in results.items():
            print(f"{backend:10} {operation:10} {r['p50_us']:9.0f} {r['p99_us']:9.0f} {r['ops_per_s']:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

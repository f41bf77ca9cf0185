"""Dashboard benchmark: `ramen httpd` rendering charts over an hour of generated traffic, through
real processes (ramen start --daemon with examples/replay.toml: a generator back-filling the last
hour at 3,000 tuples/s, 10.8 M tuples, archived; lazy per_minute and top_talkers in Python over it;
every function with factors = ["host"]).

It measures, in this order:
- refresh: a first render of "the last 6 h" (the archive holds one of them), then, after
  --refresh-after seconds, the same render again, as a dashboard on auto-refresh does: time and
  archive bytes of each (goal: the refresh reads <= 5% of the first's bytes);
- one panel: one render of per_minute over the hour (noCache=1), beside `ramen replay` of the same
  function and range as a subprocess (--runs times, medians);
- a dashboard of 20 panels refreshed at once (20 renders of different functions and fields over the
  same source, noCache=1): time and archive bytes against one panel (goals: <= 1.3x the time,
  and each archive byte read once: the bytes of the panel that reads the most, alone, its moving
  window reaching a minute before the range). The dashboard is rendered once first, unmeasured
  (its workers started, as on a dashboard already open), and then its runs alternate with the
  one panel's, so that a drift of the machine's speed weighs on both alike. Then the CPU of each,
  summed over the instance's processes (replayers included), with what a render leaves running
  for 3 s after it (the warm replayer started behind it), less the instance's idle CPU over the
  same time: a figure a slower or busier machine moves less than the time;
- render latency of one panel on auto-refresh ("the last hour", the cache on, so each render
  replays the newest minute: the merge delay included): p50 and p99 of --latency-renders renders
  (goal: p50 <= 1.0 s);
- the same under load: --load renders of up to an hour (noCache, each of its own range) kept
  running at once by as many clients, each asking again as soon as answered (after Retry-After
  when refused 503): the refreshing panel's p50 and p99 (goal: p99 <= 2 s), the long renders
  answered and refused;
- clients that give up: --gone renders of up to an hour whose clients close their connection
  after GONE_AFTER_S: how long the instance still replays for them (its `replays/*` keys).

Archive bytes are the replayers' "bytes read" counters. Run: `.venv/bin/python bench/httpd.py
[--runs N] [--json]` (about three minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import threading
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import confserver  # noqa: E402
from bench.replay import RAMEN, progress, replayer_bytes_read, running_ramen, wait_for_the_hour  # noqa: E402
from ramen import keyspace, paths  # noqa: E402
from ramen.cli.start import INSTANCE_FILE  # noqa: E402
from ramen.processes import command_line, instance_processes  # noqa: E402
from ramen.httpd.state import RELEASE_AFTER_S  # noqa: E402
from supervisor.defaults import QUIET_AFTER_REPLAYS_S  # noqa: E402

PROGRAM = ROOT / "examples" / "replay.toml"
ONE_PANEL = "sumSeries(demo.per_minute.*.bytes)"
WIDEST_PANEL = "movingAverage(sumSeries(demo.traffic.*.bytes), 6)"
"""The panel of the dashboard that reads the most: its moving window reaches 6 steps (a minute)
before the range. The 20 panels read the archive once if they read what it reads alone."""
PANELS = [  # 20 panels over the three functions of one source, as a dashboard would have them
    "sumSeries(demo.per_minute.*.bytes)", "demo.per_minute.*.bytes", "maxSeries(demo.per_minute.*.bytes)",
    "averageSeries(demo.per_minute.*.bytes)", "highestAverage(demo.per_minute.*.bytes, 5)",
    "sumSeries(demo.traffic.*.bytes)", "demo.traffic.*.bytes", "averageSeries(demo.traffic.*.bytes)",
    "minSeries(demo.traffic.*.bytes)", WIDEST_PANEL,
    "sumSeries(demo.top_talkers.*.bytes)", "demo.top_talkers.*.bytes", "maxSeries(demo.top_talkers.*.bytes)",
    "limit(sortByMaxima(demo.top_talkers.*.bytes), 3)", "scale(sumSeries(demo.per_minute.*.bytes), 0.001)",
    "perSecond(sumSeries(demo.per_minute.*.bytes))", "asPercent(demo.per_minute.*.bytes)",
    "summarize(sumSeries(demo.traffic.*.bytes), '5min', 'sum')", "offset(minSeries(demo.per_minute.*.bytes), 1)",
    "keepLastValue(sumSeries(demo.top_talkers.*.bytes))",
]
GOAL_PANELS_FACTOR = 1.3
GOAL_REFRESH_BYTES = 0.05
GOAL_P50_S = 1.0
GOAL_LOADED_P99_S = 2.0
DEFAULT_LOAD = 50
DEFAULT_GONE = 200
LONG_PANELS = ["sumSeries(demo.per_minute.*.bytes)", "sumSeries(demo.traffic.*.bytes)",
               "sumSeries(demo.top_talkers.*.bytes)"]
"""What the long renders of the load and of the clients that give up chart, in turn."""
GONE_AFTER_S = 2.0
"""How long a client that gives up waits for its render."""
GONE_WAIT_S = 300.0
"""How long the clients-gone phase waits for the instance to stop replaying for them."""
DEFAULT_RUNS = 5
"""Alternating runs of one panel and of the dashboard: the ratio of their medians, over runs a drift
of the machine's speed moves by +-0.1x one by one."""
DEFAULT_REFRESH_AFTER_S = 10.0
DEFAULT_LATENCY_RENDERS = 20
LATENCY_PERIOD_S = 1.0
"""Between two renders of the latency run: the newest minute changes, as on a refreshing dashboard."""
HTTP_TIMEOUT_S = 300
SETTLE_S = QUIET_AFTER_REPLAYS_S + 2.0
"""After a render whose CPU is measured: what it left running is its cost too (a replayer exiting;
the warm replayer the supervisor starts QUIET_AFTER_REPLAYS_S after the last replay ended, whose
imports take about a second). The idle CPU is sampled after as long, so that it holds none of it:
with one second, a start-up fell into the sample and made the idle CPU three times what it is."""
IDLE_SAMPLE_S = 3.0
"""How long the instance's idle CPU (the workers' duty cycles) is measured, to take it out."""


def render(url: str, target: str, since_s: int | str, until_s: int | str, **extra) -> list:
    query = urllib.parse.urlencode({"target": target, "from": since_s, "until": until_s, "format": "json", **extra})
    with urllib.request.urlopen(f"{url}render?{query}", timeout=HTTP_TIMEOUT_S) as answer:
        return json.loads(answer.read())


def archive_bytes() -> int:
    return sum(replayer_bytes_read(paths.counters_path()).values())


def timed(work) -> tuple[float, int, object]:
    """Seconds, archive bytes read, and the result of work()."""
    before = archive_bytes()
    started = time.perf_counter()
    result = work()
    return time.perf_counter() - started, archive_bytes() - before, result


def instance_cpu_s(base: Path) -> float:
    """CPU seconds the instance's processes (those `ramen stop` would stop) have used so far, with
    the children they reaped (the supervisor's replayers): what renders cost the machine, whichever
    process spent it."""
    token = (base / "run" / INSTANCE_FILE).read_text().strip()
    total = 0
    for pid in instance_processes(token):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def cpu_of(base: Path, work, idle_cpu_per_s: float) -> float:
    """CPU seconds of the instance's processes for work() and what it leaves running for SETTLE_S
    after (a replayer exiting, a spare warming up), less what they spend idle in that time."""
    before, started = instance_cpu_s(base), time.perf_counter()
    work()
    time.sleep(SETTLE_S)
    return instance_cpu_s(base) - before - idle_cpu_per_s * (time.perf_counter() - started)


def measure(base: Path, env: dict, args: argparse.Namespace) -> dict:
    since_us, until_us = wait_for_the_hour()
    since_s, until_s = since_us // 1_000_000, until_us // 1_000_000
    url = (base / "run" / "httpd.url").read_text().strip()
    report: dict = {"minutes": (until_s - since_s) // 60}
    if not args.loaded_only:
        report.update(measure_dashboard(base, env, url, since_s, until_s, args.runs, args.refresh_after))

    renders = args.latency_renders
    progress(f"latency: {renders} refreshes of the last hour, {LATENCY_PERIOD_S:g} s apart")
    render(url, ONE_PANEL, "-1h", "now")  # the hour cached, as on a dashboard already open
    latencies = []
    for _ in range(renders):
        time.sleep(LATENCY_PERIOD_S)
        latencies.append(timed(lambda: render(url, ONE_PANEL, "-1h", "now"))[0])
    report["latency"] = {"renders_s": latencies}

    rss_before = httpd_rss_mb(base)
    progress(f"under load: {renders} refreshes of the last hour while {args.load} long renders run")
    report["loaded"] = under_load(url, since_s, until_s, args.load, renders)
    progress(f"{args.gone} long renders whose clients leave after {GONE_AFTER_S:g} s")
    report["gone"] = clients_gone(base, url, since_s, until_s, args.gone)
    rss_after = httpd_rss_mb(base)
    time.sleep(RELEASE_AFTER_S + 2)
    report["httpd_rss_mb"] = {"before": rss_before, "after": rss_after, "released": httpd_rss_mb(base)}
    return report


def httpd_rss_mb(base: Path) -> float:
    """The resident memory of the instance's httpd."""
    token = (base / "run" / INSTANCE_FILE).read_text().strip()
    for pid in instance_processes(token):
        if "ramen.httpd.service" in command_line(pid):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:  # gone meanwhile
                continue
            return int(status.split("VmRSS:")[1].split()[0]) / 1024
    raise SystemExit("bench: the instance's httpd is not running")


def measure_dashboard(base: Path, env: dict, url: str, since_s: int, until_s: int, runs: int,
                      refresh_after_s: float) -> dict:
    """A refresh of the last 6 h; one panel against 20 at once, in time and CPU; `ramen replay`."""
    report = {}
    progress("refresh: the last 6 h, then again")
    first_s, first_bytes, _ = timed(lambda: render(url, ONE_PANEL, "-6h", "now"))
    time.sleep(refresh_after_s)
    again_s, again_bytes, _ = timed(lambda: render(url, ONE_PANEL, "-6h", "now"))
    report["refresh"] = {"first_s": first_s, "first_bytes": first_bytes, "again_s": again_s,
                         "again_bytes": again_bytes, "after_s": refresh_after_s}

    progress(f"one panel over the hour, then {len(PANELS)} panels at once, in turn ({runs} runs)")
    with ThreadPoolExecutor(len(PANELS)) as pool:
        def one_panel():
            return render(url, ONE_PANEL, since_s, until_s, noCache=1)

        def dashboard():
            return list(pool.map(lambda t: render(url, t, since_s, until_s, noCache=1), PANELS))

        dashboard()  # its workers started, as on a dashboard already open: the runs time its refreshes
        panel, panels = [], []
        for _ in range(runs):  # in turn, so that the machine's drift weighs on both alike
            panel.append(timed(one_panel))
            panels.append(timed(dashboard))
        progress(f"CPU of one panel and of {len(PANELS)} panels ({runs} runs each, {SETTLE_S:g} s after each)")
        time.sleep(SETTLE_S)
        before = instance_cpu_s(base)
        time.sleep(IDLE_SAMPLE_S)
        idle_cpu_per_s = (instance_cpu_s(base) - before) / IDLE_SAMPLE_S
        cpu = [(cpu_of(base, one_panel, idle_cpu_per_s), cpu_of(base, dashboard, idle_cpu_per_s)) for _ in range(runs)]
    ramen = [*RAMEN, "replay", "--since", str(since_s), "--until", str(until_s), "--format", "csv", "demo/per_minute"]
    replays = [timed(lambda: subprocess.run(ramen, env=env, capture_output=True, check=True)) for _ in range(runs)]
    widest_bytes = timed(lambda: render(url, WIDEST_PANEL, since_s, until_s, noCache=1))[1]
    report["one_panel"] = {"runs_s": [p[0] for p in panel], "bytes": panel[0][1], "widest_bytes": widest_bytes,
                           "replay_runs_s": [r[0] for r in replays], "cpu_s": [c[0] for c in cpu]}
    report["panels"] = {"count": len(PANELS), "runs_s": [p[0] for p in panels], "bytes": [p[1] for p in panels],
                        "cpu_s": [c[1] for c in cpu]}
    report["idle_cpu_per_s"] = idle_cpu_per_s
    return report


def long_render(url: str, k: int, since_s: int, until_s: int, timeout_s: float = HTTP_TIMEOUT_S) -> int:
    """The k-th long render (noCache, a range of its own within the hour): 200, or 503 after
    sleeping its Retry-After (the client does as asked)."""
    target = LONG_PANELS[k % len(LONG_PANELS)]
    since = since_s + 60 * (k // len(LONG_PANELS) % 30)
    query = urllib.parse.urlencode({"target": target, "from": since, "until": until_s, "format": "json",
                                    "noCache": 1})
    try:
        with urllib.request.urlopen(f"{url}render?{query}", timeout=timeout_s) as answer:
            answer.read()
            return answer.status
    except urllib.error.HTTPError as e:
        if e.code == 503:
            time.sleep(float(e.headers.get("Retry-After", "1")))
        return e.code


def under_load(url: str, since_s: int, until_s: int, load: int, renders: int) -> dict:
    """The refreshing panel's latencies while `load` clients keep a long render each running."""
    stop = threading.Event()
    statuses: list[int] = []

    def client(k: int) -> None:
        while not stop.is_set():
            statuses.append(long_render(url, k, since_s, until_s))
            k += load

    with ThreadPoolExecutor(load) as pool:
        clients = [pool.submit(client, k) for k in range(load)]
        time.sleep(LATENCY_PERIOD_S * 5)  # every long render asked, the first ones replaying
        latencies = []
        for _ in range(renders):
            time.sleep(LATENCY_PERIOD_S)
            latencies.append(timed(lambda: render(url, ONE_PANEL, "-1h", "now"))[0])
        stop.set()
        for done in clients:
            done.result()
    return {"load": load, "renders_s": latencies, "answered": statuses.count(200), "refused": statuses.count(503),
            "other": len(statuses) - statuses.count(200) - statuses.count(503)}


def replays_asked(client) -> int:
    return len(client.glob(f"{keyspace.REPLAYS}/*"))


def clients_gone(base: Path, url: str, since_s: int, until_s: int, gone: int) -> dict:
    """Seconds the instance still replays after `gone` clients left their long renders."""
    conf = (base / "run" / "ready").read_text().strip()
    with confserver.connect(conf, identity="user", auth_file=base / "confserver" / "auth.json") as client:
        with ThreadPoolExecutor(gone + 1) as pool:
            waiting, peak = threading.Event(), [0]

            def sample() -> None:
                while not waiting.is_set():
                    peak[0] = max(peak[0], replays_asked(client))
                    time.sleep(0.1)

            sampler = pool.submit(sample)
            statuses = list(pool.map(lambda k: _given_up(url, k, since_s, until_s), range(gone)))
            waiting.set()
            sampler.result()
        left = time.perf_counter()
        when_left = replays_asked(client)
        while replays_asked(client) and time.perf_counter() - left < GONE_WAIT_S:
            time.sleep(0.1)
        return {"gone": gone, "replays_peak": peak[0], "replays_when_left": when_left,
                "replays_after_s": time.perf_counter() - left, "replays_left": replays_asked(client),
                "answered_in_time": statuses.count(200)}


def _given_up(url: str, k: int, since_s: int, until_s: int) -> int:
    try:
        return long_render(url, k, since_s, until_s, timeout_s=GONE_AFTER_S)
    except (TimeoutError, urllib.error.URLError):
        return 0


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def print_report(r: dict) -> None:
    if "refresh" in r:
        print_dashboard(r)
    print_latencies(r)


def print_dashboard(r: dict) -> None:
    refresh, one, panels = r["refresh"], r["one_panel"], r["panels"]
    panel_s, replay_s = statistics.median(one["runs_s"]), statistics.median(one["replay_runs_s"])
    many_s = statistics.median(panels["runs_s"])
    print(f"one panel, {r['minutes']} min of per_minute: {panel_s:.2f} s to the JSON answer "
          f"(runs {', '.join(f'{s:.2f}' for s in one['runs_s'])}), `ramen replay` {replay_s:.2f} s; "
          f"{one['bytes']:,} archive bytes")
    print(f"{panels['count']} panels at once: {many_s:.2f} s (runs {', '.join(f'{s:.2f}' for s in panels['runs_s'])}); "
          f"archive bytes {', '.join(f'{b:,}' for b in panels['bytes'])}")
    factor, bytes_factor = many_s / panel_s, max(panels["bytes"]) / max(one["bytes"], 1)
    once = max(panels["bytes"]) / max(one["widest_bytes"], 1)
    print(f"the widest panel alone ({WIDEST_PANEL}, a minute more of the source): {one['widest_bytes']:,} "
          f"archive bytes; the {panels['count']} panels read {bytes_factor:.3f}x one panel's bytes, {once:.3f}x its")
    print(f"goal: {panels['count']} panels <= {GOAL_PANELS_FACTOR:g}x one panel's time, and read each archive byte "
          f"once (1.0x the widest panel's bytes): {factor:.2f}x, {once:.3f}x "
          f"{'pass' if factor <= GOAL_PANELS_FACTOR and once <= 1.0 else 'MISS'}")
    one_cpu, many_cpu = statistics.median(one["cpu_s"]), statistics.median(panels["cpu_s"])
    print(f"CPU, summed over the instance's processes (idle, {r['idle_cpu_per_s']:.2f} s a second, taken out): "
          f"one panel {one_cpu:.2f} s, {panels['count']} panels {many_cpu:.2f} s, {many_cpu / one_cpu:.2f}x")
    share = refresh["again_bytes"] / max(refresh["first_bytes"], 1)
    print(f"refresh of the last 6 h after {refresh['after_s']:g} s: first {refresh['first_s']:.2f} s "
          f"{refresh['first_bytes']:,} bytes, refresh {refresh['again_s']:.2f} s {refresh['again_bytes']:,} bytes")
    print(f"goal: a refresh reads <= {GOAL_REFRESH_BYTES:.0%} of the first render's bytes: {share:.1%} "
          f"{'pass' if share <= GOAL_REFRESH_BYTES else 'MISS'}")


def print_latencies(r: dict) -> None:
    latency = r["latency"]["renders_s"]
    p50, p99 = percentile(latency, 50), percentile(latency, 99)
    print(f"render latency, one panel refreshing the last hour ({len(latency)} renders): p50 {p50:.2f} s, "
          f"p99 {p99:.2f} s")
    print(f"goal: p50 <= {GOAL_P50_S:g} s: {'pass' if p50 <= GOAL_P50_S else 'MISS'}")
    loaded = r["loaded"]
    p50, p99 = percentile(loaded["renders_s"], 50), percentile(loaded["renders_s"], 99)
    print(f"the same while {loaded['load']} long renders run ({loaded['answered']} answered, {loaded['refused']} "
          f"refused 503, {loaded['other']} other): p50 {p50:.2f} s, p99 {p99:.2f} s")
    print(f"goal: p99 <= {GOAL_LOADED_P99_S:g} s: {'pass' if p99 <= GOAL_LOADED_P99_S else 'MISS'}")
    gone = r["gone"]
    print(f"{gone['gone']} long renders whose clients left after {GONE_AFTER_S:g} s ({gone['answered_in_time']} "
          f"answered in time): at most {gone['replays_peak']} replays asked while they waited, "
          f"{gone['replays_when_left']} when the last left, none after "
          f"{gone['replays_after_s']:.1f} s" + (f" ({gone['replays_left']} STILL ASKED)" if gone["replays_left"] else ""))
    rss = r["httpd_rss_mb"]
    print(f"httpd's RSS: {rss['before']:.0f} MB before the long renders, {rss['after']:.0f} MB after them, "
          f"{rss['released']:.0f} MB {RELEASE_AFTER_S + 2:g} s later")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="runs of each timed render (default %(default)s)")
    parser.add_argument("--refresh-after", type=float, default=DEFAULT_REFRESH_AFTER_S, metavar="S",
                        help="seconds between the first render and its refresh (default %(default)s)")
    parser.add_argument("--latency-renders", type=int, default=DEFAULT_LATENCY_RENDERS, metavar="N")
    parser.add_argument("--load", type=int, default=DEFAULT_LOAD, metavar="N",
                        help="long renders running while the refreshes are timed again (default %(default)s)")
    parser.add_argument("--gone", type=int, default=DEFAULT_GONE, metavar="N",
                        help="long renders whose clients leave (default %(default)s)")
    parser.add_argument("--loaded-only", action="store_true",
                        help="only the latencies, alone and under load, and the clients that give up")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if min(args.runs, args.latency_renders, args.load, args.gone) < 1:
        parser.error("--runs, --latency-renders, --load and --gone must be at least 1")
    with running_ramen("httpd", PROGRAM) as (base, env):
        report = measure(base, env, args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

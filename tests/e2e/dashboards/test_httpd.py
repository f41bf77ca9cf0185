"""`ramen httpd` end to end, as Grafana's Graphite data source uses it: `ramen start` with its httpd,
a program with factors, then the tree, renders checked against `ramen replay` of the same range,
concurrent renders merged into one read of the archive, refreshes answered from the cache, and
bad requests refused in one line."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import socket
import json
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from aiohttp.test_utils import TestClient, TestServer

from ramen import keyspace, supervisor_stats
from ramen.cli.ps import collect
from ramen.cli.start import INSTANCE_FILE
from ramen.httpd import buckets
from ramen.httpd.app import make_app
from ramen.httpd.state import RELEASE_AFTER_S, Httpd, Limits
from ramen.memory import ARROW_POOL_ENV
from ramen.processes import command_line, instance_processes
from ramen.transport import CountersFile
from ramen.transport.counters import SERVICE_COUNTER_TYPE_IDS
from tests.e2e.dashboards.site import HOST_NAMES, minute_range
from tests.e2e.test_replay import ramen_dir
from tests.waiting import quiet_supervisor_stats, wait_for

REPLAYER_ROLLUPS_TYPE_ID = SERVICE_COUNTER_TYPE_IDS["replayer"]["rollups"]


def test_the_tree_lists_programs_functions_factor_values_and_fields(dashboard_site):
    http = dashboard_site
    assert http.get("/version")[1].startswith(b"1.1.")
    top = http.json("/metrics/find", query="*")
    assert [(n["text"], n["leaf"], n["expandable"]) for n in top] == [("web", 0, 1)]
    functions = http.json("/metrics/find", query="web.*")
    assert [n["id"] for n in functions] == ["web.per_minute", "web.traffic"]
    hosts = http.json("/metrics/find", query="web.per_minute.*")
    assert [n["text"] for n in hosts] == HOST_NAMES  # the factor values the archive holds
    assert all(not n["leaf"] for n in hosts)
    host = hosts[0]["text"]
    leaves = http.json("/metrics/find", query=f"web.per_minute.{host}.*")
    assert [(n["id"], n["leaf"]) for n in leaves] == [(f"web.per_minute.{host}.bytes", 1)]
    assert http.json("/metrics/expand", query="web.per_minute.*.bytes")["results"] == sorted(
        f"web.per_minute.{n['text']}.bytes" for n in hosts)


def test_a_render_of_branches_draws_nothing_and_their_leaves_beside_them(dashboard_site):
    """Graphite draws leaves only: a pattern that stops at a factor value names no series (it once
    asked the factor values of a function the render had not fetched, and answered 500)."""
    window = dict(zip(("from", "until"), map(str, minute_range(8, 2))), format="json")
    assert dashboard_site.json("/render", target="web.per_minute.*", **window) == []
    drawn = dashboard_site.json("/render", target=["web.*.*", f"web.per_minute.{HOST_NAMES[0]}.bytes"], **window)
    assert [s["target"] for s in drawn] == [f"web.per_minute.{HOST_NAMES[0]}.bytes"]


def test_a_render_equals_ramen_replay_of_the_same_range(dashboard_site):
    since, until = minute_range(8, 4)
    expected = dashboard_site.per_minute_by_host(since, until)
    host = HOST_NAMES[0]
    one, total = dashboard_site.json("/render", target=[f"web.per_minute.{host}.bytes",
                                                        "sumSeries(web.per_minute.*.bytes)"],
                                     format="json", **{"from": str(since), "until": str(until)})
    minutes = list(range(since, until, 60))
    assert one["target"] == f"web.per_minute.{host}.bytes"
    assert one["datapoints"] == [[expected[host][m], m] for m in minutes]
    assert total["target"] == "sumSeries(web.per_minute.*.bytes)"
    assert total["datapoints"] == [[sum(expected[h][m] for h in HOST_NAMES), m] for m in minutes]


def test_grafana_posts_a_form_and_gets_the_same(dashboard_site):
    since, until = minute_range(8, 2)
    params = [("target", "web.per_minute.*.bytes"), ("from", str(since)), ("until", str(until)),
              ("format", "json"), ("maxDataPoints", "1000")]
    status, body = dashboard_site.post("/render", urllib.parse.urlencode(params).encode(),
                                       "application/x-www-form-urlencoded")
    assert status == 200
    assert json.loads(body) == dashboard_site.json("/render", **{k: v for k, v in params})


def test_renders_at_once_are_merged_into_one_read_and_a_refresh_replays_nothing(dashboard_site):
    since, until = minute_range(9, 3)
    window = {"from": str(since), "until": str(until), "format": "json"}
    targets = ["web.per_minute.*.bytes", "sumSeries(web.per_minute.*.bytes)", "web.traffic.*.bytes",
               "averageSeries(web.traffic.*.bytes)"]
    with dashboard_site.client() as client:
        # A lazy worker on its way out after an earlier test's replay holds back the replays through
        # it (its next process must read them): start from none running, as a dashboard opened anew.
        wait_for(lambda: not any(r["running"] for r in collect(client, "local") if r["function"] == "web/per_minute"),
                 "web/per_minute stopped after the earlier replays")
        before = quiet_supervisor_stats(client, "local").counters["replayers_spawned"]
        with ThreadPoolExecutor(len(targets)) as pool:
            answers = list(pool.map(lambda t: dashboard_site.json("/render", target=t, requestId=f"first-{t}", **window),
                                    targets))
        assert all(series["datapoints"] for answer in answers for series in answer)
        spawned = wait_for(lambda: supervisor_stats.read(client, "local").counters["replayers_spawned"] - before,
                           what="the spawn in the supervisor's stats")
        assert spawned == 1  # four panels over two functions of one source: one read of the archive
        # withdrawn behind the answers: no request left, no result log (httpd and its site share the base)
        wait_for(lambda: not client.glob(f"{keyspace.REPLAYS}/*") and not any((dashboard_site.base / "replays").glob("*")),
                 what="the renders' replays withdrawn and their logs removed")
        again = dashboard_site.json("/render", target=targets[0], requestId="refresh", **window)
        assert again == answers[0]
        assert dashboard_site.json("/progress", requestId="refresh")["replays"] == 0  # all from the cache
        assert supervisor_stats.read(client, "local").counters["replayers_spawned"] - before == 1


def test_a_range_partly_outside_the_archive_charts_what_exists(dashboard_site):
    since, until = minute_range(40, 35)  # starts half an hour before the back-fill
    answer = dashboard_site.json("/render", target="sumSeries(web.per_minute.*.bytes)",
                                 **{"from": str(since), "until": str(until)})
    values = [v for v, _ in answer[0]["datapoints"]]
    assert len(values) == 35
    assert values[0] is None and values[-1] is not None
    # one sum over the 35 minutes: of what exists, unless the render's xFilesFactor asks them all
    target = 'summarize(sumSeries(web.per_minute.*.bytes), "35min", "sum", true)'
    lenient, strict = (dashboard_site.json("/render", target=target, xFilesFactor=share,
                                           **{"from": str(since), "until": str(until)})[0]["datapoints"]
                       for share in ("0", "1"))
    assert lenient == [[sum(v for v in values if v is not None), since]]
    assert strict == [[None, since]]


def test_time_shift_draws_an_earlier_range_over_this_one(dashboard_site):
    since, until = minute_range(5, 3)
    target = "sumSeries(web.per_minute.*.bytes)"
    shifted, plain, earlier = dashboard_site.json(
        "/render", target=[f'timeShift({target}, "3min")', target, f'timeShift({target}, "+0s")'],
        **{"from": str(since), "until": str(until)})
    before = dashboard_site.json("/render", target=target, **{"from": str(since - 180), "until": str(until - 180)})
    assert shifted["target"] == f'timeShift({target}, "-3min")'
    assert shifted["datapoints"] == [[value, at + 180] for value, at in before[0]["datapoints"]]
    assert all(value is not None for value, _ in shifted["datapoints"]) and shifted != plain
    assert earlier["datapoints"] == plain["datapoints"]
    now, ago = dashboard_site.json("/render", target=f'timeStack({target}, "3min", 0, 2)',
                                   **{"from": str(since), "until": str(until)})
    assert (now["target"], ago["target"]) == (f"timeShift({target}, -3min, 0)", f"timeShift({target}, -3min, 1)")
    assert (now["datapoints"], ago["datapoints"]) == (plain["datapoints"], shifted["datapoints"])


def test_a_moving_average_reaches_back_for_its_first_points_in_the_replay_of_its_series(dashboard_site):
    since, until = minute_range(6, 3)
    target = "sumSeries(web.per_minute.*.bytes)"
    with dashboard_site.client() as client:
        before = quiet_supervisor_stats(client, "local").counters["replayers_spawned"]
        averaged, plain = dashboard_site.json("/render", target=[f"movingAverage({target}, 2)", target],
                                              noCache="1", requestId="moving", **{"from": str(since), "until": str(until)})
        # per_minute over the range, and over the two minutes before it: one replayer for both
        assert dashboard_site.json("/progress", requestId="moving")["replays"] == 2
        spawned = wait_for(lambda: supervisor_stats.read(client, "local").counters["replayers_spawned"] - before,
                           what="the spawn in the supervisor's stats")
        assert spawned == 1
    [wider] = dashboard_site.json("/render", target=target, **{"from": str(since - 120), "until": str(until)})
    value = {at: v for v, at in wider["datapoints"]}
    assert plain["datapoints"] == [[value[m], m] for m in range(since, until, 60)]
    # each minute and the one before it (graphite-web 1.1.10's window: the point itself included)
    assert averaged["datapoints"] == [[(value[m - 60] + value[m]) / 2, m] for m in range(since, until, 60)]


def test_targets_that_functions_make_are_fetched_in_a_round_of_their_own(dashboard_site):
    since, until = minute_range(8, 4)
    expected = dashboard_site.per_minute_by_host(since, until)
    minutes = range(since, until, 60)
    total = {m: sum(expected[h][m] for h in HOST_NAMES) for m in minutes}
    template = "asPercent(%.bytes, sumSeries(web.per_minute.*.bytes))"
    shares = dashboard_site.json("/render", target=f"applyByNode(web.per_minute.*.bytes, 2, '{template}', '%.share')",
                                 noCache="1", requestId="made", **{"from": str(since), "until": str(until)})
    assert [s["target"] for s in shares] == [f"web.per_minute.{h}.share" for h in HOST_NAMES]
    # the second round's paths are of the function and range the first fetched: no replay more
    assert dashboard_site.json("/progress", requestId="made")["replays"] == 1
    for share, host in zip(shares, HOST_NAMES):
        assert share["datapoints"] == [[pytest.approx(expected[host][m] / total[m] * 100), m] for m in minutes]
    # the hosts busiest at some minute, charted by another function (its series fetched in the second round)
    threshold = sorted(max(expected[h].values()) for h in HOST_NAMES)[len(HOST_NAMES) // 2]
    busy = [h for h in HOST_NAMES if max(expected[h].values()) > threshold]
    above = f"useSeriesAbove(web.per_minute.*.bytes, {threshold}, 'per_minute', 'traffic')"
    traffic = dashboard_site.json("/render", target=above, **{"from": str(since), "until": str(until)})
    assert busy and [s["target"] for s in traffic] == [f"web.traffic.{h}.bytes" for h in busy]
    alone = dashboard_site.json("/render", target=[f"web.traffic.{h}.bytes" for h in busy],
                                **{"from": str(since), "until": str(until)})
    assert [s["datapoints"] for s in traffic] == [s["datapoints"] for s in alone]


def test_grafanas_tag_editor_completes_and_a_tag_query_charts_the_same_series_as_their_paths(dashboard_site):
    http = dashboard_site
    assert http.json("/tags/autoComplete/tags") == ["host", "name"]
    assert http.json("/tags/autoComplete/tags", expr="name=web.per_minute.bytes") == ["host"]
    assert http.json("/tags/autoComplete/values", tag="name", valuePrefix="web.") == [
        "web.per_minute.bytes", "web.traffic.bytes"]
    assert http.json("/tags/autoComplete/values", tag="host", expr="name=web.per_minute.bytes") == HOST_NAMES
    assert http.json("/tags") == [{"tag": "host"}, {"tag": "name"}]
    assert http.json("/tags/name") == {"tag": "name", "values": [
        {"value": "web.per_minute.bytes", "count": len(HOST_NAMES)},
        {"value": "web.traffic.bytes", "count": len(HOST_NAMES)}]}
    two = HOST_NAMES[:2]
    assert http.json("/tags/findSeries", expr=["name=web.per_minute.bytes", f"host=~^({'|'.join(two)})$"]) == [
        f"web.per_minute.bytes;host={h}" for h in two]
    since, until = minute_range(8, 4)
    query = f"seriesByTag('name=web.per_minute.bytes', 'host=~^({'|'.join(two)})$')"
    tagged = http.json("/render", target=query, **{"from": str(since), "until": str(until)})
    paths = http.json("/render", target=[f"web.per_minute.{h}.bytes" for h in two],
                      **{"from": str(since), "until": str(until)})
    assert [(s["target"], s["tags"]) for s in tagged] == [
        (f"web.per_minute.bytes;host={h}", {"name": "web.per_minute.bytes", "host": h}) for h in two]
    assert [s["datapoints"] for s in tagged] == [s["datapoints"] for s in paths]
    [total] = http.json("/render", target="groupByTags(seriesByTag('name=web.per_minute.bytes'), 'sum', 'name')",
                        **{"from": str(since), "until": str(until)})
    [summed] = http.json("/render", target="sumSeries(web.per_minute.*.bytes)",
                         **{"from": str(since), "until": str(until)})
    assert (total["target"], total["tags"]) == ("web.per_minute.bytes", {"name": "web.per_minute.bytes"})
    assert total["datapoints"] == summed["datapoints"]


@pytest.mark.parametrize("params, reason", [
    ({"target": "sumSeries(web.per_minute.*.bytes"}, "target"),
    ({"target": "noSuchFunction(web.traffic.*.bytes)"}, "noSuchFunction"),
    ({"target": "web.traffic.*.bytes", "from": "now", "until": "-1h"}, "not before"),
])
def test_bad_requests_get_one_line(dashboard_site, params, reason):
    status, body = dashboard_site.get("/render", **params)
    assert status == 400, body
    text = body.decode()
    assert reason in text and text.count("\n") == 1, text


def test_a_batch_answers_as_the_renders_one_by_one(dashboard_site):
    since, until = minute_range(7, 2)
    window = {"from": str(since), "until": str(until)}
    targets = [["web.per_minute.*.bytes"], ["sumSeries(web.traffic.*.bytes)", "noSuchFunction(x)"]]
    status, body = dashboard_site.post("/render/batch", json.dumps(
        {**window, "renders": [{"targets": t} for t in targets]}).encode(), "application/json")
    first, second = json.loads(body)
    assert first == {"series": dashboard_site.json("/render", target=targets[0], **window)}
    assert second["status"] == 400 and "noSuchFunction" in second["error"]


def test_a_refresh_of_a_range_ending_now_replays_only_its_newest_part(dashboard_site):
    window = {"target": "sumSeries(web.traffic.*.bytes)", "from": "-5min", "until": "now"}
    # all of it replayed (and cached) the first time, whatever earlier renders cached
    dashboard_site.json("/render", requestId="now-first", noCache="1", **window)
    dashboard_site.json("/render", requestId="now-again", **window)
    first = dashboard_site.json("/progress", requestId="now-first")
    again = dashboard_site.json("/progress", requestId="now-again")
    assert first["replays"] == again["replays"] == 1
    # 5 minutes of rows the first time; then only what had not settled: the last seconds.
    assert 0 < again["rows"] < first["rows"] / 4, (first, again)


def test_the_window_still_open_is_null_rather_than_a_part_of_its_rows(dashboard_site):
    [series] = dashboard_site.json("/render", target="sumSeries(web.per_minute.*.bytes)", **{"from": "-4min"})
    values = [v for v, _ in series["datapoints"]]
    assert values[-1] is None  # this minute: not over, so not drawn as the dip of its first seconds
    assert values[-3] is not None and values[-3] > 0


def replayers_rollups(site) -> int:
    """Messages the site's replayers folded by their rollups, as counters.dat holds them."""
    counters = CountersFile.open(site.base / "counters.dat", create=False)
    try:
        return sum(c.value for c in counters.counters() if c.type_id == REPLAYER_ROLLUPS_TYPE_ID)
    finally:
        counters.close()


def test_a_source_is_charted_from_the_rollups_its_archived_messages_carry(dashboard_site):
    """An archived source with factors writes each message's rollup (ramen/rollup.py): a chart of it
    is served by the source's replayer itself, which folds those rather than the rows (the source's
    worker takes no part), and draws the averages of the rows `ramen replay` prints."""
    since, until = minute_range(9, 4)
    result = dashboard_site.ramen("replay", "--since", since, "--until", until, "--format", "csv", "--with-header",
                                  "web/traffic")
    assert result.returncode == 0, result.stderr
    rows = pacsv.read_csv(io.BytesIO(result.stdout.encode()))
    seconds = rows["ts"].cast(pa.timestamp("us")).cast(pa.int64()).to_numpy() // 1_000_000
    step = buckets.DEFAULT_STEP_S
    keyed = pa.table({"bucket": seconds // step * step, "host": rows["host"], "bytes": rows["bytes"]})
    expected = {(b, h): v for b, h, v in zip(*(keyed.group_by(["bucket", "host"]).aggregate([("bytes", "mean")])
                                              .column(c).to_pylist() for c in ("bucket", "host", "bytes_mean")))}
    before = replayers_rollups(dashboard_site)
    answer = dashboard_site.json("/render", target="web.traffic.*.bytes", format="json", noCache="1",
                                 **{"from": str(since), "until": str(until)})
    assert replayers_rollups(dashboard_site) > before  # counted before the replay's end: no wait
    assert sorted(s["target"] for s in answer) == [f"web.traffic.{h}.bytes" for h in HOST_NAMES]
    for series in answer:
        host = series["target"].split(".")[2]
        assert [[pytest.approx(expected[(t, host)]), t] for _, t in series["datapoints"]] == series["datapoints"]
        assert len(series["datapoints"]) == (until - since) // step


def httpd_total(site, name: str) -> float:
    """httpd's count `name` (HttpdStats), as /metrics exposes it."""
    status, metrics = site.get("/metrics")
    assert status == 200
    found = re.search(rb'^ramen_httpd_%s_total\{site="local"\} (\S+)$' % name.encode(), metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("target", ["sumSeries(web.per_minute.*.bytes)", "sumSeries(web.traffic.*.bytes)"],
                         ids=["through workers", "served by the replayer"])
def test_a_render_whose_replayer_is_killed_under_it_asks_again_and_answers(dashboard_site, target):
    """The warm replayer a render's replay will take is frozen, then killed once the replay is
    assigned to it: the supervisor fails the replay as lost, httpd asks again, and the render
    answers what it answers undisturbed (a chart of a lazy function, and one of the source, which
    its replayer serves itself)."""
    since, until = minute_range(6, 3)
    window = {"from": str(since), "until": str(until), "format": "json", "noCache": "1"}
    undisturbed = dashboard_site.json("/render", target=target, **window)
    retried = httpd_total(dashboard_site, "replays_retried")
    with dashboard_site.client() as client:
        warm = wait_for(lambda: quiet_supervisor_stats(client, "local").warm_replayer, what="a warm replayer").pid
        os.kill(warm, signal.SIGSTOP)
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(dashboard_site.json, "/render", target=target, **window)
            wait_for(lambda: any(e.value.get("pid") == warm for e in client.glob("sites/local/replayers/*")),
                     what="the render's replay assigned to the frozen replayer")
            os.kill(warm, signal.SIGKILL)
            assert answer.result(timeout=120) == undisturbed
    assert httpd_total(dashboard_site, "replays_retried") == retried + 1


def request_and_leave(site, **params) -> socket.socket:
    """A render asked on a connection of our own, which the caller closes to leave before the answer."""
    address = urllib.parse.urlsplit(site.url)
    connection = socket.create_connection((address.hostname, address.port), timeout=30)
    connection.sendall(f"GET /render?{urllib.parse.urlencode(params)} HTTP/1.1\r\n"
                       f"Host: {address.netloc}\r\n\r\n".encode())
    return connection


def thaw(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:  # its replay done, it exited
        pass


def test_a_render_whose_client_left_is_cancelled_with_its_replay_unless_another_render_waits_for_it(
        dashboard_site):
    """The warm replayer is frozen, so that the replay cannot end under the test. Two clients ask
    the same render, sharing one replay; the first leaves: the replay goes on, and the second gets
    what an undisturbed render gets once the replayer thaws. Then a client alone leaves: its replay
    is withdrawn (its request key deleted, the replayer stopped): nothing runs on for nobody."""
    since, until = minute_range(6, 3)
    window = {"target": "sumSeries(web.per_minute.*.bytes)", "from": str(since), "until": str(until),
              "format": "json", "noCache": "1"}
    undisturbed = dashboard_site.json("/render", **window)
    started, cancelled = (httpd_total(dashboard_site, n) for n in ("replays_started", "replays_cancelled"))
    renders_cancelled = httpd_total(dashboard_site, "renders_cancelled")
    with dashboard_site.client() as client:
        def frozen_warm_replayer() -> int:
            warm = wait_for(lambda: quiet_supervisor_stats(client, "local").warm_replayer, what="a warm replayer").pid
            os.kill(warm, signal.SIGSTOP)
            return warm

        def assigned_to(pid: int) -> bool:
            return any(e.value.get("pid") == pid for e in client.glob("sites/local/replayers/*"))

        warm = frozen_warm_replayer()
        try:
            leaving = request_and_leave(dashboard_site, **window, requestId="leaving")
            with ThreadPoolExecutor(1) as pool:
                staying = pool.submit(dashboard_site.json, "/render", **window, requestId="staying")
                wait_for(lambda: assigned_to(warm), what="the renders' replay assigned to the frozen replayer")
                wait_for(lambda: dashboard_site.json("/progress", requestId="staying")["replays_shared"]
                         + dashboard_site.json("/progress", requestId="leaving")["replays_shared"] == 1,
                         what="both renders waiting for one replay")
                leaving.close()
                wait_for(lambda: httpd_total(dashboard_site, "renders_cancelled") == renders_cancelled + 1,
                         what="the render whose client left cancelled")
                os.kill(warm, signal.SIGCONT)
                assert staying.result(timeout=120) == undisturbed
        finally:
            thaw(warm)
        assert httpd_total(dashboard_site, "replays_started") == started + 1
        assert httpd_total(dashboard_site, "replays_cancelled") == cancelled

        warm = frozen_warm_replayer()
        try:
            leaving = request_and_leave(dashboard_site, **window)
            wait_for(lambda: assigned_to(warm), what="the render's replay assigned to the frozen replayer")
            assert len(client.glob(f"{keyspace.REPLAYS}/*")) == 1
            leaving.close()
            wait_for(lambda: httpd_total(dashboard_site, "replays_cancelled") == cancelled + 1,
                     what="the replay nobody waits for cancelled")
            wait_for(lambda: not client.glob(f"{keyspace.REPLAYS}/*"), what="its request withdrawn")
        finally:
            thaw(warm)
        wait_for(lambda: not assigned_to(warm), what="the replayer stopped, its key removed")


def httpd_pid(site) -> int:
    token = (site.base / "run" / INSTANCE_FILE).read_text().strip()
    (pid,) = [pid for pid in instance_processes(token) if "ramen.httpd.service" in command_line(pid)]
    return pid


def test_httpd_runs_pyarrow_on_the_c_allocator_and_gives_memory_back_once_renders_stop(dashboard_site):
    """What keeps its memory near its base after a burst (ramen/memory.py; bench/httpd.py measures
    it): pyarrow on glibc's malloc, whose free memory is trimmed once no render has run for a while."""
    environ = Path(f"/proc/{httpd_pid(dashboard_site)}/environ").read_bytes().split(b"\0")
    assert f"{ARROW_POOL_ENV}=system".encode() in environ
    log = dashboard_site.base / "logs" / "httpd.log"
    released = log.read_text().count("no render for")
    since, until = minute_range(8, 4)
    dashboard_site.json("/render", target="web.per_minute.*.bytes", format="json", noCache="1",
                        **{"from": str(since), "until": str(until)})
    line = wait_for(lambda: [line for line in log.read_text().splitlines() if "no render for" in line][released:],
                    what="httpd giving memory back after the render", timeout_s=RELEASE_AFTER_S * 6)[0]
    assert re.search(r"RSS \d+ -> \d+ MB; the cache holds \d+ MB, pyarrow \d+ MB, drawn grids \d+ MB$", line), line


def test_a_fetch_whose_buckets_pass_the_bound_is_refused_in_one_line_and_its_replay_withdrawn(dashboard_site):
    """An httpd of this test's own on the site (its bound on what a fetch may hold set low): the
    buckets of every host of web.traffic are added up as its replay sends them, and the render is
    refused once they pass the bound, not after the whole range is held."""
    since, until = minute_range(9, 8)
    query = f"/render?target=sumSeries(web.traffic.*.bytes)&from={since}&until={until}&noCache=1"

    async def render() -> tuple[int, str, str]:
        with ramen_dir(dashboard_site.base), dashboard_site.client("user") as client:
            http = TestClient(TestServer(make_app(Httpd(client, "local", limits=Limits(max_fetch_bytes=4096)))))
            await http.start_server()
            try:
                answer = await http.get(query)
                metrics = await (await http.get("/metrics")).text()
                return answer.status, await answer.text(), metrics
            finally:
                await http.close()

    status, text, metrics = asyncio.run(render())
    assert status == 400
    assert text == ("render: the buckets of web/traffic over the range take more than 0.00390625 MiB (every value "
                    "of its factors, before any series is drawn): ask a shorter range\n")
    assert 'ramen_httpd_fetches_too_big_total{site="local"} 1' in metrics
    with dashboard_site.client() as client:
        wait_for(lambda: not client.glob(f"{keyspace.REPLAYS}/*"), what="its replay withdrawn")

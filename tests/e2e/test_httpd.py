"""`ramen httpd` end to end, as Grafana's Graphite data source uses it: `ramen start` with its httpd,
a program with factors, then the tree, renders checked against `ramen replay` of the same range,
concurrent renders merged into one read of the archive, refreshes answered from the cache, and
bad requests refused in one line."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from ramen.cli.ps import collect

from tests.e2e.test_replay import EXAMPLES, MINUTE_US, STARTUP_S, Stack, minute_range, wait_for_backfill
from tests.waiting import wait_for

RATE = 500
HOSTS = 5
BACKFILL_MIN = 10
PROGRAM = f"""
[program]
name = "web"

[[function]]
name = "traffic"
source = {{ kind = "generator", rate = {RATE}, hosts = {HOSTS}, seed = 3, backfill = "{BACKFILL_MIN}m" }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
factors = ["host"]
archive = {{ retention = "1d" }}

[[function]]
name = "per_minute"
lazy = true
from = ["traffic"]
window = {{ every = "1 minute", lateness = "10s" }}
engine = "python"
call = "examples.net:per_minute"
event_time = "start"
factors = ["host"]
"""


class Http:
    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def get(self, path: str, **params) -> tuple[int, bytes]:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=120) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def json(self, path: str, **params):
        status, body = self.get(path, **params)
        assert status == 200, body
        return json.loads(body)

    def post_form(self, path: str, fields: list[tuple[str, str]]) -> tuple[int, bytes]:
        request = urllib.request.Request(f"{self.url}{path}", data=urllib.parse.urlencode(fields).encode())
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    base = tmp_path_factory.mktemp("httpd")
    program = base / "web.toml"
    program.write_text(PROGRAM)
    stack = Stack(base)
    started = stack.ramen("start", "--daemon", "--dir", base, program, timeout=STARTUP_S)
    assert started.returncode == 0, started.stderr + started.stdout
    try:
        wait_for_backfill(base, "web/traffic")
        stack.http = Http(wait_for(lambda: _read(base / "run" / "httpd.url"), "httpd's URL file"))
        yield stack
    finally:
        stack.ramen("stop", "--dir", base)


def _read(path):
    try:
        return path.read_text().strip()
    except OSError:
        return None


def replayed_per_minute(stack, since_us: int, until_us: int) -> dict[tuple[str, int], int]:
    table = stack.replay_table("web/per_minute", since_us, until_us)
    starts = table["start"].to_pylist()
    return {(host, int(start.timestamp())): b for host, start, b in
            zip(table["host"].to_pylist(), starts, table["bytes"].to_pylist())}


def test_the_tree_lists_programs_functions_factor_values_and_fields(stack):
    http = stack.http
    assert http.get("/version")[1].startswith(b"1.1.")
    top = http.json("/metrics/find", query="*")
    assert [(n["text"], n["leaf"], n["expandable"]) for n in top] == [("web", 0, 1)]
    functions = http.json("/metrics/find", query="web.*")
    assert [n["id"] for n in functions] == ["web.per_minute", "web.traffic"]
    hosts = http.json("/metrics/find", query="web.per_minute.*")
    assert len(hosts) == HOSTS and all(not n["leaf"] for n in hosts)  # values from what the archive holds
    host = hosts[0]["text"]
    leaves = http.json("/metrics/find", query=f"web.per_minute.{host}.*")
    assert [(n["id"], n["leaf"]) for n in leaves] == [(f"web.per_minute.{host}.bytes", 1)]
    assert http.json("/metrics/expand", query="web.per_minute.*.bytes")["results"] == sorted(
        f"web.per_minute.{n['text']}.bytes" for n in hosts)


def test_a_render_equals_ramen_replay_of_the_same_range(stack):
    since, until = minute_range(8, 4)
    expected = replayed_per_minute(stack, since, until)
    hosts = sorted({host for host, _ in expected})
    answer = stack.http.json("/render", target=[f"web.per_minute.{hosts[0]}.bytes", "sumSeries(web.per_minute.*.bytes)"],
                             format="json", **{"from": str(since // 1_000_000), "until": str(until // 1_000_000)})
    one, total = answer
    assert one["target"] == f"web.per_minute.{hosts[0]}.bytes"
    minutes = [since // 1_000_000 + 60 * i for i in range(4)]
    assert one["datapoints"] == [[expected[(hosts[0], m)], m] for m in minutes]
    assert total["target"] == "sumSeries(web.per_minute.*.bytes)"
    assert total["datapoints"] == [[sum(expected[(h, m)] for h in hosts), m] for m in minutes]


def test_grafana_posts_a_form_and_gets_the_same(stack):
    since, until = minute_range(8, 2)
    params = [("target", "web.per_minute.*.bytes"), ("from", str(since // 1_000_000)),
              ("until", str(until // 1_000_000)), ("format", "json"), ("maxDataPoints", "1000")]
    status, body = stack.http.post_form("/render", params)
    assert status == 200
    assert json.loads(body) == stack.http.json("/render", **{k: v for k, v in params})


def test_renders_at_once_are_merged_into_one_read_and_a_refresh_replays_nothing(stack):
    since, until = minute_range(9, 3)
    window = {"from": str(since // 1_000_000), "until": str(until // 1_000_000), "format": "json"}
    targets = ["web.per_minute.*.bytes", "sumSeries(web.per_minute.*.bytes)", "web.traffic.*.bytes",
               "averageSeries(web.traffic.*.bytes)"]
    with stack.client() as client:
        # A lazy worker on its way out after an earlier test's replay holds back the replays through
        # it (its next process must read them): start from none running, as a dashboard opened anew.
        wait_for(lambda: not any(r["running"] for r in collect(client, "local") if r["function"] == "web/per_minute"),
                 "web/per_minute stopped after the earlier replays")
        before = client.get("sites/local/supervisor/stats").value.get("replayers_spawned", 0)
        with ThreadPoolExecutor(len(targets)) as pool:
            answers = list(pool.map(lambda t: stack.http.json("/render", target=t, requestId=f"first-{t}", **window),
                                    targets))
        assert all(series["datapoints"] for answer in answers for series in answer)
        spawned = wait_for(lambda: client.get("sites/local/supervisor/stats").value["replayers_spawned"] - before,
                           what="the spawn in the supervisor's stats")
        assert spawned == 1  # four panels over two functions of one source: one read of the archive
        again = stack.http.json("/render", target=targets[0], requestId="refresh", **window)
        assert again == answers[0]
        assert stack.http.json("/progress", requestId="refresh")["replays"] == 0  # all from the cache
        assert client.get("sites/local/supervisor/stats").value["replayers_spawned"] - before == 1


def test_a_range_partly_outside_the_archive_charts_what_exists(stack):
    since, until = minute_range(BACKFILL_MIN + 30, 35)  # starts long before the backfill
    answer = stack.http.json("/render", target="sumSeries(web.per_minute.*.bytes)",
                             **{"from": str(since // 1_000_000), "until": str(until // 1_000_000)})
    values = [v for v, _ in answer[0]["datapoints"]]
    assert len(values) == 35
    assert values[0] is None and values[-1] is not None


@pytest.mark.parametrize("params, reason", [
    ({"target": "sumSeries(web.per_minute.*.bytes"}, "target"),
    ({"target": "noSuchFunction(web.traffic.*.bytes)"}, "noSuchFunction"),
    ({"target": "web.traffic.*.bytes", "from": "now", "until": "-1h"}, "not before"),
])
def test_bad_requests_get_one_line(stack, params, reason):
    status, body = stack.http.get("/render", **params)
    assert status == 400, body
    text = body.decode()
    assert reason in text and text.count("\n") == 1, text


def test_a_batch_answers_as_the_renders_one_by_one(stack):
    since, until = minute_range(7, 2)
    window = {"from": str(since // 1_000_000), "until": str(until // 1_000_000)}
    targets = [["web.per_minute.*.bytes"], ["sumSeries(web.traffic.*.bytes)", "noSuchFunction(x)"]]
    request = urllib.request.Request(f"{stack.http.url}/render/batch", headers={"Content-Type": "application/json"},
                                     data=json.dumps({**window, "renders": [{"targets": t} for t in targets]}).encode())
    with urllib.request.urlopen(request, timeout=120) as answer:
        first, second = json.loads(answer.read())
    assert first == {"series": stack.http.json("/render", target=targets[0], **window)}
    assert second["status"] == 400 and "noSuchFunction" in second["error"]

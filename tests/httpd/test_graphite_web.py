"""The graphite-web fixture's own tests, and the contract of graphite-web's cluster federation
written down as tests: a real graphite-web 1.1.8 whose CLUSTER_SERVERS names a small aiohttp
stand-in, answering with hand-built pickle or msgpack, shows what graphite-web sends to a cluster
server and what it needs back before it charts a series. ramen httpd's `local=1` answers
(ramen/httpd/render.py) must meet the same contract; tests/e2e/test_federation.py holds them to it.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import math
import pickle
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

import msgpack
import numpy as np
import pytest
from aiohttp import web

from tests.httpd.graphite_web import cluster_server, graphite_web  # noqa: F401 (a fixture)

START_S = 1_700_000_040
"""A minute boundary, so graphite-web has nothing to align."""
STEP_S = 60
VALUES = [1.0, None, 2.5, 4.0]
"""None is Graphite's null: a step without a value."""
LEAVES = ("ramen.fn.x", "ramen.fn.y")
BRANCHES = ("ramen", "ramen.fn")
HTTP_TIMEOUT_S = 90.0
CONTENT_TYPES = {"pickle": "application/pickle", "msgpack": "application/x-msgpack"}


@dataclass
class StandIn:
    """A cluster server answering as graphite-web's own `local=1` views do, with knobs to answer as
    graphite-web must not be answered. `requests` records what graphite-web sent."""
    echo_path_expression: bool = True
    values: dict[str, list] = field(default_factory=lambda: {path: list(VALUES) for path in LEAVES})
    """Each leaf's values."""
    content_type: str | None = None
    """None: the format's own content type."""
    requests: list[dict] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        params = list(request.query.items())
        if request.method == "POST":
            params += [(key, value) for key, value in (await request.post()).items()]
        self.requests.append({"method": request.method, "path": request.path, "params": params,
                              "content_type": request.content_type})
        given = dict(params)
        if request.path == "/metrics/find/":
            pattern = given["query"].split(".")
            answer = [{"path": path, "is_leaf": path in LEAVES}
                      | ({"intervals": [(START_S, START_S + STEP_S * len(VALUES))]} if path in LEAVES else {})
                      for path in BRANCHES + LEAVES if _matches(path.split("."), pattern)]
        elif request.path == "/render/":
            answer = []
            for target in [value for key, value in params if key == "target"]:
                for path in LEAVES:
                    if _matches(path.split("."), target.split(".")):
                        series = {"name": path, "start": START_S, "end": START_S + STEP_S * len(self.values[path]),
                                  "step": STEP_S, "values": self.values[path]}
                        if self.echo_path_expression:
                            series["pathExpression"] = target
                        answer.append(series)
        else:
            raise web.HTTPNotFound()
        fmt = given["format"]
        body = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL) if fmt == "pickle" \
            else msgpack.packb(answer, use_bin_type=True)
        response = web.Response(body=body)
        response.headers["Content-Type"] = self.content_type or CONTENT_TYPES[fmt]
        return response

    def sent(self, path: str) -> list[dict]:
        return [request for request in self.requests if request["path"] == path]


def _matches(parts: list[str], pattern: list[str]) -> bool:
    return len(parts) == len(pattern) and all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pattern))


@pytest.fixture
def stand_in():
    """The stand-in served by aiohttp on a loop of its own thread, on a free loopback port."""
    server = StandIn()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)

    async def start() -> str:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    server.url = asyncio.run_coroutine_threadsafe(start(), loop).result()
    yield server
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def get(url: str, path: str, **params) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=HTTP_TIMEOUT_S) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def render_json(url: str, target: str) -> list[dict]:
    status, body = get(url, "/render", target=target, format="json", **{"from": START_S, "until": START_S + 240})
    assert status == 200, body[-500:]
    return json.loads(body)


EXPECTED_POINTS = [[value, START_S + STEP_S * i] for i, value in enumerate(VALUES)]


@pytest.mark.parametrize("use_post", [False, True])
def test_graphite_web_charts_a_cluster_servers_pickled_series(graphite_web, stand_in, use_post):
    fmt = "pickle"
    web_ = graphite_web([cluster_server(stand_in.url, fmt)], use_post=use_post)

    assert render_json(web_.url, "ramen.fn.x") == [
        {"target": "ramen.fn.x", "tags": {"name": "ramen.fn.x"}, "datapoints": EXPECTED_POINTS}]

    [sent] = stand_in.sent("/render/")
    assert sent["method"] == ("POST" if use_post else "GET")
    # urllib3 encodes a POST's fields as multipart/form-data, not urlencoded
    assert sent["content_type"] == ("multipart/form-data" if use_post else "application/octet-stream")
    params = dict(sent["params"])
    assert sorted(params) == ["format", "from", "local", "noCache", "now", "target", "until"]
    assert (params["format"], params["local"], params["noCache"], params["target"]) == (fmt, "1", "1", "ramen.fn.x")
    assert (int(params["from"]), int(params["until"])) == (START_S, START_S + 240)
    assert not stand_in.sent("/metrics/find/"), "a render of a plain path needs no find"


def test_graphite_web_find_lists_a_cluster_servers_pickled_nodes(graphite_web, stand_in):
    fmt = "pickle"
    web_ = graphite_web([cluster_server(stand_in.url, fmt)])

    status, body = get(web_.url, "/metrics/find", query="ramen.*")
    assert status == 200, body[-500:]
    assert [(node["id"], node["leaf"]) for node in json.loads(body)] == [("ramen.fn", 0)]
    status, body = get(web_.url, "/metrics/find", query="ramen.fn.*")
    assert [(node["id"], node["leaf"]) for node in json.loads(body)] == [("ramen.fn.x", 1), ("ramen.fn.y", 1)]

    sent = stand_in.sent("/metrics/find/")
    assert [dict(request["params"]) for request in sent] == [
        {"local": "1", "format": fmt, "query": "ramen.*"}, {"local": "1", "format": fmt, "query": "ramen.fn.*"}]
    assert {request["method"] for request in sent} == {"GET"}


def test_ramens_treejson_is_graphite_webs_for_a_glob_before_the_last_level_and_with_wildcards(graphite_web, stand_in):
    """The same nodes, as graphite-web's own find view lists them (its ids: the query up to its last
    level, then the name) and as ramen's /metrics/find does; ramen's ids were the first match's path,
    and its `wildcards=1` was ignored."""
    from ramen.httpd.names import Node
    from ramen.httpd.render import to_find
    web_ = graphite_web([cluster_server(stand_in.url, "pickle")])
    for query, wildcards in (("ramen.f*.*", False), ("ramen.*.*", True), ("ramen.*", True), ("ramen.f?.x", False)):
        status, body = get(web_.url, "/metrics/find", query=query, **({"wildcards": "1"} if wildcards else {}))
        assert status == 200, body[-500:]
        nodes = [Node(path, path in LEAVES, [(START_S, START_S + STEP_S * len(VALUES))] if path in LEAVES else [])
                 for path in BRANCHES + LEAVES if _matches(path.split("."), query.split("."))]
        assert json.loads(to_find(nodes, "treejson", wildcards=wildcards, query=query)) == json.loads(body), query


def test_a_glob_target_is_sent_as_is_and_each_series_must_echo_it_as_path_expression(graphite_web, stand_in):
    web_ = graphite_web([cluster_server(stand_in.url, "pickle")])

    assert [series["target"] for series in render_json(web_.url, "ramen.fn.*")] == list(LEAVES)
    assert dict(stand_in.sent("/render/")[0]["params"])["target"] == "ramen.fn.*"

    # graphite-web files what a cluster server returns under its pathExpression (the name when
    # absent), and charts what it filed under the target it asked for: nothing, here.
    stand_in.echo_path_expression = False
    assert render_json(web_.url, "ramen.fn.*") == []
    assert [series["target"] for series in render_json(web_.url, "ramen.fn.x")] == ["ramen.fn.x"]


def test_nulls_must_be_none_not_nan(graphite_web, stand_in):
    """graphite-web's functions skip nulls by `is None`: a NaN is a number to them, and poisons a
    sum where a None is left out. A series' nulls must travel as None (pickle) or nil (msgpack)."""
    web_ = graphite_web([cluster_server(stand_in.url, "pickle")])
    stand_in.values = {"ramen.fn.x": [1.0, None, 2.5, 4.0], "ramen.fn.y": [1.0, 1.0, 1.0, 1.0]}
    [summed] = render_json(web_.url, "sumSeries(ramen.fn.*)")
    assert [value for value, _ in summed["datapoints"]] == [2.0, 1.0, 3.5, 5.0]

    stand_in.values["ramen.fn.x"][1] = math.nan
    [summed] = render_json(web_.url, "sumSeries(ramen.fn.*)")
    assert [value for value, _ in summed["datapoints"]] == [2.0, None, 3.5, 5.0]


def test_the_safe_unpickler_refuses_numpy_values(graphite_web, stand_in):
    """graphite-web unpickles only plain types (and its own TimeSeries, Tags, Interval, IntervalSet,
    collections.deque): numpy floats must become Python floats before pickling. graphite-web logs
    the refusal and charts nothing (its empty local whisper finder still answered)."""
    web_ = graphite_web([cluster_server(stand_in.url, "pickle")])
    stand_in.values["ramen.fn.x"] = list(np.array([1.0, 2.0, 2.5, 4.0]))

    assert render_json(web_.url, "ramen.fn.x") == []
    assert "Attempting to unpickle unsafe module numpy" in web_.exception_log()


@pytest.mark.parametrize("path", ["/render", "/metrics/find"])
def test_debian_graphite_web_cannot_read_msgpack_on_python_3_10_and_later(graphite_web, stand_in, path):
    """graphite-web 1.1.8 reads msgpack with its bundled umsgpack 2.4.1 (python3-msgpack is not
    installed), which checks map keys against collections.Hashable, gone since Python 3.10: every
    msgpack answer with a dict in it fails. (With python3-msgpack 1.x it would fail too: graphite-web
    passes `encoding=`, which msgpack 1.0 removed.) So a graphite-web federating ramen asks for
    pickle, its default; this test fails, saying msgpack became usable, once Debian fixes it."""
    web_ = graphite_web([cluster_server(stand_in.url, "msgpack")])

    status, body = get(web_.url, path, target="ramen.fn.x", query="ramen.fn.*", format="json",
                       **{"from": START_S, "until": START_S + 240})
    assert dict(stand_in.requests[0]["params"])["format"] == "msgpack"
    assert "module 'collections' has no attribute 'Hashable'" in web_.exception_log()
    assert (status, json.loads(body)) == (200, [])

"""The HTTP edges of httpd, through aiohttp's test server and a real confserver: credentials,
Graphite's /version and /tags, bad requests as one-line 400s."""

import asyncio
import base64
import functools
import logging

import pytest
from aiohttp.test_utils import TestClient, TestServer

from ramen import keyspace
from ramen.program import loads
from ramen.httpd.app import GRAPHITE_VERSION, make_app
from ramen.httpd.state import Httpd, Limits
from ramen.httpd.auth import AuthError, Credentials, addressed_to_loopback, check_listen
from ramen.httpd.service import IDLE_CONNECTION_TIMEOUT_S, RUNNER_OPTIONS, SERVER_LOG
from ramen.listen import parse_listen


def sync(test):
    """Run an async test on a loop of its own (no pytest plugin needed)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


async def serve(conf, **options) -> TestClient:
    http = TestClient(TestServer(make_app(Httpd(conf, "httpd-test", **options))))
    await http.start_server()
    return http


@sync
async def test_graphite_version_no_events_and_tags_of_no_such_series(client):
    """The confserver is the suite's: other tests' programs may be loaded."""
    http = await serve(client)
    try:
        assert await (await http.get("/version")).text() == GRAPHITE_VERSION
        assert await (await http.get("/events/get_data?from=-1h&until=now&tags=deploy")).json() == []
        assert await (await http.get("/progress?requestId=nope")).json() == {"state": "unknown"}
        for path in ("/tags/autoComplete/tags?expr=name=no.such.series", "/tags/autoComplete/values?tag=no_such_tag",
                     "/tags/findSeries?expr=name=no.such.series", "/tags?filter=no_such_tag"):
            assert await (await http.get(path)).json() == [], path
        assert await (await http.get("/tags/no_such_tag")).json() is None  # as graphite-web answers
        for method, path, reason in (
                ("GET", "/tags/findSeries", "a tag query needs at least one expression"),
                ("GET", "/tags/findSeries?expr=host!=a", "no expression of 'host!=a' needs a value"),
                ("GET", "/tags/autoComplete/values", "autoComplete/values: a tag is needed"),
                ("GET", "/tags?limit=ten", "limit must be a whole number, not 'ten'"),
                ("POST", "/tags/tagSeries?path=a.b;c=d", "ramen's tags are its functions' names and factors"),
                ("POST", "/tags/delSeries", "cannot be set or deleted")):
            answer = await http.request(method, path)
            assert answer.status == 400 and reason in await answer.text(), path
    finally:
        await http.close()


@sync
async def test_bad_requests_are_one_line_400s(client):
    http = await serve(client, limits=Limits(max_targets=2, max_range_s=2 * 86400))
    try:
        for query, reason in (("", "at least one target"),
                              ("target=a&target=b&target=c", "3 targets, more than 2"),
                              ("target=a.b&from=-3d", "longer than 2 days"),
                              ("target=a.b&from=now&until=-1h", "is not before until"),
                              ("target=a.b&from=yesterdayish", "from:"),
                              ("target=a.b&maxDataPoints=lots", "maxDataPoints"),
                              (f"target=a.b&maxDataPoints={'9' * 400}", "maxDataPoints must be within"),
                              ("target=a.b&xFilesFactor=most", "xFilesFactor"),
                              ("target=a.b&xFilesFactor=2", "xFilesFactor must be within 0..1")):
            answer = await http.get(f"/render?{query}")
            text = await answer.text()
            assert answer.status == 400, (query, text)
            assert reason in text and text.count("\n") == 1, (query, text)
        answer = await http.get("/metrics/find")
        assert answer.status == 400 and "query" in await answer.text()
    finally:
        await http.close()


@sync
async def test_credentials_are_required_when_configured(client, tmp_path):
    auth = tmp_path / "auth"
    auth.write_text("# dashboards\nbearer s3cret\nbasic grafana pa:ss\n")
    http = await serve(client, credentials=Credentials.load(auth))
    try:
        assert (await http.get("/version")).status == 401
        assert (await http.get("/version", headers={"Authorization": "Bearer wrong"})).status == 401
        assert (await http.get("/version", headers={"Authorization": "Bearer s3cret"})).status == 200
        basic = base64.b64encode(b"grafana:pa:ss").decode()
        assert (await http.get("/version", headers={"Authorization": f"Basic {basic}"})).status == 200
        wrong = base64.b64encode(b"grafana:pa").decode()
        assert (await http.get("/version", headers={"Authorization": f"Basic {wrong}"})).status == 401
    finally:
        await http.close()


@sync
async def test_without_credentials_only_requests_to_a_loopback_name_are_answered(client, tmp_path):
    """A page whose name resolves to 127.0.0.1 (DNS rebinding) must not read or change anything."""
    http = await serve(client)
    try:
        for host in ("127.0.0.1:29380", "localhost", "LOCALHOST.:80", "[::1]:29380", "127.1.2.3", "app.localhost:1"):
            assert (await http.get("/version", headers={"Host": host})).status == 200, host
        for host in ("evil.example.com", "evil.example.com:29380", "10.0.0.1:29380", "localhost.evil.com",
                     "127.0.0.1.evil.com", "[2001:db8::1]:29380"):
            answer = await http.put("/dashboards/x", json={"charts": []}, headers={"Host": host})
            assert answer.status == 403, host
            assert await answer.text() == (f"httpd without --auth answers requests to 127.0.0.1 or localhost only, "
                                           f"not to {host!r}\n")
        assert client.get_or_none("dashboards/x") is None
    finally:
        await http.close()
    http = await serve(client, credentials=Credentials(tokens=(b"t",)))
    try:  # with credentials, any name (a host's, an address beyond loopback): the credentials decide
        answer = await http.get("/version", headers={"Host": "ramen.example.com", "Authorization": "Bearer t"})
        assert answer.status == 200
    finally:
        await http.close()
    assert addressed_to_loopback(None) and addressed_to_loopback("")  # HTTP/1.0: no Host


@sync
async def test_a_request_aiohttp_cannot_read_is_a_400_logged_in_one_line_without_a_traceback(client, caplog):
    server = TestServer(make_app(Httpd(client, "httpd-test")))
    await server.start_server(**RUNNER_OPTIONS)
    try:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        with caplog.at_level(logging.INFO, logger=SERVER_LOG.name):
            writer.write(f"GET /metrics/find?query={'x' * 9000} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            assert (await asyncio.wait_for(reader.readline(), 30)).startswith((b"HTTP/1.0 400", b"HTTP/1.1 400"))
            await asyncio.wait_for(reader.read(), 30)  # answered, then closed
        writer.close()
        (record,) = [r for r in caplog.records if r.name == SERVER_LOG.name]
        message = record.getMessage()
        assert record.levelno == logging.INFO and not record.exc_info and not record.exc_text
        assert "400 Got more than 8190 bytes" in message and len(message) < 300 and "\n" not in message
    finally:
        await server.close()


@sync
async def test_a_request_head_sent_halfway_or_no_request_at_all_is_closed_after_the_idle_timeout(client):
    """What RUNNER_OPTIONS' keepalive_timeout does on this aiohttp (its default held them an hour)."""
    assert RUNNER_OPTIONS["keepalive_timeout"] == IDLE_CONNECTION_TIMEOUT_S
    server = TestServer(make_app(Httpd(client, "httpd-test")))
    await server.start_server(**{**RUNNER_OPTIONS, "keepalive_timeout": 0.2})
    try:
        half, half_writer = await asyncio.open_connection(server.host, server.port)
        idle, idle_writer = await asyncio.open_connection(server.host, server.port)
        half_writer.write(b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for reader in (half, idle):
            assert await asyncio.wait_for(reader.read(), 30) == b""  # closed by the server
        for writer in (half_writer, idle_writer):
            writer.close()
    finally:
        await server.close()


def test_beyond_loopback_needs_credentials(tmp_path):
    check_listen("127.0.0.1", None)
    check_listen("localhost", None)
    with pytest.raises(AuthError, match="no credentials"):
        check_listen("0.0.0.0", None)
    auth = tmp_path / "auth"
    auth.write_text("bearer t\n")
    check_listen("0.0.0.0", Credentials.load(auth))
    auth.write_text("token t\n")
    with pytest.raises(AuthError, match=":1: expected"):
        Credentials.load(auth)
    auth.write_bytes(bytes(range(128, 256)))
    with pytest.raises(AuthError, match="is not text"):
        Credentials.load(auth)
    assert parse_listen("[::1]:0") == ("::1", 0)  # an IPv6 loopback, as in a URL: no credentials needed
    check_listen(parse_listen("[::1]:8080")[0], None)


@sync
async def test_a_batch_answers_each_render_or_its_error(client):
    http = await serve(client)
    try:
        answer = await http.post("/render/batch", json={"from": "-1h", "until": "now", "renders": [
            {"targets": ["no.such.metric"]}, {"targets": ["sumSeries(no.such.*"]}, {"targets": "x"}]})
        assert answer.status == 200
        found = await answer.json()
        assert found[0] == {"series": []}  # a path that matches nothing charts nothing, as in Graphite
        assert "column" in found[1]["error"] and "targets must be a list" in found[2]["error"]
        for body, reason in (("not json", "not JSON"), ('{"renders": 3}', "expected"),
                             ('{"from": "now", "until": "-1h", "renders": []}', "not before"),
                             ("[" * 100_000 + "]" * 100_000, "nested too deeply")):
            answer = await http.post("/render/batch", data=body, headers={"Content-Type": "application/json"})
            assert answer.status == 400 and reason in await answer.text()
    finally:
        await http.close()


@sync
async def test_a_target_of_no_path_is_answered_without_a_replay(client):
    http = await serve(client)
    try:
        answer = await http.get("/render?target=constantLine(3)&target=countSeries()&from=1000&until=1600&format=json")
        assert answer.status == 200, await answer.text()
        line, count = await answer.json()
        assert (line["target"], line["datapoints"]) == ("3.0", [[3, 1000], [3, 1300], [3, 1600]])
        assert (count["target"], [v for v, _ in count["datapoints"]]) == ("0", [0, 0, 0])
    finally:
        await http.close()


@sync
async def test_numbers_too_large_for_a_function_are_one_line_400s_not_500s(client):
    """Each was a 500 with a traceback: Python refused to read the integer, or numpy or a float could
    not hold it."""
    http = await serve(client)
    try:
        for target, status, reason in ((f"scale(constantLine(1), {'9' * 5000})", 200, None),
                                       (f"constantLine({'9' * 400})", 200, None),
                                       (f"round(constantLine(1), {'9' * 12})", 400, "must be an integer within"),
                                       (f"timeFunction('t', {'9' * 30})", 400, "must be an integer, not 1e+30"),
                                       (f"sinFunction('s', 1, {'9' * 12})", 400, "must be an integer within")):
            answer = await http.post("/render", data={"target": target, "from": "1000", "until": "1600"})
            text = await answer.text()
            assert answer.status == status and (reason is None or reason in text), (target, text)
    finally:
        await http.close()


@sync
async def test_targets_made_by_functions_take_rounds_of_fetches_up_to_a_bound(client, monkeypatch):
    """constantLine(5) is named "5": useSeriesAbove makes the target `group(no.such.path)` of it, which
    a second round fetches (no function matches it: no replay, no series)."""
    http = await serve(client)
    made = "useSeriesAbove(constantLine(5), 1, '5', 'no.such.path')"
    try:
        answer = await http.get("/render", params={"target": made, "from": "1000", "until": "1600"})
        assert answer.status == 200 and await answer.json() == [], await answer.text()
        monkeypatch.setattr("ramen.httpd.renderer.MAX_FETCH_ROUNDS", 1)
        answer = await http.get("/render", params={"target": made, "from": "1000", "until": "1600"})
        assert answer.status == 400
        assert await answer.text() == ("render: targets made by functions (applyByNode, useSeriesAbove, aliasQuery) "
                                       "need more than 1 rounds of fetches\n")
    finally:
        await http.close()


@sync
async def test_a_render_too_many_points_long_is_refused_before_its_replays(client):
    """No supervisor runs here: a render that got as far as its replays would fail another way."""
    program = loads('[program]\nname = "p"\n\n[[function]]\nname = "f"\n'
                    'source = { kind = "generator", rate = 10, hosts = 2 }\n'
                    'schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }\nevent_time = "ts"\n'
                    'factors = ["host"]\narchive = { retention = "1d" }\n')
    client.set(f"{keyspace.PROGRAMS}/p", program.to_dict())
    http = await serve(client, limits=Limits(max_points=8_000))
    try:
        answer = await http.get("/render?target=sumSeries(p.f.*.bytes)&from=-1d")  # 8,640 steps of 10 s
        assert answer.status == 400
        assert await answer.text() == ("render: the range holds 8,640 points of 1 function at their steps, more "
                                       "than 8,000: ask a shorter range or fewer series\n")
    finally:
        await http.close()


@sync
async def test_a_range_a_function_reaches_beyond_the_bound_and_a_huge_target_are_refused_before_any_replay(client):
    """No supervisor runs here: a render that got as far as its replays would fail another way."""
    program = loads('[program]\nname = "q"\n\n[[function]]\nname = "f"\n'
                    'source = { kind = "generator", rate = 10, hosts = 2 }\n'
                    'schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }\nevent_time = "ts"\n'
                    'factors = ["host"]\narchive = { retention = "1d" }\n')
    client.set(f"{keyspace.PROGRAMS}/q", program.to_dict())
    http = await serve(client)
    try:
        # A '100y' bootstrap reached back to 1970 (56 years): a grid of every host, 12 GB.
        answer = await http.get("/render?target=holtWintersForecast(q.f.host0.bytes,'100y')&from=-10min")
        assert answer.status == 400
        text = await answer.text()
        assert text.startswith("render: q.f.host0.bytes would be fetched over ") and text.endswith(
            "days (a forecast's bootstrap, a moving window or a regression's source included), more than 800\n")
        answer = await http.get("/render?target=movingAverage(q.f.host0.bytes,'1000d')&from=-1d")
        assert answer.status == 400 and "more than 800" in await answer.text()
        huge = "sumSeries(" + ",".join(["q.f.host0.bytes"] * 5000) + ")"
        answer = await http.post("/render", data={"target": huge, "from": "-1h"})
        assert answer.status == 400
        assert await answer.text() == f"render: a target of {len(huge):,} characters, more than 65,536\n"
    finally:
        await http.close()


def test_a_range_is_fetched_in_pieces_cut_where_the_renders_range_begins_and_ends_in_whole_steps():
    from ramen.httpd.renderer import pieces_of
    assert pieces_of(60, 1000, 2000, 1000, 2000) == [(1000, 2000)]  # the render's own range: one piece
    assert pieces_of(60, 700, 2000, 1000, 2000) == [(700, 960), (960, 2000)]  # a moving window's reach
    assert pieces_of(60, 700, 1500, 1000, 2000) == [(700, 960), (960, 1500)]  # a source range over its start
    assert pieces_of(60, 100, 400, 1000, 2000) == [(100, 400)]  # a timeShift's: apart altogether
    assert pieces_of(10, 500, 2500, 1000, 2000) == [(500, 1000), (1000, 2000), (2000, 2500)]


def test_httpd_waits_for_a_confserver_only_while_something_may_restart_it(tmp_path, monkeypatch):
    """`ramen httpd` by hand with no confserver failed after 31 s, waiting for a restart nobody would do."""
    import argparse

    import confserver
    from ramen import paths
    from ramen.httpd.service import _connect_timeout_s
    from ramen.locks import FileLock
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path))
    monkeypatch.delenv(confserver.CONFSERVER_ENV, raising=False)
    assert _connect_timeout_s(argparse.Namespace(confserver=None)) == confserver.DEFAULT_CONNECT_TIMEOUT_S
    assert _connect_timeout_s(argparse.Namespace(confserver="ramen://10.0.0.1:7000")) == \
        confserver.SERVICE_CONNECT_TIMEOUT_S
    paths.pid_file().parent.mkdir(parents=True)
    lock = FileLock.acquire(paths.pid_file(), create=True)  # as `ramen start` holds it while it runs
    try:
        assert _connect_timeout_s(argparse.Namespace(confserver=None)) == confserver.SERVICE_CONNECT_TIMEOUT_S
    finally:
        lock.release()


@sync
async def test_functions_lists_by_group_type_and_name_as_graphite_web(client):
    """graphite-web's /functions view: its `type=pie` listed every series function (ramen ignored
    the parameter), `group`, `grouped` and /functions/<name> too."""
    http = await serve(client)
    try:
        pie = await (await http.get("/functions?type=pie")).json()
        assert sorted(pie) == ["average", "maximum", "minimum"]
        assert pie["average"] == {"name": "average", "function": "average(series)", "description": "Return the average",
                                  "module": "ramen.httpd.functions", "group": "Pie",  # as its series functions
                                  "params": [{"name": "series", "type": "series", "required": True}]}
        alias = await (await http.get("/functions?group=Alias")).json()
        assert {"alias", "upper", "lower"} <= set(alias) and "sumSeries" not in alias
        grouped = await (await http.get("/functions?grouped=1")).json()
        assert "upper" in grouped["Alias"] and "sumSeries" in grouped["Combine"]
        upper = await http.get("/functions/upper")
        assert upper.status == 200 and (await upper.json())["function"].startswith("upper(")
        missing = await http.get("/functions/nope")
        assert missing.status == 404 and (await missing.json()) == {"error": "Function not found: nope"}
    finally:
        await http.close()

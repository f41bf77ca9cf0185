"""Dashboards in the confserver and their HTTP routes (ramen/httpd/dashboards.py), and the page's
assets (ramen/httpd/assets.py), against a real built-in confserver with aiohttp's test client."""

from __future__ import annotations

import asyncio
import json

import confserver
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from ramen.httpd import assets, dashboards
from ramen.httpd.dashboards import Chart, Dashboard, DashboardError


@pytest.fixture
def conf(builtin_server):
    """A client as httpd has one: an authenticated identity (anonymous may not write dashboards/)."""
    with confserver.connect(builtin_server.url, identity="user", auth_file=builtin_server.auth_file) as client:
        client.delete_tree("dashboards")
        yield client
        client.delete_tree("dashboards")


def serve(app_routes, test):
    """Run `test(client)` against an app built by `app_routes(app)` on a real socket."""
    async def main():
        app = web.Application()
        app_routes(app)
        async with TestClient(TestServer(app)) as client:
            return await test(client)
    return asyncio.run(main())


def two_charts(name: str = "ops") -> dict:
    return {"name": name, "charts": [{"title": "traffic", "targets": ["net.traffic.bytes", "sumSeries(net.*.bytes)"]},
                                     {"title": "", "targets": ["net.errors.count"]}],
            "from": "-6h", "until": "now", "refresh_s": 10}


# -- the value ---------------------------------------------------------------------------------------

def test_a_dashboard_is_its_value_both_ways():
    value = two_charts()
    dashboard = Dashboard.from_value(value)
    assert dashboard == Dashboard("ops", [Chart("traffic", ["net.traffic.bytes", "sumSeries(net.*.bytes)"]),
                                          Chart("", ["net.errors.count"])], "-6h", "now", 10)
    assert dashboard.to_value() == value


@pytest.mark.parametrize("value, reason", [
    ([], "dashboard ops: not a JSON object but []"),
    ({"charts": [], "colour": "red"}, "dashboard ops: unknown field 'colour'"),
    ({"charts": {}}, "dashboard ops: 'charts' is a list, not {}"),
    ({"charts": [{"title": "x"}]}, "dashboard ops: chart 1: missing field 'targets'"),
    ({"charts": [{"targets": ["a.b", ""]}]}, "dashboard ops: chart 1: target 2 is a non-empty string, not ''"),
    ({"charts": [{"targets": [3]}]}, "dashboard ops: chart 1: target 1 is a non-empty string, not 3"),
    ({"from": "yesteryear"}, "dashboard ops: 'from': "),
    ({"refresh_s": -1}, "dashboard ops: 'refresh_s' is whole seconds from 0 (off) to 86400, not -1"),
    ({"refresh_s": 1.5}, "dashboard ops: 'refresh_s' is whole seconds"),
    ({"name": "other"}, "dashboard ops: its value names another dashboard, 'other'"),
    ({"charts": [{"targets": ["a"]}] * (dashboards.MAX_CHARTS + 1)}, f"more than {dashboards.MAX_CHARTS}"),
])
def test_a_bad_value_is_refused_in_one_line_naming_the_field(value, reason):
    with pytest.raises(DashboardError) as raised:
        Dashboard.from_value(value, "ops")
    message = str(raised.value)
    assert reason in message and "\n" not in message


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "a b", "ü", "-x"])
def test_a_name_that_cannot_be_a_key_segment_is_refused(name):
    with pytest.raises(DashboardError, match="letters, digits"):
        Dashboard(name)


# -- the routes ---------------------------------------------------------------------------------------

def test_put_stores_the_dashboard_under_its_key_and_get_and_list_read_it_back(conf):
    async def test(http):
        put = await http.put("/dashboards/ops", json={k: v for k, v in two_charts().items() if k != "name"})
        assert put.status == 200, await put.text()
        stored = conf.get("dashboards/ops").value
        assert stored == two_charts()
        got = await http.get("/dashboards/ops")
        assert got.status == 200 and await got.json() == two_charts()
        await http.put("/dashboards/b.2", json=two_charts("b.2"))
        listed = await http.get("/dashboards")
        assert await listed.json() == ["b.2", "ops"]
    serve(lambda app: dashboards.add_routes(app, conf), test)


def test_put_replaces_a_saved_dashboard(conf):
    async def test(http):
        await http.put("/dashboards/ops", json=two_charts())
        changed = dict(two_charts(), charts=[], **{"from": "-15min"})
        assert (await http.put("/dashboards/ops", json=changed)).status == 200
        assert await (await http.get("/dashboards/ops")).json() == changed
    serve(lambda app: dashboards.add_routes(app, conf), test)


def test_delete_removes_the_key_and_unknown_dashboards_are_404(conf):
    async def test(http):
        await http.put("/dashboards/ops", json=two_charts())
        deleted = await http.delete("/dashboards/ops")
        assert deleted.status == 204
        assert conf.get_or_none("dashboards/ops") is None
        for answer in (await http.get("/dashboards/ops"), await http.delete("/dashboards/ops")):
            assert answer.status == 404
            assert await answer.text() == "no dashboard ops\n"
        assert await (await http.get("/dashboards")).json() == []
    serve(lambda app: dashboards.add_routes(app, conf), test)


@pytest.mark.parametrize("body, reason", [
    (b"{not json", "dashboard ops: the body is not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "dashboard ops: the body's JSON is nested too deeply"),
    (json.dumps({"charts": [{"title": "t", "targets": ["a.b"]}], "until": "tomorrow+"}).encode(),
     "dashboard ops: 'until': "),
    (json.dumps({"name": "x"}).encode(), "dashboard ops: its value names another dashboard, 'x'"),
])
def test_a_bad_body_is_a_400_with_a_one_line_reason_and_stores_nothing(conf, body, reason):
    async def test(http):
        answer = await http.put("/dashboards/ops", data=body, headers={"Content-Type": "application/json"})
        text = await answer.text()
        assert answer.status == 400, text
        assert text.startswith(reason) and text.count("\n") == 1
        assert conf.get_or_none("dashboards/ops") is None
    serve(lambda app: dashboards.add_routes(app, conf), test)


def test_a_bad_name_in_the_url_is_a_400(conf):
    async def test(http):
        answer = await http.put("/dashboards/.x", json={})
        assert answer.status == 400
        assert "letters, digits" in await answer.text()
    serve(lambda app: dashboards.add_routes(app, conf), test)


def test_a_body_over_the_bound_is_refused_unread(conf):
    async def test(http):
        answer = await http.put("/dashboards/ops", data=b" " * (dashboards.MAX_BODY_BYTES + 1))
        assert answer.status == 413
        assert conf.get_or_none("dashboards/ops") is None
    serve(lambda app: dashboards.add_routes(app, conf), test)


def test_a_value_written_by_hand_that_does_not_read_is_named_not_served(conf):
    conf.set("dashboards/hand", {"charts": "all of them"})

    async def test(http):
        answer = await http.get("/dashboards/hand")
        assert answer.status == 500
        assert (await answer.text()).startswith("dashboards/hand in the confserver: dashboard hand: 'charts' is a list")
    serve(lambda app: dashboards.add_routes(app, conf), test)


def test_an_identity_that_may_not_write_gets_a_403_naming_the_key(builtin_server, conf):
    with confserver.connect(builtin_server.url) as anonymous:
        async def test(http):
            answer = await http.put("/dashboards/ops", json=two_charts())
            assert answer.status == 403
            text = await answer.text()
            assert text.startswith("confserver: ") and "dashboards/ops" in text
        serve(lambda app: dashboards.add_routes(app, anonymous), test)


# -- the page's assets --------------------------------------------------------------------------------

def test_the_page_script_style_and_uplot_are_served(tmp_path, monkeypatch):
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "uPlot.iife.min.js").write_text("var uPlot = 'the test copy';")
    (dist / "uPlot.min.css").write_text(".uplot {}")
    monkeypatch.setenv(assets.UPLOT_DIR_ENV, str(dist))

    async def test(http):
        page = await http.get("/")
        assert page.status == 200 and page.content_type == "text/html"
        html = await page.text()
        for asset in ("/vendor/uplot/uPlot.iife.min.js", "/vendor/uplot/uPlot.min.css", "/static/page.js",
                      "/static/page.css"):
            assert asset in html
            assert (await http.get(asset)).status == 200, asset
        assert await (await http.get("/vendor/uplot/uPlot.iife.min.js")).text() == "var uPlot = 'the test copy';"
        assert (await http.get("/static/../assets.py")).status in (403, 404)
    serve(assets.add_routes, test)


def test_a_missing_uplot_makes_the_page_say_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv(assets.UPLOT_DIR_ENV, str(tmp_path / "nowhere"))

    async def test(http):
        page = await http.get("/")
        assert page.status == 503
        text = await page.text()
        assert "npm install --prefix" in text and f"uplot@{assets.UPLOT_VERSION}" in text
        assert str(tmp_path / "nowhere") in text
        assert (await http.get("/vendor/uplot/uPlot.iife.min.js")).status == 404
    serve(assets.add_routes, test)


def test_the_setup_installs_the_uplot_version_assets_names():
    from pathlib import Path
    setup = (Path(__file__).parents[2] / ".ci" / "setup").read_text()
    assert f"UPLOT_VERSION={assets.UPLOT_VERSION}\n" in setup


def test_httpds_app_serves_the_page_and_the_dashboards(conf):
    from ramen.httpd.app import make_app
    from ramen.httpd.state import Httpd
    httpd = Httpd(conf)

    async def test(http):
        assert (await http.put("/dashboards/ops", json=two_charts())).status == 200
        assert await (await http.get("/dashboards")).json() == ["ops"]
        page = await http.get("/")
        assert page.status == 200, f"uPlot missing? {assets.UPLOT_SETUP_COMMAND}"
        assert "/static/page.js" in await page.text()
        assert (await http.get("/static/page.js")).status == 200

    async def main():
        async with TestClient(TestServer(make_app(httpd))) as client:
            await test(client)
    asyncio.run(main())

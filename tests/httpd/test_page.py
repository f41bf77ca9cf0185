"""ramen's dashboard page in a real headless Chromium, against a small aiohttp app: the page's own
routes (ramen/httpd/assets.py, ramen/httpd/dashboards.py on a real built-in confserver) and a stand-in
for httpd's data routes (/render, /render/batch, /metrics/find, /progress) that answers known series and records
what the page asked. tests/e2e/test_page.py drives the same page against the real httpd and replays.
"""

from __future__ import annotations

import asyncio
import fnmatch
import math
import threading
from urllib.parse import parse_qs, urlsplit

import confserver
import pytest
from aiohttp import web

from ramen.httpd import assets, dashboards
from ramen.program.durations import MICROS_PER_SECOND
from ramen.times import TimeError, parse_time
from tests.httpd.browser import browser, charts_settled, render_counts, save_screenshot, wait_for  # noqa: F401

NOW_S = 1_764_000_000
"""The stand-in's "now", fixed so a range such as -1h is the same points at every run."""
STEP_S = 60
PATHS = ("test.saw.value", "test.sine.count", "test.sine.value")
BAD_TARGET = "sumSeries(test.saw.value"
BAD_TARGET_REASON = "target 'sumSeries(test.saw.value': a '(' is never closed"
GATE_TIMEOUT_S = 20.0
"""How long a gated render waits for the others before answering that they never came."""
RUNNING_PROGRESS = {"state": "running", "rows": 1234, "replays": 2, "replays_done": 1, "elapsed_s": 0.5}
"""As fetch.py's Progress.to_dict() answers /progress while a render runs."""


def value_at(path: str, t: int) -> float:
    """The stand-in's series: known functions of time, so the test knows each point drawn."""
    if path == "test.sine.value":
        return round(100 * math.sin(t / 600), 3)
    if path == "test.sine.count":
        return float((t // STEP_S) % 7)
    return float((t // STEP_S) % 13)


def expected_points(path: str, from_s: int, until_s: int) -> list[list]:
    first = -(-from_s // STEP_S) * STEP_S
    return [[value_at(path, t), t] for t in range(first, until_s, STEP_S)]


def epoch_s(text: str, *, end: bool) -> int:
    return parse_time(text, NOW_S * MICROS_PER_SECOND, end=end) // MICROS_PER_SECOND


class StandIn:
    """httpd's data routes as the page calls them (the contract app.py implements)."""

    def __init__(self):
        self.renders: list[dict] = []
        self.in_flight = 0
        self.gate = 0
        """A render answers only once this many are in flight together: proves they were fired at once."""
        self.released: asyncio.Event | None = None
        self.changed: asyncio.Condition | None = None
        self.running: set[str] = set()

    async def setup(self) -> None:
        self.released = asyncio.Event()
        self.released.set()
        self.changed = asyncio.Condition()

    def reset(self) -> None:
        self.renders.clear()
        self.gate = 0
        self.released.set()

    async def render(self, request: web.Request) -> web.Response:
        query = request.query
        spec = {"targets": query.getall("target", []), "maxDataPoints": query.get("maxDataPoints"),
                "requestId": query.get("requestId")}
        (status, answer), = await self._answer([spec], query.get("from"), query.get("until"))
        return web.json_response(answer) if status == 200 else web.Response(status=status, text=answer + "\n")

    async def render_batch(self, request: web.Request) -> web.Response:
        """POST /render/batch, as app.py answers it: one item per render, its series or its error."""
        body = await request.json()
        answers = await self._answer(body["renders"], body.get("from"), body.get("until"))
        return web.json_response([{"series": answer} if status == 200 else {"status": status, "error": answer}
                                  for status, answer in answers])

    async def _answer(self, specs: list[dict], from_text: str | None, until_text: str | None) -> list[tuple]:
        """(status, series or reason) per render, once `gate` renders are in flight and released."""
        for spec in specs:
            self.renders.append({"targets": spec["targets"], "from": from_text, "until": until_text,
                                 "maxDataPoints": spec.get("maxDataPoints"), "requestId": spec.get("requestId")})
            self.running.add(spec.get("requestId") or "")
        async with self.changed:
            self.in_flight += len(specs)
            self.changed.notify_all()
        try:
            if self.gate:
                async with self.changed:
                    try:
                        await asyncio.wait_for(self.changed.wait_for(lambda: self.in_flight >= self.gate),
                                               GATE_TIMEOUT_S)
                    except TimeoutError:
                        return [(504, f"only {self.in_flight} renders in flight")] * len(specs)
            await self.released.wait()
            try:
                from_s, until_s = epoch_s(from_text, end=False), epoch_s(until_text, end=True)
            except (TypeError, TimeError) as e:
                return [(400, str(e))] * len(specs)
            return [self._series(spec["targets"], from_s, until_s) for spec in specs]
        finally:
            for spec in specs:
                self.running.discard(spec.get("requestId") or "")
            async with self.changed:
                self.in_flight -= len(specs)

    @staticmethod
    def _series(targets: list[str], from_s: int, until_s: int) -> tuple:
        answer = []
        for target in targets:
            if target == BAD_TARGET:
                return 400, BAD_TARGET_REASON
            for path in sorted(p for p in PATHS if fnmatch.fnmatchcase(p, target)):
                answer.append({"target": path, "tags": {"name": path},
                               "datapoints": expected_points(path, from_s, until_s)})
        return 200, answer

    async def progress(self, request: web.Request) -> web.Response:
        if request.query.get("requestId") in self.running:
            return web.json_response(RUNNING_PROGRESS)
        return web.json_response({"state": "unknown", "rows": 0, "replays": 0, "elapsed_s": 0})

    async def find(self, request: web.Request) -> web.Response:
        """As httpd's /metrics/find answers format=json: every match by its path, sorted."""
        assert request.query["format"] == "json", request.query
        query = request.query["query"].split(".")
        nodes = {}
        for path in PATHS:
            parts = path.split(".")
            if len(parts) >= len(query) and all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, query)):
                node = ".".join(parts[:len(query)])
                nodes[node] = {"path": node, "is_leaf": len(parts) == len(query)}
        return web.json_response([nodes[k] for k in sorted(nodes)])


class ServedPage:
    """The app on a real socket, its loop in a thread of its own (Selenium's calls block)."""

    def __init__(self, client):
        self.stand_in = StandIn()
        self.client = client
        self.loop = asyncio.new_event_loop()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _start(self) -> None:
        await self.stand_in.setup()
        app = web.Application()
        assets.add_routes(app)
        dashboards.add_routes(app, self.client)
        app.router.add_get("/render", self.stand_in.render)
        app.router.add_post("/render/batch", self.stand_in.render_batch)
        app.router.add_get("/progress", self.stand_in.progress)
        app.router.add_get("/metrics/find", self.stand_in.find)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    def start(self) -> ServedPage:
        threading.Thread(target=self.loop.run_forever, name="page-app", daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    def call(self, function, *args):
        """function(*args) on the app's loop (the stand-in's events belong to it)."""
        async def run():
            return function(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def conf(builtin_server):
    with confserver.connect(builtin_server.url, identity="user", auth_file=builtin_server.auth_file) as client:
        yield client


@pytest.fixture(scope="module")
def served(conf):
    if assets.uplot_dir() is None:
        pytest.fail(f"uPlot is not installed: {assets.UPLOT_SETUP_COMMAND}")
    page = ServedPage(conf).start()
    yield page
    page.stop()


@pytest.fixture
def page(served, conf, browser):  # noqa: F811  (the fixture imported above)
    conf.delete_tree("dashboards")
    served.call(served.stand_in.reset)
    yield served
    conf.delete_tree("dashboards")


def open_page(browser, page, query: str = "") -> None:  # noqa: F811
    browser.get(f"{page.url}/{query}")
    wait_for(browser, "return window.ramenPage !== undefined", what="the page's script")


def assert_drawn(chart: dict, paths: list[str], from_s: int, until_s: int) -> None:
    """The chart drew exactly the stand-in's points of `paths` over [from_s, until_s)."""
    assert chart["error"] == ""
    assert [s["target"] for s in chart["series"]] == paths
    for series, path in zip(chart["series"], paths):
        assert series["datapoints"] == expected_points(path, from_s, until_s)
    times = sorted({t for path in paths for _, t in expected_points(path, from_s, until_s)})
    assert chart["data"][0] == times
    for column, path in zip(chart["data"][1:], paths):
        assert column == [value_at(path, t) for t in times]


def test_charts_named_in_the_url_render_at_once_and_draw_what_render_answered(browser, page):  # noqa: F811
    page.stand_in.gate = 2  # neither chart is answered until both asked
    open_page(browser, page, "?chart1=test.sine.value&title1=sine&chart2=test.saw.value&chart2=test.sine.count"
                             "&from=-1h&until=now")
    charts = charts_settled(browser)
    from_s, until_s = epoch_s("-1h", end=False), epoch_s("now", end=True)
    assert [c["title"] for c in charts] == ["sine", ""]
    assert_drawn(charts[0], ["test.sine.value"], from_s, until_s)
    assert_drawn(charts[1], ["test.saw.value", "test.sine.count"], from_s, until_s)
    assert len(browser.find_elements("css selector", ".chart .uplot")) == 2
    assert sorted(r["targets"] for r in page.stand_in.renders) == [["test.saw.value", "test.sine.count"],
                                                                    ["test.sine.value"]]
    assert all(int(r["maxDataPoints"]) >= 200 and r["requestId"] for r in page.stand_in.renders)
    assert len({r["requestId"] for r in page.stand_in.renders}) == 2


def test_more_charts_than_a_browser_opens_connections_are_still_asked_for_at_once(browser, page):  # noqa: F811
    """A browser opens 6 connections to a host: one request per chart would leave 4 of these 10
    waiting, past the supervisor's merge delay. The page sends them in one /render/batch."""
    charts = 10
    page.stand_in.gate = charts  # none is answered until all ten are asked
    open_page(browser, page, "?" + "&".join(f"chart{i}=test.saw.value" for i in range(1, charts + 1)) + "&from=-1h")
    drawn = charts_settled(browser)
    from_s, until_s = epoch_s("-1h", end=False), epoch_s("now", end=True)
    assert len(drawn) == charts
    for chart in drawn:
        assert_drawn(chart, ["test.saw.value"], from_s, until_s)


def test_series_are_picked_from_the_tree_and_a_preset_rerenders_every_chart(browser, page):  # noqa: F811
    open_page(browser, page)
    search = browser.find_element("id", "search")
    search.send_keys("test.s")
    wait_for(browser, "return [...document.querySelectorAll('#search-results li')].map(l => l.dataset.id)"
                      ".join() === 'test.saw,test.sine'", what="the branches matching test.s*")
    browser.find_element("css selector", "#search-results li[data-id='test.sine']").click()
    wait_for(browser, "return document.querySelector(\"#search-results li[data-id='test.sine.value']\")",
             what="the leaves under test.sine")
    browser.find_element("css selector", "#search-results li[data-id='test.sine.value']").click()
    charts = charts_settled(browser)
    assert charts[0]["targets"] == ["test.sine.value"]

    browser.find_element("id", "add-chart").click()
    second = browser.find_elements("css selector", ".chart")[1]
    second.find_element("css selector", ".chart-target-input").send_keys("test.sa*.value\n")
    wait_for(browser, "return window.ramenCharts[1].renders >= 1 && window.ramenCharts[1].state === 'done'",
             what="the second chart")

    before = render_counts(browser)
    browser.find_element("css selector", "#preset option[value='-6h']").click()
    charts = charts_settled(browser, before)
    from_s, until_s = epoch_s("-6h", end=False), epoch_s("now", end=True)
    assert_drawn(charts[0], ["test.sine.value"], from_s, until_s)
    assert_drawn(charts[1], ["test.saw.value"], from_s, until_s)
    assert [(r["from"], r["until"]) for r in page.stand_in.renders[-2:]] == [("-6h", "now")] * 2
    query = parse_qs(urlsplit(browser.current_url).query)
    assert query == {"chart1": ["test.sine.value"], "chart2": ["test.sa*.value"], "from": ["-6h"], "until": ["now"]}


def test_a_drag_on_one_chart_zooms_every_chart_into_that_range(browser, page):  # noqa: F811
    from selenium.webdriver.common.action_chains import ActionChains
    open_page(browser, page, "?chart1=test.sine.value&chart2=test.saw.value&from=-1h&until=now")
    before = [c["renders"] for c in charts_settled(browser)]
    over = browser.find_elements("css selector", ".chart .u-over")[0]
    width = over.size["width"]
    ActionChains(browser).move_to_element_with_offset(over, -width // 4, 0).click_and_hold() \
        .move_by_offset(width // 2, 0).release().perform()
    charts = charts_settled(browser, before)
    from_s, until_s = int(charts[0]["from"]), int(charts[0]["until"])
    whole_from, whole_until = epoch_s("-1h", end=False), epoch_s("now", end=True)
    # Half the chart's width, from a quarter in: about the middle half of the hour.
    assert whole_from + 600 < from_s < whole_from + 1200 and whole_until - 1200 < until_s < whole_until - 600
    assert [(c["from"], c["until"]) for c in charts] == [(str(from_s), str(until_s))] * 2
    assert_drawn(charts[0], ["test.sine.value"], from_s, until_s)
    assert_drawn(charts[1], ["test.saw.value"], from_s, until_s)
    assert {(r["from"], r["until"]) for r in page.stand_in.renders[-2:]} == {(str(from_s), str(until_s))}
    query = parse_qs(urlsplit(browser.current_url).query)
    assert (query["from"], query["until"]) == ([str(from_s)], [str(until_s)])


def test_a_running_render_shows_its_replays_progress(browser, page):  # noqa: F811
    page.call(page.stand_in.released.clear)
    open_page(browser, page, "?chart1=test.sine.value")
    status = wait_for(browser, "const s = document.querySelector('.chart-status').textContent;"
                               "return s.startsWith('replaying') && s", what="the progress line")
    assert status == "replaying: 1,234 rows, 1 of 2 replays done, 0.5 s"
    assert browser.execute_script("return window.ramenCharts[0].progress") == RUNNING_PROGRESS
    page.call(page.stand_in.released.set)
    charts_settled(browser)
    assert browser.find_element("css selector", ".chart-status").text == "1 series, 60 points"


def test_a_bad_target_shows_the_servers_reason_in_its_chart(browser, page, tmp_path):  # noqa: F811
    open_page(browser, page, f"?chart1={BAD_TARGET}&chart2=test.saw.value")
    charts = charts_settled(browser)
    assert charts[0]["state"] == "error" and charts[0]["error"] == f"400: {BAD_TARGET_REASON}"
    error = browser.find_elements("css selector", ".chart-error")[0]
    assert error.is_displayed() and error.text == f"400: {BAD_TARGET_REASON}"
    assert charts[1]["state"] == "done" and not browser.find_elements("css selector", ".chart-error")[1].is_displayed()
    save_screenshot(browser, tmp_path / "bad-target.png")


def test_an_absolute_range_renders_between_its_utc_times(browser, page):  # noqa: F811
    open_page(browser, page, "?chart1=test.saw.value")
    before = [c["renders"] for c in charts_settled(browser)]
    browser.execute_script("""
        const set = (id, v) => { const e = document.getElementById(id); e.value = v;
                                 e.dispatchEvent(new Event('change')); };
        set('abs-from', '2025-11-24T10:00:00'); set('abs-until', '2025-11-24T10:30:00');""")
    charts = charts_settled(browser, before)
    from_s, until_s = 1_763_978_400, 1_763_980_200  # 10:00 and 10:30 UTC
    assert (charts[0]["from"], charts[0]["until"]) == (str(from_s), str(until_s))
    assert_drawn(charts[0], ["test.saw.value"], from_s, until_s)


def test_a_dashboard_is_saved_reloaded_from_its_url_listed_and_deleted(browser, page, conf):  # noqa: F811
    open_page(browser, page, "?chart1=test.sine.value&title1=sine&chart2=test.saw.value&from=-6h&until=now")
    charts_settled(browser)
    browser.find_element("css selector", "#refresh option[value='10']").click()
    browser.find_element("id", "dashboard-name").send_keys("ops")
    browser.find_element("id", "save").click()
    wait_for(browser, "return document.getElementById('dashboard-status').textContent === 'saved ops'",
             what="the save")
    assert conf.get("dashboards/ops").value == {
        "name": "ops", "charts": [{"title": "sine", "targets": ["test.sine.value"]},
                                  {"title": "", "targets": ["test.saw.value"]}],
        "from": "-6h", "until": "now", "refresh_s": 10}
    shared = browser.current_url
    assert parse_qs(urlsplit(shared).query) == {"dashboard": ["ops"], "from": ["-6h"], "until": ["now"],
                                                "refresh": ["10"]}

    # The URL alone brings it back, from the confserver, with a range of its own.
    conf.set("dashboards/ops", dict(conf.get("dashboards/ops").value, charts=[
        {"title": "from the confserver", "targets": ["test.sine.count"]}]))
    open_page(browser, page, "?" + urlsplit(shared).query.replace("from=-6h", "from=-15min"))
    charts = charts_settled(browser)
    assert [(c["title"], c["targets"]) for c in charts] == [("from the confserver", ["test.sine.count"])]
    assert_drawn(charts[0], ["test.sine.count"], epoch_s("-15min", end=False), epoch_s("now", end=True))
    assert browser.find_element("id", "dashboard-name").get_attribute("value") == "ops"
    wait_for(browser, "return [...document.querySelectorAll('#dashboards option')].map(o => o.value).join() === ',ops'",
             what="the saved dashboards' list")

    browser.find_element("id", "delete").click()
    wait_for(browser, "return document.getElementById('dashboard-status').textContent === 'deleted ops'",
             what="the delete")
    assert conf.get_or_none("dashboards/ops") is None


def test_an_unknown_dashboard_in_the_url_says_so(browser, page):  # noqa: F811
    open_page(browser, page, "?dashboard=gone")
    status = wait_for(browser, "return document.getElementById('dashboard-status').textContent",
                      what="the dashboard's status")
    assert status == "cannot load gone: 404: no dashboard gone"



def test_a_search_ending_with_a_dot_lists_what_is_below_that_level(browser, page):  # noqa: F811
    open_page(browser, page)
    browser.find_element("id", "search").send_keys("test.*.")
    wait_for(browser, "return [...document.querySelectorAll('#search-results li')].map(l => l.dataset.id)"
                      ".join() === 'test.saw.value,test.sine.count,test.sine.value'", what="the leaves under test.*")
    assert browser.find_element("id", "search-status").text == "test.*.*: 3"


# The page's timers, taken over before its script runs: the test fires the auto-refresh itself
# instead of waiting 10 s (and can see that none is left running once it is turned off).
MANUAL_INTERVALS = """
window.manualIntervals = [];
window.setInterval = (callback, ms) => window.manualIntervals.push({callback, ms, cleared: false});
window.clearInterval = (id) => { if (id) window.manualIntervals[id - 1].cleared = true; };
"""


def test_auto_refresh_rerenders_every_chart_at_its_period_until_turned_off(browser, page):  # noqa: F811
    script = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": MANUAL_INTERVALS})
    try:
        open_page(browser, page, "?chart1=test.saw.value&chart2=test.sine.value&refresh=10")
        before = [c["renders"] for c in charts_settled(browser)]
        intervals = browser.execute_script("return window.manualIntervals.map(i => [i.ms, i.cleared])")
        assert intervals == [[10_000, False]]
        assert browser.find_element("id", "refresh").get_attribute("value") == "10"
        renders = len(page.stand_in.renders)
        browser.execute_script("window.manualIntervals[0].callback()")
        charts = charts_settled(browser, before)
        assert [c["renders"] for c in charts] == [n + 1 for n in before]
        assert len(page.stand_in.renders) == renders + 2

        browser.find_element("css selector", "#refresh option[value='60']").click()
        assert browser.execute_script("return window.manualIntervals.map(i => [i.ms, i.cleared])") == [
            [10_000, True], [60_000, False]]
        browser.find_element("css selector", "#refresh option[value='0']").click()
        assert browser.execute_script("return window.manualIntervals.every(i => i.cleared)")
        assert "refresh" not in parse_qs(urlsplit(browser.current_url).query)
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})

"""ramen's dashboard page end to end: `ramen start` with an archived program and its httpd, the page
in Debian's headless Chromium. A two-chart dashboard is built through the page; the points it draws
must be what `ramen replay` prints for the same series; a drag zooms every chart; the dashboard is
saved, and the page reloaded from its URL shows it again; a bad target's error is shown in its chart.

Starts ramen services: run under `flock /tmp/ramen-e2e.lock`.
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from ramen import paths
from ramen.archive.coverage import archive_coverage
from tests.e2e.test_replay import Stack
from tests.httpd.browser import browser, charts_settled, save_screenshot, wait_for  # noqa: F401 (a fixture)
from tests.waiting import wait_for as wait_until

RATE = 20
HOSTS = 2
BACKFILL_MIN = 8
PROGRAM = f"""
[program]
name = "pg"

[[function]]
name = "traffic"
source = {{ kind = "generator", rate = {RATE}, hosts = {HOSTS}, seed = 5, backfill = "{BACKFILL_MIN}m" }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
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
STARTUP_S = 60.0
MINUTE_S = 60
HOST_NAMES = [f"host{i:02d}" for i in range(HOSTS)]
FIRST = f"pg.per_minute.{HOST_NAMES[0]}.bytes"
SECOND = f"pg.per_minute.{HOST_NAMES[1]}.bytes"
TOTAL = "sumSeries(pg.per_minute.*.bytes)"
BAD = "sumSeries(pg.per_minute.*.bytes"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """ramen with its httpd, the archive back-filled."""
    base = tmp_path_factory.mktemp("page")
    program = base / "pg.toml"
    program.write_text(PROGRAM)
    stack = Stack(base)
    started = stack.ramen("start", "--daemon", "--dir", base, program, timeout=STARTUP_S)
    assert started.returncode == 0, started.stderr + started.stdout
    try:
        wait_for_backfill(base)
        wait_until(lambda: (base / "run" / "httpd.url").exists(), "ramen httpd's URL", timeout_s=STARTUP_S)
        yield stack
    finally:
        stack.ramen("stop", "--dir", base)


def wait_for_backfill(base: Path) -> None:
    now_us = time.time_ns() // 1000
    want_since, want_until = now_us - (BACKFILL_MIN - 1) * MINUTE_S * 10**6, now_us - MINUTE_S * 10**6
    os.environ["RAMEN_DIR"], saved = str(base), os.environ.get("RAMEN_DIR")
    try:
        wait_until(lambda: any(i.since_us <= want_since and i.until_us >= want_until
                               for i in archive_coverage(paths.archive_dir("local")).get("pg/traffic", [])),
                   "the archive covering the back-filled range", timeout_s=STARTUP_S)
    finally:
        os.environ.pop("RAMEN_DIR") if saved is None else os.environ.__setitem__("RAMEN_DIR", saved)


def httpd_url(stack: Stack) -> str:
    return (stack.base / "run" / "httpd.url").read_text().strip().rstrip("/")


def replayed(stack: Stack, since_s: int, until_s: int) -> dict[str, dict[int, float]]:
    """What `ramen replay` prints for pg/per_minute over [since, until): host -> {start_s: bytes}."""
    result = stack.ramen("replay", "--since", since_s, "--until", until_s, "--format", "csv", "--with-header",
                         "pg/per_minute")
    assert result.returncode == 0, result.stderr
    table = pacsv.read_csv(io.BytesIO(result.stdout.encode()))
    starts = table["start"].cast(pa.timestamp("s")).cast(pa.int64()).to_pylist()
    by_host: dict[str, dict[int, float]] = {}
    for start, host, value in zip(starts, table["host"].to_pylist(), table["bytes"].to_pylist()):
        by_host.setdefault(host, {})[start] = float(value)
    return by_host


def drawn(chart: dict) -> dict[str, dict[int, float]]:
    """The points a chart drew (uPlot's data: x, then one column per series), by series name."""
    xs, *columns = chart["data"]
    return {series["target"]: {t: v for t, v in zip(xs, column) if v is not None}
            for series, column in zip(chart["series"], columns)}


def test_the_page_charts_what_ramen_replay_prints_zooms_saves_reloads_and_shows_errors(stack, browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.action_chains import ActionChains
    now_minute = int(time.time()) // MINUTE_S * MINUTE_S
    since, until = now_minute - 6 * MINUTE_S, now_minute - 2 * MINUTE_S
    expected = replayed(stack, since, until)
    assert sorted(expected) == HOST_NAMES and all(len(points) == 4 for points in expected.values())
    total = {t: sum(expected[h][t] for h in HOST_NAMES) for t in expected[HOST_NAMES[0]]}

    url = httpd_url(stack)
    browser.get(f"{url}/?from={since}&until={until}")
    wait_for(browser, "return window.ramenPage !== undefined", what="the page's script")

    # Chart 1 from the series tree, through the search box.
    browser.find_element("id", "search").send_keys("pg.per_minute.*.")
    leaf = wait_for(browser, f"return document.querySelector(\"#search-results li[data-id='{FIRST}']\")",
                    what=f"{FIRST} in the search results")
    leaf.click()
    # Chart 2 typed in: a Graphite function over a glob, and a plain series.
    browser.find_element("id", "add-chart").click()
    second = browser.find_elements("css selector", ".chart")[1]
    second.find_element("css selector", ".chart-target-input").send_keys(TOTAL + "\n")
    second.find_element("css selector", ".chart-target-input").send_keys(SECOND + "\n")
    charts = wait_for(browser, """const c = window.ramenCharts;
        return c.length === 2 && c[1].targets.length === 2 && c.every(x => x.state === 'done') &&
               JSON.parse(JSON.stringify(c));""", what="both charts drawn")
    assert [c["targets"] for c in charts] == [[FIRST], [TOTAL, SECOND]]
    assert drawn(charts[0]) == {FIRST: expected[HOST_NAMES[0]]}
    assert drawn(charts[1]) == {TOTAL: total, SECOND: expected[HOST_NAMES[1]]}

    # A drag over the middle of chart 1 narrows both charts to it.
    before = [c["renders"] for c in charts]
    over = browser.find_elements("css selector", ".chart .u-over")[0]
    width = over.size["width"]
    ActionChains(browser).move_to_element_with_offset(over, -width // 4, 0).click_and_hold() \
        .move_by_offset(width // 2, 0).release().perform()
    charts = charts_settled(browser, before)
    zoom_from, zoom_until = int(charts[0]["from"]), int(charts[0]["until"])
    assert since < zoom_from < zoom_until < until
    assert [(c["from"], c["until"]) for c in charts] == [(str(zoom_from), str(zoom_until))] * 2
    for chart in charts:
        for name, points in drawn(chart).items():
            whole = {FIRST: expected[HOST_NAMES[0]], SECOND: expected[HOST_NAMES[1]], TOTAL: total}[name]
            assert points and all(zoom_from - MINUTE_S < t < zoom_until for t in points), (name, points)
            assert points == {t: whole[t] for t in points}

    # Saved, then the page reloaded from its URL shows the same dashboard over the same range.
    browser.find_element("id", "dashboard-name").send_keys("e2e")
    browser.find_element("id", "save").click()
    wait_for(browser, "return document.getElementById('dashboard-status').textContent === 'saved e2e'",
             what="the save")
    shared = browser.current_url
    assert parse_qs(urlsplit(shared).query) == {"dashboard": ["e2e"], "from": [str(zoom_from)],
                                                "until": [str(zoom_until)]}
    browser.get(shared.replace(f"from={zoom_from}", f"from={since}").replace(f"until={zoom_until}",
                                                                             f"until={until}"))
    charts = charts_settled(browser)
    assert [c["targets"] for c in charts] == [[FIRST], [TOTAL, SECOND]]
    assert drawn(charts[0]) == {FIRST: expected[HOST_NAMES[0]]}
    assert drawn(charts[1]) == {TOTAL: total, SECOND: expected[HOST_NAMES[1]]}

    # A bad target: httpd's one-line reason, in its chart.
    before = [c["renders"] for c in charts]
    first = browser.find_elements("css selector", ".chart")[0]
    first.find_element("css selector", ".chart-target-input").send_keys(BAD + "\n")
    error = wait_for(browser, "const c = window.ramenCharts[0]; return c.state === 'error' && c.error",
                     what="the bad target's error")
    assert error.startswith("400: ") and "\n" not in error
    shown = browser.find_elements("css selector", ".chart-error")[0]
    assert shown.is_displayed() and shown.text == error
    save_screenshot(browser, tmp_path / "page.png")

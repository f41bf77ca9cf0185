"""ramen's dashboard page end to end: `ramen start` with an archived program and its httpd, the page
in Debian's headless Chromium. A two-chart dashboard is built through the page; the points it draws
must be what `ramen replay` prints for the same series; a drag zooms every chart; the dashboard is
saved, and the page reloaded from its URL shows it again; a bad target's error is shown in its chart.

Runs on the dashboards' shared site (tests/e2e/dashboards/conftest.py): run under `flock /tmp/ramen-e2e.lock`.
"""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

from tests.e2e.dashboards.site import HOST_NAMES, MINUTE_S
from tests.httpd.browser import browser, charts_settled, save_screenshot, wait_for  # noqa: F401 (a fixture)

FIRST = f"web.per_minute.{HOST_NAMES[0]}.bytes"
SECOND = f"web.per_minute.{HOST_NAMES[1]}.bytes"
TOTAL = "sumSeries(web.per_minute.*.bytes)"
BAD = "sumSeries(web.per_minute.*.bytes"


def drawn(chart: dict) -> dict[str, dict[int, float]]:
    """The points a chart drew (uPlot's data: x, then one column per series), by series name."""
    xs, *columns = chart["data"]
    return {series["target"]: {t: v for t, v in zip(xs, column) if v is not None}
            for series, column in zip(chart["series"], columns)}


def test_the_page_charts_what_ramen_replay_prints_zooms_saves_and_shows_errors(dashboard_site, browser, tmp_path):  # noqa: F811,E501
    from selenium.webdriver.common.action_chains import ActionChains
    now_minute = int(time.time()) // MINUTE_S * MINUTE_S
    since, until = now_minute - 6 * MINUTE_S, now_minute - 2 * MINUTE_S
    expected = dashboard_site.per_minute_by_host(since, until)
    assert sorted(expected) == HOST_NAMES and all(len(points) == 4 for points in expected.values())
    total = {t: sum(expected[h][t] for h in HOST_NAMES) for t in expected[HOST_NAMES[0]]}

    url = dashboard_site.url
    browser.get(f"{url}/?from={since}&until={until}")
    wait_for(browser, "return window.ramenPage !== undefined", what="the page's script")

    # A glob before the last level lists every match (it listed the first host's alone).
    browser.find_element("id", "search").send_keys("web.per_minute.*.bytes")
    wait_for(browser, "return [...document.querySelectorAll('#search-results li')].map(l => l.dataset.id).join() === "
                      f"'{','.join(f'web.per_minute.{host}.bytes' for host in HOST_NAMES)}'",
             what="every host's bytes in the search results")
    browser.find_element("id", "search").clear()
    # Chart 1 from the series tree, through the search box.
    browser.find_element("id", "search").send_keys("web.per_minute.*.")
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

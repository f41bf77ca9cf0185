"""graphite-web's cluster federation end to end: `ramen start` with an archived program and its
httpd, and a real graphite-web (Debian's 1.1.8) whose CLUSTER_SERVERS names that httpd. graphite-web
must list ramen's metrics and chart ramen's series exactly as `ramen replay` prints them.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.e2e.dashboards.site import HOST_NAMES, HTTP_TIMEOUT_S, MINUTE_S, minute_range
from tests.httpd.graphite_web import absent_reason, cluster_server, graphite_web  # noqa: F401 (a fixture)

# Asked once, before the shared site starts for nothing: the graphite_web fixture would skip only after.
_ABSENT = absent_reason()
pytestmark = pytest.mark.skipif(_ABSENT is not None, reason=str(_ABSENT))


def get(url: str, path: str, **params) -> list | dict:
    query = urllib.parse.urlencode(params, doseq=True)
    try:
        with urllib.request.urlopen(f"{url}{path}?{query}", timeout=HTTP_TIMEOUT_S) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        pytest.fail(f"{path} answered {error.code}: {error.read()[-500:]!r}")


def charted(series: dict) -> dict[int, float]:
    return {ts: value for value, ts in series["datapoints"] if value is not None}


@pytest.mark.parametrize("use_post", [False, True], ids=["get", "post"])
def test_graphite_web_lists_ramens_metrics(dashboard_site, graphite_web, use_post):  # noqa: F811
    web = graphite_web([cluster_server(dashboard_site.url)], use_post=use_post)

    top = get(web.url, "/metrics/find", query="web.*")
    assert ("web.per_minute", 0) in [(node["id"], node["leaf"]) for node in top]
    hosts = get(web.url, "/metrics/find", query="web.per_minute.*")
    assert [(node["id"], node["leaf"]) for node in hosts] == [(f"web.per_minute.{h}", 0) for h in HOST_NAMES]
    fields = get(web.url, "/metrics/find", query=f"web.per_minute.{HOST_NAMES[0]}.*")
    assert [(node["id"], node["leaf"]) for node in fields] == [(f"web.per_minute.{HOST_NAMES[0]}.bytes", 1)]


@pytest.mark.parametrize("use_post", [False, True], ids=["get", "post"])
def test_graphite_web_charts_what_ramen_replay_prints(dashboard_site, graphite_web, use_post):  # noqa: F811
    web = graphite_web([cluster_server(dashboard_site.url)], use_post=use_post)
    since, until = minute_range(6, 4)
    expected = dashboard_site.per_minute_by_host(since, until)
    assert sorted(expected) == HOST_NAMES and all(len(points) == 4 for points in expected.values())

    for host in HOST_NAMES:
        [series] = get(web.url, "/render", target=f"web.per_minute.{host}.bytes", format="json",
                       **{"from": since, "until": until})
        assert series["target"] == f"web.per_minute.{host}.bytes"
        assert [ts for _, ts in series["datapoints"]] == list(range(since, until, MINUTE_S))
        assert charted(series) == expected[host]

    # A glob goes to ramen unexpanded; ramen's answer must file each series under it.
    both = get(web.url, "/render", target="web.per_minute.*.bytes", format="json", **{"from": since, "until": until})
    assert {series["target"]: charted(series) for series in both} == {
        f"web.per_minute.{host}.bytes": expected[host] for host in HOST_NAMES}
    # And graphite-web's own functions work on ramen's series.
    [total] = get(web.url, "/render", target="sumSeries(web.per_minute.*.bytes)", format="json",
                  **{"from": since, "until": until})
    assert charted(total) == {ts: sum(expected[h][ts] for h in HOST_NAMES) for ts in expected[HOST_NAMES[0]]}


def test_graphite_web_completes_ramens_tags_and_charts_its_tagged_series(dashboard_site, graphite_web):  # noqa: F811
    web = graphite_web([cluster_server(dashboard_site.url)])
    assert get(web.url, "/tags/autoComplete/tags", expr="name=web.per_minute.bytes") == ["host"]
    assert get(web.url, "/tags/autoComplete/values", tag="host", expr="name=web.per_minute.bytes") == HOST_NAMES
    since, until = minute_range(6, 4)
    expected = dashboard_site.per_minute_by_host(since, until)
    two = HOST_NAMES[:2]
    # graphite-web sends the call as written, and files the series it gets back by it
    query = f"seriesByTag('name=web.per_minute.bytes','host=~^({'|'.join(two)})$')"
    found = get(web.url, "/render", target=query, format="json", **{"from": since, "until": until})
    assert [(series["target"], series["tags"]) for series in found] == [
        (f"web.per_minute.bytes;host={h}", {"name": "web.per_minute.bytes", "host": h}) for h in two]
    assert [charted(series) for series in found] == [expected[h] for h in two]
    [total] = get(web.url, "/render", target=f"sumSeries({query})", format="json", **{"from": since, "until": until})
    assert charted(total) == {ts: sum(expected[h][ts] for h in two) for ts in expected[two[0]]}

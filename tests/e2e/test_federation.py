"""graphite-web's cluster federation end to end: `ramen start` with an archived program and its
httpd, and a real graphite-web (Debian's 1.1.8) whose CLUSTER_SERVERS names that httpd. graphite-web
must list ramen's metrics and chart ramen's series exactly as `ramen replay` prints them.
"""

from __future__ import annotations

import io
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from ramen import paths
from ramen.archive.coverage import archive_coverage
from tests.e2e.test_replay import Stack
from tests.httpd.graphite_web import absent_reason, cluster_server, graphite_web  # noqa: F401 (a fixture)
from tests.waiting import wait_for

# Asked once, before ramen starts for nothing: the graphite_web fixture would skip only after.
_ABSENT = absent_reason()
pytestmark = pytest.mark.skipif(_ABSENT is not None, reason=str(_ABSENT))

RATE = 20
HOSTS = 2
BACKFILL_MIN = 8
PROGRAM = f"""
[program]
name = "fed"

[[function]]
name = "traffic"
source = {{ kind = "generator", rate = {RATE}, hosts = {HOSTS}, seed = 11, backfill = "{BACKFILL_MIN}m" }}
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
HTTP_TIMEOUT_S = 120.0
MINUTE_S = 60
HOST_NAMES = [f"host{i:02d}" for i in range(HOSTS)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """ramen with its httpd, the archive back-filled."""
    base = tmp_path_factory.mktemp("federation")
    program = base / "fed.toml"
    program.write_text(PROGRAM)
    stack = Stack(base)
    started = stack.ramen("start", "--daemon", "--dir", base, program, timeout=STARTUP_S)
    assert started.returncode == 0, started.stderr + started.stdout
    try:
        wait_for_backfill_of(base)
        wait_for(lambda: (base / "run" / "httpd.url").exists(), "ramen httpd's URL", timeout_s=STARTUP_S)
        yield stack
    finally:
        stack.ramen("stop", "--dir", base)


def wait_for_backfill_of(base: Path) -> None:
    """Until the archive under `base` covers the back-filled range of fed/traffic but its last minute."""
    now_us = time.time_ns() // 1000
    want_since, want_until = now_us - (BACKFILL_MIN - 1) * MINUTE_S * 10**6, now_us - MINUTE_S * 10**6
    os.environ["RAMEN_DIR"], saved = str(base), os.environ.get("RAMEN_DIR")
    try:
        wait_for(lambda: any(i.since_us <= want_since and i.until_us >= want_until
                             for i in archive_coverage(paths.archive_dir("local")).get("fed/traffic", [])),
                 "the archive covering the back-filled range", timeout_s=STARTUP_S)
    finally:
        os.environ.pop("RAMEN_DIR") if saved is None else os.environ.__setitem__("RAMEN_DIR", saved)


def httpd_url(stack: Stack) -> str:
    return (stack.base / "run" / "httpd.url").read_text().strip()


def get(url: str, path: str, **params) -> list | dict:
    query = urllib.parse.urlencode(params, doseq=True)
    try:
        with urllib.request.urlopen(f"{url}{path}?{query}", timeout=HTTP_TIMEOUT_S) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        pytest.fail(f"{path} answered {error.code}: {error.read()[-500:]!r}")


def minute_range(minutes_ago: int, minutes: int) -> tuple[int, int]:
    """[since, until) in epoch seconds, on minute boundaries, well inside the back-filled range."""
    now_minute = int(time.time()) // MINUTE_S * MINUTE_S
    since = now_minute - minutes_ago * MINUTE_S
    return since, since + minutes * MINUTE_S


def replayed(stack: Stack, since_s: int, until_s: int) -> dict[str, dict[int, float]]:
    """What `ramen replay` prints for fed/per_minute over [since, until): host -> {start_s: bytes}."""
    result = stack.ramen("replay", "--since", since_s, "--until", until_s, "--format", "csv", "--with-header",
                         "fed/per_minute")
    assert result.returncode == 0, result.stderr
    table = pacsv.read_csv(io.BytesIO(result.stdout.encode()))
    starts = table["start"].cast(pa.timestamp("s")).cast(pa.int64()).to_pylist()
    by_host: dict[str, dict[int, float]] = {}
    for start, host, value in zip(starts, table["host"].to_pylist(), table["bytes"].to_pylist()):
        by_host.setdefault(host, {})[start] = float(value)
    return by_host


def charted(series: dict) -> dict[int, float]:
    return {ts: value for value, ts in series["datapoints"] if value is not None}


@pytest.mark.parametrize("use_post", [False, True], ids=["get", "post"])
def test_graphite_web_lists_ramens_metrics(stack, graphite_web, use_post):
    web = graphite_web([cluster_server(httpd_url(stack))], use_post=use_post)

    top = get(web.url, "/metrics/find", query="fed.*")
    assert ("fed.per_minute", 0) in [(node["id"], node["leaf"]) for node in top]
    hosts = get(web.url, "/metrics/find", query="fed.per_minute.*")
    assert [(node["id"], node["leaf"]) for node in hosts] == [(f"fed.per_minute.{h}", 0) for h in HOST_NAMES]
    fields = get(web.url, "/metrics/find", query=f"fed.per_minute.{HOST_NAMES[0]}.*")
    assert [(node["id"], node["leaf"]) for node in fields] == [(f"fed.per_minute.{HOST_NAMES[0]}.bytes", 1)]


@pytest.mark.parametrize("use_post", [False, True], ids=["get", "post"])
def test_graphite_web_charts_what_ramen_replay_prints(stack, graphite_web, use_post):
    web = graphite_web([cluster_server(httpd_url(stack))], use_post=use_post)
    since, until = minute_range(6, 4)
    expected = replayed(stack, since, until)
    assert sorted(expected) == HOST_NAMES and all(len(points) == 4 for points in expected.values())

    for host in HOST_NAMES:
        [series] = get(web.url, "/render", target=f"fed.per_minute.{host}.bytes", format="json",
                       **{"from": since, "until": until})
        assert series["target"] == f"fed.per_minute.{host}.bytes"
        assert [ts for _, ts in series["datapoints"]] == list(range(since, until, MINUTE_S))
        assert charted(series) == expected[host]

    # A glob goes to ramen unexpanded; ramen's answer must file each series under it.
    both = get(web.url, "/render", target="fed.per_minute.*.bytes", format="json", **{"from": since, "until": until})
    assert {series["target"]: charted(series) for series in both} == {
        f"fed.per_minute.{host}.bytes": expected[host] for host in HOST_NAMES}
    # And graphite-web's own functions work on ramen's series.
    [total] = get(web.url, "/render", target="sumSeries(fed.per_minute.*.bytes)", format="json",
                  **{"from": since, "until": until})
    assert charted(total) == {ts: sum(expected[h][ts] for h in HOST_NAMES) for ts in expected[HOST_NAMES[0]]}

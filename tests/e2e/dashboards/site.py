"""The site the dashboards' end-to-end tests share (conftest.py beside starts it once):
`ramen start` with its httpd over an archived generator with factors, and what those tests ask of
it (httpd's URL and answers, `ramen replay` of the same range to compare with)."""

from __future__ import annotations

import io
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from tests.e2e.test_replay import STARTUP_S, Stack
from tests.waiting import wait_for

RATE = 100
HOSTS = 3
HOST_NAMES = [f"host{i:02d}" for i in range(HOSTS)]
MINUTE_S = 60
HTTP_TIMEOUT_S = 120.0
PROGRAM = f"""
[program]
name = "web"

[[function]]
name = "traffic"
source = {{ kind = "generator", rate = {RATE}, hosts = {HOSTS}, seed = 3, backfill = "10m" }}
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


class DashboardSite(Stack):
    """`ramen start` of PROGRAM, its archive back-filled, its httpd listening."""

    def __init__(self, base: Path):
        super().__init__(base)
        self.url = ""

    def start(self) -> DashboardSite:
        super().start("web", PROGRAM, "web/traffic")
        url_file = self.base / "run" / "httpd.url"
        self.url = wait_for(lambda: url_file.exists() and url_file.read_text().strip().rstrip("/"),
                            "httpd's URL file", timeout_s=STARTUP_S)
        return self

    def get(self, path: str, **params) -> tuple[int, bytes]:
        """httpd's status and body for GET path?params (a list value: the parameter repeated)."""
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=HTTP_TIMEOUT_S) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def json(self, path: str, **params):
        status, body = self.get(path, **params)
        assert status == 200, body
        return json.loads(body)

    def post(self, path: str, data: bytes, content_type: str) -> tuple[int, bytes]:
        request = urllib.request.Request(f"{self.url}{path}", data=data, headers={"Content-Type": content_type})
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as answer:
            return answer.status, answer.read()

    def per_minute_by_host(self, since_s: int, until_s: int) -> dict[str, dict[int, float]]:
        """What `ramen replay` prints for web/per_minute over [since, until): host -> {start_s: bytes}."""
        result = self.ramen("replay", "--since", since_s, "--until", until_s, "--format", "csv", "--with-header",
                            "web/per_minute")
        assert result.returncode == 0, result.stderr
        table = pacsv.read_csv(io.BytesIO(result.stdout.encode()))
        starts = table["start"].cast(pa.timestamp("s")).cast(pa.int64()).to_pylist()
        by_host: dict[str, dict[int, float]] = {}
        for start, host, value in zip(starts, table["host"].to_pylist(), table["bytes"].to_pylist()):
            by_host.setdefault(host, {})[start] = float(value)
        return by_host


def minute_range(minutes_ago: int, minutes: int) -> tuple[int, int]:
    """[since, until) in epoch seconds on minute boundaries, `minutes_ago` back (inside the back-fill
    for up to 9)."""
    now_minute = int(time.time()) // MINUTE_S * MINUTE_S
    since = now_minute - minutes_ago * MINUTE_S
    return since, since + minutes * MINUTE_S

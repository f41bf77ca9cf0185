"""A real Prometheus server (Debian's /usr/bin/prometheus) scraping one target every second, and an
aiohttp app served on a thread of its own, for tests of `/metrics`.

Reusable by any suite: point `PrometheusServer` at a running `ramen httpd` (its address is in
`$RAMEN_DIR/run/httpd.url`) as at an app a test serves with `AppServer`:

    with PrometheusServer(tmp_path / "prometheus", "127.0.0.1:29380") as prometheus:
        prometheus.wait_for('up{job="ramen"}', 1)
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

PROMETHEUS_BIN = "/usr/bin/prometheus"
JOB = "ramen"
SCRAPE_INTERVAL_S = 1
STARTUP_TIMEOUT_S = 30.0
WAIT_TIMEOUT_S = 30.0
"""How long wait_for gives a value to show: a scrape a second, Prometheus' first one up to an
interval after start, so 30 s is a broken setup, not a slow one."""
POLL_INTERVAL_S = 0.2
HTTP_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_prometheus() -> str:
    """The Prometheus binary; the test is skipped, saying why, only where it is not installed."""
    if not Path(PROMETHEUS_BIN).exists():
        pytest.skip(f"{PROMETHEUS_BIN} is absent (Debian's `prometheus` package)")
    return PROMETHEUS_BIN


class PrometheusServer:
    """`prometheus` with a TSDB and config of its own under `directory`, scraping `target`
    (host:port) at `metrics_path` every SCRAPE_INTERVAL_S as job "ramen"."""

    def __init__(self, directory: Path, target: str, *, metrics_path: str = "/metrics",
                 bearer_token: str | None = None) -> None:
        self.directory = Path(directory)
        self.target = target
        self.metrics_path = metrics_path
        self.bearer_token = bearer_token
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.log_path = self.directory / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config(self) -> str:
        # JSON is YAML: no YAML writer needed.
        job = {"job_name": JOB, "scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
               "metrics_path": self.metrics_path, "static_configs": [{"targets": [self.target]}]}
        if self.bearer_token is not None:
            job["authorization"] = {"type": "Bearer", "credentials": self.bearer_token}
        return json.dumps({"global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s"}, "scrape_configs": [job]}, indent=1)

    def start(self) -> PrometheusServer:
        binary = require_prometheus()
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "prometheus.yml"
        config.write_text(self._config())
        self.port = free_port()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={self.directory / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=HTTP_TIMEOUT_S) as answer:
                    if answer.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not start within {STARTUP_TIMEOUT_S} s: {self.log_tail()}")
            time.sleep(POLL_INTERVAL_S)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def query(self, expr: str) -> list[dict]:
        """The instant vector of `expr` (Prometheus' /api/v1/query): [{"metric": {...}, "value": [t, "v"]}]."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as answer:
            body = json.load(answer)
        if body.get("status") != "success":
            raise AssertionError(f"prometheus query {expr!r} failed: {body}")
        return body["data"]["result"]

    def target_health(self) -> str:
        """What Prometheus says of its last scrape of the target, for failure messages."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=HTTP_TIMEOUT_S) as answer:
                targets = json.load(answer)["data"]["activeTargets"]
        except (urllib.error.URLError, OSError, KeyError, ValueError) as e:
            return f"(targets unreadable: {e})"
        return "; ".join(f"{t.get('scrapeUrl')}: {t.get('health')} {t.get('lastError')!r}" for t in targets) or "none"

    def wait_for(self, expr: str, expected: float, *, timeout_s: float = WAIT_TIMEOUT_S) -> list[dict]:
        """Poll until every series of `expr` has the value `expected` (at least one series);
        fails naming the query, what it last answered and the target's health."""
        deadline = time.monotonic() + timeout_s
        result: list[dict] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result and all(float(r["value"][1]) == expected for r in result):
                return result
            time.sleep(POLL_INTERVAL_S)
        raise AssertionError(f"prometheus: {expr} did not become {expected} within {timeout_s} s: last answer "
                             f"{result}; target {self.target_health()}")

    def wait_for_series(self, expr: str, *, timeout_s: float = WAIT_TIMEOUT_S) -> list[dict]:
        """Poll until `expr` answers at least one series (a filter such as `x > 0` answers none
        until it holds); fails naming the query and the target's health."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                return result
            time.sleep(POLL_INTERVAL_S)
        raise AssertionError(f"prometheus: {expr} answered no series within {timeout_s} s; "
                             f"target {self.target_health()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory / "data", ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class AppServer:
    """An aiohttp Application served on 127.0.0.1 (a free port) by an event loop on a thread of its
    own, so a synchronous test (and a Prometheus process) can reach it over a real socket."""

    def __init__(self, app) -> None:
        self.app = app
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="app-server", daemon=True)
        self._runner = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    async def _start(self) -> None:
        from aiohttp import web
        self._runner = web.AppRunner(self.app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    def start(self) -> AppServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(HTTP_TIMEOUT_S)
        return self

    def get(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) of GET `path`."""
        with urllib.request.urlopen(f"{self.url}{path}", timeout=HTTP_TIMEOUT_S) as answer:
            return answer.status, answer.headers.get("Content-Type", ""), answer.read()

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(HTTP_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(HTTP_TIMEOUT_S)
        self._loop.close()

    def __enter__(self) -> AppServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

"""A real Prometheus scrapes the /metrics of the httpd that `ramen start` runs: `up`, counters of
counters.dat (a worker's, its log's, the archiver's) and a stats key of the confserver."""

from __future__ import annotations

import os
import signal
import urllib.parse


from tests.e2e.test_start import _processes_with
from tests.httpd.prometheus import PrometheusServer, require_prometheus
from tests.waiting import wait_for

STARTUP_S = 60.0
PROGRAM = """
[program]
name = "scraped"

[[function]]
name = "ticks"
source = { kind = "generator", rate = 10, hosts = 2, seed = 1 }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
archive = { retention = "1d" }
"""


def test_prometheus_scrapes_the_counters_and_stats_of_a_running_site(tmp_path):
    require_prometheus()
    from tests.e2e.test_replay import Stack
    program = tmp_path / "scraped.toml"
    program.write_text(PROGRAM)
    stack = Stack(tmp_path)
    started = stack.ramen("start", "--daemon", "--dir", tmp_path, program, timeout=STARTUP_S)
    assert started.returncode == 0, started.stderr
    try:
        url_file = tmp_path / "run" / "httpd.url"
        url = wait_for(lambda: url_file.exists() and url_file.read_text().strip(), "httpd's URL file",
                       timeout_s=STARTUP_S)
        address = urllib.parse.urlsplit(url).netloc
        with PrometheusServer(tmp_path / "prometheus", address) as prometheus:
            prometheus.wait_for('up{job="ramen"}', 1)
            prometheus.wait_for('ramen_metrics_source_up{site="local"}', 1, timeout_s=STARTUP_S)
            ticks = 'site="local",program="scraped",function="ticks"'
            # The worker's rows out: counted in counters.dat, and written in its stats key each second.
            prometheus.wait_for_series(f"ramen_worker_tuples_out_total{{{ticks}}} > 0", timeout_s=STARTUP_S)
            prometheus.wait_for_series(f"ramen_worker_stats_tuples_out{{{ticks}}} > 0", timeout_s=STARTUP_S)
            # Its archived live log: written, read by the archiver, recorded.
            prometheus.wait_for_series(f'ramen_publisher_position{{{ticks},log="live"}} > 0', timeout_s=STARTUP_S)
            prometheus.wait_for_series(f'ramen_subscriber_position{{{ticks},reader="archiver"}} > 0',
                                       timeout_s=STARTUP_S)
            prometheus.wait_for_series(f"ramen_recording_position{{{ticks}}} > 0", timeout_s=STARTUP_S)
    finally:
        stopped = stack.ramen("stop", "--dir", tmp_path, timeout=STARTUP_S)
        for pid in _processes_with(f"RAMEN_DIR={tmp_path}"):  # not to outlive the test
            os.kill(pid, signal.SIGKILL)
    assert stopped.returncode == 0, stopped.stderr

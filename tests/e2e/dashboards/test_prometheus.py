"""A real Prometheus scrapes the /metrics of the httpd that `ramen start` runs: `up`, counters of
counters.dat (a worker's, its log's, the archiver's) and a stats key of the confserver."""

from __future__ import annotations

import urllib.parse

from tests.httpd.prometheus import PrometheusServer, require_prometheus

WAIT_S = 60.0


def test_prometheus_scrapes_the_counters_and_stats_of_a_running_site(dashboard_site, tmp_path):
    require_prometheus()
    address = urllib.parse.urlsplit(dashboard_site.url).netloc
    with PrometheusServer(tmp_path / "prometheus", address) as prometheus:
        prometheus.wait_for('up{job="ramen"}', 1)
        prometheus.wait_for('ramen_metrics_source_up{site="local"}', 1, timeout_s=WAIT_S)
        traffic = 'site="local",program="web",function="traffic"'
        # The source's rows out: counted in counters.dat, and written in its stats key each second.
        prometheus.wait_for_series(f"ramen_worker_tuples_out_total{{{traffic}}} > 0", timeout_s=WAIT_S)
        prometheus.wait_for_series(f"ramen_worker_stats_tuples_out{{{traffic}}} > 0", timeout_s=WAIT_S)
        # Its archived live log: written, read by the archiver, recorded.
        prometheus.wait_for_series(f'ramen_publisher_position{{{traffic},log="live"}} > 0', timeout_s=WAIT_S)
        prometheus.wait_for_series(f'ramen_subscriber_position{{{traffic},reader="archiver"}} > 0',
                                   timeout_s=WAIT_S)
        prometheus.wait_for_series(f"ramen_recording_position{{{traffic}}} > 0", timeout_s=WAIT_S)

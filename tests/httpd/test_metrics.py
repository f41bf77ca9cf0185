"""`GET /metrics`: the counters file, the confserver's stats and httpd's own counts in Prometheus'
format, read by prometheus-client's parser and scraped by a real Prometheus server."""

from __future__ import annotations

import pytest
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from ramen import keyspace, paths
from ramen.archive.catalog import Catalog
from ramen.archive.coverage import function_channel
from ramen.archive.recorder import Recorder
from ramen.clocks import ManualClock
from ramen.httpd import metrics
from ramen.httpd.metrics import HttpdStats
from ramen.replay.contract import ChannelRange, ReplayerAssignment, ReplayerStats
from ramen.supervisor_stats import SupervisorStats
from ramen.transport.counters import CountersFile
from ramen.transport.image import Image
from ramen.transport.logbuffer import LogBuffer, LogBufferParams
from ramen.transport.publication import ExclusivePublication
from ramen.transport.service_counters import allocate_service_counter
from supervisor.counters import SupervisorCounters
from tests.httpd.prometheus import AppServer, PrometheusServer, require_prometheus
from workers.stats import WorkerCounters

TERM_LENGTH = 64 * 1024
SEGMENT_LENGTH = 64 * 1024
CORRELATION_ID = 4242
SESSION_ID, STREAM_ID = 7, 1
PAYLOAD = b"x" * 100
PAYLOAD_END_POSITION = 160
"""One 100-byte message: a 32-byte header, 132 bytes aligned to 32."""
HEARTBEAT_AGE_S = 3
SOURCE, READER = "net/traffic", "net/per_minute"


class Site:
    """A site on this host with real counters: a function's output log with its publication, a
    child's image of it, the archiver's recording of it, a worker's, a replayer's and the
    supervisor's counters, as their own code allocates them."""

    def __init__(self, ramen_dir, site: str) -> None:
        self.site = site
        self.clock = ManualClock()
        ramen_dir.mkdir(parents=True)
        self.counters = CountersFile.open(paths.counters_path())
        log_path = paths.output_log(site, SOURCE)
        log_path.parent.mkdir(parents=True)
        self.log = LogBuffer.create(log_path, LogBufferParams(term_length=TERM_LENGTH, session_id=SESSION_ID,
                                                              stream_id=STREAM_ID, correlation_id=CORRELATION_ID))
        self.publication = ExclusivePublication(self.log, self.counters, clock=self.clock)
        self.image = Image(LogBuffer.open(log_path), self.counters, name=f"{READER} <- {log_path.name}",
                           clock=self.clock)
        assert self.publication.offer(PAYLOAD) == PAYLOAD_END_POSITION
        assert self.image.poll(lambda *fragment: None, 10) == 1
        self.catalog = Catalog.create(paths.archive_dir(site))
        self.recorder = Recorder(self.catalog, LogBuffer.open(log_path), self.counters, segment_length=SEGMENT_LENGTH,
                                 channel=function_channel(SOURCE))
        self.worker = WorkerCounters(SOURCE, self.counters)
        self.worker.add("tuples in", 42)
        self.worker.add("spark ms", 1500)
        self.supervisor = SupervisorCounters.allocate(self.counters, site)
        self.supervisor.restarts = 3
        self.replayer_bytes = allocate_service_counter(self.counters, "replayer", "bytes_read", "9")
        self.replayer_bytes.set(12345)

    def close(self) -> None:
        self.replayer_bytes.close()
        self.supervisor.close()
        self.worker.close()
        self.recorder.close()
        self.catalog.close()
        self.image.close()
        self.publication.close()
        self.counters.close()


@pytest.fixture
def site(tmp_path, monkeypatch, request):
    monkeypatch.setenv(paths.RAMEN_DIR_ENV, str(tmp_path / "ramen"))
    made = Site(tmp_path / "ramen", f"metrics-{request.node.name[:40].replace('[', '-').replace(']', '')}")
    yield made
    made.close()


@pytest.fixture
def writer(builtin_server):
    """Writes the stats keys as the services do (admin may write them all)."""
    import confserver
    with confserver.connect(builtin_server.url, identity="admin", auth_file=builtin_server.auth_file) as connected:
        yield connected


def scrape(client, site: Site, stats: HttpdStats | None = None, **options) -> dict:
    """{family name: {frozenset of label items: value}} of one scrape, through the parser."""
    from prometheus_client import generate_latest
    registry = metrics.make_registry(client, site.site, stats or HttpdStats(), clock=site.clock, **options)
    return parse(generate_latest(registry).decode())


def parse(text: str) -> dict:
    families = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            families.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return families


def one(families: dict, name: str, **labels) -> float:
    """The value of the one sample of `name` whose labels include `labels`."""
    found = [value for sample_labels, value in families.get(name, {}).items() if set(labels.items()) <= sample_labels]
    assert len(found) == 1, f"{name} {labels}: {len(found)} samples in {sorted(families.get(name, {}), key=str)}"
    return found[0]


def labels_of(families: dict, name: str, **labels) -> dict:
    found = [dict(s) for s in families.get(name, {}) if set(labels.items()) <= s]
    assert len(found) == 1, f"{name} {labels}: {found}"
    return found[0]


# -- counters.dat ----------------------------------------------------------------------------------

def test_stream_counters_are_labelled_with_the_function_whose_log_they_measure(site, client):
    families = scrape(client, site)
    pub = labels_of(families, "ramen_publisher_position", label=f"pub-pos: {SESSION_ID} {STREAM_ID} traffic.logbuffer")
    assert pub["program"] == "net" and pub["function"] == "traffic" and pub["log"] == "live"
    assert pub["session"] == str(SESSION_ID) and pub["stream"] == str(STREAM_ID) and pub["site"] == site.site
    assert one(families, "ramen_publisher_position", counter_id=pub["counter_id"]) == PAYLOAD_END_POSITION
    assert one(families, "ramen_publisher_limit", program="net", function="traffic") > PAYLOAD_END_POSITION
    assert one(families, "ramen_publisher_back_pressure_events_total", program="net") == 0


def test_a_subscriber_is_labelled_with_its_reader_and_its_heartbeat_is_an_age_in_seconds(site, client):
    site.clock.advance(HEARTBEAT_AGE_S)  # the image stamped its heartbeat when it polled, then went quiet
    families = scrape(client, site)
    reader = dict(program="net", function="traffic", reader=READER)
    assert one(families, "ramen_subscriber_position", **reader) == PAYLOAD_END_POSITION
    assert one(families, "ramen_subscriber_heartbeat_age_seconds", **reader) == HEARTBEAT_AGE_S
    assert one(families, "ramen_subscriber_dropped", **reader) == 0
    assert one(families, "ramen_subscriber_unblocked_frames_total", **reader) == 0


def test_a_recording_is_labelled_with_the_function_it_records(site, client):
    families = scrape(client, site)
    recording = labels_of(families, "ramen_recording_position", program="net", function="traffic")
    assert recording["recording"] == str(site.recorder.recording_id) and recording["session"] == str(SESSION_ID)
    assert one(families, "ramen_recording_position", program="net") == PAYLOAD_END_POSITION
    assert one(families, "ramen_subscriber_position", function="traffic", reader="archiver") == PAYLOAD_END_POSITION


def test_service_counters_are_named_after_their_type_with_their_instance(site, client):
    families = scrape(client, site)
    assert one(families, "ramen_worker_tuples_in_total", program="net", function="traffic") == 42
    assert one(families, "ramen_worker_spark_seconds_total", program="net", function="traffic") == 1.5
    assert one(families, "ramen_supervisor_restarts_total", service_instance=site.site) == 3
    assert one(families, "ramen_replayer_bytes_read_total", service_instance="9") == 12345
    assert one(families, "ramen_metrics_source_up", source="counters") == 1


def test_without_a_counters_file_the_other_sources_are_still_exposed(tmp_path, client):
    site = Site.__new__(Site)
    site.site, site.clock = "metrics-no-counters", ManualClock()
    families = scrape(client, site, HttpdStats(renders=2), counters_path=tmp_path / "absent.dat")
    assert one(families, "ramen_metrics_source_up", source="counters") == 0
    assert one(families, "ramen_httpd_renders_total") == 2
    assert not any(name.startswith("ramen_publisher") for name in families)


def test_a_confserver_that_cannot_answer_leaves_the_counters_exposed(site, builtin_server):
    import confserver
    gone = confserver.connect(builtin_server.url, identity="user", auth_file=builtin_server.auth_file)
    gone.close()  # every call now raises Disconnected, as when the confserver is unreachable
    families = scrape(gone, site)
    assert one(families, "ramen_metrics_source_up", source="confserver") == 0
    assert one(families, "ramen_metrics_source_up", source="counters") == 1
    assert one(families, "ramen_worker_tuples_in_total", function="traffic") == 42


# -- confserver stats ------------------------------------------------------------------------------

def test_worker_replayer_and_supervisor_stats_are_labelled_gauges(site, client, writer):
    worker = WorkerCounters(READER, clock=site.clock)
    worker.add("tuples in", 10, channel=5)
    worker.add("tuples out", 4, channel=5)
    record = worker.record(position_in=160, position_out=96)
    writer.set(keyspace.function_key(site.site, READER, "stats"), record.to_value())
    assignment = ReplayerAssignment(id=9, source=SOURCE, log="9.logbuffer", archive_dir="archive",
                                    channels=(ChannelRange(5, 0, 1_000_000),))
    writer.set(keyspace.replayer_key(site.site, 9), assignment.to_value())
    writer.set(keyspace.replayer_stats_key(site.site, 9),
               ReplayerStats(bytes_read=12345, messages=3, rows_out=7, channels={5: 7}, done=False).to_value())
    writer.set(keyspace.supervisor_stats_key(site.site),
               SupervisorStats(SupervisorCounters().to_dict(), running_workers=2, updated_us=1).to_value())
    families = scrape(client, site)

    function = dict(site=site.site, program="net", function="per_minute")
    assert one(families, "ramen_worker_stats_tuples_in", **function) == 10
    assert one(families, "ramen_worker_stats_position_in", **function) == 160
    assert one(families, "ramen_worker_stats_updated_seconds", **function) == site.clock.epoch_us() / 1e6
    assert one(families, "ramen_worker_stats_channels_tuples_out", replay_channel="5", **function) == 4
    replayer = dict(site=site.site, program="net", function="traffic", replayer="9")
    assert one(families, "ramen_replayer_stats_bytes_read", **replayer) == 12345
    assert one(families, "ramen_replayer_stats_channels", replay_channel="5", **replayer) == 7
    assert one(families, "ramen_replayer_stats_done", **replayer) == 0
    assert one(families, "ramen_supervisor_stats_running_workers", site=site.site) == 2
    assert one(families, "ramen_metrics_source_up", source="confserver") == 1


def test_a_replayer_stats_value_off_its_contract_is_left_out(site, client, writer):
    writer.set(keyspace.replayer_stats_key(site.site, 8), {"bytes_read": 1})  # fields missing
    families = scrape(client, site)
    assert not any(("replayer", "8") in labels for labels in families.get("ramen_replayer_stats_bytes_read", {}))
    assert one(families, "ramen_metrics_source_up", source="confserver") == 1


def test_field_names_that_are_not_prometheus_names_are_sanitised(site, client, writer):
    writer.set(keyspace.function_key(site.site, "odd-prog/f", "stats"), {"weird-field.x": 1, "2nd": 2})
    families = scrape(client, site)
    assert one(families, "ramen_worker_stats_weird_field_x", program="odd-prog") == 1
    assert one(families, "ramen_worker_stats_2nd", program="odd-prog") == 2
    assert metrics.metric_name("9lives-x") == "_9lives_x"
    assert metrics.label_name("__reserved") == "xreserved"


# -- httpd's own, and the route ----------------------------------------------------------------------

def test_httpd_stats_are_counters(site, client):
    stats = HttpdStats(renders=5, render_errors=1, replays_started=1, bytes_served=2048, cache_hits=3,
                       cache_misses=6)
    stats.add("replays_started", 3)  # as the pool's threads count
    families = scrape(client, site, stats)
    assert {name: one(families, f"ramen_httpd_{name}_total") for name in
            ("renders", "render_errors", "replays_started", "bytes_served", "cache_hits", "cache_misses")} == \
        {"renders": 5, "render_errors": 1, "replays_started": 4, "bytes_served": 2048, "cache_hits": 3,
         "cache_misses": 6}


def test_get_metrics_answers_the_exposition_format_over_http(site, client):
    app = web.Application()
    metrics.add_routes(app, client=client, site=site.site, stats=HttpdStats(renders=1), clock=site.clock)
    with AppServer(app) as server:
        status, content_type, body = server.get("/metrics")
    assert status == 200 and content_type == CONTENT_TYPE_LATEST
    families = parse(body.decode())
    assert one(families, "ramen_publisher_position", program="net", function="traffic") == PAYLOAD_END_POSITION
    help_lines = [line for line in body.decode().splitlines() if line.startswith("# HELP ramen_")]
    assert help_lines and all(len(line.split(" ", 3)) == 4 for line in help_lines)


# -- a real Prometheus -------------------------------------------------------------------------------

def test_a_real_prometheus_scrapes_up_and_a_ramen_counter(site, client, tmp_path):
    require_prometheus()
    app = web.Application()
    metrics.add_routes(app, client=client, site=site.site, stats=HttpdStats(), clock=site.clock)
    with AppServer(app) as server, PrometheusServer(tmp_path / "prometheus", server.address) as prometheus:
        prometheus.wait_for('up{job="ramen"}', 1)
        prometheus.wait_for(f'ramen_publisher_position{{site="{site.site}",program="net",function="traffic"}}',
                            PAYLOAD_END_POSITION)
        prometheus.wait_for(f'ramen_worker_tuples_in_total{{site="{site.site}",function="traffic"}}', 42)
        # Prometheus keeps `instance` for its target: a label of that name would come back renamed.
        prometheus.wait_for(f'ramen_supervisor_restarts_total{{service_instance="{site.site}"}}', 3)

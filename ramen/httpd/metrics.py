"""`GET /metrics`: the site's counters and stats in Prometheus' exposition format.

Three sources, read at each scrape by one custom Collector on a registry of its own (never
prometheus-client's global one, which would mix in the process's own metrics and any other
registry user in the same process):

- every allocated counter of the host's counters file (what `ramen stat` prints), one metric
  family per counter type (`ramen_publisher_position`, `ramen_worker_tuples_in_total`, …), labelled
  with what the counter identifies: the log it measures (the program and function writing it, a
  replayer, a replay's recipient), session, stream, the reading function, the service instance,
  and the raw `label`; a subscriber's heartbeat as its age in seconds;
- the stats keys of the site in the confserver (workers', replayers', the supervisor's), each
  number of a value a gauge labelled site, program, function (and replay channel for per-channel
  rows, replayer id for replayers); replayers' values read through their contract, ReplayerStats;
- httpd's own counts (HttpdStats), which the app increments.

Reading the file and the confserver blocks, so the handler collects in a thread (asyncio.to_thread):
the event loop keeps serving renders meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ramen import keyspace, paths, supervisor_stats
from ramen.archive.coverage import function_of_channel
from ramen.archive.recorder import RECORDING_KEY
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.program import split_qualified
from ramen.replay.contract import ContractError, ReplayerAssignment, ReplayerStats
from ramen.transport import counters as ctr
from ramen.transport.counters import CounterInfo, CountersFile, CountersFileError
from ramen.transport.logbuffer import LOG_CORRELATION_ID_OFFSET, LOG_META_DATA_LENGTH

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
PREFIX = "ramen_"
MS_PER_S = 1000.0
US_PER_S = 1_000_000.0
NS_PER_MS = 1_000_000

_INVALID_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_:]")
_INVALID_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(text: str) -> str:
    """A valid Prometheus metric name made of `text`: [a-zA-Z_:][a-zA-Z0-9_:]*."""
    name = _INVALID_NAME_CHARS.sub("_", text)
    return name if name and not name[0].isdigit() else f"_{name}"


def label_name(text: str) -> str:
    """A valid label name made of `text`: [a-zA-Z_][a-zA-Z0-9_]*, never `__`-prefixed (reserved)."""
    name = _INVALID_LABEL_CHARS.sub("_", text)
    if name.startswith("__"):
        name = "x" + name.lstrip("_")
    return name if name and not name[0].isdigit() else f"_{name}"


# -- httpd's own ---------------------------------------------------------------------------------

@dataclass
class HttpdStats:
    """What httpd did since it started: the app increments these, /metrics exposes each as
    `ramen_httpd_<name>_total`. On the event loop `stats.renders += 1` will do (one thread); from
    the pool's threads, `stats.add("replays_started")`, which a lock keeps from losing counts. A
    scrape's thread reads a plain int: the old value or the new one."""

    renders: int = field(default=0, metadata={"help": "Requests to /render answered."})
    render_errors: int = field(default=0, metadata={"help": "Requests to /render answered with an error (4xx or 5xx)."})
    replays_started: int = field(default=0, metadata={"help": "Replays httpd asked for to answer renders."})
    replays_retried: int = field(default=0, metadata={"help": "Replays asked again because a process on their path "
                                                              "died under them."})
    bytes_served: int = field(default=0, metadata={"help": "Bytes of response bodies httpd sent."})
    cache_hits: int = field(default=0, metadata={"help": "Ranges a render found (in part) in httpd's cache of closed windows."})
    cache_misses: int = field(default=0, metadata={"help": "Holes in httpd's cache a render had to replay."})
    renders_cancelled: int = field(default=0, metadata={"help": "Renders whose client left before the answer: "
                                                                "their replays no other render shared were withdrawn."})
    renders_refused: int = field(default=0, metadata={"help": "Renders answered 503: httpd ran and queued as many "
                                                              "long replays as it takes (ramen/httpd/admission.py)."})
    replays_cancelled: int = field(default=0, metadata={"help": "Replays withdrawn because no render waited for "
                                                                "them any more."})
    fetches_too_big: int = field(default=0, metadata={"help": "Fetches whose buckets passed the bound on what one "
                                                              "may hold: their renders were refused."})
    connections_refused: int = field(default=0, metadata={"help": "Connections answered 503 and closed: httpd held "
                                                                  "as many as it takes (ramen/httpd/listener.py)."})
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, count: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + count)

    def counts(self) -> dict[str, int]:
        """Each count by name (what /metrics exposes)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.name.startswith("_")}

    @staticmethod
    def help(name: str) -> str:
        return HttpdStats.__dataclass_fields__[name].metadata["help"]


# -- counters.dat ----------------------------------------------------------------------------------

_STREAM, _RECORDING, _SERVICE, _WORKER, _OTHER = "stream", "recording", "service", "worker", "other"
_LABELS = {
    _STREAM: ("site", "program", "function", "log", "replayer", "replay_channel", "session", "stream", "reader",
              "counter_id", "label"),
    _RECORDING: ("site", "program", "function", "recording", "session", "stream", "counter_id", "label"),
    _SERVICE: ("site", "service_instance", "counter_id", "label"),
    _WORKER: ("site", "program", "function", "counter_id", "label"),
    _OTHER: ("site", "type_id", "counter_id", "label"),
}
"""The labels of each kind of counter, by what its key and label identify; a label a counter
cannot tell is "" (which Prometheus takes as absent). A service's instance (the supervisor's site,
the archiver's directory, the replayer's id) is `service_instance`: Prometheus gives `instance` to
the scraped target and would rename ours."""


@dataclass(frozen=True)
class CounterType:
    """How one counter type of counters.dat is exposed."""
    name: str
    """Metric family name, without `ramen_` (a counter's `_total` is added by the exposition)."""
    help: str
    identifies: str
    monotonic: bool = False
    """A count (Prometheus counter) rather than a level (gauge): Prometheus takes a drop as a reset."""
    scale: float = 1.0
    """Multiplies the raw value into the unit the name says (ms to seconds)."""


def _service_types() -> dict[int, CounterType]:
    types = {}
    for service, ids in ctr.SERVICE_COUNTER_TYPE_IDS.items():
        for name, type_id in ids.items():
            identifies = _WORKER if service == "worker" else _SERVICE
            scale = 1.0
            if name.endswith("_ms"):  # a time in ms: Prometheus' unit is the second
                name, scale = name.removesuffix("_ms") + "_seconds", 1 / MS_PER_S
            what = f"`{ctr.TYPE_NAMES[type_id]}`"
            types[type_id] = CounterType(f"{service}_{name}", f"The {service}'s count of {what} (counters.dat type "
                                         f"{type_id}, as `ramen stat` shows it).", identifies, True, scale)
    return types


COUNTER_TYPES: dict[int, CounterType] = {
    ctr.PUBLISHER_LIMIT_TYPE_ID: CounterType(
        "publisher_limit", "Position (bytes) a publication may write up to: its slowest subscriber's position plus "
        "the term window (Aeron's pub-lmt).", _STREAM),
    ctr.PUBLISHER_POSITION_TYPE_ID: CounterType(
        "publisher_position", "Position (bytes) a publication has written up to (Aeron's pub-pos).", _STREAM),
    ctr.SUBSCRIBER_POSITION_TYPE_ID: CounterType(
        "subscriber_position", "Position (bytes) a subscriber has read up to (Aeron's sub-pos).", _STREAM),
    ctr.RECORDING_POSITION_TYPE_ID: CounterType(
        "recording_position", "Position (bytes) the archiver has recorded a log up to (Aeron Archive's rec-pos).",
        _RECORDING),
    ctr.BACK_PRESSURE_EVENTS_TYPE_ID: CounterType(
        "publisher_back_pressure_events", "Offers a publication refused because its slowest subscriber was a term "
        "window behind.", _STREAM, True),
    ctr.SUBSCRIBERS_DROPPED_TYPE_ID: CounterType(
        "publisher_subscribers_dropped", "Subscribers a publication gave up waiting for (silent too long).", _STREAM,
        True),
    ctr.UNBLOCKED_FRAMES_TYPE_ID: CounterType(
        "subscriber_unblocked_frames", "Frames a dead writer left half-written that a subscriber padded over.",
        _STREAM, True),
    **_service_types(),
}
OTHER_COUNTER = CounterType("counter", "A counter of counters.dat of a type ramen does not name (by type_id).",
                            _OTHER)

RECORDER_IMAGE_PREFIX = "recorder "
RECORDER_READER = "archiver"
"""The reader label of the archiver's subscriptions (the recorder names its image `recorder <log>`)."""
SUBSCRIBER_HEARTBEAT_AGE = "subscriber_heartbeat_age_seconds"
SUBSCRIBER_DROPPED = "subscriber_dropped"


@dataclass(frozen=True)
class LogIdentity:
    """What a log buffer of the site is, found from its path: whose output, or which replay's."""
    log: str
    """live (a function's output), replay (a function's replay output), replayer, recipient."""
    program: str = ""
    function: str = ""
    replayer: str = ""
    replay_channel: str = ""


def _correlation_id(path: Path) -> int | None:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < LOG_META_DATA_LENGTH:
                return None
            raw = os.pread(f.fileno(), 8, size - LOG_META_DATA_LENGTH + LOG_CORRELATION_ID_OFFSET)
    except OSError:
        return None  # removed since it was listed
    return int.from_bytes(raw, "little", signed=True) if len(raw) == 8 else None


def site_logs(site: str, replayer_sources: dict[str, str]) -> dict[int, LogIdentity]:
    """The site's log buffers on this host by correlation id (what a stream counter's key names),
    so stream counters get the program and function of their log; `replayer_sources` gives the
    function each replayer (by id) replays."""
    found: dict[Path, LogIdentity] = {}
    for qualified_name, path in paths.output_logs(site).items():
        program, function = split_qualified(qualified_name)
        found[path] = LogIdentity("live", program, function)
    logs_dir = paths.site_dir(site) / "logs"
    for path in sorted(logs_dir.glob(f"*/*{paths.REPLAY_LOG_SUFFIX}")):
        found[path] = LogIdentity("replay", path.parent.name, path.name.removesuffix(paths.REPLAY_LOG_SUFFIX))
    for path in sorted(paths.replayer_logs_dir(site).glob(f"*{paths.LOG_SUFFIX}")):
        replayer = path.name.removesuffix(paths.LOG_SUFFIX)
        program, function = split_qualified(replayer_sources.get(replayer, ""))
        found[path] = LogIdentity("replayer", program, function, replayer=replayer)
    for path in sorted(paths.recipient_logs_dir().glob(f"*{paths.LOG_SUFFIX}")):
        found[path] = LogIdentity("recipient", replay_channel=path.name.removesuffix(paths.LOG_SUFFIX))
    by_id = {}
    for path, identity in found.items():
        correlation_id = _correlation_id(path)
        if correlation_id is not None:
            by_id[correlation_id] = identity
    return by_id


def counter_labels(info: CounterInfo, site: str, logs: dict[int, LogIdentity]) -> tuple[CounterType, dict[str, str]]:
    """The counter's type and its labels, from its key and label (their layouts: counters.py,
    recorder.py, service_counters.py, workers/stats.py)."""
    kind = COUNTER_TYPES.get(info.type_id, OTHER_COUNTER)
    labels = dict.fromkeys(_LABELS[kind.identifies], "")
    labels.update(site=site, counter_id=str(info.id), label=info.label)
    if kind.identifies == _STREAM:
        correlation_id, session, stream, _ = ctr.STREAM_KEY.unpack_from(info.key)
        identity = logs.get(correlation_id)
        labels.update(session=str(session), stream=str(stream))
        if identity is not None:
            labels.update(log=identity.log, program=identity.program, function=identity.function,
                          replayer=identity.replayer, replay_channel=identity.replay_channel)
        # After `<session> <stream> `: a worker's image is named `<reader prog/func> <- <log file>`
        # (workers/inputs.py), the archiver's `recorder <log file>` (archive/recorder.py).
        name = info.label.partition(": ")[2].split(" ", 2)[-1]
        reader, arrow, _ = name.partition(" <- ")
        if arrow:
            labels["reader"] = reader
        elif name.startswith(RECORDER_IMAGE_PREFIX):
            labels["reader"] = RECORDER_READER
    elif kind.identifies == _RECORDING:
        recording_id, session = RECORDING_KEY.unpack_from(info.key)
        labels.update(recording=str(recording_id), session=str(session))
        # `rec-pos: <recording> <session> <stream> <channel>`; a function's channel names it.
        parts = info.label.split(" ")
        if len(parts) >= 5:
            labels["stream"] = parts[3]
            labels["program"], labels["function"] = split_qualified(function_of_channel(parts[4]) or "")
    elif kind.identifies == _SERVICE:
        labels["service_instance"] = info.key.rstrip(b"\0").decode(errors="replace")
    elif kind.identifies == _WORKER:
        # `worker <prog>/<func> <what>` (workers/stats.py)
        parts = info.label.split(" ")
        if len(parts) >= 3:
            labels["program"], labels["function"] = split_qualified(parts[1])
    else:
        labels["type_id"] = str(info.type_id)
    return kind, labels


class _Families:
    """Metric families by name, made on first use, so a scrape lists each family once."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}

    def add(self, name: str, help_text: str, labels: dict[str, str], value: float, *, monotonic: bool = False) -> None:
        name = metric_name(PREFIX + name)
        family = self.families.get(name)
        if family is None:
            make = CounterMetricFamily if monotonic else GaugeMetricFamily
            family = self.families[name] = make(name, help_text, labels=[label_name(k) for k in labels])
        family.add_metric(list(labels.values()), value)


def collect_counters(families: _Families, counters: CountersFile, site: str, logs: dict[int, LogIdentity],
                     now_ms: int) -> None:
    for info in counters.counters():
        kind, labels = counter_labels(info, site, logs)
        families.add(kind.name, kind.help, labels, info.value * kind.scale, monotonic=kind.monotonic)
        if info.type_id == ctr.SUBSCRIBER_POSITION_TYPE_ID:
            # A subscriber stamps its heartbeat (monotonic ms) as it polls: how long ago it did is
            # how a writer tells a dead reader from a slow one.
            families.add(SUBSCRIBER_HEARTBEAT_AGE, "Seconds since the subscriber last showed it was alive (its "
                         "heartbeat in counters.dat).", labels, max(0, now_ms - info.heartbeat_ms) / MS_PER_S)
            families.add(SUBSCRIBER_DROPPED, "1 if the subscriber's writer gave up waiting for it (DROPPED), else 0.",
                         labels, float(info.status == ctr.COUNTER_DROPPED))


# -- confserver stats ------------------------------------------------------------------------------

def _numbers(value: Any, prefix: str = "", channel: str = "") -> Iterator[tuple[str, str, float]]:
    """(field path, replay channel, number) of every number in a stats value: nested mappings
    join their names with `_`, a mapping keyed by channel numbers gives its rows a channel.
    Times in µs, ms or s become seconds, as Prometheus wants. Strings and lists are not numbers."""
    if isinstance(value, dict):
        by_channel = bool(value) and all(str(k).isdigit() for k in value)
        for key, item in value.items():
            if by_channel:
                yield from _numbers(item, prefix, str(key))
            else:
                yield from _numbers(item, f"{prefix}_{key}" if prefix else str(key), channel)
    elif isinstance(value, (int, float)) and prefix:  # bool included: 1 or 0
        if prefix.endswith("_us"):
            yield prefix.removesuffix("_us") + "_seconds", channel, value / US_PER_S
        elif prefix.endswith("_ms"):
            yield prefix.removesuffix("_ms") + "_seconds", channel, value / MS_PER_S
        elif prefix.endswith("_s"):
            yield prefix.removesuffix("_s") + "_seconds", channel, float(value)
        else:
            yield prefix, channel, float(value)


def _add_stats(families: _Families, what: str, key: str, value: Any, labels: dict[str, str],
               value_name: str = "") -> None:
    """Every number of a stats value as a gauge `ramen_<what>_stats_<field>`; the rows of a
    mapping by channel (`channels`) with a replay_channel label: `ramen_worker_stats_channels_tuples_in`."""
    for path, channel, number in _numbers(value, value_name):
        if channel:
            families.add(f"{what}_stats_{path}", f"`{path}` of {key}, by replay channel.",
                         {**labels, "replay_channel": channel}, number)
        else:
            families.add(f"{what}_stats_{path}", f"`{path}` of {key}.", labels, number)


def collect_stats(families: _Families, client, site: str) -> dict[str, str]:
    """The site's stats keys; returns each replayer's source function (by replayer id), which
    names the logs of replayers."""
    worker_key = f"{keyspace.workers_prefix(site)}/<prog>/<func>/stats (the worker's, docs/runtime.md)"
    for entry in client.glob(f"{keyspace.workers_prefix(site)}/*/*/stats"):
        program, function = split_qualified(keyspace.qualified_name_of(entry.key))
        if isinstance(entry.value, dict):
            _add_stats(families, "worker", worker_key, entry.value,
                       {"site": site, "program": program, "function": function})
    sources = {}
    for entry in client.glob(f"{keyspace.replayers_prefix(site)}/*"):
        try:
            assignment = ReplayerAssignment.from_value(entry.value, entry.key)
        except ContractError as e:
            log.debug("not a replayer: %s", e)
            continue
        sources[str(assignment.id)] = assignment.source
    for entry in client.glob(f"{keyspace.replayers_prefix(site)}/*/stats"):
        replayer = entry.key.split("/")[-2]
        try:
            stats = ReplayerStats.from_value(entry.value, entry.key)
        except ContractError as e:
            log.warning("metrics: %s", e)
            continue
        program, function = split_qualified(sources.get(replayer, ""))
        labels = {"site": site, "program": program, "function": function, "replayer": replayer}
        for f in dataclasses.fields(stats):
            _add_stats(families, "replayer", f"{ReplayerStats.KEY} ({ReplayerStats.__name__}.{f.name})",
                       getattr(stats, f.name), labels, f.name)
    try:
        supervisor = supervisor_stats.read(client, site)
    except ContractError as e:
        log.warning("metrics: %s", e)
    else:
        if supervisor is not None:
            _add_stats(families, "supervisor", f"{supervisor_stats.SupervisorStats.KEY} (SupervisorStats)",
                       dict(supervisor.counters, running_workers=supervisor.running_workers,
                            updated_us=supervisor.updated_us), {"site": site})
    return sources


# -- the collector and the route -------------------------------------------------------------------

class RamenCollector(Collector):
    """Reads everything at each scrape (no cache: a scrape is a snapshot, as `ramen stat` is).
    A source that cannot be read is left out and says so in `ramen_metrics_source_up`, so one
    broken source does not blank the others."""

    def __init__(self, client, site: str, stats: HttpdStats, *, counters_path: Path | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.client = client
        self.site = site
        self.stats = stats
        self.counters_path = counters_path
        self.clock = clock

    def describe(self) -> list:
        return []  # registering must not scrape; the names vary with what runs

    def collect(self) -> Iterator[Metric]:
        families = _Families()
        up = GaugeMetricFamily(metric_name(PREFIX + "metrics_source_up"),
                               "1 if the source (counters file, confserver) could be read at this scrape, else 0.",
                               labels=["site", "source"])
        from confserver import ConfError  # lazily, as ramen's CLI does: ramen does not depend on it
        sources: dict[str, str] = {}
        try:
            sources = collect_stats(families, self.client, self.site)
            up.add_metric([self.site, "confserver"], 1)
        except ConfError as e:  # a confserver down must not hide the counters (and vice versa)
            log.warning("metrics: cannot read the confserver: %s", e)
            up.add_metric([self.site, "confserver"], 0)
        try:
            counters = CountersFile.open(self.counters_path or paths.counters_path(), create=False)
        except (CountersFileError, OSError) as e:
            log.info("metrics: %s", e)
            up.add_metric([self.site, "counters"], 0)
        else:
            try:
                logs = site_logs(self.site, sources)
                collect_counters(families, counters, self.site, logs, self.clock.nanos() // NS_PER_MS)
                up.add_metric([self.site, "counters"], 1)
            finally:
                counters.close()
        for name, count in self.stats.counts().items():
            families.add(f"httpd_{name}", HttpdStats.help(name), {"site": self.site}, count, monotonic=True)
        yield up
        yield from families.families.values()


def make_registry(client, site: str, stats: HttpdStats, **options) -> CollectorRegistry:
    """A registry of its own holding only ramen's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RamenCollector(client, site, stats, **options))
    return registry


def add_routes(app: web.Application, *, client, site: str, stats: HttpdStats, **options) -> None:
    """Register `GET /metrics` on `app`; `options` go to RamenCollector (counters_path, clock)."""
    registry = make_registry(client, site, stats, **options)

    async def metrics(request: web.Request) -> web.Response:
        body = await asyncio.to_thread(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get(METRICS_PATH, metrics)

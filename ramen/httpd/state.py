"""httpd's state, which every request shares: the confserver client, the programs as loaded, the
cache, the thread pools, the limits of a request, the renders running and their progress."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from ramen import keyspace
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.httpd import buckets
from ramen.httpd.admission import AdmissionLimits, RenderMemory, ReplaySlots
from ramen.httpd.auth import Credentials
from ramen.httpd.cache import DEFAULT_MAX_BYTES, ResultCache
from ramen.httpd.factors import FactorValues
from ramen.httpd.fetch import Fetcher, Progress
from ramen.httpd.metrics import HttpdStats
from ramen.httpd.names import MetricTree
from ramen.memory import release_unused_memory, rss_bytes
from ramen.program import Function, Program, ProgramError
from ramen.replay.contract import DEFAULT_REPLAY_TIMEOUT_S

log = logging.getLogger(__name__)

MAX_TARGETS = 100
MAX_METRICS = 10_000
"""Series one render may fetch, after globs: a glob that matches more is refused, not run."""
MAX_RANGE_S = 400 * 86400
MAX_FETCH_RANGE_S = 2 * MAX_RANGE_S
"""The range any series of a render may be fetched over: the render's, moved (timeShift), or reaching
before it (a moving window, a forecast's bootstrap, linearRegression's source). A bootstrap of
'100y' escaped MAX_RANGE_S and reached back to 1970: 56 years of minutes."""
MAX_TARGET_LENGTH = 64 * 1024
"""Characters of one target: a Grafana target is a few hundred; one of 900 KiB took 300 MB to parse."""
MAX_POINTS = 50_000_000
"""Points of all the series one render draws, 400 MB of them: a range that many steps of a function
long is refused before it is replayed, not run out of memory with."""
MAX_FETCH_BYTES = 1 << 30
"""What the buckets of one fetch (a function over a range) may hold, every value of its factors
together, checked as its replay's buckets are added up: the points bound counts the series drawn,
after the fetch, which holds them all (50 hosts of a 10 s function over 399 days: 172 M buckets,
about 7 GB, before a one-line refusal)."""
MAX_RENDER_BYTES = 1 << 30
"""What one render may take by the estimate made before its fetches (renderer.py's _reserve,
buckets.estimated_bytes: the buckets of its functions over their ranges, every combination of
factor values known, and a drawn point per bucket and field): one past it is refused in one line
before it starts. The renders running together are bounded too (admission.py, MAX_RENDERS_BYTES)."""
THREADS = 16
"""Threads for the confserver's reads, the metric tree and targets' evaluation."""
FETCH_THREADS = 128
"""Threads for fetches: most wait on a replay, their own or a shared one. Beyond the long replays
running and waiting (admission.py), enough are left for the renders the cache answers and the
short replays of refreshes: 20 panels of 3 functions fit several times."""
PROGRESS_KEPT = 1000
"""Finished renders' progress kept for the page's last poll, newest first."""
RELEASE_AFTER_S = 5.0
"""Once no render has run for this long, the memory the allocators keep of the last ones is given
back (ramen/memory.py): after a burst of 200 renders, 226 -> 168 MB (141 MB before the burst)."""


@dataclass(frozen=True)
class Limits:
    max_targets: int = MAX_TARGETS
    max_metrics: int = MAX_METRICS
    max_range_s: int = MAX_RANGE_S
    max_fetch_range_s: int = MAX_FETCH_RANGE_S
    max_points: int = MAX_POINTS
    max_target_length: int = MAX_TARGET_LENGTH
    max_fetch_bytes: int = MAX_FETCH_BYTES
    max_render_bytes: int = MAX_RENDER_BYTES


class Httpd:
    """The service's state: the confserver client, the programs as loaded, the cache, the pools."""

    def __init__(self, client, site: str = keyspace.DEFAULT_SITE, *, credentials: Credentials | None = None,
                 limits: Limits = Limits(), admission: AdmissionLimits = AdmissionLimits(),
                 cache_bytes: int = DEFAULT_MAX_BYTES, timeout_s: float = DEFAULT_REPLAY_TIMEOUT_S,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.client = client
        self.site = site
        self.credentials = credentials
        self.limits = limits
        self.clock = clock
        self.pool = ThreadPoolExecutor(THREADS, thread_name_prefix="httpd")
        self.fetch_pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="httpd fetch")
        self.cache = ResultCache(cache_bytes)
        self.stats = HttpdStats()
        self.fetcher = Fetcher(client, site, self.cache, self.stats, timeout_s=timeout_s,
                               max_bytes=limits.max_fetch_bytes, slots=ReplaySlots(admission), clock=clock)
        self.progress: OrderedDict[str, Progress] = OrderedDict()
        self.renders_running = 0
        self._release: asyncio.TimerHandle | None = None
        self._programs: dict[str, Program] | None = None
        self._programs_lock = threading.Lock()
        self._programs_watch = client.watch(f"{keyspace.PROGRAMS}/*")
        self.factor_values = FactorValues(self.fetcher, site, self.programs, clock=clock)
        self.memory = RenderMemory(admission)

    def close(self) -> None:
        self._programs_watch.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.fetch_pool.shutdown(wait=False, cancel_futures=True)
        self.fetcher.close()

    # -- programs and the tree (on pool threads) ---------------------------------------------------

    def programs(self) -> dict[str, Program]:
        """The loaded programs, read again whenever one changed (a watch says so)."""
        with self._programs_lock:
            if self._programs_watch.drain() or self._programs is None:
                programs = {}
                for entry in self.client.glob(f"{keyspace.PROGRAMS}/*"):
                    try:
                        programs[entry.key.split("/", 1)[1]] = Program.from_dict(entry.value)
                    except ProgramError as e:
                        log.warning("%s cannot be read, left out of the metric tree: %s", entry.key, e)
                self._programs = programs
            return self._programs

    def tree(self) -> MetricTree:
        return MetricTree(self.programs(), self.factor_values)

    # -- rendering (on pool threads) ---------------------------------------------------------------

    def buckets_of(self, programs: dict[str, Program], function: Function, since_s: int, until_s: int,
                   progress: Progress, no_cache: bool) -> pa.Table:
        """The function's buckets over whole steps covering [since_s, until_s); their factor values
        remembered for completion."""
        step = buckets.step_s(function)
        start, end = since_s // step * step, -(-until_s // step) * step
        table = self.fetcher.buckets(programs, function, start, end, progress, no_cache=no_cache)
        self.factor_values.remember(function, table)
        return table

    # -- renders running (on the event loop) -------------------------------------------------------

    def render_started(self) -> None:
        self.renders_running += 1
        if self._release is not None:
            self._release.cancel()
            self._release = None

    def render_ended(self) -> None:
        """The last render running ended: the allocators' free memory goes back after a quiet while."""
        self.renders_running -= 1
        if self.renders_running == 0:
            loop = asyncio.get_running_loop()
            self._release = loop.call_later(RELEASE_AFTER_S, loop.run_in_executor, self.pool, self._release_memory)

    def _release_memory(self) -> None:
        before = rss_bytes()
        release_unused_memory()
        log.info("no render for %g s: RSS %d -> %d MB; the cache holds %d MB, pyarrow %d MB, drawn grids %d MB",
                 RELEASE_AFTER_S, before >> 20, rss_bytes() >> 20, self.cache.nbytes >> 20,
                 pa.default_memory_pool().bytes_allocated() >> 20, buckets.derived_bytes() >> 20)

    def track(self, request_id: str | None) -> Progress:
        progress = Progress()
        if request_id:
            self.progress[request_id] = progress
            self.progress.move_to_end(request_id)
            while len(self.progress) > PROGRESS_KEPT:
                self.progress.popitem(last=False)
        return progress

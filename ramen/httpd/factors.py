"""The factor values a dashboard can complete (`net.traffic.<host>`): what the archives hold over
their newest hour, read through a replay (cached, so the next render of that hour is free) and
again every FACTOR_REFRESH_S, with what past renders met on the way.

A render does not need them: it matches its globs against the values of its own range."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pyarrow as pa

from ramen import paths
from ramen.archive.coverage import archive_coverage
from ramen.archive.errors import ArchiveError
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.httpd import buckets
from ramen.httpd.fetch import FetchError, Fetcher, Progress
from ramen.program import Function, Program

log = logging.getLogger(__name__)

FACTOR_LOOKBACK_S = 3600
FACTOR_REFRESH_S = 300


class FactorValues:
    """Thread-safe: asked from the pool's threads by the metric tree."""

    def __init__(self, fetcher: Fetcher, site: str, programs: Callable[[], dict[str, Program]], *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.fetcher = fetcher
        self.site = site
        self.programs = programs
        self.clock = clock
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str], tuple[float | None, set[tuple[str, ...]]]] = {}
        """Per function (name, signature): when the archives were last read (None: never), the values."""

    def __call__(self, function: Function) -> list[tuple[str, ...]]:
        key = (function.qualified_name, function.signature)
        now = self.clock.seconds()
        with self._lock:
            read_at, values = self._known.get(key, (None, set()))
        if read_at is None or now - read_at > FACTOR_REFRESH_S:
            found = self._read_archives(function)
            with self._lock:
                values = self._known.get(key, (None, set()))[1] | found
                self._known[key] = (now, values)
        return sorted(values)

    def known(self, function: Function) -> int:
        """How many combinations of its factor values are known now, without reading anything: a
        render's estimate of its memory counts on them (0 for a function never met)."""
        with self._lock:
            return len(self._known.get((function.qualified_name, function.signature), (None, ()))[1])

    def remember(self, function: Function, table: pa.Table) -> None:
        """Add the values a render's buckets hold."""
        if not function.factors:
            return
        key = (function.qualified_name, function.signature)
        found = buckets.factor_values(function, table)
        with self._lock:
            read_at, values = self._known.get(key, (None, set()))
            self._known[key] = (read_at, values | found)

    def _read_archives(self, function: Function) -> set[tuple[str, ...]]:
        reach_s = self._archive_reach_s(function)
        if reach_s is None:
            return set()
        step = buckets.step_s(function)
        since = (reach_s - FACTOR_LOOKBACK_S) // step * step
        try:
            table = self.fetcher.buckets(self.programs(), function, since, reach_s + step, Progress())
        except FetchError as e:
            log.warning("factor values of %s: %s", function.qualified_name, e)
            return set()
        return buckets.factor_values(function, table)

    def _archive_reach_s(self, function: Function) -> int | None:
        """The newest event time (s) the archives of the function's archived ancestors hold."""
        try:
            coverage = archive_coverage(paths.archive_dir(self.site))
        except ArchiveError as e:
            log.warning("factor values of %s: %s", function.qualified_name, e)
            return None
        by_name = {f.qualified_name: f for p in self.programs().values() for f in p}
        todo, seen, reach = [function.qualified_name], set(), None
        while todo:
            name = todo.pop()
            if name in seen or name not in by_name:
                continue
            seen.add(name)
            for interval in coverage.get(name, []):
                reach = max(reach or 0, interval.until_us // buckets.US_PER_S)
            todo.extend(by_name[name].parents)
        return reach

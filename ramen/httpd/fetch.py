"""What a render needs of a function over a range, as buckets: from the cache where settled, from
summarised replays (ramen.replay.client, the path `ramen replay` takes; the target folds its rows
into buckets) for the holes.

Blocking: the app runs it on a thread pool of its own, one thread per function of a render, so a
dashboard's renders all ask for their replays within the supervisor's merge delay. Two renders
that need the same hole of the same function at once share one replay; a long one waits for a slot
(ramen/httpd/admission.py). A render whose client left is cancelled (Fetcher.leave): a replay no
other render waits for is withdrawn, its slot freed.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.httpd import buckets
from ramen.httpd.admission import WAIT_POLL_S, RenderCancelled, ReplaySlots
from ramen.httpd.cache import ResultCache
from ramen.httpd.metrics import HttpdStats
from ramen.program import Function, Program
from ramen.replay.client import LOST_REPLAY_ATTEMPTS, Replay, ReplayCancelled, ReplayFailed, replay_to_newest
from ramen.replay.plan import ReplayGapError, ReplayPlanError
from ramen.replay.summary import SummaryError

log = logging.getLogger(__name__)

SETTLE_S = 10
"""A bucket is cached once it ended this long (plus the window's lateness) before what the
archives held at its replay: rows a little out of order may still come into a younger one."""
COMBINE_ROWS = 1 << 20
"""Partial buckets gathered before they are added up: memory stays bounded by this many rows and
the buckets, whatever the range."""
COMBINE_PARTS = 4
"""... or this many parts: added up as they come (a target's folds come every few hundred
messages), so that what is left when the replay ends, and a render waits for, is little."""


def _close(replay: Replay) -> None:
    try:
        replay.close()
    except Exception:  # noqa: BLE001 - a bug: logged, the next replays go on
        log.exception("closing replay %s", replay.channel)


class FetchError(Exception):
    """A replay failed (one line, for the user: a damaged archive, a dead peer, a timeout)."""


class FetchTooBig(Exception):
    """The buckets of one fetch passed the bound on what it may hold: the render is refused (400)."""


@dataclass(eq=False)
class Progress:
    """Of one render, for the page's progress line: replays started and done, those of other renders
    it waits for too (shared), rows received; and whether it was given up (its client left, or a
    part of it failed: `cancelled`, which the threads fetching for it look at)."""
    replays: int = 0
    replays_done: int = 0
    replays_shared: int = 0
    rows: int = 0
    started: float = field(default_factory=time.monotonic)
    done: bool = False
    cancelled: threading.Event = field(default_factory=threading.Event)

    def to_dict(self) -> dict:
        return {"state": "done" if self.done else "running", "replays": self.replays,
                "replays_done": self.replays_done, "replays_shared": self.replays_shared, "rows": self.rows,
                "elapsed_s": round(time.monotonic() - self.started, 3)}


@dataclass(eq=False)
class _Shared:
    """One replay and the renders waiting for it; `stop` once none does."""
    future: Future = field(default_factory=Future)
    waiters: set[Progress] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)


class Fetcher:
    def __init__(self, client, site: str, cache: ResultCache, stats: HttpdStats, *, timeout_s: float,
                 max_bytes: int | None = None, slots: ReplaySlots | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        """`max_bytes`: what the buckets of one fetch may hold, every factor value's together (None:
        no bound); past it the replay is withdrawn and FetchTooBig raised."""
        self.client = client
        self.site = site
        self.cache = cache
        self.stats = stats
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.slots = slots or ReplaySlots()
        self.clock = clock
        self._lock = threading.Lock()
        self._inflight: dict[tuple, _Shared] = {}
        self._closer = ThreadPoolExecutor(1, thread_name_prefix="replay close")

    def close(self) -> None:
        """Once every replay it made is closed."""
        self._closer.shutdown(wait=True)

    def leave(self, progress: Progress) -> None:
        """The render of `progress` is given up: the replays it alone waited for stop (and a render
        asking one of them from now on starts its own)."""
        progress.cancelled.set()
        with self._lock:
            for key, shared in list(self._inflight.items()):
                shared.waiters.discard(progress)
                if not shared.waiters:
                    shared.stop.set()
                    del self._inflight[key]

    def buckets(self, programs: dict[str, Program], function: Function, since_s: int, until_s: int,
                progress: Progress, *, no_cache: bool = False) -> pa.Table:
        """The buckets of `function` starting in [since_s, until_s) (aligned to its step);
        `no_cache`: all of them replayed (graphite-web's noCache; what the bench measures)."""
        if no_cache:
            return self._replay_shared(programs, function, since_s, until_s, progress)
        held, holes = self.cache.lookup(function, since_s, until_s)
        parts = [held]
        if holes != [(since_s, until_s)]:
            self.stats.add("cache_hits")
        self.stats.add("cache_misses", len(holes))
        for hole in holes:
            parts.append(self._replay_shared(programs, function, *hole, progress))
        return buckets.combine(function, parts)

    def _replay_shared(self, programs, function: Function, since_s: int, until_s: int, progress: Progress) -> pa.Table:
        key = (function.qualified_name, function.signature, since_s, until_s)
        with self._lock:
            if progress.cancelled.is_set():  # left before this job of its render began
                raise RenderCancelled()
            shared = self._inflight.get(key)
            mine = shared is None
            if mine:
                shared = self._inflight[key] = _Shared()
            shared.waiters.add(progress)
        if not mine:
            progress.replays_shared += 1
            return self._wait(shared, progress)
        try:
            table = self._replay(programs, function, since_s, until_s, progress, shared.stop)
            shared.future.set_result(table)
            return table
        except BaseException as e:
            shared.future.set_exception(e)
            raise
        finally:
            with self._lock:
                if self._inflight.get(key) is shared:  # else leave() took it out
                    del self._inflight[key]

    @staticmethod
    def _wait(shared: _Shared, progress: Progress) -> pa.Table:
        """The shared replay's table, unless our render is cancelled first."""
        while True:
            try:
                return shared.future.result(timeout=WAIT_POLL_S)
            except TimeoutError:
                if progress.cancelled.is_set():
                    raise RenderCancelled() from None

    def _replay(self, programs, function: Function, since_s: int, until_s: int, progress: Progress,
                stop: threading.Event) -> pa.Table:
        """Replay [since_s, until_s) of the function (in a slot when long); cache what settled; its
        buckets. RenderCancelled once `stop` is set."""
        with self.slots.held(until_s - since_s, stop):
            return self._replay_in_slot(programs, function, since_s, until_s, progress, stop)

    def _replay_in_slot(self, programs, function: Function, since_s: int, until_s: int, progress: Progress,
                        stop: threading.Event) -> pa.Table:
        now_s = self.clock.epoch_us() / buckets.US_PER_S
        since_us, until_us = since_s * buckets.US_PER_S, until_s * buckets.US_PER_S
        # The target folds its rows into buckets: an hour of a source's rows never leaves its worker.
        options = dict(site=self.site, timeout_s=self.timeout_s, strict=False, summary=buckets.summary_of(function))
        for attempt in range(1, LOST_REPLAY_ATTEMPTS + 1):
            try:
                replay = (replay_to_newest if until_s >= now_s else Replay)(
                    self.client, programs, function.qualified_name, since_us, until_us, **options)
            except ReplayGapError:
                # No archive holds any of the range: nothing to chart there (graphite answers nulls).
                reach_s = until_s if until_s < now_s - SETTLE_S else since_s
                nothing = buckets.empty(function)
                self.cache.put(function, since_s, reach_s, nothing)
                return nothing
            except (ReplayPlanError, ReplayFailed, SummaryError) as e:
                raise FetchError(str(e)) from None
            self.stats.add("replays_started")
            progress.replays += 1
            try:
                table = self._read(function, replay, progress, stop)
                break
            except ReplayFailed as e:  # none of its buckets reached the chart: lost, it is asked again
                if not e.lost or attempt == LOST_REPLAY_ATTEMPTS:
                    raise FetchError(str(e)) from None
                log.warning("replay %d of %s over [%d, %d): %s: asking again", replay.channel,
                            function.qualified_name, since_s, until_s, e)
                self.stats.add("replays_retried")
        if function.window is not None:
            # A window the replay did not hold whole (the one still open, where the archives end)
            # would chart a fraction of its rows as a dip: it is left out, null, until it is whole.
            step = buckets.step_s(function)
            table = buckets.between(table, since_s, int(replay.plan.until_us // buckets.US_PER_S) // step * step)
        self.cache.put(function, since_s, self._settled_until(function, replay, until_s, now_s), table)
        return table

    def _read(self, function: Function, replay: Replay, progress: Progress, stop: threading.Event) -> pa.Table:
        """The buckets a replay's target writes, added up as they come."""
        table, pending, pending_rows = buckets.empty(function), [], 0
        try:
            replay.start()
            for batch in replay.batches(stop=stop):  # partial buckets, as the target folds them
                pending.append(pa.Table.from_batches([batch]))
                pending_rows += batch.num_rows
                progress.rows += batch.num_rows
                if pending_rows >= COMBINE_ROWS or len(pending) >= COMBINE_PARTS:
                    table, pending, pending_rows = buckets.combine(function, [table, *pending]), [], 0
                    self._check_size(function, table.nbytes)
        except ReplayCancelled:
            replay.close()
            self.stats.add("replays_cancelled")
            log.info("replay %d of %s cancelled: the renders waiting for it are gone", replay.channel,
                     function.qualified_name)
            raise RenderCancelled() from None
        except BaseException:
            replay.close()
            raise
        finally:
            progress.replays_done += 1
        # Its request withdrawn and its log removed behind the answer, not before it: 7-19 ms a
        # replay (a key deleted, a 48 MiB log unlinked) that a dashboard's renders waited for.
        self._closer.submit(_close, replay)
        table = buckets.combine(function, [table, *pending])
        self._check_size(function, table.nbytes)
        return table

    def _check_size(self, function: Function, nbytes: int) -> None:
        """FetchTooBig once the buckets held pass max_bytes: checked as they are added up, so that a
        fetch stops there rather than after the whole range (the caller closes the replay)."""
        if self.max_bytes is not None and nbytes > self.max_bytes:
            self.stats.add("fetches_too_big")
            raise FetchTooBig(f"render: the buckets of {function.qualified_name} over the range take more than "
                              f"{self.max_bytes / (1 << 20):g} MiB (every value of its factors, before any series "
                              f"is drawn): ask a shorter range")

    @staticmethod
    def _settled_until(function: Function, replay: Replay, until_s: int, now_s: float) -> int:
        """Up to where no row can come any more: the archives' reach at the replay (less the
        lateness and SETTLE_S when they were still short of the range), floored to a step."""
        lateness_s = function.window.lateness_us / buckets.US_PER_S if function.window else 0
        reach_s = replay.plan.until_us / buckets.US_PER_S
        settled = min(until_s, now_s - lateness_s - SETTLE_S)
        if reach_s < until_s:  # the archives stopped short of the range: what they hold last may still grow
            settled = min(settled, reach_s - lateness_s - SETTLE_S)
        step = buckets.step_s(function)
        return int(settled // step * step)

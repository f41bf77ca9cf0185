"""The HTTP application: routes, limits, credentials, and the render path (targets -> metrics ->
buckets through the cache and replays -> series -> Graphite functions -> the asked format).

Handlers never block the event loop: what reads the confserver or evaluates targets runs on the
thread pool of `Httpd`, the fetches of buckets (the cache, replays) on a pool of their own (a thread
per function of a render: a dashboard's renders must all ask for their replays within the
supervisor's merge delay, so that pool is large and its threads mostly wait; the long replays it
runs are bounded by ramen/httpd/admission.py). A render whose client leaves is cancelled (aiohttp
cancels its handler), and so are the replays no other render waits for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
from aiohttp import web

from ramen import keyspace
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.httpd import assets, buckets, dashboards, metrics, render, tagdb, target
from ramen.httpd import functions as graphite_functions
from ramen.httpd.admission import AdmissionLimits, Overloaded, ReplaySlots
from ramen.httpd.auth import Credentials, addressed_to_loopback
from ramen.httpd.cache import DEFAULT_MAX_BYTES, ResultCache
from ramen.httpd.factors import FactorValues
from ramen.httpd.fetch import FetchError, Fetcher, Progress
from ramen.httpd.metrics import HttpdStats
from ramen.httpd.names import MetricTree, PathError
from ramen.httpd.regexes import RegexError
from ramen.httpd.params import one, params
from ramen.httpd.series import DEFAULT_XFILES_FACTOR, Series
from ramen.memory import release_unused_memory, rss_bytes
from ramen.program import Function, Program, ProgramError
from ramen.replay.contract import DEFAULT_REPLAY_TIMEOUT_S
from ramen.times import TimeError, parse_time

log = logging.getLogger(__name__)

GRAPHITE_VERSION = "1.1.10"
"""What /version answers: a 1.1.x graphite-web, so Grafana turns on its 1.1 features (functions
from /functions, tags)."""
MAX_REQUEST_BYTES = 1024 * 1024
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
MAX_DATA_POINTS = 100_000
DEFAULT_FROM, DEFAULT_UNTIL = "-24h", "now"
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
back: after a burst of 200 renders httpd held 785 MB for good, 145 MB before it."""


class BadRequest(ValueError):
    """A request httpd cannot answer as asked: 400 with this one line."""


USER_ERRORS = (BadRequest, PathError, TimeError, target.TargetError, tagdb.TagRequestError, RegexError, FetchError,
               Overloaded)
"""What a request is answered in one line (400, 502 for a failed replay, 503 when overloaded); anything
else is a bug."""


def status_of(error: Exception) -> int:
    """The HTTP status of a user error: a replay that failed is the peer's (502), too many long replays
    ours for a while (503), the rest the request's."""
    if isinstance(error, Overloaded):
        return 503
    return 502 if isinstance(error, FetchError) else 400


def headers_of(error: Exception) -> dict[str, str]:
    return {"Retry-After": str(error.retry_after_s)} if isinstance(error, Overloaded) else {}


@dataclass(frozen=True)
class Limits:
    max_targets: int = MAX_TARGETS
    max_metrics: int = MAX_METRICS
    max_range_s: int = MAX_RANGE_S
    max_fetch_range_s: int = MAX_FETCH_RANGE_S
    max_points: int = MAX_POINTS
    max_target_length: int = MAX_TARGET_LENGTH


class Httpd:
    """The service's state: the confserver client, the programs as loaded, the cache, the pool."""

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
                               slots=ReplaySlots(admission), clock=clock)
        self.progress: OrderedDict[str, Progress] = OrderedDict()
        self.renders_running = 0
        self._release: asyncio.TimerHandle | None = None
        self._programs: dict[str, Program] | None = None
        self._programs_lock = threading.Lock()
        self._programs_watch = client.watch(f"{keyspace.PROGRAMS}/*")
        self.factor_values = FactorValues(self.fetcher, site, self.programs, clock=clock)

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


# -- request helpers ---------------------------------------------------------------------------------

HTTPD = web.AppKey("httpd", Httpd)


def time_range(values: dict[str, list[str]], httpd: Httpd) -> tuple[int, int, int]:
    """from, until and now in epoch seconds, from Graphite's grammar (and its `now` parameter)."""
    now_us = httpd.clock.epoch_us()
    if (now := one(values, "now")) is not None:
        now_us = _parse(now, now_us, "now")
    since_us = _parse(one(values, "from", DEFAULT_FROM), now_us, "from")
    until_us = _parse(one(values, "until", DEFAULT_UNTIL), now_us, "until", end=True)
    since_s, until_s = since_us // 1_000_000, -(-until_us // 1_000_000)
    if since_s >= until_s:
        raise BadRequest(f"from ({one(values, 'from', DEFAULT_FROM)}) is not before until "
                         f"({one(values, 'until', DEFAULT_UNTIL)})")
    if until_s - since_s > httpd.limits.max_range_s:
        raise BadRequest(f"the range is longer than {httpd.limits.max_range_s // 86400} days")
    return since_s, until_s, now_us // 1_000_000


def _parse(text: str, now_us: int, name: str, *, end: bool = False) -> int:
    # Grafana sends `from=-6h` and `until=now`, or epoch seconds; graphite-web also takes `-6hours`.
    try:
        return parse_time(text, now_us, end=end)
    except TimeError as e:
        raise BadRequest(f"{name}: {e}") from None


@web.middleware
async def guard(request: web.Request, handler):
    """Who asks first (a loopback Host without credentials, else the credentials), then user errors
    as one-line 400s, and bugs as 500s with a traceback in the log (never in the answer)."""
    httpd = request.app[HTTPD]
    if httpd.credentials is None and not addressed_to_loopback(request.headers.get("Host")):
        return web.Response(status=403, text=f"httpd without --auth answers requests to 127.0.0.1 or localhost only, "
                                             f"not to {request.headers.get('Host')!r}\n")
    if httpd.credentials is not None and not httpd.credentials.allows(request.headers.get("Authorization")):
        return web.Response(status=401, text="credentials needed\n",
                            headers={"WWW-Authenticate": 'Basic realm="ramen"'})
    try:
        response = await handler(request)
        if isinstance(response, web.Response) and isinstance(response.body, bytes):
            httpd.stats.add("bytes_served", len(response.body))
        return response
    except USER_ERRORS as e:
        return web.Response(status=status_of(e), text=f"{e}\n", headers=headers_of(e))
    except web.HTTPException:
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path_qs)
        return web.Response(status=500, text="internal error: see httpd's log\n")


# -- handlers -------------------------------------------------------------------------------------------

async def version(request: web.Request) -> web.Response:
    return web.Response(text=GRAPHITE_VERSION)


async def no_events(request: web.Request) -> web.Response:
    """/events/get_data: ramen keeps no events; Grafana asks (an annotation query on a Graphite data
    source), and takes an empty answer."""
    return web.json_response([])


async def progress(request: web.Request) -> web.Response:
    found = request.app[HTTPD].progress.get(request.query.get("requestId", ""))
    return web.json_response(found.to_dict() if found else {"state": "unknown"})


async def find(request: web.Request) -> web.Response:
    httpd = request.app[HTTPD]
    values = await params(request)
    query = one(values, "query")
    if not query:
        raise BadRequest("find: a query is needed, such as query=*")
    fmt = one(values, "format", "treejson")
    if fmt not in render.FIND_FORMATS:
        raise BadRequest(f"find: unknown format {fmt!r} ({', '.join(render.FIND_FORMATS)})")
    loop = asyncio.get_running_loop()
    nodes = await loop.run_in_executor(httpd.pool, lambda: httpd.tree().find(query))
    return _answer(render.to_find(nodes, fmt), fmt)


async def expand(request: web.Request) -> web.Response:
    httpd = request.app[HTTPD]
    values = await params(request)
    queries = values.get("query", [])
    if not queries:
        raise BadRequest("expand: a query is needed, such as query=net.*")
    leaves_only = one(values, "leavesOnly", "0") == "1"
    loop = asyncio.get_running_loop()

    def run() -> list[str]:
        tree = httpd.tree()
        out = set()
        for query in queries:
            out.update(f.path for f in tree.find(query) if f.leaf or not leaves_only)
        return sorted(out)

    return web.json_response({"results": await loop.run_in_executor(httpd.pool, run)})


async def functions(request: web.Request) -> web.Response:
    return web.json_response(graphite_functions.describe_functions())


RENDER_FORMATS = ("json", "csv", "pickle", "msgpack")
MAX_BATCH_RENDERS = 100


async def evaluate_targets(httpd: Httpd, targets: list[str], since_s: int, until_s: int, now_s: int, *,
                           request_id: str | None = None, no_cache: bool = False,
                           xfiles_factor: float = DEFAULT_XFILES_FACTOR) -> list[Series]:
    """The series of Graphite targets over [since_s, until_s): every target parsed first, then
    each function they need fetched at once over each range it is needed over (one pool job each;
    a timeShift moves a range, a moving window reaches back before it), then the functions applied.
    Targets that functions make as they run (applyByNode's, useSeriesAbove's, aliasQuery's) have
    what they need fetched in a round of their own, and the targets are evaluated again."""
    targets = [t for t in targets if t.strip()]
    if not targets:
        raise BadRequest("render: at least one target is needed")
    if len(targets) > httpd.limits.max_targets:
        raise BadRequest(f"render: {len(targets)} targets, more than {httpd.limits.max_targets}")
    for text in targets:
        if len(text) > httpd.limits.max_target_length:
            raise BadRequest(f"render: a target of {len(text):,} characters, more than "
                             f"{httpd.limits.max_target_length:,}")
    nodes = [target.parse(t, graphite_functions.FUNCTIONS) for t in targets]  # all checked before anything runs
    progress = httpd.track(request_id)
    loop = asyncio.get_running_loop()
    httpd.render_started()
    try:
        programs = await loop.run_in_executor(httpd.pool, httpd.programs)
        tree = MetricTree(programs, httpd.factor_values)

        def step_of(expression: str) -> int:
            return max((buckets.step_s(f) for f in tree.functions_matching(expression)), default=0)
        context = graphite_functions.Context(since_s, until_s, now_s, xfiles_factor, step_of=step_of)
        # (path expression, from_s, until_s): a timeShift moves a range, a moving window reaches back
        wanted = sorted({w for node in nodes for w in graphite_functions.fetches(node, context)})
        _check_fetch_ranges(wanted, httpd.limits)
        series_of: graphite_functions.Fetched = {}
        tables: dict[tuple[str, int, int], pa.Table] = {}  # (function, from_s, until_s) -> its buckets, every round's
        for _ in range(MAX_FETCH_ROUNDS):
            earlier = [s for found in series_of.values() for s in found]
            series_of.update(await _fetch(httpd, programs, tree, wanted, since_s, until_s, progress, no_cache, tables,
                                          len(earlier), sum(len(s.values) for s in earlier)))
            try:
                # On the pool: a moving median over a long range takes seconds the loop owes other requests.
                return await loop.run_in_executor(httpd.pool, graphite_functions.evaluate_all, nodes, series_of,
                                                  context)
            except graphite_functions.FetchesNeeded as more:
                wanted = more.wanted
        raise BadRequest(f"render: targets made by functions (applyByNode, useSeriesAbove, aliasQuery) need more "
                         f"than {MAX_FETCH_ROUNDS} rounds of fetches")
    except BaseException as e:
        if isinstance(e, asyncio.CancelledError):  # its client left (aiohttp's handler cancellation)
            httpd.stats.add("renders_cancelled")
        elif isinstance(e, Overloaded):
            httpd.stats.add("renders_refused")
        httpd.fetcher.leave(progress)  # its fetches still running are wanted by nobody else
        raise
    finally:
        progress.done = True
        httpd.render_ended()


MAX_FETCH_ROUNDS = 3
"""Rounds of fetches a render may take: its targets', then those of the targets its functions make
(applyByNode's, useSeriesAbove's, aliasQuery's), then of targets these make in turn."""


async def _fetch(httpd: Httpd, programs: dict[str, Program], tree: MetricTree, wanted: list[tuple[str, int, int]],
                 since_s: int, until_s: int, progress: Progress, no_cache: bool,
                 tables: dict[tuple[str, int, int], pa.Table], metrics_before: int, points_before: int
                 ) -> graphite_functions.Fetched:
    """The series each (path expression, from_s, until_s) matches, its functions fetched at once in
    pieces: the part within the render's range as every render of that range fetches it (a
    dashboard's panels share its replay), the rest (a moving window's reach) apart. `tables` holds
    the pieces earlier rounds fetched (a made target's paths are mostly of the same functions, over
    the same ranges), and gets this round's. The render's limits count the series and points of its
    earlier rounds too."""
    loop = asyncio.get_running_loop()
    needed = {(f.qualified_name, since, until): f for e, since, until in wanted for f in tree.functions_matching(e)}
    pieces = {key: pieces_of(buckets.step_s(f), key[1], key[2], since_s, until_s) for key, f in needed.items()}
    fetched = {(key[0], *piece): f for key, f in needed.items() for piece in pieces[key]}
    _check_points(sum((until - since) // buckets.step_s(f) for (_, since, until), f in fetched.items()),
                  len(fetched), "function", httpd.limits)
    # Every piece at once (a pool job each: their replays meet in the merge delay); a glob over
    # factor values then matches the values these hold, so a render never needs the archive's
    # newest hour (completion's factor values) on top of its own range.
    missing = [key for key in fetched if key not in tables]
    tables.update(zip(missing, await asyncio.gather(*(
        loop.run_in_executor(httpd.fetch_pool, httpd.buckets_of, programs, fetched[key], key[1], key[2], progress,
                             no_cache)
        for key in missing))))
    joined = {key: _joined(f, [tables[(key[0], *piece)] for piece in pieces[key]]) for key, f in needed.items()}
    expanded = {}  # (path expression, from_s, until_s) -> the metrics it names there
    for since, until in {(since, until) for _, since, until in wanted}:
        present = MetricTree(programs, lambda f, a=since, b=until: sorted(buckets.factor_values(
            f, joined[f.qualified_name, a, b])))
        expanded.update(((e, a, b), present.expand(e)) for e, a, b in wanted if (a, b) == (since, until))
    metrics = {(m.path, since, until): m for (_, since, until), found in expanded.items() for m in found}
    if metrics_before + len(metrics) > httpd.limits.max_metrics:
        raise BadRequest(f"render: the targets name {metrics_before + len(metrics):,} series, more than "
                         f"{httpd.limits.max_metrics:,}")
    _check_points(points_before + sum((until - since) // buckets.step_s(needed[m.function, since, until])
                                      for (_, since, until), m in metrics.items()),
                  metrics_before + len(metrics), "series", httpd.limits)
    by_path = {}
    for (name, since, until), function in needed.items():
        drawn = [m for (_, a, b), m in metrics.items() if (m.function, a, b) == (name, since, until)]
        for metric, series in zip(drawn, buckets.to_series(function, joined[name, since, until], [
                (m.factor_values, m.field, m.path) for m in drawn], since, until)):
            if metric.tags:  # named by a tag query
                series.tags = dict(metric.tags)
            by_path[series.name, since, until] = series
    return {key: [by_path[m.path, key[1], key[2]] for m in found] for key, found in expanded.items()}


def pieces_of(step_s: int, since_s: int, until_s: int, render_since_s: int, render_until_s: int
              ) -> list[tuple[int, int]]:
    """[since_s, until_s) cut where the render's range (in whole steps) begins and ends: the part
    within it is fetched as every render of that range fetches it (one replay for a dashboard's
    panels, one cache chunk), the rest apart (a moving window's reach before the range)."""
    cuts = [cut for cut in (render_since_s // step_s * step_s, -(-render_until_s // step_s) * step_s)
            if since_s < cut < until_s]
    bounds = [since_s, *cuts, until_s]
    return list(zip(bounds, bounds[1:]))


def _joined(function: Function, tables: list[pa.Table]) -> pa.Table:
    """The buckets of a range fetched in pieces; a range in one piece keeps its table, whose drawn
    grids the renders sharing it compute once (buckets._derived)."""
    return tables[0] if len(tables) == 1 else buckets.combine(function, tables)


def _check_fetch_ranges(wanted: list[tuple[str, int, int]], limits: Limits) -> None:
    """Every range a render's series would be fetched over is bounded, before anything is fetched."""
    for expression, since_s, until_s in wanted:
        if until_s - since_s > limits.max_fetch_range_s:
            raise BadRequest(f"render: {expression} would be fetched over {(until_s - since_s) // 86400:,} days "
                             f"(a forecast's bootstrap, a moving window or a regression's source included), "
                             f"more than {limits.max_fetch_range_s // 86400}")


def _check_points(total: int, count: int, kind: str, limits: Limits) -> None:
    """A render whose series would hold more than limits.max_points is refused in one line: before
    its replays when one series of each function is already too many."""
    if total > limits.max_points:
        kinds = kind if count == 1 or kind == "series" else kind + "s"
        raise BadRequest(f"render: the range holds {total:,} points of {count:,} {kinds} at their steps, more than "
                         f"{limits.max_points:,}: ask a shorter range or fewer series")


async def render_handler(request: web.Request) -> web.Response:
    """Graphite's /render: `target` repeated, from/until, format, maxDataPoints (json), xFilesFactor."""
    httpd = request.app[HTTPD]
    httpd.stats.renders += 1
    try:
        values = await params(request)
        fmt = one(values, "format", "json")
        if fmt not in RENDER_FORMATS:
            raise BadRequest(f"render: unknown format {fmt!r} ({', '.join(RENDER_FORMATS)})")
        since_s, until_s, now_s = time_range(values, httpd)
        max_points = _max_data_points(one(values, "maxDataPoints"))
        results = await evaluate_targets(httpd, values.get("target", []), since_s, until_s, now_s,
                                         request_id=one(values, "requestId"),
                                         no_cache=one(values, "noCache", "0").lower() in ("1", "true"),
                                         xfiles_factor=_xfiles_factor(one(values, "xFilesFactor")))
    except Exception:
        httpd.stats.add("render_errors")
        raise
    if fmt in render.LOCAL_FORMATS:
        return _answer(render.to_local(results, fmt), fmt)
    if fmt == "csv":
        return _answer(render.to_csv(results), fmt)
    return _answer(render.to_json(results, max_points), fmt)


async def render_batch_handler(request: web.Request) -> web.Response:
    """POST /render/batch: several renders over one range, answered together.

    Body: {"from", "until", "renders": [{"targets": [...], "maxDataPoints": n, "requestId": id}]}.
    Answer: one item per render, {"series": [<as /render?format=json>]} or {"status": 400|502|500,
    "error": "<one line>"}.
    ramen's page refreshes its charts with it: a browser opens at most 6 connections to a host,
    so past 6 charts one request per chart would queue, and miss the supervisor's merge delay."""
    httpd = request.app[HTTPD]
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("render/batch: the body is not JSON") from None
    except RecursionError:
        raise BadRequest("render/batch: the body's JSON is nested too deeply") from None
    renders = body.get("renders") if isinstance(body, dict) else None
    if not isinstance(renders, list) or not all(isinstance(r, dict) for r in renders):
        raise BadRequest('render/batch: expected {"from", "until", "renders": [{"targets": [...]}, ...]}')
    if len(renders) > MAX_BATCH_RENDERS:
        raise BadRequest(f"render/batch: {len(renders)} renders, more than {MAX_BATCH_RENDERS}")
    since_s, until_s, now_s = time_range({k: [str(body[k])] for k in ("from", "until", "now") if k in body}, httpd)

    async def one_render(spec: dict) -> bytes:
        httpd.stats.renders += 1
        try:
            targets = spec.get("targets")
            if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
                raise BadRequest("render: targets must be a list of strings")
            max_points = _max_data_points(str(spec["maxDataPoints"]) if "maxDataPoints" in spec else None)
            results = await evaluate_targets(httpd, targets, since_s, until_s, now_s,
                                             request_id=spec.get("requestId"), no_cache=bool(spec.get("noCache")))
            return b'{"series":' + render.to_json(results, max_points) + b"}"
        except USER_ERRORS as e:
            httpd.stats.add("render_errors")
            return json.dumps({"status": status_of(e), "error": str(e)}).encode()
        except Exception:
            httpd.stats.add("render_errors")
            log.exception("render/batch: a render of %s failed", spec.get("targets"))
            return json.dumps({"status": 500, "error": "internal error: see httpd's log"}).encode()

    answers = await asyncio.gather(*(one_render(spec) for spec in renders))
    return _answer(b"[" + b",".join(answers) + b"]", "json")


def _xfiles_factor(text: str | None) -> float:
    if text is None or text == "":
        return DEFAULT_XFILES_FACTOR
    try:
        share = float(text)
    except ValueError:
        raise BadRequest(f"xFilesFactor {text!r} is not a number") from None
    if not 0 <= share <= 1:
        raise BadRequest(f"xFilesFactor must be within 0..1, not {text}")
    return share


def _max_data_points(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    try:
        points = int(float(text))
    except ValueError:
        raise BadRequest(f"maxDataPoints {text!r} is not a number") from None
    except OverflowError:  # inf, or too many digits for a float
        raise BadRequest(f"maxDataPoints must be within 1..{MAX_DATA_POINTS}") from None
    if not 1 <= points <= MAX_DATA_POINTS:
        raise BadRequest(f"maxDataPoints must be within 1..{MAX_DATA_POINTS}")
    return points


CONTENT_TYPES = {"json": "application/json", "treejson": "application/json", "completer": "application/json",
                 "csv": "text/csv", "pickle": "application/pickle", "msgpack": "application/x-msgpack"}


def _answer(body: bytes, fmt: str) -> web.Response:
    return web.Response(body=body, content_type=CONTENT_TYPES.get(fmt, "application/octet-stream"))


def make_app(httpd: Httpd) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=MAX_REQUEST_BYTES)
    app[HTTPD] = httpd
    for path, handler in (("/render", render_handler), ("/metrics/find", find), ("/metrics/expand", expand)):
        for suffix in ("", "/"):
            app.router.add_route("GET", path + suffix, handler)
            app.router.add_route("POST", path + suffix, handler)
    app.router.add_post("/render/batch", render_batch_handler)
    app.router.add_get("/version", version)
    app.router.add_get("/functions", functions)
    app.router.add_get("/progress", progress)
    metrics.add_routes(app, client=httpd.client, site=httpd.site, stats=httpd.stats)
    tagdb.add_routes(app, httpd.tree, httpd.pool)
    app.router.add_route("*", "/events/get_data", no_events)
    assets.add_routes(app)
    dashboards.add_routes(app, httpd.client)
    app.on_cleanup.append(_close)
    return app


async def _close(app: web.Application) -> None:
    app[HTTPD].close()


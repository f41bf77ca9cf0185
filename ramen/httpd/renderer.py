"""The render path: targets -> metrics -> buckets through the cache and replays (fetch.py) ->
series -> Graphite functions (functions/). The handlers (app.py) parse the request and format
what this gives (render.py).

Every bound of a render (targets, their length, the ranges a series is fetched over, series and
points, the memory its buckets and series are estimated to take) is checked before anything is
fetched; what needs the metric tree is evaluated on the pool, the fetches on the fetch pool, at once."""

from __future__ import annotations

import asyncio

import pyarrow as pa

from ramen.httpd import buckets, target
from ramen.httpd import functions as graphite_functions
from ramen.httpd.admission import MIB, Overloaded
from ramen.httpd.errors import BadRequest
from ramen.httpd.fetch import Progress
from ramen.httpd.names import MetricTree
from ramen.httpd.series import DEFAULT_XFILES_FACTOR, Series
from ramen.httpd.state import Httpd, Limits
from ramen.program import Function, Program


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
    reserved: dict[tuple[str, int, int], int] = {}  # the pieces it holds of httpd's memory, their estimates
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
                                          reserved, len(earlier), sum(len(s.values) for s in earlier)))
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
        httpd.memory.release(reserved)
        progress.done = True
        httpd.render_ended()


MAX_FETCH_ROUNDS = 3
"""Rounds of fetches a render may take: its targets', then those of the targets its functions make
(applyByNode's, useSeriesAbove's, aliasQuery's), then of targets these make in turn."""


async def _fetch(httpd: Httpd, programs: dict[str, Program], tree: MetricTree, wanted: list[tuple[str, int, int]],
                 since_s: int, until_s: int, progress: Progress, no_cache: bool,
                 tables: dict[tuple[str, int, int], pa.Table], reserved: dict[tuple[str, int, int], int],
                 metrics_before: int, points_before: int) -> graphite_functions.Fetched:
    """The series each (path expression, from_s, until_s) matches, its functions fetched at once in
    pieces: the part within the render's range as every render of that range fetches it (a
    dashboard's panels share its replay), the rest (a moving window's reach) apart. `tables` holds
    the pieces earlier rounds fetched (a made target's paths are mostly of the same functions, over
    the same ranges), and gets this round's. The render's limits count the series and points of its
    earlier rounds too, and its memory what `reserved` holds (the pieces it reserved, with their
    estimates), to which this round's are added before they are fetched."""
    loop = asyncio.get_running_loop()
    needed = {(f.qualified_name, since, until): f for e, since, until in wanted for f in tree.functions_matching(e)}
    pieces = {key: pieces_of(buckets.step_s(f), key[1], key[2], since_s, until_s) for key, f in needed.items()}
    fetched = {(key[0], *piece): f for key, f in needed.items() for piece in pieces[key]}
    _check_points(sum((until - since) // buckets.step_s(f) for (_, since, until), f in fetched.items()),
                  len(fetched), "function", httpd.limits)
    _reserve(httpd, {key: f for key, f in fetched.items() if key not in reserved}, reserved)
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


def _reserve(httpd: Httpd, pieces: dict[tuple[str, int, int], Function], reserved: dict[tuple[str, int, int], int]
             ) -> None:
    """Before the pieces are fetched: what they will take, estimated from the factor values known
    (buckets.estimated_bytes), with what the render holds already, within limits.max_render_bytes
    (a one-line refusal, before any replay); then reserved in httpd's memory (Overloaded beside
    the renders running: 503). A function never met counts one combination of factor values: its
    fetch is bounded as it runs (fetch.py, max_fetch_bytes), and its values known for the next."""
    estimates = {key: buckets.estimated_bytes(f, httpd.factor_values.known(f) if f.factors else 1, key[1], key[2])
                 for key, f in pieces.items()}
    total = sum(reserved.values()) + sum(estimates.values())
    if total > httpd.limits.max_render_bytes:
        largest = max(estimates, key=estimates.get)
        raise BadRequest(f"render: would take about {total / MIB:,.0f} MiB ({largest[0]} over "
                         f"{(largest[2] - largest[1]) / 86400:,.1f} days alone about "
                         f"{estimates[largest] / MIB:,.0f} MiB, every value of its factors known), more than "
                         f"{httpd.limits.max_render_bytes / MIB:,.0f} MiB: ask a shorter range or fewer series")
    httpd.memory.reserve(estimates)
    reserved.update(estimates)


def _check_points(total: int, count: int, kind: str, limits: Limits) -> None:
    """A render whose series would hold more than limits.max_points is refused in one line: before
    its replays when one series of each function is already too many."""
    if total > limits.max_points:
        kinds = kind if count == 1 or kind == "series" else kind + "s"
        raise BadRequest(f"render: the range holds {total:,} points of {count:,} {kinds} at their steps, more than "
                         f"{limits.max_points:,}: ask a shorter range or fewer series")

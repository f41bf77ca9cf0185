"""Functions that combine several series into fewer: sumSeries & co, percentileOfSeries, divideSeries,
asPercent, the groupings by node and by wildcard."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ramen.httpd.functions.context import Context, Evaluator
from ramen.httpd.functions.reductions import aggregate_rows, check_percent, normalize, percentiles, points_matrix
from ramen.httpd.functions.results import (fresh, named, node_of, path_expressions, real_or_null,
                                          strictest_xfiles_factor)
from ramen.httpd.functions.transform import constant_line
from ramen.httpd.series import Series, SeriesLists
from ramen.httpd.tags import NAME_TAG, parse_tagged
from ramen.httpd.target import TargetError


def _aggregate(context: Context, series_lists: list[list[Series]], func: str, xfiles_factor: float | None = None
               ) -> list[Series]:
    series_list = [s for sublist in series_lists for s in sublist]
    if not series_list:
        return []
    xff = strictest_xfiles_factor(series_list) if xfiles_factor is None else xfiles_factor
    normalized, start, step = normalize(series_list)
    name = f"{func}Series({path_expressions(series_list)})"
    values = aggregate_rows(func, points_matrix(normalized, start, step), xfiles_factor=xff)
    tags = dict(series_list[0].tags)
    for s in series_list[1:]:
        tags = {key: value for key, value in tags.items() if s.tags.get(key) == value}
    tags.setdefault("name", name)
    tags["aggregatedBy"] = func
    return [Series(name=name, start=start, step=step, values=values, path_expression=name, tags=tags,
                   xfiles_factor=xff)]


def sum_series(context: Context, seriesLists: list[list[Series]]) -> list[Series]:
    """Adds the series point by point into one, named `sumSeries(<path expressions>)`; series of
    different steps are first consolidated to their lowest common step. A point where every series is
    null is null."""
    return _aggregate(context, seriesLists, "sum")


def average_series(context: Context, seriesLists: list[list[Series]]) -> list[Series]:
    """The mean of the series' non-null values at each point, as one series named
    `averageSeries(<path expressions>)`."""
    return _aggregate(context, seriesLists, "average")


def max_series(context: Context, seriesLists: list[list[Series]]) -> list[Series]:
    """The largest of the series' values at each point, as one series named `maxSeries(...)`."""
    return _aggregate(context, seriesLists, "max")


def min_series(context: Context, seriesLists: list[list[Series]]) -> list[Series]:
    """The smallest of the series' values at each point, as one series named `minSeries(...)`."""
    return _aggregate(context, seriesLists, "min")


def diff_series(context: Context, seriesLists: list[list[Series]]) -> list[Series]:
    """The first series less all the others, point by point, as one series named `diffSeries(...)`
    (nulls skipped, as graphite-web: where the first is null, the first non-null one is the
    minuend)."""
    return _aggregate(context, seriesLists, "diff")


def multiply_series(context: Context, seriesLists: list[list[Series]]) -> list[Series]:
    """The series multiplied point by point, as one series named `multiplySeries(...)`; null where
    any is null. A lone series is returned as it is, as graphite-web does."""
    if len(seriesLists) == 1 and len(seriesLists[0]) == 1:
        return seriesLists[0]
    return _aggregate(context, seriesLists, "multiply")


def range_of_series(context: Context, seriesLists: list[list[Series]]) -> list[Series]:
    """The largest less the smallest of the series' values at each point, as one series named
    `rangeOfSeries(...)`."""
    return _aggregate(context, seriesLists, "rangeOf")


def stddev_series(context: Context, seriesLists: list[list[Series]]) -> list[Series]:
    """The standard deviation of the series' values at each point, as one series named
    `stddevSeries(...)`."""
    return _aggregate(context, seriesLists, "stddev")


def count_series(context: Context, seriesLists: list[list[Series]]) -> list[Series]:
    """How many series there are, at every point, as one series named `countSeries(...)` (a
    constant line at 0 when there are none)."""
    series_list = [s for sublist in seriesLists for s in sublist]
    if not series_list:
        [line] = constant_line(context, 0)
        return [line.copy(path_expression="countSeries()")]
    normalized, start, step = normalize(series_list)
    length = points_matrix(normalized, start, step).shape[0]
    return [fresh(f"countSeries({path_expressions(series_list)})", start, step,
                   np.full(length, float(len(series_list))), series_list)]


def percentile_of_series(context: Context, seriesList: list[Series], n: float, interpolate: bool = False
                         ) -> list[Series]:
    """The `n`th percentile of the series' values at each point, as one series named
    `percentileOfSeries(<path expression>,<n>)`: the value at that rank among the non-null ones,
    or with `interpolate` between the two around it."""
    check_percent("percentileOfSeries", n)
    if not seriesList:
        return []
    normalized, start, step = normalize(seriesList)
    values = percentiles(points_matrix(normalized, start, step), n, interpolate)
    return [fresh(f"percentileOfSeries({seriesList[0].path_expression},{n:g})", start, step, values, seriesList)]


def aggregate_with_wildcards(context: Context, seriesList: list[Series], func: str, position: list[int]
                             ) -> list[Series]:
    """The series grouped by their paths without the elements at `position`s, each group combined by
    `func` into one series named by what is left: `aggregateWithWildcards(prog.f.*.bytes, "sum", 2)`
    is `prog.f.bytes`, the sum over the hosts."""
    groups: dict[str, list[Series]] = {}
    for s in seriesList:
        key = ".".join(part for index, part in enumerate(s.name.split(".")) if index not in position)
        groups.setdefault(key, []).append(s)
    return [s.copy(name=key) for key, members in groups.items() for s in aggregate(context, members, func)]


def with_wildcards(func: str) -> Callable[..., list[Series]]:
    def combined(context: Context, seriesList: list[Series], position: list[int]) -> list[Series]:
        return aggregate_with_wildcards(context, seriesList, func, position)
    combined.__doc__ = (f"aggregateWithWildcards by {func}: the series grouped by their paths without the "
                        f"elements at `position`s, each group's {func} named by what is left.")
    return combined


def _as_long(name: str, first: list[Series], second: list[Series]) -> None:
    """Two lists combined pairwise must be as long."""
    if len(first) != len(second):
        raise TargetError(f"{name}: the two lists hold {len(first)} and {len(second)} series; they must be as long")


def aggregate_series_lists(context: Context, seriesListFirstPos: list[Series], seriesListSecondPos: list[Series],
                           func: str, xFilesFactor: float | None = None) -> list[Series]:
    """The two lists' series combined pairwise by `func` (the first with the first, ...), each
    named `<func>Series(<a>,<b>)`; the lists must be as long."""
    _as_long("aggregateSeriesLists", seriesListFirstPos, seriesListSecondPos)
    results = []
    for first, second in zip(seriesListFirstPos, seriesListSecondPos):
        [combined] = aggregate(context, [first, second], func, xFilesFactor)
        results.append(combined.copy(name=f"{combined.name[:combined.name.find('Series(')]}Series({first.name},"
                                          f"{second.name})"))
    return results


def series_lists_by(func: str) -> Callable[..., list[Series]]:
    def combined(context: Context, seriesListFirstPos: list[Series], seriesListSecondPos: list[Series]
                 ) -> list[Series]:
        return aggregate_series_lists(context, seriesListFirstPos, seriesListSecondPos, func)
    combined.__doc__ = f"aggregateSeriesLists by {func}: the two lists' series pairwise, the first with the first."
    return combined


def divide_series_lists(context: Context, dividendSeriesList: list[Series], divisorSeriesList: list[Series]
                        ) -> list[Series]:
    """The first list's series divided by the second's pairwise, each named `divideSeries(<a>,<b>)`;
    null where the divisor is null or 0. The lists must be as long."""
    _as_long("divideSeriesLists", dividendSeriesList, divisorSeriesList)
    return [s for dividend, divisor in zip(dividendSeriesList, divisorSeriesList)
            for s in divide_series(context, [dividend], [divisor])]


def pow_series(context: Context, seriesList: list[list[Series]]) -> list[Series]:
    """The first series to the power of the second, that to the third...: one series named
    `powSeries(<names>)`; null where a value is null or the power no real number."""
    series_list = [s for sublist in seriesList for s in sublist]
    if not series_list:
        return []
    normalized, start, step = normalize(series_list)
    matrix = points_matrix(normalized, start, step)
    values = matrix[:, 0]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for column in range(1, matrix.shape[1]):
            values = np.power(values, matrix[:, column])
    return [fresh(f"powSeries({','.join(s.name for s in series_list)})", start, step, real_or_null(values),
                  series_list)]


def weighted_average(context: Context, seriesListAvg: list[Series], seriesListWeight: list[Series],
                     nodes: list[int | str]) -> list[Series]:
    """The average of the first list's series weighted by the second's, matched by the path
    elements (or tags) `nodes`: sum(value x weight) / sum(weights) at each point, one series named
    `weightedAverage(<averages>, <weights>, <nodes>)`. The lists must be as long."""
    if len(seriesListAvg) != len(seriesListWeight):
        raise TargetError(f"weightedAverage: {len(seriesListAvg)} series to average and {len(seriesListWeight)} "
                          f"weights; they must be as many")
    pairs: dict[str, dict[str, Series]] = {}
    for average, weight in zip(seriesListAvg, seriesListWeight):
        pairs.setdefault(".".join(node_of(average, n) for n in nodes), {})["average"] = average
        pairs.setdefault(".".join(node_of(weight, n) for n in nodes), {})["weight"] = weight
    products = []
    for pair in pairs.values():
        if len(pair) == 2:
            average, weight = pair["average"], pair["weight"]
            values = _by_position(average.values, weight.values, np.multiply)  # as graphite-web zips them
            products.append(fresh(f"product({weight.name},{average.name})", average.start, average.step, values,
                                  (average, weight)))
    if not products:
        return []
    [total] = _aggregate(context, [products], "sum")
    [weights] = _aggregate(context, [seriesListWeight], "sum")
    with np.errstate(invalid="ignore", divide="ignore"):
        values = _by_position(total.values, np.where(weights.values == 0, np.nan, weights.values), np.divide)

    def expressions(series_list: list[Series]) -> str:
        return ",".join(sorted({s.path_expression for s in series_list}))
    nodes_text = ",".join(map(str, nodes))
    name = f"weightedAverage({expressions(seriesListAvg)}, {expressions(seriesListWeight)}, {nodes_text})"
    return [fresh(name, total.start, total.step, values, [*seriesListAvg, *seriesListWeight])]


def _by_position(a: np.ndarray, b: np.ndarray, op) -> np.ndarray:
    """op of two arrays point by point from their first, the shorter padded with nulls."""
    length = max(len(a), len(b))
    padded = [np.concatenate((x, np.full(length - len(x), np.nan))) for x in (a, b)]
    return op(*padded)


def divide_series(context: Context, dividendSeriesList: list[Series], divisorSeries: list[Series]) -> list[Series]:
    """Each series divided point by point by the one divisor series, named `divideSeries(<a>,<b>)`;
    null where either is null or the divisor is 0. No divisor: every point null,
    `divideSeries(<a>,MISSING)`."""
    if not divisorSeries:
        return [named(s, f"divideSeries({s.name},MISSING)", values=np.full(len(s.values), np.nan))
                for s in dividendSeriesList]
    if len(divisorSeries) > 1:
        raise TargetError(f"divideSeries: the divisor must be exactly one series, not {len(divisorSeries)}")
    divisor = divisorSeries[0]
    results = []
    for dividend in dividendSeriesList:
        pair, start, step = normalize([dividend, divisor])
        matrix = points_matrix(pair, start, step)
        with np.errstate(invalid="ignore", divide="ignore"):
            values = np.where(matrix[:, 1] != 0, matrix[:, 0] / matrix[:, 1], np.nan)
        results.append(fresh(f"divideSeries({dividend.name},{divisor.name})", start, step, values, pair))
    return results


SERIES_FUNCTION_CALLBACKS = {"avg": "average"}
"""Callbacks graphite-web's groupByNode(s) finds among its series functions before its
aggregations: there `avg` is averageSeries, tagged `aggregatedBy: average` (not `avg`)."""


def group_by_nodes(context: Context, seriesList: list[Series], callback: str, nodes: list[int | str]
                   ) -> list[Series]:
    """The series grouped by some elements of their paths (or tags), each group combined by
    `callback` (an aggregation, or sumSeries & co) into one series named by those elements joined
    by dots: `groupByNodes(prog.per_minute.*.bytes, "sum", 2)` is one series per host."""
    groups: dict[str, list[Series]] = {}
    for s in seriesList:
        groups.setdefault(".".join(node_of(s, node) for node in nodes), []).append(s)
    callback = SERIES_FUNCTION_CALLBACKS.get(callback, callback)
    return [s.copy(name=key) for key, members in groups.items() for s in aggregate(context, members, callback)]



def group_by_tags(context: Context, seriesList: list[Series], callback: str, tags: list[str]) -> list[Series]:
    """The series grouped by the values of some tags (ramen's are `name` and a function's
    factors: `groupByTags(seriesByTag('name=~demo.per_minute.*'), 'sum', 'host')`), each group
    combined by `callback` into one series, named and tagged in Graphite's tagged form: the shared
    `name` (else the callback's name), then the tags (`sum;host=h1`)."""
    if not tags:
        raise TargetError("groupByTags: no tags to group by")
    names = {s.tags.get(NAME_TAG, s.name) for s in seriesList}
    name = names.pop() if len(names) == 1 else callback
    groups: dict[str, list[Series]] = {}
    for s in seriesList:
        head = s.tags.get(NAME_TAG, s.name) if NAME_TAG in tags else name
        key = ";".join([head, *sorted(f"{tag}={s.tags.get(tag, '')}" for tag in tags if tag != NAME_TAG)])
        groups.setdefault(key, []).append(s)
    return [s.copy(name=key, path_expression=key, tags=parse_tagged(key))
            for key, members in groups.items() for s in aggregate(context, members, callback)]


def group_by_node(context: Context, seriesList: list[Series], nodeNum: int | str, callback: str = "average"
                  ) -> list[Series]:
    """groupByNodes with one element: `groupByNode(prog.per_minute.*.bytes, 2, "sum")`."""
    return group_by_nodes(context, seriesList, callback, [nodeNum])


def aggregate(context: Context, seriesList: list[Series], func: str, xFilesFactor: float | None = None
              ) -> list[Series]:
    """Combines the series into one by an aggregation function (sum, average, max, ...), named
    `<func>Series(<path expressions>)`; `aggregate(x, "sum")` is `sumSeries(x)`."""
    func = func[:-len("Series")] if func.endswith("Series") else func
    return _aggregate(context, [seriesList], func, xFilesFactor)


def group(context: Context, seriesLists: list[list[Series]]) -> list[Series]:
    """All the series of all the arguments as one list, to give several to a one-list function."""
    return [s for sublist in seriesLists for s in sublist]


def map_series(context: Context, seriesList: list[Series], mapNodes: list[int | str]) -> SeriesLists:
    """The series in groups of the same path elements (or tags) `mapNodes`, in the order the groups
    are first met: lists for reduceSeries (`mapSeries(servers.*.disk.*, 1)`: one per server)."""
    groups: dict[str, list[Series]] = {}
    for s in seriesList:
        groups.setdefault(".".join(node_of(s, node) for node in mapNodes), []).append(s)
    return SeriesLists(groups.values())


def reduce_series(context: Context, seriesLists: SeriesLists, reduceFunction: str, reduceNode: int,
                  reduceMatchers: list[str], *, evaluator: Evaluator) -> list[Series]:
    """Each of mapSeries' groups reduced to one series by the function `reduceFunction`: the group's
    series whose path element `reduceNode` is one of `reduceMatchers` are its arguments, one list
    each, in the matchers' order (`reduceSeries(mapSeries(servers.*.disk.*, 1), "asPercent", 3,
    "bytes_used", "total_bytes")`: each server's disk use in percent). Each result is named by the
    path before that element, then `reduce.<function>` (`servers.server1.disk.reduce.asPercent`).
    A group missing one of the matchers yields nothing (graphite-web fails on it)."""
    groups: dict[str, list[Series | None]] = {}
    for series_list in seriesLists:
        for s in series_list:
            nodes = s.name.split(".")
            if not -len(nodes) <= reduceNode < len(nodes) or nodes[reduceNode] not in reduceMatchers:
                continue
            key = ".".join(nodes[:reduceNode]) + ".reduce." + reduceFunction
            groups.setdefault(key, [None] * len(reduceMatchers))[reduceMatchers.index(nodes[reduceNode])] = s
    reduced = []
    for key, members in groups.items():
        if any(s is None for s in members):
            continue
        result = evaluator.apply(reduceFunction, [[s] for s in members])
        if result:
            reduced.append(result[0].copy(name=key))
    return reduced


def apply_by_node(context: Context, seriesList: list[Series], nodeNum: int, templateFunction: str,
                  newName: str | None = None, *, evaluator: Evaluator) -> list[Series]:
    """For each prefix of the series' paths up to element `nodeNum`, the target `templateFunction`
    with each `%` replaced by the prefix, named `newName` with the same replacement if given
    (`applyByNode(servers.*.disk.free, 1, "divideSeries(%.disk.free, sumSeries(%.disk.*))",
    "%.disk.share_free")`: each server's share of free disk)."""
    prefixes = sorted({".".join(s.name.split(".")[:nodeNum + 1]) for s in seriesList})
    made = evaluator.targets([templateFunction.replace("%", prefix) for prefix in prefixes])
    return [s.copy(name=newName.replace("%", prefix) if newName else s.name, path_expression=prefix)
            for prefix, found in zip(prefixes, made) for s in found]


def _percent(values: np.ndarray, totals: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals == 0, np.nan, values / totals * 100.0)


def as_percent(context: Context, seriesList: list[Series], total: object = None,
               nodes: list[int | str] | None = None) -> list[Series]:
    """Each series as a percentage of a total: the sum of all the series (no total), a number, one
    series, or as many series as there are (matched by sorted name). A null or zero total gives null.
    Named `asPercent(<name>,<total>)`. With nodes (path elements or tag names, as aliasByNode), each
    series is matched with the total(s) of the same key, or the sum of its own group when total is
    None; a series or total without a match gives an all-null `asPercent(<name>,MISSING)` or
    `asPercent(MISSING,<total>)`."""
    if nodes:
        return _as_percent_by_nodes(context, seriesList, total, nodes)
    if not seriesList:
        return []
    if isinstance(total, list) and len(total) == len(seriesList) and len(total) > 1:
        results = []
        for part, whole in zip(sorted(seriesList, key=lambda s: s.name), sorted(total, key=lambda s: s.name)):
            pair, start, step = normalize([part, whole])
            matrix = points_matrix(pair, start, step)
            results.append(fresh(f"asPercent({part.name},{whole.name})", start, step,
                                  _percent(matrix[:, 0], matrix[:, 1]), (part, whole)))
        return results
    if isinstance(total, list) and len(total) != 1:
        raise TargetError(f"asPercent: total must be a number, one series or {len(seriesList)} series "
                          f"(as many as the first argument), not {len(total)}")
    if isinstance(total, list):
        normalized, start, step = normalize([*seriesList, total[0]])
        matrix = points_matrix(normalized, start, step)
        totals, total_text = matrix[:, -1], total[0].name
        matrix = matrix[:, :-1]
    else:
        normalized, start, step = normalize(seriesList)
        matrix = points_matrix(normalized, start, step)
        if total is None:
            totals = aggregate_rows("sum", matrix)
            total_text = f"sumSeries({path_expressions(seriesList)})"
        elif isinstance(total, (int, float)) and not isinstance(total, bool):
            totals = np.full(len(matrix), float(total))
            total_text = str(total)
        else:
            raise TargetError(f"asPercent: total must be a number, a series list or None, not {total!r}")
    return [fresh(f"asPercent({s.name},{total_text})", start, step, _percent(matrix[:, column], totals), (s,))
            for column, s in enumerate(seriesList)]


def _as_percent_by_nodes(context: Context, seriesList: list[Series], total: object,
                         nodes: list[int | str]) -> list[Series]:
    if total is not None and not isinstance(total, list):
        raise TargetError(f"asPercent: with nodes, total must be None or a series list, not {total!r}")

    def key(s: Series) -> str:
        return ".".join(node_of(s, node) for node in nodes)

    def summed(group_list: list[Series]) -> Series:
        if len(group_list) == 1:
            return group_list[0]
        normalized, start, step = normalize(group_list)
        return fresh(f"sumSeries({path_expressions(group_list)})", start, step,
                      aggregate_rows("sum", points_matrix(normalized, start, step)), group_list)

    groups: dict[str, list[Series]] = {}
    for s in seriesList:
        groups.setdefault(key(s), []).append(s)
    keys = list(groups)
    totals_by_key: dict[str, list[Series]] = {}
    for s in (total if total is not None else []):
        totals_by_key.setdefault(key(s), []).append(s)
        if key(s) not in keys:
            keys.append(key(s))
    totals = {k: summed(found) for k, found in (groups if total is None else totals_by_key).items()}
    results = []
    for k in keys:
        if k not in groups:
            whole = totals[k]
            results.append(fresh(f"asPercent(MISSING,{whole.name})", whole.start, whole.step,
                                  np.full(len(whole.values), np.nan), (whole,)))
            continue
        for part in groups[k]:
            if k not in totals:
                results.append(fresh(f"asPercent({part.name},MISSING)", part.start, part.step,
                                      np.full(len(part.values), np.nan), (part,)))
                continue
            whole = totals[k]
            pair, start, step = normalize([part, whole])
            matrix = points_matrix(pair, start, step)
            results.append(fresh(f"asPercent({part.name},{whole.name})", start, step,
                                  _percent(matrix[:, 0], matrix[:, 1]), (part, whole)))
    return results

"""Graphite's target functions over ramen's series: `evaluate` walks a parsed target, and
`FUNCTIONS` lists what it knows, described as graphite-web's `/functions` answers so Grafana's
function editor offers them.

Semantics and the names of results follow graphite-web's render/functions.py (Grafana users read
those names in legends and alias them by node), computed over whole numpy arrays with NaN as
Graphite's null: a reduction over nothing but nulls is null, never 0. Where graphite-web has a bug
we keep its names but not the bug; each such place says so.

The caller resolves globs and fetches: `evaluate` gets, for each path expression of the target
and the shift of its range (`fetches`: timeShift moves it), the series it matched. Nothing here
reads data past the range it is given.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import reduce

import numpy as np

from ramen.httpd.series import DEFAULT_XFILES_FACTOR, Series
from ramen.httpd.target import Call, Literal, Node, PathExpr, TargetError, parse
from ramen.times import MAX_TIME_US, OFFSET_UNITS

__all__ = ["AGGREGATIONS", "Context", "FUNCTIONS", "FunctionSpec", "Param", "aggregate_rows", "describe_functions",
           "evaluate", "fetches", "parse_interval_s", "TargetError"]

MODULE_NAME = "ramen.httpd.functions"
"""What `/functions` says each function's module is (graphite-web: graphite.render.functions)."""
MICROS_PER_SECOND = 1_000_000
INTERVAL_SUGGESTIONS = ["10min", "1h", "1d"]
WINDOW_SUGGESTIONS = [5, 7, 10, "1min", "5min", "10min", "30min", "1hour"]

AGGREGATIONS = ("average", "avg_zero", "median", "sum", "min", "max", "diff", "stddev", "count", "range",
                "multiply", "last")
"""graphite-web's aggregation functions (aggFuncs), for sumSeries & co, summarize and highest."""
AGGREGATION_ALIASES = {"rangeOf": "range", "avg": "average", "total": "sum", "current": "last"}
CONSOLIDATION_ONLY = ("first",)
"""Consolidation (maxDataPoints, lcm steps) knows `first` besides the aggregations."""


@dataclass(frozen=True)
class Context:
    """What a render asks for, as the functions need it."""
    from_s: int
    until_s: int
    now_s: int
    xfiles_factor: float = DEFAULT_XFILES_FACTOR
    """The render's `xFilesFactor`: what the series it fetches start with (Series.xfiles_factor)."""
    shift_s: int = 0
    """Seconds the range is moved by, inside timeShift: from_s and until_s are already moved, and a
    path's series are those fetched over the moved range."""

    def shifted(self, seconds: int) -> Context:
        return dataclasses.replace(self, from_s=self.from_s + seconds, until_s=self.until_s + seconds,
                                   shift_s=self.shift_s + seconds)


# Reductions over rows, NaN as null


def aggregate_rows(func: str, matrix: np.ndarray, *, real: np.ndarray | None = None,
                   denominator: float | np.ndarray | None = None,
                   xfiles_factor: float = DEFAULT_XFILES_FACTOR) -> np.ndarray:
    """Reduce each row of `matrix` by graphite's aggregation `func`, nulls skipped.

    `real` marks the cells that exist (False for padding of ragged rows: it counts for neither
    avg_zero's denominator nor multiply); a row's result is null unless it holds a non-null
    value and non-null/denominator >= xfiles_factor (denominator: the row's real cells unless given,
    as graphite-web counts a window's or a band's nominal size).
    """
    func = AGGREGATION_ALIASES.get(func, func)
    matrix = np.asarray(matrix, dtype=np.float64)
    rows = matrix.shape[0]
    if real is None:
        real = np.ones(matrix.shape, dtype=bool)
    present = ~np.isnan(matrix) & real
    count = present.sum(axis=1)
    if denominator is None:
        denominator = real.sum(axis=1)
    result = np.full(rows, np.nan)
    ok = count > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        ok &= (count / denominator) >= xfiles_factor
    if matrix.shape[1] == 0 or not ok.any():
        return result
    values = np.where(present, matrix, np.nan)
    zeroed = np.where(present, matrix, 0.0)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # all-null rows: masked by `ok` below
        if func == "sum":
            reduced = zeroed.sum(axis=1)
        elif func == "average":
            reduced = zeroed.sum(axis=1) / count
        elif func == "avg_zero":
            reduced = zeroed.sum(axis=1) / real.sum(axis=1)
        elif func == "median":
            reduced = np.nanmedian(values, axis=1)
        elif func == "min":
            reduced = np.nanmin(values, axis=1)
        elif func == "max":
            reduced = np.nanmax(values, axis=1)
        elif func == "range":
            reduced = np.nanmax(values, axis=1) - np.nanmin(values, axis=1)
        elif func == "stddev":
            reduced = np.nanstd(values, axis=1)
        elif func == "count":
            reduced = count.astype(np.float64)
        elif func == "diff":  # the first non-null minus all the others
            reduced = 2 * _first_present(values, present) - zeroed.sum(axis=1)
        elif func == "multiply":  # a null factor makes the product null
            reduced = np.where((real & ~present).any(axis=1), np.nan, np.where(real, matrix, 1.0).prod(axis=1))
        elif func == "last":
            reduced = _first_present(values[:, ::-1], present[:, ::-1])
        elif func == "first":
            reduced = _first_present(values, present)
        else:
            raise TargetError(f"unknown aggregation function {func!r} (known: {', '.join(_aggregation_names())})")
    result[ok] = reduced[ok]
    return result


def _first_present(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    index = present.argmax(axis=1)
    return values[np.arange(values.shape[0]), index]


def _aggregation_names() -> list[str]:
    return [*AGGREGATIONS, *AGGREGATION_ALIASES]


def consolidate_values(values: np.ndarray, values_per_point: int, func: str,
                       xfiles_factor: float = DEFAULT_XFILES_FACTOR) -> np.ndarray:
    """graphite-web's consolidation: each run of `values_per_point` values from the first becomes
    one by `func` (a last, shorter run too, judged against the full run's size as graphite-web does)."""
    if values_per_point <= 1:
        return np.array(values, dtype=np.float64)
    n = len(values)
    points = -(-n // values_per_point)
    padded = np.full(points * values_per_point, np.nan)
    padded[:n] = values
    real = np.zeros(points * values_per_point, dtype=bool)
    real[:n] = True
    shape = (points, values_per_point)
    return aggregate_rows(func, padded.reshape(shape), real=real.reshape(shape), denominator=values_per_point,
                          xfiles_factor=xfiles_factor)


def consolidated(series: Series, values_per_point: int) -> Series:
    """`series` with `values_per_point` values per point, by its own consolidation function and
    xFilesFactor."""
    if values_per_point <= 1:
        return series
    return series.copy(step=series.step * values_per_point,
                       values=consolidate_values(series.values, values_per_point, series.consolidate,
                                                 series.xfiles_factor))


# Intervals


_INTERVAL_PART = re.compile(r"(\d+)([A-Za-z]+)")


def parse_interval_s(text: str) -> int:
    """Seconds in a Graphite interval (`1h`, `30min`, `1d12h`, `-5min`), graphite-web's units by prefix
    (s, min, h, d, w, mon = 30 d, y = 365 d); `m` alone is minutes, as everywhere in ramen."""
    if not isinstance(text, str) or not text:
        raise TargetError(f"bad interval {text!r}: expected a number and a unit, e.g. \"1h\" or \"5min\"")
    sign, body = (-1, text[1:]) if text[0] == "-" else (1, text[1:] if text[0] == "+" else text)
    total_us, pos = 0, 0
    while pos < len(body):
        part = _INTERVAL_PART.match(body, pos)
        if part is None:
            raise TargetError(f"bad interval {text!r}: expected a number and a unit, e.g. \"1h\" or \"5min\"")
        total_us += int(part.group(1)) * _unit_us(part.group(2), text)
        pos = part.end()
    if pos == 0:
        raise TargetError(f"bad interval {text!r}: expected a number and a unit, e.g. \"1h\" or \"5min\"")
    if total_us > MAX_TIME_US:  # longer than any range a render may have: numpy's int64 would overflow
        raise TargetError(f"bad interval {text!r}: longer than any time range (1970 to 9999)")
    return sign * total_us // MICROS_PER_SECOND


def _unit_us(spelled: str, text: str) -> int:
    if spelled == "m":
        return 60 * MICROS_PER_SECOND
    for prefix, micros in OFFSET_UNITS:
        if spelled.lower().startswith(prefix):
            return micros
    raise TargetError(f"bad interval {text!r}: no unit {spelled!r} (s, min, h, d, w, mon, y)")


# Combining series of different steps


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


def normalize(series_list: Sequence[Series]) -> tuple[list[Series], int, int]:
    """The series at their lowest common step (each consolidated by its own function and
    xFilesFactor, as graphite-web does), the start of the earliest, and that step.

    graphite-web then zips the series by position; we place each by its start instead (the same
    when starts agree, which fetches of one range ensure, and right when they do not).
    """
    step = reduce(_lcm, (s.step for s in series_list))
    start = min(s.start for s in series_list)
    return [consolidated(s, step // s.step) for s in series_list], start, step


def _matrix(series_list: Sequence[Series], start: int, step: int) -> np.ndarray:
    """Points × series, NaN where a series has no point (graphite-web's zip_longest padding)."""
    offsets = [(s.start - start) // step for s in series_list]
    length = max((offset + len(s.values) for offset, s in zip(offsets, series_list)), default=0)
    matrix = np.full((length, len(series_list)), np.nan)
    for column, (offset, s) in enumerate(zip(offsets, series_list)):
        matrix[offset:offset + len(s.values), column] = s.values
    return matrix


def _path_expressions(series_list: Sequence[Series]) -> str:
    """The distinct path expressions of `series_list`, comma-joined: how aggregates are named."""
    return ",".join(dict.fromkeys(s.path_expression for s in series_list))


def _named(series: Series, name: str, **changes) -> Series:
    """A copy renamed as a function's result; graphite-web makes the name its path expression too."""
    return series.copy(name=name, path_expression=name, **changes)


def _tagged(series: Series, **tags: object) -> dict[str, str]:
    """The series' tags plus `tags`, values as strings (graphite-web's Tags stores str())."""
    return {**series.tags, **{key: str(value) for key, value in tags.items()}}


def _fresh(name: str, start: int, step: int, values: np.ndarray, of: Sequence[Series] = ()) -> Series:
    """A series a function made from several (`of`; its tags only its name, as graphite-web's new
    TimeSeries), as strict about nulls as they are."""
    return Series(name=name, start=start, step=step, values=values, path_expression=name, tags={"name": name},
                  xfiles_factor=_xfiles_factor(of) if of else DEFAULT_XFILES_FACTOR)


# The functions. Each takes the context and its bound parameters, and returns a new list.


def _xfiles_factor(series_list: Sequence[Series]) -> float:
    """What a reduction across series needs of their values at a point: the strictest of theirs (the
    render's, or what setXFilesFactor set on them; graphite-web's request-wide value, there set by
    whichever setXFilesFactor ran last, even in another target)."""
    return max(s.xfiles_factor for s in series_list)


def _aggregate(context: Context, series_lists: list[list[Series]], func: str, xfiles_factor: float | None = None
               ) -> list[Series]:
    series_list = [s for sublist in series_lists for s in sublist]
    if not series_list:
        return []
    xff = _xfiles_factor(series_list) if xfiles_factor is None else xfiles_factor
    normalized, start, step = normalize(series_list)
    name = f"{func}Series({_path_expressions(series_list)})"
    values = aggregate_rows(func, _matrix(normalized, start, step), xfiles_factor=xff)
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
    length = _matrix(normalized, start, step).shape[0]
    return [_fresh(f"countSeries({_path_expressions(series_list)})", start, step,
                   np.full(length, float(len(series_list))), series_list)]


def percentile_of_series(context: Context, seriesList: list[Series], n: float, interpolate: bool = False
                         ) -> list[Series]:
    """The `n`th percentile of the series' values at each point, as one series named
    `percentileOfSeries(<path expression>,<n>)`: the value at that rank among the non-null ones,
    or with `interpolate` between the two around it."""
    _check_percent("percentileOfSeries", n)
    if not seriesList:
        return []
    normalized, start, step = normalize(seriesList)
    values = _percentiles(_matrix(normalized, start, step), n, interpolate)
    return [_fresh(f"percentileOfSeries({seriesList[0].path_expression},{n:g})", start, step, values, seriesList)]


def _check_percent(name: str, n: float) -> None:
    if not 0 < n <= 100:
        raise TargetError(f"{name}: the percentile must be within (0, 100], not {n:g}")


def _percentiles(matrix: np.ndarray, n: float, interpolate: bool) -> np.ndarray:
    """graphite-web's percentile of each row's non-null values: the value of rank n% of (count + 1),
    rounded up, or interpolated to the next one; null where a row has none."""
    rows, width = matrix.shape
    if width == 0:
        return np.full(rows, np.nan)
    ordered = np.sort(matrix, axis=1)  # nulls last
    count = np.count_nonzero(~np.isnan(matrix), axis=1)
    fractional = n / 100.0 * (count + 1)
    rank = fractional.astype(np.int64)
    fraction = fractional - rank
    if not interpolate:
        rank = rank + np.ceil(fraction).astype(np.int64)
    index = np.where(rank == 0, 0, np.where(rank - 1 >= count, count - 1, rank - 1))
    every = np.arange(rows)
    result = ordered[every, np.clip(index, 0, width - 1)]
    if interpolate:
        following = ordered[every, np.clip(rank, 0, width - 1)]
        result = np.where((rank > 0) & (rank < count), result + fraction * (following - result), result)
    return np.where(count > 0, result, np.nan)


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


def _with_wildcards(func: str) -> Callable[..., list[Series]]:
    def combined(context: Context, seriesList: list[Series], position: list[int]) -> list[Series]:
        return aggregate_with_wildcards(context, seriesList, func, position)
    combined.__doc__ = (f"aggregateWithWildcards by {func}: the series grouped by their paths without the "
                        f"elements at `position`s, each group's {func} named by what is left.")
    return combined


def divide_series(context: Context, dividendSeriesList: list[Series], divisorSeries: list[Series]) -> list[Series]:
    """Each series divided point by point by the one divisor series, named `divideSeries(<a>,<b>)`;
    null where either is null or the divisor is 0. No divisor: every point null,
    `divideSeries(<a>,MISSING)`."""
    if not divisorSeries:
        return [_named(s, f"divideSeries({s.name},MISSING)", values=np.full(len(s.values), np.nan))
                for s in dividendSeriesList]
    if len(divisorSeries) > 1:
        raise TargetError(f"divideSeries: the divisor must be exactly one series, not {len(divisorSeries)}")
    divisor = divisorSeries[0]
    results = []
    for dividend in dividendSeriesList:
        pair, start, step = normalize([dividend, divisor])
        matrix = _matrix(pair, start, step)
        with np.errstate(invalid="ignore", divide="ignore"):
            values = np.where(matrix[:, 1] != 0, matrix[:, 0] / matrix[:, 1], np.nan)
        results.append(_fresh(f"divideSeries({dividend.name},{divisor.name})", start, step, values, pair))
    return results


def group_by_nodes(context: Context, seriesList: list[Series], callback: str, nodes: list[int | str]
                   ) -> list[Series]:
    """The series grouped by some elements of their paths (or tags), each group combined by
    `callback` (an aggregation, or sumSeries & co) into one series named by those elements joined
    by dots: `groupByNodes(prog.per_minute.*.bytes, "sum", 2)` is one series per host."""
    groups: dict[str, list[Series]] = {}
    for s in seriesList:
        groups.setdefault(".".join(_node(s, node) for node in nodes), []).append(s)
    return [s.copy(name=key) for key, members in groups.items() for s in aggregate(context, members, callback)]


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


def alias(context: Context, seriesList: list[Series], newName: str) -> list[Series]:
    """Names every series `newName` in the legend."""
    return [s.copy(name=newName) for s in seriesList]


def _node(series: Series, node: int | str) -> str:
    """Element `node` of the series' metric path (or, for a function's result, of the first path in
    its name), or the value of tag `node` when it is a name or out of range ('' if absent)."""
    name = series.name
    if name.endswith(")"):
        name = _first_path(name) or name
    if isinstance(node, int):
        try:
            return name.split(";", 1)[0].split(".")[node]
        except IndexError:
            pass
    return series.tags.get(str(node), "")


def _first_path(name: str) -> str | None:
    """The first metric path in a function's result name (`sumSeries(a.b,c.d)` -> `a.b`)."""
    try:
        node = parse(name, _AnyName())
    except TargetError:
        return None
    while isinstance(node, Call) and node.args:
        node = node.args[0]
    return node.text if isinstance(node, PathExpr) else None


class _AnyName:
    """A function table that knows every name: result names are parsed only to find their paths."""

    def __contains__(self, name: object) -> bool:
        return True


def alias_by_node(context: Context, seriesList: list[Series], nodes: list[int | str]) -> list[Series]:
    """Names each series by some elements of its path, joined by dots: `aliasByNode(prog.*.x, 1)`
    names each series by its function. Elements count from 0 (negative from the end); a name
    instead of a number takes that tag's value."""
    return [s.copy(name=".".join(_node(s, node) for node in nodes)) for s in seriesList]


def alias_sub(context: Context, seriesList: list[Series], search: str, replace: str) -> list[Series]:
    """Names each series by a regular expression's substitution in its name (`\\1` for a group)."""
    try:
        pattern = re.compile(search)
        return [s.copy(name=pattern.sub(replace, s.name)) for s in seriesList]
    except (re.error, IndexError) as e:
        raise TargetError(f"aliasSub: {e}") from None


def alias_by_metric(context: Context, seriesList: list[Series]) -> list[Series]:
    """Names each series by the last element of its path (the field, in ramen), also inside a
    function's result name."""
    renamed = []
    for s in seriesList:
        inner = s.name[s.name.rfind("(") + 1:]
        closing = inner.find(")")
        inner = inner if closing < 0 else inner[:closing]
        renamed.append(s.copy(name=re.sub(",.*$", "", inner.split(".")[-1])))
    return renamed


def scale(context: Context, seriesList: list[Series], factor: float) -> list[Series]:
    """Multiplies every value by `factor`; nulls stay null."""
    return [_named(s, f"scale({s.name},{factor:g})", values=s.values * factor, tags=_tagged(s, scale=factor))
            for s in seriesList]


def offset(context: Context, seriesList: list[Series], factor: float) -> list[Series]:
    """Adds `factor` to every value; nulls stay null."""
    return [_named(s, f"offset({s.name},{factor:g})", values=s.values + factor, tags=_tagged(s, offset=factor))
            for s in seriesList]


def summarize(context: Context, seriesList: list[Series], intervalString: str, func: str = "sum",
              alignToFrom: bool = False) -> list[Series]:
    """Reduces each series to one point per interval (`"1h"`, `"10min"`) by `func` (sum by default;
    average, max, min, last, ...). Buckets start at multiples of the interval since the epoch, or at
    the series' start with alignToFrom=true. Named `summarize(<name>, "<interval>", "<func>")`.
    As in graphite-web, when the series ends on a bucket boundary the last bucket is an empty one."""
    interval = parse_interval_s(intervalString)
    if interval <= 0:
        raise TargetError(f"summarize: interval {intervalString!r} must be longer than 0 s")
    func_known = AGGREGATION_ALIASES.get(func, func)
    if func_known not in AGGREGATIONS:
        raise TargetError(f"summarize: unknown function {func!r} (known: {', '.join(_aggregation_names())})")
    results = []
    for s in seriesList:
        if alignToFrom:
            new_start = s.start
            buckets = -(-(s.end - s.start) // interval)
        else:
            new_start = s.start - s.start % interval
            buckets = (s.end - s.end % interval + interval - new_start) // interval
        bucket_of = (s.timestamps() - new_start) // interval
        counts = np.bincount(bucket_of, minlength=buckets)[:buckets]
        width = int(counts.max(initial=0))
        matrix = np.full((buckets, max(width, 1)), np.nan)
        real = np.zeros(matrix.shape, dtype=bool)
        first_of = np.concatenate(([0], np.cumsum(counts)[:-1]))
        position = np.arange(len(s.values)) - first_of[bucket_of]
        matrix[bucket_of, position] = s.values
        real[bucket_of, position] = True
        values = aggregate_rows(func, matrix, real=real, denominator=interval / s.step,
                                xfiles_factor=s.xfiles_factor)
        name = f'summarize({s.name}, "{intervalString}", "{func}"{", true" if alignToFrom else ""})'
        results.append(_named(s, name, start=new_start, step=interval, values=values,
                              tags=_tagged(s, summarize=intervalString, summarizeFunction=func)))
    return results


def consolidate_by(context: Context, seriesList: list[Series], consolidationFunc: str) -> list[Series]:
    """Sets how a series is consolidated when it has more points than the chart has room for
    (maxDataPoints) or is combined with a coarser series: average (the default), sum, min, max,
    first, last."""
    return [_named(s, f'consolidateBy({s.name},"{consolidationFunc}")', consolidate=consolidationFunc,
                   tags=_tagged(s, consolidateBy=consolidationFunc)) for s in seriesList]


def set_xfiles_factor(context: Context, seriesList: list[Series], xFilesFactor: float) -> list[Series]:
    """Sets the share (0 to 1) of a run of values that must not be null for its reduction to be: when
    the series is consolidated (maxDataPoints, a coarser series beside it), summarised, averaged over
    a moving window, or combined with others (sumSeries & co take the strictest of their series').
    0, the default: one value is enough; 1: all of them. Short form: xFilesFactor."""
    if not 0 <= xFilesFactor <= 1:
        raise TargetError(f"setXFilesFactor: xFilesFactor must be within 0..1, not {xFilesFactor:g}")
    return [s.copy(xfiles_factor=xFilesFactor, tags=_tagged(s, xFilesFactor=xFilesFactor)) for s in seriesList]


def transform_null(context: Context, seriesList: list[Series], default: float = 0,
                   referenceSeries: list[Series] | None = None) -> list[Series]:
    """Nulls become `default` (0); with reference series, only at the points where one of them
    has a value."""
    results = []
    for s in seriesList:
        fill = np.isnan(s.values)
        if referenceSeries:
            present = np.zeros(len(s.values), dtype=bool)
            for reference in referenceSeries:  # by position, as graphite-web zips them
                length = min(len(reference.values), len(present))
                present[:length] |= ~np.isnan(reference.values[:length])
            fill &= present
        text = f"transformNull({s.name},{default:g}{',referenceSeries' if referenceSeries else ''})"
        tags = _tagged(s, transformNull=default, **({"referenceSeries": 1} if referenceSeries else {}))
        results.append(_named(s, text, values=np.where(fill, float(default), s.values), tags=tags))
    return results


def absolute(context: Context, seriesList: list[Series]) -> list[Series]:
    """Each value's absolute value."""
    return [_named(s, f"absolute({s.name})", values=np.abs(s.values), tags=_tagged(s, absolute=1))
            for s in seriesList]


def derivative(context: Context, seriesList: list[Series]) -> list[Series]:
    """Each value less the one before it (null after a null); see nonNegativeDerivative and
    perSecond for counters."""
    return [_named(s, f"derivative({s.name})", values=np.concatenate(([np.nan], np.diff(s.values)))[:len(s.values)],
                   tags=_tagged(s, derivative=1)) for s in seriesList]


def integral(context: Context, seriesList: list[Series]) -> list[Series]:
    """The running sum of the values from `from` on; a null stays null (and adds nothing)."""
    results = []
    for s in seriesList:
        present = ~np.isnan(s.values)
        values = np.where(present, np.cumsum(np.where(present, s.values, 0.0)), np.nan)
        results.append(_named(s, f"integral({s.name})", values=values, tags=_tagged(s, integral=1)))
    return results


def _power(seriesList: list[Series], exponent: float, name: str, **tags: object) -> list[Series]:
    """Each value to `exponent`; null where that is not a real number (a negative's root, 1/0)."""
    results = []
    for s in seriesList:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            values = np.power(s.values, exponent)
        results.append(_named(s, name.format(s.name), values=np.where(np.isfinite(values), values, np.nan),
                              tags=_tagged(s, **tags)))
    return results


def square_root(context: Context, seriesList: list[Series]) -> list[Series]:
    """Each value's square root; null for a negative one."""
    return _power(seriesList, 0.5, "squareRoot({})", squareRoot=1)


def power(context: Context, seriesList: list[Series], factor: float) -> list[Series]:
    """Each value to the power `factor`; null where that is no real number."""
    return _power(seriesList, factor, f"pow({{}},{factor:g})", pow=factor)


def invert(context: Context, seriesList: list[Series]) -> list[Series]:
    """1 divided by each value; null for 0."""
    return _power(seriesList, -1.0, "invert({})", invert=1)


def logarithm(context: Context, seriesList: list[Series], base: int = 10) -> list[Series]:
    """Each value's logarithm in `base` (10); null for a value of 0 or less."""
    if base <= 0 or base == 1:
        raise TargetError(f"log: the base must be above 0 and not 1, not {base}")
    results = []
    for s in seriesList:
        with np.errstate(invalid="ignore", divide="ignore"):
            values = np.where(s.values > 0, np.log(s.values) / math.log(base), np.nan)
        results.append(_named(s, f"log({s.name}, {base})", values=values, tags=_tagged(s, log=base)))
    return results


def delay(context: Context, seriesList: list[Series], steps: int) -> list[Series]:
    """Each value moved `steps` points later (earlier if negative), nulls where nothing moved in:
    unlike timeShift, no other range is fetched."""
    results = []
    for s in seriesList:
        values = np.full(len(s.values), np.nan)
        if steps >= 0:
            values[steps:] = s.values[:len(s.values) - steps] if steps < len(s.values) else []
        else:
            values[:steps] = s.values[-steps:] if -steps < len(s.values) else []
        results.append(_named(s, f"delay({s.name},{steps})", values=values, tags=_tagged(s, delay=steps)))
    return results


def offset_to_zero(context: Context, seriesList: list[Series]) -> list[Series]:
    """Each series less its smallest value, so that its lowest point is 0."""
    results = []
    for s in seriesList:
        present = s.values[~np.isnan(s.values)]
        minimum = float(present.min()) if len(present) else None
        values = s.values - minimum if minimum is not None else s.values
        results.append(_named(s, f"offsetToZero({s.name})", values=values,
                              tags=_tagged(s, offsetToZero=minimum)))
    return results


def changed(context: Context, seriesList: list[Series]) -> list[Series]:
    """1 where the value differs from the last value before it, else 0 (also where null, and at the
    first value)."""
    results = []
    for s in seriesList:
        present = ~np.isnan(s.values)
        index = np.arange(len(s.values))
        last = np.maximum.accumulate(np.where(present, index, -1)) if len(index) else index
        before = np.concatenate(([-1], last[:-1]))  # the last value before each point
        previous = s.values[np.maximum(before, 0)]
        values = (present & (before >= 0) & (s.values != previous)).astype(np.float64)
        results.append(_named(s, f"changed({s.name})", values=values))
    return results


def is_non_null(context: Context, seriesList: list[Series]) -> list[Series]:
    """1 where there is a value, 0 where it is null: count series with sumSeries(isNonNull(...))."""
    return [_named(s, f"isNonNull({s.name})", values=(~np.isnan(s.values)).astype(np.float64),
                   tags=_tagged(s, isNonNull=1)) for s in seriesList]


def n_percentile(context: Context, seriesList: list[Series], n: float) -> list[Series]:
    """Each series as one flat line at its `n`th percentile over the range (a series without values
    is left out)."""
    _check_percent("nPercentile", n)
    results = []
    for s in seriesList:
        [value] = _percentiles(s.values.reshape(1, -1), n, False).tolist()
        if not math.isnan(value):
            results.append(_named(s, f"nPercentile({s.name}, {n:g})", values=np.full(len(s.values), value),
                                  tags=_tagged(s, nPercentile=n)))
    return results


def constant_line(context: Context, value: float) -> list[Series]:
    """A flat line at `value` across the range (three points, as graphite-web draws it)."""
    step = max((context.until_s - context.from_s) // 2, 1)
    text = str(value)
    return [Series(name=text, start=context.from_s, step=step, values=np.full(3, float(value)),
                   path_expression=f"constantLine({text})", tags={"name": text}, xfiles_factor=context.xfiles_factor)]


def _time_shift_text(timeShift: str) -> str:
    """graphite-web's reading: back in time unless it says + ("1d" is "-1d")."""
    return "-" + timeShift if timeShift[:1].isdigit() else timeShift


def time_shift_s(context: Context, timeShift: str, alignDst: bool = False) -> int:
    """Seconds timeShift moves the range by (negative: back); with alignDst, an hour more or less
    when the range and the moved one are each wholly in or out of daylight saving time, and not
    alike (local time, as graphite-web's server reads it)."""
    shift = parse_interval_s(_time_shift_text(timeShift))
    if alignDst:
        def in_dst(epoch_s: int) -> bool:
            return time.localtime(epoch_s).tm_isdst > 0
        now = (in_dst(context.from_s), in_dst(context.until_s))
        then = (in_dst(context.from_s + shift), in_dst(context.until_s + shift))
        if all(now) and not any(then):
            shift += 3600
        elif not any(now) and all(then):
            shift -= 3600
    return shift


def time_shift(context: Context, seriesList: list[Series], timeShift: str, resetEnd: bool = True,
               alignDst: bool = False) -> list[Series]:
    """The series as they were at another time, drawn over this range: `timeShift(x, "7d")` beside
    `x` compares with a week before (back in time unless the shift says +). Named
    `timeShift(<name>, "-7d")`. resetEnd: no more points than the range has (the default)."""
    text = _time_shift_text(timeShift)
    shift = time_shift_s(context, timeShift, alignDst)
    results = []
    for s in seriesList:  # fetched over the moved range (evaluate): moved back by whole steps
        start = s.start - shift // s.step * s.step
        values = s.values[:max(0, -((start - context.until_s) // s.step))] if resetEnd else s.values
        results.append(_named(s, f'timeShift({s.name}, "{text}")', start=start, values=values.copy(),
                              tags=_tagged(s, timeShift=text)))
    return results


def keep_last_value(context: Context, seriesList: list[Series], limit: float = math.inf) -> list[Series]:
    """Fills each run of nulls with the value before it, if the run is at most `limit` points long
    (any length by default). A run at the very start has nothing to repeat and stays null."""
    results = []
    for s in seriesList:
        values = s.values.copy()
        present = ~np.isnan(values)
        index = np.arange(len(values))
        last_before = np.maximum.accumulate(np.where(present, index, -1)) if len(values) else index
        next_after = np.minimum.accumulate(np.where(present, index, len(values))[::-1])[::-1] if len(values) \
            else index
        run = next_after - last_before - 1
        fill = ~present & (last_before >= 0) & (run <= limit)
        values[fill] = values[last_before[fill]]
        results.append(_named(s, f"keepLastValue({s.name})", values=values))
    return results


def _non_negative_delta(values: np.ndarray, maxValue: float | None, minValue: float | None) -> np.ndarray:
    """graphite-web's counter deltas: a value out of [minValue, maxValue] is null (and no previous
    value for the next); a decrease is a wrap at maxValue, a reset to minValue, or null."""
    values = values.copy()
    with np.errstate(invalid="ignore"):
        if maxValue is not None:
            values[values > maxValue] = np.nan
        if minValue is not None:
            values[values < minValue] = np.nan
        previous = np.concatenate(([np.nan], values[:-1]))
        delta = values - previous
        wrapped = delta < 0
        if maxValue is not None:
            delta[wrapped] = maxValue + 1 + values[wrapped] - previous[wrapped] - (minValue or 0)
        elif minValue is not None:
            delta[wrapped] = values[wrapped] - minValue
        else:
            delta[wrapped] = np.nan
    return delta


def non_negative_derivative(context: Context, seriesList: list[Series], maxValue: float | None = None,
                            minValue: float | None = None) -> list[Series]:
    """The increase of a counter from each point to the next; a decrease (a reset) is null, unless
    maxValue says where the counter wraps (or minValue what it restarts from)."""
    return [_named(s, f"nonNegativeDerivative({s.name})", values=_non_negative_delta(s.values, maxValue, minValue),
                   tags=_tagged(s, nonNegativeDerivative=1)) for s in seriesList]


def per_second(context: Context, seriesList: list[Series], maxValue: float | None = None,
               minValue: float | None = None) -> list[Series]:
    """nonNegativeDerivative divided by the step in seconds: a counter's rate per second."""
    return [_named(s, f"perSecond({s.name})", values=np.round(_non_negative_delta(s.values, maxValue, minValue)
                                                               / s.step, 6),
                   tags=_tagged(s, perSecond=1)) for s in seriesList]


MOVING_WINDOW_CELLS = 1 << 20
"""Window cells a moving min, max or median reduces at once: a week of seconds with a 5 min window
is 181 M cells, reduced a slice at a time in bounded memory."""


def moving_window(context: Context, seriesList: list[Series], windowSize: int | str, func: str = "average",
                  xFilesFactor: float | None = None) -> list[Series]:
    """Each point becomes `func` (average, sum, min, max, median, ...) of the non-null values of the
    points before it (not itself, as in graphite-web) within the window: a number of points, or a
    time ("5min"). Named `moving<Func>(<name>,<window>)`.

    No bootstrap: graphite-web fetches one more window before `from` so the first points reduce a
    full window; ramen fetches only [from, until), so the first point is null and the first window
    of points reduces fewer values (its xFilesFactor still counts the full window).
    """
    tag = "moving" + func.capitalize()
    results = []
    for s in seriesList:
        if isinstance(windowSize, str):
            points = abs(parse_interval_s(windowSize)) // s.step
            name = f'{tag}({s.name},"{windowSize}")'
        else:
            points = windowSize
            name = f"{tag}({s.name},{windowSize})"
        xff = s.xfiles_factor if xFilesFactor is None else xFilesFactor
        results.append(_named(s, name, values=_moving(s.values, points, func, xff),
                              tags=_tagged(s, **{tag: windowSize})))
    return results


def _moving(values: np.ndarray, points: int, func: str, xff: float) -> np.ndarray:
    """`func` over each point's window [i - points, i), padding before the first point not counted."""
    n = len(values)
    if points <= 0 or n == 0:
        return np.full(n, np.nan)
    func = AGGREGATION_ALIASES.get(func, func)
    present = ~np.isnan(values)
    if func in ("average", "sum"):  # running sums: no window is materialised
        sums = np.concatenate(([0.0], np.cumsum(np.where(present, values, 0.0))))
        counts = np.concatenate(([0], np.cumsum(present)))
        end = np.arange(n)
        begin = np.maximum(end - points, 0)
        count = counts[end] - counts[begin]
        with np.errstate(invalid="ignore", divide="ignore"):
            reduced = sums[end] - sums[begin]
            if func == "average":
                reduced = reduced / count
            ok = (count > 0) & (count / points >= xff)
        return np.where(ok, reduced, np.nan)
    padded = np.concatenate((np.full(points, np.nan), values))
    real = np.concatenate((np.zeros(points, dtype=bool), np.ones(n, dtype=bool)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, points)[:n]
    real_windows = np.lib.stride_tricks.sliding_window_view(real, points)[:n]
    result = np.empty(n)
    rows = max(1, MOVING_WINDOW_CELLS // points)
    for first in range(0, n, rows):
        last = first + rows
        result[first:last] = aggregate_rows(func, windows[first:last], real=real_windows[first:last],
                                            denominator=points, xfiles_factor=xff)
    return result


def _moving_by(func: str) -> Callable[..., list[Series]]:
    def moving(context: Context, seriesList: list[Series], windowSize: int | str,
               xFilesFactor: float | None = None) -> list[Series]:
        return moving_window(context, seriesList, windowSize, func, xFilesFactor)
    moving.__doc__ = f"""Each point becomes the {func} of the non-null values of the points before it within the
        window: a number of points, or a time ("5min"). As movingWindow, with no data before `from`."""
    return moving


def _reduced(series_list: list[Series], func: str) -> list[float]:
    """`func` over each series' values (NaN: nothing to reduce), as graphite-web's aggregation
    functions reduce a whole series (no xFilesFactor)."""
    if not series_list:
        return []
    width = max(len(s.values) for s in series_list)
    matrix, real = np.full((len(series_list), width), np.nan), np.zeros((len(series_list), width), dtype=bool)
    for row, s in enumerate(series_list):  # one reduction for all (a row each, padded where shorter)
        matrix[row, :len(s.values)] = s.values
        real[row, :len(s.values)] = True
    return aggregate_rows(func, matrix, real=real).tolist()


def _sorted_by(series_list: list[Series], func: str, *, lowest: bool = False) -> list[Series]:
    """Highest first by `func` over each series' values, all-null series last (`lowest`: lowest
    first, all-null series first, as graphite-web ranks a null as -inf); ties keep their order."""
    keys = [-math.inf if math.isnan(key) else key for key in _reduced(series_list, func)]
    order = sorted(range(len(series_list)), key=lambda i: keys[i], reverse=not lowest)
    return [series_list[i] for i in order]


def highest(context: Context, seriesList: list[Series], n: int = 1, func: str = "average") -> list[Series]:
    """The `n` series with the highest value of `func` (average, max, sum, ...) over the range."""
    return _sorted_by(seriesList, func)[:n]


def lowest(context: Context, seriesList: list[Series], n: int = 1, func: str = "average") -> list[Series]:
    """The `n` series with the lowest value of `func` (average, min, last, ...) over the range,
    lowest first (all-null ones before any)."""
    return _sorted_by(seriesList, func, lowest=True)[:n]


def _ranked_by(func: str, *, lowest: bool = False) -> Callable[..., list[Series]]:
    def ranked(context: Context, seriesList: list[Series], n: int) -> list[Series]:
        return _sorted_by(seriesList, func, lowest=lowest)[:n]
    ranked.__doc__ = (f"The `n` series with the {'lowest' if lowest else 'highest'} "
                      f"{'last value' if func == 'last' else func} over the range.")
    return ranked


OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "=": lambda value, threshold: not math.isnan(value) and value == threshold,
    "!=": lambda value, threshold: math.isnan(value) or value != threshold,
    ">": lambda value, threshold: not math.isnan(value) and value > threshold,
    ">=": lambda value, threshold: not math.isnan(value) and value >= threshold,
    "<": lambda value, threshold: math.isnan(value) or value < threshold,
    "<=": lambda value, threshold: math.isnan(value) or value <= threshold,
}
"""filterSeries' comparisons, a series with nothing to reduce (NaN) judged as graphite-web's None:
less than anything, equal to nothing."""


def filter_series(context: Context, seriesList: list[Series], func: str, operator: str, threshold: float
                  ) -> list[Series]:
    """The series whose `func` over the range (average, max, last, ...) compares with `threshold`
    by `operator` (=, !=, >, >=, <, <=): `filterSeries(x, "max", ">", 1000)`."""
    compare = OPERATORS[operator]
    return [s for s, value in zip(seriesList, _reduced(seriesList, func)) if compare(value, threshold)]


def _filtered_by(func: str, operator: str) -> Callable[..., list[Series]]:
    def filtered(context: Context, seriesList: list[Series], n: float) -> list[Series]:
        return filter_series(context, seriesList, func, operator, n)
    what = {"last": "last value", "average": "average", "max": "maximum", "min": "minimum"}[func]
    filtered.__doc__ = (f"The series whose {what} over the range is "
                        f"{'above `n`' if operator == '>' else 'at most `n` (or that have no value)'}.")
    return filtered


def _regex(name: str, pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise TargetError(f"{name}: bad regular expression {pattern!r}: {e}") from None


def exclude(context: Context, seriesList: list[Series], pattern: str) -> list[Series]:
    """The series whose names do not match the regular expression `pattern`."""
    regex = _regex("exclude", pattern)
    return [s for s in seriesList if not regex.search(s.name)]


def grep(context: Context, seriesList: list[Series], pattern: str) -> list[Series]:
    """The series whose names match the regular expression `pattern`."""
    regex = _regex("grep", pattern)
    return [s for s in seriesList if regex.search(s.name)]


def remove_empty_series(context: Context, seriesList: list[Series], xFilesFactor: float | None = None
                        ) -> list[Series]:
    """The series with at least one value, or with at least that share of non-null values."""
    xff = 0.0 if xFilesFactor is None else xFilesFactor
    kept = []
    for s in seriesList:
        present = int(np.count_nonzero(~np.isnan(s.values)))
        if present and present / len(s.values) >= xff:
            kept.append(s)
    return kept


def remove_below_value(context: Context, seriesList: list[Series], n: float) -> list[Series]:
    """Values below `n` become null."""
    with np.errstate(invalid="ignore"):
        return [_named(s, f"removeBelowValue({s.name}, {n:g})", values=np.where(s.values < n, np.nan, s.values))
                for s in seriesList]


def remove_above_value(context: Context, seriesList: list[Series], n: float) -> list[Series]:
    """Values above `n` become null."""
    with np.errstate(invalid="ignore"):
        return [_named(s, f"removeAboveValue({s.name}, {n:g})", values=np.where(s.values > n, np.nan, s.values))
                for s in seriesList]


def limit(context: Context, seriesList: list[Series], n: int) -> list[Series]:
    """The first `n` series only."""
    return list(seriesList[:n])


def sort_by_maxima(context: Context, seriesList: list[Series]) -> list[Series]:
    """The series by their largest value, highest first."""
    return _sorted_by(seriesList, "max")


def sort_by_name(context: Context, seriesList: list[Series], natural: bool = False, reverse: bool = False
                 ) -> list[Series]:
    """By name; `natural`: numbers in names by their value (server2 before server11)."""
    def natural_key(s: Series) -> str:
        return re.sub(r"\d+", lambda number: f"{int(number.group(0)):010}", s.name)
    return sorted(seriesList, key=natural_key if natural else (lambda s: s.name), reverse=reverse)


def sort_by(context: Context, seriesList: list[Series], func: str = "average", reverse: bool = False
            ) -> list[Series]:
    """By `func` over the range (average, max, sum, last, ...), lowest first (all-null ones before
    any); `reverse`: highest first."""
    return _sorted_by(seriesList, func, lowest=not reverse)


def sort_by_total(context: Context, seriesList: list[Series]) -> list[Series]:
    """By the sum of their values, highest first."""
    return _sorted_by(seriesList, "sum")


def sort_by_minima(context: Context, seriesList: list[Series]) -> list[Series]:
    """The series with a value above 0, by their smallest value, lowest first."""
    positive = [s for s, top in zip(seriesList, _reduced(seriesList, "max")) if top > 0]
    return _sorted_by(positive, "min", lowest=True)


def group(context: Context, seriesLists: list[list[Series]]) -> list[Series]:
    """All the series of all the arguments as one list, to give several to a one-list function."""
    return [s for sublist in seriesLists for s in sublist]


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
            matrix = _matrix(pair, start, step)
            results.append(_fresh(f"asPercent({part.name},{whole.name})", start, step,
                                  _percent(matrix[:, 0], matrix[:, 1]), (part, whole)))
        return results
    if isinstance(total, list) and len(total) != 1:
        raise TargetError(f"asPercent: total must be a number, one series or {len(seriesList)} series "
                          f"(as many as the first argument), not {len(total)}")
    if isinstance(total, list):
        normalized, start, step = normalize([*seriesList, total[0]])
        matrix = _matrix(normalized, start, step)
        totals, total_text = matrix[:, -1], total[0].name
        matrix = matrix[:, :-1]
    else:
        normalized, start, step = normalize(seriesList)
        matrix = _matrix(normalized, start, step)
        if total is None:
            totals = aggregate_rows("sum", matrix)
            total_text = f"sumSeries({_path_expressions(seriesList)})"
        elif isinstance(total, (int, float)) and not isinstance(total, bool):
            totals = np.full(len(matrix), float(total))
            total_text = str(total)
        else:
            raise TargetError(f"asPercent: total must be a number, a series list or None, not {total!r}")
    return [_fresh(f"asPercent({s.name},{total_text})", start, step, _percent(matrix[:, column], totals), (s,))
            for column, s in enumerate(seriesList)]


def _as_percent_by_nodes(context: Context, seriesList: list[Series], total: object,
                         nodes: list[int | str]) -> list[Series]:
    if total is not None and not isinstance(total, list):
        raise TargetError(f"asPercent: with nodes, total must be None or a series list, not {total!r}")

    def key(s: Series) -> str:
        return ".".join(_node(s, node) for node in nodes)

    def summed(group_list: list[Series]) -> Series:
        if len(group_list) == 1:
            return group_list[0]
        normalized, start, step = normalize(group_list)
        return _fresh(f"sumSeries({_path_expressions(group_list)})", start, step,
                      aggregate_rows("sum", _matrix(normalized, start, step)), group_list)

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
            results.append(_fresh(f"asPercent(MISSING,{whole.name})", whole.start, whole.step,
                                  np.full(len(whole.values), np.nan), (whole,)))
            continue
        for part in groups[k]:
            if k not in totals:
                results.append(_fresh(f"asPercent({part.name},MISSING)", part.start, part.step,
                                      np.full(len(part.values), np.nan), (part,)))
                continue
            whole = totals[k]
            pair, start, step = normalize([part, whole])
            matrix = _matrix(pair, start, step)
            results.append(_fresh(f"asPercent({part.name},{whole.name})", start, step,
                                  _percent(matrix[:, 0], matrix[:, 1]), (part, whole)))
    return results


# The table /functions describes and evaluate dispatches through


@dataclass(frozen=True)
class Param:
    """One parameter, as graphite-web's Param.toJSON describes it."""
    name: str
    type: str
    """graphite-web's type names: seriesList, seriesLists, float, integer, intOrInf, intOrInterval,
    interval, string, boolean, aggFunc, node, nodeOrTag, any."""
    required: bool = False
    default: object = None
    multiple: bool = False
    options: tuple = ()
    suggestions: tuple = ()

    def to_json(self) -> dict:
        """Only what is set, as graphite-web writes it (Grafana reads absence as false/none)."""
        described: dict = {"name": self.name, "type": self.type}
        if self.required:
            described["required"] = True
        if self.default is not None:
            described["default"] = "inf" if self.default == math.inf else self.default
        if self.multiple:
            described["multiple"] = True
        if self.options:
            described["options"] = sorted(self.options, key=str)
        if self.suggestions:
            described["suggestions"] = list(self.suggestions)
        return described


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    call: Callable[..., list[Series]]
    group: str
    params: tuple[Param, ...]
    description: str = field(default="")

    def signature(self) -> str:
        """As graphite-web shows it: `summarize(seriesList, intervalString, func='sum', alignToFrom=False)`."""
        parts = []
        for param in self.params:
            if param.multiple:
                parts.append(f"*{param.name}")
            elif param.default is not None:
                parts.append(f"{param.name}={param.default!r}")
            elif not param.required and param.type != "seriesList":
                parts.append(f"{param.name}=None")
            else:
                parts.append(param.name)
        return f"{self.name}({', '.join(parts)})"

    def to_json(self) -> dict:
        return {"name": self.name, "function": self.signature(), "description": self.description,
                "module": MODULE_NAME, "group": self.group, "params": [p.to_json() for p in self.params]}


_SERIES = Param("seriesList", "seriesList", required=True)
_SERIES_LISTS = Param("seriesLists", "seriesList", required=True, multiple=True)
_POSITIONS = Param("position", "node", multiple=True)
_THRESHOLD = Param("n", "float", required=True)
_COUNT = Param("n", "integer", required=True)
_WINDOW = Param("windowSize", "intOrInterval", required=True, suggestions=tuple(WINDOW_SUGGESTIONS))
_AGG_OPTIONS = tuple(_aggregation_names())
_CONSOLIDATION_OPTIONS = ("sum", "average", "avg", "avg_zero", "min", "max", "first", "last")
_CALLBACK_OPTIONS = (*_AGG_OPTIONS, "averageSeries", "diffSeries", "maxSeries", "minSeries", "multiplySeries",
                     "sumSeries")
"""What groupByNode(s) combine a group with: an aggregation, or a function of ours that aggregates."""


def _spec(name: str, call: Callable[..., list[Series]], group_name: str, *params: Param) -> FunctionSpec:
    return FunctionSpec(name, call, group_name, params, " ".join((call.__doc__ or "").split()))


FUNCTIONS: dict[str, FunctionSpec] = {spec.name: spec for spec in (
    _spec("alias", alias, "Alias", _SERIES, Param("newName", "string", required=True)),
    _spec("aliasByNode", alias_by_node, "Alias", _SERIES, Param("nodes", "nodeOrTag", required=True, multiple=True)),
    _spec("aliasByMetric", alias_by_metric, "Alias", _SERIES),
    _spec("aliasSub", alias_sub, "Alias", _SERIES, Param("search", "string", required=True),
          Param("replace", "string", required=True)),
    _spec("sumSeries", sum_series, "Combine", _SERIES_LISTS),
    _spec("averageSeries", average_series, "Combine", _SERIES_LISTS),
    _spec("maxSeries", max_series, "Combine", _SERIES_LISTS),
    _spec("minSeries", min_series, "Combine", _SERIES_LISTS),
    _spec("diffSeries", diff_series, "Combine", _SERIES_LISTS),
    _spec("multiplySeries", multiply_series, "Combine", _SERIES_LISTS),
    _spec("divideSeries", divide_series, "Combine", Param("dividendSeriesList", "seriesList", required=True),
          Param("divisorSeries", "seriesList", required=True)),
    _spec("groupByNode", group_by_node, "Combine", _SERIES, Param("nodeNum", "nodeOrTag", required=True),
          Param("callback", "aggOrSeriesFunc", default="average", options=_CALLBACK_OPTIONS)),
    _spec("groupByNodes", group_by_nodes, "Combine", _SERIES,
          Param("callback", "aggOrSeriesFunc", required=True, options=_CALLBACK_OPTIONS),
          Param("nodes", "nodeOrTag", multiple=True)),
    _spec("aggregate", aggregate, "Combine", _SERIES, Param("func", "aggFunc", required=True, options=_AGG_OPTIONS),
          Param("xFilesFactor", "float")),
    _spec("group", group, "Combine", Param("seriesLists", "seriesList", multiple=True)),
    _spec("rangeOfSeries", range_of_series, "Combine", _SERIES_LISTS),
    _spec("stddevSeries", stddev_series, "Combine", _SERIES_LISTS),
    _spec("countSeries", count_series, "Combine", Param("seriesLists", "seriesList", multiple=True)),
    _spec("percentileOfSeries", percentile_of_series, "Combine", _SERIES, Param("n", "float", required=True),
          Param("interpolate", "boolean", default=False)),
    _spec("aggregateWithWildcards", aggregate_with_wildcards, "Combine", _SERIES,
          Param("func", "aggFunc", required=True, options=_AGG_OPTIONS), _POSITIONS),
    *(_spec(f"{func}SeriesWithWildcards", _with_wildcards(func), "Combine", _SERIES, _POSITIONS)
      for func in ("sum", "average", "multiply")),
    _spec("asPercent", as_percent, "Combine", _SERIES, Param("total", "any"),
          Param("nodes", "nodeOrTag", multiple=True)),
    _spec("scale", scale, "Transform", _SERIES, Param("factor", "float", required=True)),
    _spec("offset", offset, "Transform", _SERIES, Param("factor", "float", required=True)),
    _spec("summarize", summarize, "Transform", _SERIES,
          Param("intervalString", "interval", required=True, suggestions=tuple(INTERVAL_SUGGESTIONS)),
          Param("func", "aggFunc", default="sum", options=_AGG_OPTIONS),
          Param("alignToFrom", "boolean", default=False)),
    _spec("transformNull", transform_null, "Transform", _SERIES, Param("default", "float", default=0),
          Param("referenceSeries", "seriesList")),
    _spec("absolute", absolute, "Transform", _SERIES),
    _spec("derivative", derivative, "Transform", _SERIES),
    _spec("integral", integral, "Transform", _SERIES),
    _spec("timeShift", time_shift, "Transform", _SERIES,
          Param("timeShift", "interval", required=True,
                suggestions=("1h", "6h", "12h", "1d", "2d", "7d", "14d", "30d")),
          Param("resetEnd", "boolean", default=True), Param("alignDst", "boolean", default=False)),
    _spec("squareRoot", square_root, "Transform", _SERIES),
    _spec("pow", power, "Transform", _SERIES, Param("factor", "float", required=True)),
    _spec("invert", invert, "Transform", _SERIES),
    _spec("log", logarithm, "Transform", _SERIES, Param("base", "integer", default=10)),
    _spec("delay", delay, "Transform", _SERIES, Param("steps", "integer", required=True)),
    _spec("offsetToZero", offset_to_zero, "Transform", _SERIES),
    _spec("isNonNull", is_non_null, "Transform", _SERIES),
    _spec("changed", changed, "Special", _SERIES),
    _spec("constantLine", constant_line, "Special", Param("value", "float", required=True)),
    _spec("keepLastValue", keep_last_value, "Transform", _SERIES, Param("limit", "intOrInf", default=math.inf)),
    _spec("nonNegativeDerivative", non_negative_derivative, "Transform", _SERIES, Param("maxValue", "float"),
          Param("minValue", "float")),
    _spec("perSecond", per_second, "Transform", _SERIES, Param("maxValue", "float"), Param("minValue", "float")),
    _spec("consolidateBy", consolidate_by, "Special", _SERIES,
          Param("consolidationFunc", "string", required=True, options=_CONSOLIDATION_OPTIONS)),
    *(_spec(name, set_xfiles_factor, "Special", _SERIES, Param("xFilesFactor", "float", required=True))
      for name in ("setXFilesFactor", "xFilesFactor")),
    _spec("movingWindow", moving_window, "Calculate", _SERIES, _WINDOW,
          Param("func", "aggFunc", default="average", options=_AGG_OPTIONS), Param("xFilesFactor", "float")),
    *(_spec(f"moving{func.capitalize()}", _moving_by(func), "Calculate", _SERIES, _WINDOW,
            Param("xFilesFactor", "float"))
      for func in ("average", "sum", "min", "max", "median")),
    _spec("nPercentile", n_percentile, "Calculate", _SERIES, Param("n", "float", required=True)),
    _spec("highestAverage", _ranked_by("average"), "Filter Series", _SERIES, _COUNT),
    _spec("highestCurrent", _ranked_by("last"), "Filter Series", _SERIES, _COUNT),
    _spec("highestMax", _ranked_by("max"), "Filter Series", _SERIES, _COUNT),
    _spec("highest", highest, "Filter Series", _SERIES, _COUNT,
          Param("func", "aggFunc", default="average", options=_AGG_OPTIONS)),
    _spec("lowestAverage", _ranked_by("average", lowest=True), "Filter Series", _SERIES, _COUNT),
    _spec("lowestCurrent", _ranked_by("last", lowest=True), "Filter Series", _SERIES, _COUNT),
    _spec("lowest", lowest, "Filter Series", _SERIES, _COUNT,
          Param("func", "aggFunc", default="average", options=_AGG_OPTIONS)),
    _spec("filterSeries", filter_series, "Filter Series", _SERIES,
          Param("func", "aggFunc", required=True, options=_AGG_OPTIONS),
          Param("operator", "string", required=True, options=tuple(OPERATORS)),
          Param("threshold", "float", required=True)),
    *(_spec(f"{what}{'Above' if operator == '>' else 'Below'}", _filtered_by(func, operator), "Filter Series",
            _SERIES, _THRESHOLD)
      for what, func in (("current", "last"), ("average", "average"), ("maximum", "max"), ("minimum", "min"))
      for operator in (">", "<=")),
    _spec("exclude", exclude, "Filter Series", _SERIES, Param("pattern", "string", required=True)),
    _spec("grep", grep, "Filter Series", _SERIES, Param("pattern", "string", required=True)),
    _spec("removeEmptySeries", remove_empty_series, "Filter Series", _SERIES, Param("xFilesFactor", "float")),
    _spec("removeBelowValue", remove_below_value, "Filter Data", _SERIES, _THRESHOLD),
    _spec("removeAboveValue", remove_above_value, "Filter Data", _SERIES, _THRESHOLD),
    _spec("limit", limit, "Filter Series", _SERIES, _COUNT),
    _spec("sortByMaxima", sort_by_maxima, "Sorting", _SERIES),
    _spec("sortByName", sort_by_name, "Sorting", _SERIES, Param("natural", "boolean", default=False),
          Param("reverse", "boolean", default=False)),
    _spec("sortByTotal", sort_by_total, "Sorting", _SERIES),
    _spec("sortByMinima", sort_by_minima, "Sorting", _SERIES),
    _spec("sortBy", sort_by, "Sorting", _SERIES, Param("func", "aggFunc", default="average", options=_AGG_OPTIONS),
          Param("reverse", "boolean", default=False)),
)}
"""Every function a target may call, by the name a target calls it."""


def describe_functions(group_name: str | None = None, grouped: bool = False) -> dict:
    """What `GET /functions` answers (graphite-web's shape), optionally one group or grouped by group."""
    described: dict = {}
    for name, spec in FUNCTIONS.items():
        if group_name is not None and spec.group != group_name:
            continue
        if grouped:
            described.setdefault(spec.group, {})[name] = spec.to_json()
        else:
            described[name] = spec.to_json()
    return described


# Evaluation


Fetched = dict[tuple[str, int], list[Series]]
"""(path expression, shift_s) -> the series it matched over the range moved by shift_s (`fetches`)."""


def fetches(node: Node, context: Context) -> list[tuple[str, int]]:
    """Every (path expression, shift in seconds) the target needs fetched, once each: a path under
    timeShift over the range moved by its shift (nested ones add up), any other over the range.
    A timeShift whose shift is not a literal interval is a TargetError here, before any fetch."""
    found: dict[tuple[str, int], None] = {}
    stack = [(node, context)]
    while stack:
        current, where = stack.pop()
        if isinstance(current, PathExpr):
            found.setdefault((current.text, where.shift_s))
        elif isinstance(current, Call):
            args, kwargs = _scoped_args(current, where)
            stack.extend(reversed(args + [(arg, scope) for _, arg, scope in kwargs]))
    return list(found)


TIME_SHIFT = "timeShift"


def _scoped_args(node: Call, context: Context) -> tuple[list[tuple[Node, Context]], list[tuple[str, Node, Context]]]:
    """A call's arguments, each with the context it is evaluated in: a timeShift's series (its
    first, or `seriesList=`) in the moved range, everything else in the call's own."""
    shifted = context.shifted(_shift_of(node, context)) if node.name == TIME_SHIFT else context
    args = [(arg, shifted if index == 0 else context) for index, arg in enumerate(node.args)]
    return args, [(name, arg, shifted if name == "seriesList" else context) for name, arg in node.kwargs]


def _shift_of(node: Call, context: Context) -> int:
    """The seconds a timeShift call moves its series' range by, from its literal arguments."""
    spec = FUNCTIONS[TIME_SHIFT]
    literals = [arg.value if isinstance(arg, Literal) else [] for arg in node.args]
    kwargs = {name: arg.value if isinstance(arg, Literal) else [] for name, arg in node.kwargs}
    if node.args:
        literals[0] = []  # the series: not needed to know the shift
    kwargs.pop("seriesList", None)
    bound = _bind(spec, literals if node.args else [[]], kwargs)
    shift = time_shift_s(context, bound["timeShift"], bound.get("alignDst", False))
    if context.from_s + shift < 0 or (context.until_s + shift) * MICROS_PER_SECOND > MAX_TIME_US:
        raise TargetError(f"timeShift: {bound['timeShift']!r} moves the range out of 1970 to 9999")
    return shift


def evaluate(node: Node, fetched: Fetched, context: Context) -> list[Series]:
    """The series a target yields. `fetched` holds the series each (path expression, shift) of
    `fetches` matched (a path absent or matching nothing yields no series, as in graphite-web).
    The fetched series are not modified."""
    value = _value(node, fetched, context)
    if not isinstance(value, list):
        raise TargetError(f"a target must yield series, not the literal {value!r}")
    return value


def _value(node: Node, fetched: Fetched, context: Context) -> object:
    if isinstance(node, Literal):
        return node.value
    if isinstance(node, PathExpr):
        return [s.copy(path_expression=node.text, xfiles_factor=context.xfiles_factor)
                for s in fetched.get((node.text, context.shift_s), [])]
    spec = FUNCTIONS.get(node.name)
    if spec is None:
        raise TargetError(f"unknown function {node.name!r}")
    scoped_args, scoped_kwargs = _scoped_args(node, context)
    args = [_value(arg, fetched, scope) for arg, scope in scoped_args]
    kwargs = {name: _value(arg, fetched, scope) for name, arg, scope in scoped_kwargs}
    return spec.call(context, **_bind(spec, args, kwargs))


def _bind(spec: FunctionSpec, args: list, kwargs: dict) -> dict:
    """Arguments by parameter name, checked and converted by type (graphite-web's validateParams)."""
    params = spec.params
    bound: dict = {}
    for index, value in enumerate(args):
        if index < len(params) and not params[index].multiple:
            param = params[index]
            bound[param.name] = _checked(spec, param, value)
        elif params and params[-1].multiple:
            param = params[-1]
            bound.setdefault(param.name, []).append(_checked(spec, param, value))
        else:
            raise TargetError(f"{spec.name}: too many arguments ({len(args)}; it takes {len(params)})")
    for name, value in kwargs.items():
        param = next((p for p in params if p.name == name), None)
        if param is None:
            raise TargetError(f"{spec.name}: no parameter {name!r} (it takes {', '.join(p.name for p in params)})")
        if name in bound:
            raise TargetError(f"{spec.name}: parameter {name!r} given twice")
        checked = _checked(spec, param, value)
        bound[name] = [checked] if param.multiple else checked
    for param in params:
        if param.required and param.name not in bound:
            raise TargetError(f"{spec.name}: missing required parameter {param.name!r}")
        if param.multiple:
            bound.setdefault(param.name, [])
    return bound


def _checked(spec: FunctionSpec, param: Param, value: object) -> object:
    """`value` as `param` needs it; TargetError naming the function, parameter and value otherwise."""
    kind = param.type
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)

    def bad(expected: str) -> TargetError:
        shown = "a series list" if isinstance(value, list) else repr(value)
        return TargetError(f"{spec.name}: parameter {param.name!r} must be {expected}, not {shown}")

    if value is None and not param.required:
        return param.default
    if kind == "seriesList":
        if not isinstance(value, list):
            raise bad("a series list (a path or a function of series)")
        return value
    if kind == "any":
        return value
    if isinstance(value, list):
        raise bad({"float": "a number", "integer": "an integer", "node": "an integer", "intOrInf": "an integer or inf",
                   "interval": 'an interval string such as "1h"', "intOrInterval": "a number of points or an interval",
                   "aggFunc": "a string", "aggOrSeriesFunc": "a string"}.get(kind, f"a {kind}"))
    if kind == "float":
        if not is_number:
            raise bad("a number")
        return value  # an int stays one, as graphite-web has it: a tag `scale=2`, not `2.0`
    if kind in ("integer", "node"):
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad("an integer")
        return value
    if kind == "intOrInf":
        if (isinstance(value, int) and not isinstance(value, bool)) or value == math.inf:
            return value
        raise bad("an integer or inf")
    if kind == "nodeOrTag":
        if (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str):
            return value
        raise bad("a node number or a tag name")
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        if value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise bad("true or false")
    if kind == "interval":
        if not isinstance(value, str):
            raise bad('an interval string such as "1h"')
        parse_interval_s(value)
        return value
    if kind == "intOrInterval":
        if isinstance(value, str):
            parse_interval_s(value)
            return value
        if is_number and float(value).is_integer() and value > 0:
            return int(value)
        raise bad('a number of points (> 0) or an interval string such as "5min"')
    if kind in ("string", "aggFunc", "aggOrSeriesFunc"):
        if not isinstance(value, str):
            raise bad("a string")
        if param.options and value not in param.options:
            raise bad(f"one of {', '.join(param.options)}")
        return value
    return value

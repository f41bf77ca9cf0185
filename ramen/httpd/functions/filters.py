"""Functions that keep, drop or reorder whole series (highest, filterSeries, grep, sortBy, ...) or
drop values (removeBelowValue)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np

from ramen.httpd.functions.context import Context, Evaluator
from ramen.httpd.functions.reductions import check_percent, normalize, percentiles, points_matrix, reduce_each
from ramen.httpd.functions.results import compiled, named, substituted, tagged
from ramen.httpd.series import Series
from ramen.httpd.target import TargetError


def _sorted_by(series_list: list[Series], func: str, *, lowest: bool = False) -> list[Series]:
    """Highest first by `func` over each series' values, all-null series last (`lowest`: lowest
    first, all-null series first, as graphite-web ranks a null as -inf); ties keep their order."""
    keys = [-math.inf if math.isnan(key) else key for key in reduce_each(series_list, func)]
    order = sorted(range(len(series_list)), key=lambda i: keys[i], reverse=not lowest)
    return [series_list[i] for i in order]


def highest(context: Context, seriesList: list[Series], n: int = 1, func: str = "average") -> list[Series]:
    """The `n` series with the highest value of `func` (average, max, sum, ...) over the range."""
    return _sorted_by(seriesList, func)[:n]


def lowest(context: Context, seriesList: list[Series], n: int = 1, func: str = "average") -> list[Series]:
    """The `n` series with the lowest value of `func` (average, min, last, ...) over the range,
    lowest first (all-null ones before any)."""
    return _sorted_by(seriesList, func, lowest=True)[:n]


def ranked_by(func: str, *, lowest: bool = False) -> Callable[..., list[Series]]:
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
    return [s for s, value in zip(seriesList, reduce_each(seriesList, func)) if compare(value, threshold)]


def filtered_by(func: str, operator: str) -> Callable[..., list[Series]]:
    def filtered(context: Context, seriesList: list[Series], n: float) -> list[Series]:
        return filter_series(context, seriesList, func, operator, n)
    what = {"last": "last value", "average": "average", "max": "maximum", "min": "minimum"}[func]
    filtered.__doc__ = (f"The series whose {what} over the range is "
                        f"{'above `n`' if operator == '>' else 'at most `n` (or that have no value)'}.")
    return filtered


def exclude(context: Context, seriesList: list[Series], pattern: str) -> list[Series]:
    """The series whose names do not match the regular expression `pattern`."""
    regex = compiled("exclude", pattern)
    return [s for s in seriesList if not regex.search(s.name)]


def grep(context: Context, seriesList: list[Series], pattern: str) -> list[Series]:
    """The series whose names match the regular expression `pattern`."""
    regex = compiled("grep", pattern)
    return [s for s in seriesList if regex.search(s.name)]


def use_series_above(context: Context, seriesList: list[Series], value: float, search: str, replace: str, *,
                     evaluator: Evaluator) -> list[Series]:
    """In place of each series whose maximum is above `value`, the series named by replacing the
    regular expression `search` in its name by `replace` (`useSeriesAbove(app.*.requests, 10,
    'requests', 'latency')`: the latency of the apps that served more than 10 requests)."""
    above = [s.name for s in seriesList if not np.isnan(s.values).all() and np.nanmax(s.values) > value]
    names = substituted("useSeriesAbove", search, replace, above)
    if not names:
        return []
    (found,) = evaluator.targets([f"group({','.join(names)})"])
    return [s for s in found if len(s.values)]


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
        return [named(s, f"removeBelowValue({s.name}, {n:g})", values=np.where(s.values < n, np.nan, s.values))
                for s in seriesList]


def remove_above_value(context: Context, seriesList: list[Series], n: float) -> list[Series]:
    """Values above `n` become null."""
    with np.errstate(invalid="ignore"):
        return [named(s, f"removeAboveValue({s.name}, {n:g})", values=np.where(s.values > n, np.nan, s.values))
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
    positive = [s for s, top in zip(seriesList, reduce_each(seriesList, "max")) if top > 0]
    return _sorted_by(positive, "min", lowest=True)


def _beyond_percentile(seriesList: list[Series], n: float, name: str, drop) -> list[Series]:
    """Values past each series' own percentile (`drop(values, limit)`) nulled; tagged nPercentile, as
    graphite-web's are by the nPercentile it asks."""
    results = []
    for s in seriesList:
        [limit] = percentiles(s.values.reshape(1, -1), n, False).tolist()
        if math.isnan(limit):  # no value: nothing to remove
            results.append(named(s, f"{name}({s.name}, {n:g})"))
            continue
        with np.errstate(invalid="ignore"):
            values = np.where(drop(s.values, limit), np.nan, s.values)
        results.append(named(s, f"{name}({s.name}, {n:g})", values=values, tags=tagged(s, nPercentile=n)))
    return results


def remove_above_percentile(context: Context, seriesList: list[Series], n: float) -> list[Series]:
    """Values above the series' `n`th percentile (nPercentile's) become null."""
    check_percent("removeAbovePercentile", n)
    return _beyond_percentile(seriesList, n, "removeAbovePercentile", lambda values, limit: values > limit)


def remove_below_percentile(context: Context, seriesList: list[Series], n: float) -> list[Series]:
    """Values below the series' `n`th percentile (nPercentile's) become null."""
    check_percent("removeBelowPercentile", n)
    return _beyond_percentile(seriesList, n, "removeBelowPercentile", lambda values, limit: values < limit)


def _upper_percent(name: str, n: float) -> float:
    """The upper edge of the band between the `n`th and the (100 - n)th percentiles, checked."""
    upper = n if n >= 50 else 100 - n
    check_percent(name, upper)
    return upper


def remove_between_percentile(context: Context, seriesList: list[Series], n: float) -> list[Series]:
    """The series with a value outside the band between the `n`th and the (100 - n)th percentiles
    of all the series' values at some point: the outliers."""
    n = _upper_percent("removeBetweenPercentile", n)
    if not seriesList:
        return []
    normalized, start, step = normalize(seriesList)
    matrix = points_matrix(normalized, start, step)
    low, high = percentiles(matrix, 100 - n, False), percentiles(matrix, n, False)
    with np.errstate(invalid="ignore"):
        outside = ~((low[:, None] < matrix) & (matrix < high[:, None])) & ~np.isnan(matrix)
    return [s for column, s in enumerate(seriesList) if outside[:, column].any()]


def average_outside_percentile(context: Context, seriesList: list[Series], n: float) -> list[Series]:
    """The series whose average is outside the band between the `n`th and the (100 - n)th
    percentiles of the series' averages."""
    n = _upper_percent("averageOutsidePercentile", n)
    averages = np.array(reduce_each(seriesList, "average"))
    [low], [high] = (percentiles(averages.reshape(1, -1), p, False) for p in (100 - n, n))
    return [s for s, average in zip(seriesList, averages) if not low < average < high]


def most_deviant(context: Context, seriesList: list[Series], n: int) -> list[Series]:
    """The `n` series whose values vary the most (the highest variance), most first."""
    variances = reduce_each(seriesList, "stddev")
    ranked = sorted((i for i, v in enumerate(variances) if not math.isnan(v)), key=lambda i: variances[i],
                    reverse=True)
    return [seriesList[i] for i in ranked[:n]]


def unique(context: Context, seriesLists: list[list[Series]]) -> list[Series]:
    """The series of all the arguments, each name once (its first)."""
    seen: dict[str, Series] = {}
    for s in (s for sublist in seriesLists for s in sublist):
        seen.setdefault(s.name, s)
    return list(seen.values())

"""Reductions over rows of values, NaN as Graphite's null: graphite-web's aggregation functions
(sumSeries & co, summarize, highest, moving windows), consolidation (maxDataPoints, series of
different steps), percentiles, and series of different steps put side by side. numpy only: no
per-point Python."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from functools import reduce

import numpy as np

from ramen.httpd.series import DEFAULT_XFILES_FACTOR, Series
from ramen.httpd.target import TargetError


AGGREGATIONS = ("average", "avg_zero", "median", "sum", "min", "max", "diff", "stddev", "count", "range",
                "multiply", "last")
"""graphite-web's aggregation functions (aggFuncs), for sumSeries & co, summarize and highest."""


AGGREGATION_ALIASES = {"rangeOf": "range", "avg": "average", "total": "sum", "current": "last"}


CONSOLIDATION_ONLY = ("first",)
"""Consolidation (maxDataPoints, lcm steps) knows `first` besides the aggregations."""


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
            reduced = 2 * first_present(values, present) - zeroed.sum(axis=1)
        elif func == "multiply":  # a null factor makes the product null
            reduced = np.where((real & ~present).any(axis=1), np.nan, np.where(real, matrix, 1.0).prod(axis=1))
        elif func == "last":
            reduced = first_present(values[:, ::-1], present[:, ::-1])
        elif func == "first":
            reduced = first_present(values, present)
        else:
            raise TargetError(f"unknown aggregation function {func!r} (known: {', '.join(aggregation_names())})")
    result[ok] = reduced[ok]
    return result


def first_present(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    index = present.argmax(axis=1)
    return values[np.arange(values.shape[0]), index]


def aggregation_names() -> list[str]:
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


def points_matrix(series_list: Sequence[Series], start: int, step: int) -> np.ndarray:
    """Points × series, NaN where a series has no point (graphite-web's zip_longest padding)."""
    offsets = [(s.start - start) // step for s in series_list]
    length = max((offset + len(s.values) for offset, s in zip(offsets, series_list)), default=0)
    matrix = np.full((length, len(series_list)), np.nan)
    for column, (offset, s) in enumerate(zip(offsets, series_list)):
        matrix[offset:offset + len(s.values), column] = s.values
    return matrix


def check_percent(name: str, n: float) -> None:
    if not 0 < n <= 100:
        raise TargetError(f"{name}: the percentile must be within (0, 100], not {n:g}")


def percentiles(matrix: np.ndarray, n: float, interpolate: bool) -> np.ndarray:
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


def reduce_each(series_list: list[Series], func: str) -> list[float]:
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

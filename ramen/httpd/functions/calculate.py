"""Functions that compute over a window of each series' points (movingWindow & co) or its whole
range (nPercentile)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ramen.httpd.functions.context import Context, parse_interval_s
from ramen.httpd.functions.reductions import (AGGREGATION_ALIASES, aggregate_rows, check_percent, percentiles,
                                              reduce_each)
from ramen.httpd.functions.results import named, tagged
from ramen.httpd.functions.transform import constant_line
from ramen.httpd.series import Series
from ramen.httpd.target import TargetError


def n_percentile(context: Context, seriesList: list[Series], n: float) -> list[Series]:
    """Each series as one flat line at its `n`th percentile over the range (a series without values
    is left out)."""
    check_percent("nPercentile", n)
    results = []
    for s in seriesList:
        [value] = percentiles(s.values.reshape(1, -1), n, False).tolist()
        if not math.isnan(value):
            results.append(named(s, f"nPercentile({s.name}, {n:g})", values=np.full(len(s.values), value),
                                  tags=tagged(s, nPercentile=n)))
    return results


MOVING_WINDOW_SLICE_CELLS = 1 << 20
"""Window cells a moving median (stddev, ...) reduces at once: its windows are reduced a slice of
them at a time, in bounded memory."""
MOVING_WINDOW_MAX_CELLS = 50_000_000
"""The most window cells a moving median (stddev, ...) reduces, about two seconds here: beyond, a
one-line error rather than a render that runs for minutes (sums, averages, counts, minima, maxima
and last values take time in proportion to the points alone, whatever the window)."""


def moving_window(context: Context, seriesList: list[Series], windowSize: int | str, func: str = "average",
                  xFilesFactor: float | None = None) -> list[Series]:
    """Each point becomes `func` (average, sum, min, max, median, ...) of the non-null values of the
    window that ends with it, itself included, as graphite-web's since 1.1.9 (its issue #2632;
    1.1.8 left the point out, every value one step late): a number of points, or a time ("5min").
    Named `moving<Func>(<name>,<window>)`. The series are fetched from one window before the range
    (evaluation.SERIES_SCOPES), so that the first points reduce a whole window, as graphite-web's do.
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
        ahead = points_ahead(s, context)
        results.append(named(s, name, start=s.start + ahead * s.step,
                             values=_moving_through(tag, s.values, points, func, xff)[ahead:],
                             tags=tagged(s, **{tag: windowSize})))
    return results


def points_ahead(series: Series, context: Context) -> int:
    """Points of `series` before the context's range: those fetched ahead of it for the first
    windows (a moving window's, a forecast's bootstrap), which its result leaves out."""
    return min(len(series.values), max(0, -(-(context.from_s // series.step * series.step - series.start)
                                           // series.step)))


def _moving_through(name: str, values: np.ndarray, points: int, func: str, xff: float) -> np.ndarray:
    """`func` over each point's window [i - points + 1, i], itself included: the window before the
    point that follows it (_moving's, over the values and one null past them)."""
    return _moving(name, np.append(values, np.nan), points, func, xff, counted=len(values))[1:]


def _moving(name: str, values: np.ndarray, points: int, func: str, xff: float, *, counted: int) -> np.ndarray:
    """`func` over each point's window [i - points, i) of the non-null values, null unless the share
    of non-null ones in `points` reaches `xff` (graphite-web's xff over its window). `counted`: the
    points a refusal names."""
    n = len(values)
    if points <= 0 or n == 0:
        return np.full(n, np.nan)
    func = AGGREGATION_ALIASES.get(func, func)
    width = min(points, n)  # a window before point i < n holds at most n points, however long it is
    present = ~np.isnan(values)
    count = _window_sums(present, width)
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = (count > 0) & (count / points >= xff)
    if func in ("sum", "average", "avg_zero", "count"):  # running sums
        total = _window_sums(np.where(present, values, 0.0), width)
        with np.errstate(invalid="ignore", divide="ignore"):
            # avg_zero too: graphite-web hands a window's non-null values alone to the function
            reduced = total if func == "sum" else count.astype(np.float64) if func == "count" else total / count
    elif func in ("min", "max", "range"):
        reduced = _sliding(values, width, np.fmax) - _sliding(values, width, np.fmin) if func == "range" \
            else _sliding(values, width, np.fmin if func == "min" else np.fmax)
    elif func == "last":  # the last non-null value before each point, if it is within the window
        index = np.arange(n)
        last = np.concatenate(([-1], np.maximum.accumulate(np.where(present, index, -1))[:-1]))
        reduced = np.where(last >= index - width, values[np.maximum(last, 0)], np.nan)
    else:
        reduced = _windows_reduced(name, values, width, points, func, xff, counted)
    return np.where(ok, reduced, np.nan)


def _window_sums(values: np.ndarray, width: int, *, inclusive: bool = False) -> np.ndarray:
    """Sums of `values` over each point's window of `width` points: [i - width, i), the points before
    it (movingWindow's), or with `inclusive` [i - width + 1, i], it and those before (stdev's)."""
    running = np.concatenate(([0], np.cumsum(values)))
    end = np.arange(len(values)) + inclusive
    return running[end] - running[np.maximum(end - width, 0)]


def _sliding(values: np.ndarray, width: int, fold: np.ufunc) -> np.ndarray:
    """fold (np.fmin or np.fmax: nulls skipped) over each window [i - width, i), in time
    proportional to the points whatever the width (van Herk / Gil-Werman: each window is the
    fold of a block's suffix and the next block's prefix)."""
    n = len(values)
    padded_length = -(-(n + width) // width) * width
    padded = np.full(padded_length, np.nan)
    padded[width:width + n] = values  # window i is padded[i:i + width]
    blocks = padded.reshape(-1, width)
    prefix = fold.accumulate(blocks, axis=1).ravel()
    suffix = fold.accumulate(blocks[:, ::-1], axis=1)[:, ::-1].ravel()
    start = np.arange(n)
    return fold(suffix[start], prefix[start + width - 1])


def _windows_reduced(name: str, values: np.ndarray, width: int, points: int, func: str, xff: float, counted: int
                     ) -> np.ndarray:
    """Any aggregation over the non-null values of each window [i - width, i) (a null is no factor
    of a product, as graphite-web hands a window's non-null values alone to the function), the
    windows laid out a slice at a time."""
    n = len(values)
    if counted * width > MOVING_WINDOW_MAX_CELLS:
        raise TargetError(f"{name}: a window of {points:,} points over {counted:,} points is {counted * width:,} "
                          f"values to reduce, more than {MOVING_WINDOW_MAX_CELLS:,}: ask a shorter window or range")
    padded = np.concatenate((np.full(width, np.nan), values))
    real = np.concatenate((np.zeros(width, dtype=bool), np.ones(n, dtype=bool)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, width)[:n]
    real_windows = np.lib.stride_tricks.sliding_window_view(real, width)[:n]
    result = np.empty(n)
    rows = max(1, MOVING_WINDOW_SLICE_CELLS // width)
    for first in range(0, n, rows):
        last = first + rows
        window = windows[first:last]
        result[first:last] = aggregate_rows(func, window, real=real_windows[first:last] & ~np.isnan(window),
                                            denominator=points, xfiles_factor=xff)
    return result


def moving_by(func: str) -> Callable[..., list[Series]]:
    def moving(context: Context, seriesList: list[Series], windowSize: int | str,
               xFilesFactor: float | None = None) -> list[Series]:
        return moving_window(context, seriesList, windowSize, func, xFilesFactor)
    moving.__doc__ = f"""Each point becomes the {func} of the non-null values of the points before it within the
        window: a number of points, or a time ("5min"). As movingWindow, with no data before `from`."""
    return moving


def stdev(context: Context, seriesList: list[Series], points: int, windowTolerance: float = 0.1) -> list[Series]:
    """The standard deviation of each point and the `points` - 1 before it (this one included, unlike
    movingWindow), null where the window's share of non-null values is below `windowTolerance`."""
    results = []
    for s in seriesList:
        present = ~np.isnan(s.values)
        zeroed = np.where(present, s.values, 0.0)
        count, total, squares = (_window_sums(v, points, inclusive=True) for v in (present, zeroed, zeroed ** 2))
        with np.errstate(invalid="ignore", divide="ignore"):
            deviation = np.sqrt(count * squares - total ** 2) / count
            ok = (count > 0) & (count / points >= windowTolerance)
        results.append(named(s, f"stdev({s.name},{int(points)})", values=np.where(ok, deviation, np.nan),
                             tags=tagged(s, stdev=points)))
    return results


def aggregate_line(context: Context, seriesList: list[Series], func: str = "average", keepStep: bool = False
                   ) -> list[Series]:
    """Each series as one flat line at its `func` (average, max, last, ...) over the range, across
    the range (or at the series' own points with `keepStep`)."""
    results = []
    for s, value in zip(seriesList, reduce_each(seriesList, func)):
        shown = "None" if math.isnan(value) else f"{value:g}"
        name = f"aggregateLine({s.name}, {shown})"
        if keepStep:
            results.append(named(s, name, values=np.full(len(s.values), value)))
        else:
            [line] = constant_line(context, value)
            results.append(line.copy(name=name, path_expression=name))
    return results


EMA_BLOCK_POINTS = 32
"""Points an exponential moving average folds at once (a matrix of decays), short enough that the
decays' powers stay well within a float's range."""


def exponential_moving_average(context: Context, seriesList: list[Series], windowSize: int | str) -> list[Series]:
    """Each point becomes the exponential moving average of the values before it, weighing each one
    2 / (window + 1) (window: a number of points, or a time, "5min", whose seconds count as points,
    as graphite-web reads it); a null point is null and leaves the average as it was. The series
    are fetched from one window before the range: the average starts from that window's, drawn at
    the first point (null where it has no value: graphite-web's is 0 there, and so is the average
    it starts from)."""
    results = []
    for s in seriesList:
        if isinstance(windowSize, str):
            seconds = abs(parse_interval_s(windowSize))
            weight, name = 2.0 / (seconds + 1), f'exponentialMovingAverage({s.name},"{windowSize}")'
        else:
            weight, name = 2.0 / (windowSize + 1), f"exponentialMovingAverage({s.name},{windowSize})"
        ahead = points_ahead(s, context)
        before, inside = s.values[:ahead], s.values[ahead:]
        first = float(np.mean(before[~np.isnan(before)])) if not np.isnan(before).all() else math.nan
        values = np.full(len(inside), np.nan)
        if len(inside):
            values[0] = round(first, 6)
        if len(inside) > 1:
            present = ~np.isnan(inside[:-1])
            averages = _ema(inside[:-1][present], weight, 0.0 if math.isnan(first) else first)
            values[1:][present] = np.round(averages, 6)  # the average through a point is drawn at the next one
        results.append(named(s, name, start=s.start + ahead * s.step, values=values,
                             tags=tagged(s, exponentialMovingAverage=windowSize)))
    return results


def _ema(values: np.ndarray, weight: float, start: float) -> np.ndarray:
    """e_k = weight * x_k + (1 - weight) * e_(k-1), from e_(-1) = start, a block of EMA_BLOCK_POINTS
    at a time: within a block, e = decay^(k+1) * e_before + weight * sum_j decay^(k-j) x_j."""
    decay, size = 1.0 - weight, EMA_BLOCK_POINTS
    count = len(values)
    blocks = -(-count // size)
    padded = np.zeros(blocks * size)
    padded[:count] = values
    k = np.arange(size)
    lags = k[:, None] - k[None, :]
    within = np.where(lags >= 0, weight * decay ** np.maximum(lags, 0), 0.0)  # [k, j]
    partial = padded.reshape(blocks, size) @ within.T  # each block's sums as if it started from 0
    carried = decay ** (k + 1)
    ends = np.empty(blocks)
    before = start
    for b in range(blocks):  # one step a block: what each block starts from
        ends[b] = before
        before = carried[-1] * before + partial[b, -1]
    return (partial + ends[:, None] * carried[None, :]).ravel()[:count]

"""Functions that compute over a window of each series' points (movingWindow & co) or its whole
range (nPercentile)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ramen.httpd.functions.context import Context, parse_interval_s
from ramen.httpd.functions.reductions import AGGREGATION_ALIASES, aggregate_rows, check_percent, percentiles
from ramen.httpd.functions.results import named, tagged
from ramen.httpd.series import Series


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
        results.append(named(s, name, values=_moving(s.values, points, func, xff),
                              tags=tagged(s, **{tag: windowSize})))
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


def moving_by(func: str) -> Callable[..., list[Series]]:
    def moving(context: Context, seriesList: list[Series], windowSize: int | str,
               xFilesFactor: float | None = None) -> list[Series]:
        return moving_window(context, seriesList, windowSize, func, xFilesFactor)
    moving.__doc__ = f"""Each point becomes the {func} of the non-null values of the points before it within the
        window: a number of points, or a time ("5min"). As movingWindow, with no data before `from`."""
    return moving

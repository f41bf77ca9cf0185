"""Functions that make series of nothing but the range (graphite-web's test and demonstration
series): the time itself, a sine, a random walk; and events, of which ramen has none."""

from __future__ import annotations

import numpy as np

from ramen.httpd.functions.context import Context, check_made_points
from ramen.httpd.functions.results import of_range
from ramen.httpd.series import Series


def _times(name: str, context: Context, step: int) -> np.ndarray:
    """Seconds from the range's start, every `step`, before its end."""
    step = max(step, 1)
    check_made_points(name, (context.until_s - context.from_s) // step, f"a point every {step} s")
    return np.arange(context.from_s, context.until_s, step, dtype=np.float64)


def _series(context: Context, name: str, step: int, values: np.ndarray, path_expression: str | None = None
            ) -> list[Series]:
    return [of_range(context, name, context.from_s, max(step, 1), values, path_expression)]


def identity(context: Context, name: str) -> list[Series]:
    """The time, in seconds since the epoch, every minute of the range."""
    return _series(context, name, 60, _times("identity", context, 60), f'identity("{name}")')


def time_function(context: Context, name: str, step: int = 60) -> list[Series]:
    """The time, in seconds since the epoch, every `step` seconds of the range."""
    return _series(context, name, step, _times("timeFunction", context, step))


def sin_function(context: Context, name: str, amplitude: int = 1, step: int = 60) -> list[Series]:
    """amplitude x sin(the time in seconds), every `step` seconds of the range."""
    return _series(context, name, step, np.sin(_times("sinFunction", context, step)) * amplitude)


def random_walk(context: Context, name: str, step: int = 60) -> list[Series]:
    """A random walk from 0, each step up to 0.5 up or down, every `step` seconds of the range."""
    count = len(_times("randomWalk", context, step))
    moves = np.random.default_rng().random(count) - 0.5
    return _series(context, name, step, np.concatenate(([0.0], np.cumsum(moves)[:-1]))[:count])


def events(context: Context, tags: list[str]) -> list[Series]:
    """The number of events tagged so in each second of the range: ramen keeps no events (its
    /events/get_data is empty), so every second is null, and a dashboard made for graphite-web that
    overlays its events still renders."""
    count = len(_times("events", context, 1))
    series = of_range(context, "events(" + ", ".join(f'"{tag}"' for tag in tags) + ")", context.from_s, 1,
                      np.full(count, np.nan))
    series.consolidate = "sum"  # its own, just made: no copy of its points for it
    return [series]

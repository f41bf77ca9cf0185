"""What a render asks of the functions (its range, `now`, its xFilesFactor; inside timeShift, a
moving window or a forecast, the range their series are fetched over), and Graphite's interval
strings (`"5min"`, `"1d"`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ramen.httpd.series import DEFAULT_XFILES_FACTOR, Series
from ramen.httpd.target import TargetError
from ramen.times import MAX_TIME_US, OFFSET_UNITS, TimeError, parse_time


MICROS_PER_SECOND = 1_000_000


@dataclass(frozen=True)
class Context:
    """What a render asks for, as the functions need it."""
    from_s: int
    until_s: int
    now_s: int
    xfiles_factor: float = DEFAULT_XFILES_FACTOR
    """The render's `xFilesFactor`: what the series it fetches start with (Series.xfiles_factor)."""
    step_of: Callable[[str], int] | None = field(default=None, compare=False)
    """The step (s) of a path expression's series before they are fetched, the coarsest where it
    names several functions (0: none): how far back a moving window of N points reaches."""
    stacks: dict = field(default_factory=dict, compare=False)
    """stacked's running totals by stack name, over the render's targets (shared by moved copies)."""

    def ranging(self, from_s: int, until_s: int) -> Context:
        """Another range: where a function has its series fetched that draws them moved
        (timeShift), or needs points before its range (a moving window's first windows, a
        forecast's bootstrap) or beside it (linearRegression's source)."""
        return dataclasses.replace(self, from_s=from_s, until_s=until_s)

    def time_s(self, text: object, function: str) -> int:
        """A time as `from` and `until` take it ("-1h", "20261125", epoch seconds), in seconds since
        the epoch, `now` the render's; TargetError naming `function` if it is none."""
        try:
            return parse_time(str(text), self.now_s * MICROS_PER_SECOND) // MICROS_PER_SECOND
        except TimeError as e:
            raise TargetError(f"{function}: {e}") from None


class Evaluator(Protocol):
    """What evaluation gives a function that evaluates more than its arguments (FunctionSpec's
    `evaluates`), bound to its call's context and to the series fetched for the render."""

    def apply(self, name: str, series_lists: list[list[Series]]) -> list[Series]:
        """Function `name` of the table over series lists, as its only arguments (reduceSeries'
        reduceFunction)."""

    def targets(self, texts: list[str]) -> list[list[Series]]:
        """The series of targets made at evaluation (applyByNode's template, useSeriesAbove's and
        aliasQuery's related series). Their paths were not known before the first fetches:
        evaluation raises FetchesNeeded with what is still to fetch, and the render evaluates again
        once it is."""


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


MAX_MADE_POINTS = 10_000_000
"""Points a function may make of nothing or of a series at a finer step than its own (a generated
series, summarize's or hitcount's intervals): 80 MB, a year of seconds three times over."""


def check_made_points(name: str, count: int, what: str) -> None:
    """A function about to make `count` points is refused past MAX_MADE_POINTS, in one line."""
    if count > MAX_MADE_POINTS:
        raise TargetError(f"{name}: {what} over the range is {count:,} points, more than {MAX_MADE_POINTS:,}: "
                          f"ask a longer step or a shorter range")

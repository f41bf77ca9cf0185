"""Functions that graphite-web's PNG charts read (colours, line styles, stacking, axes,
thresholds): a chart served as JSON draws its own, so most keep their series as they are, named
and tagged as graphite-web names them, and a dashboard made for graphite-web renders here unchanged."""

from __future__ import annotations

import numpy as np

from ramen.httpd.functions.context import Context
from ramen.httpd.functions.results import named, of_range, tagged
from ramen.httpd.functions.transform import constant_line
from ramen.httpd.series import Series
from ramen.httpd.target import TargetError

DEFAULT_STACK = "__DEFAULT__"


def color(context: Context, seriesList: list[Series], theColor: str) -> list[Series]:
    """The series' colour in graphite-web's PNG charts (a JSON chart picks its own)."""
    return list(seriesList)


def alpha(context: Context, seriesList: list[Series], alpha: float) -> list[Series]:
    """The series' opacity in graphite-web's PNG charts (a JSON chart picks its own)."""
    return list(seriesList)


def line_width(context: Context, seriesList: list[Series], width: float) -> list[Series]:
    """The series' line width in graphite-web's PNG charts (a JSON chart picks its own)."""
    return list(seriesList)


def dashed(context: Context, seriesList: list[Series], dashLength: int = 5) -> list[Series]:
    """Dashed lines in graphite-web's PNG charts; named `dashed(<name>, <length>)`."""
    return [named(s, f"dashed({s.name}, {dashLength:g})", tags=tagged(s, dashed=dashLength)) for s in seriesList]


def second_y_axis(context: Context, seriesList: list[Series]) -> list[Series]:
    """The series on the right-hand axis in graphite-web's PNG charts; named `secondYAxis(<name>)`."""
    return [named(s, f"secondYAxis({s.name})", tags=tagged(s, secondYAxis=1)) for s in seriesList]


def draw_as_infinite(context: Context, seriesList: list[Series]) -> list[Series]:
    """Non-zero points as vertical lines in graphite-web's PNG charts; named `drawAsInfinite(<name>)`."""
    return [named(s, f"drawAsInfinite({s.name})", tags=tagged(s, drawAsInfinite=1)) for s in seriesList]


def stacked(context: Context, seriesList: list[Series], stack: str | None = None) -> list[Series]:
    """Each series on top of those before it: its values plus theirs, point by point (a null stays
    null and adds nothing). A named stack goes on across the render's targets and keeps the names;
    the default one names each `stacked(<name>)`."""
    name = DEFAULT_STACK if stack is None else stack
    total = context.stacks.setdefault(name, np.zeros(0))
    results = []
    for s in seriesList:
        if len(total) < len(s.values):
            total = np.concatenate((total, np.zeros(len(s.values) - len(total))))
        present = ~np.isnan(s.values)
        total[:len(s.values)][present] += s.values[present]
        values = np.where(present, total[:len(s.values)], np.nan)
        if name == DEFAULT_STACK:
            results.append(named(s, f"stacked({s.name})", values=values, tags=tagged(s, stacked=name)))
        else:
            results.append(s.copy(values=values))
    context.stacks[name] = total
    return results


def threshold(context: Context, value: float, label: str | None = None, color: str | None = None) -> list[Series]:
    """A flat line at `value` across the range, named `label` (else as constantLine names it)."""
    [line] = constant_line(context, value)
    return [line.copy(name=label)] if label else [line]


def area_between(context: Context, seriesList: list[Series]) -> list[Series]:
    """The area between exactly two series (the lower, then the upper) in graphite-web's PNG charts:
    both named `areaBetween(<the upper's path expression>)`, with the upper's tags."""
    if len(seriesList) != 2:
        raise TargetError(f"areaBetween: exactly 2 series, not {len(seriesList)}")
    lower, upper = seriesList
    name = f"areaBetween({upper.path_expression})"
    tags = tagged(upper, areaBetween=1)
    return [lower.copy(name=name, tags=tags), upper.copy(name=name, tags=tags)]


def vertical_line(context: Context, ts: str, label: str | None = None, color: str | None = None) -> list[Series]:
    """A vertical line at `ts` (a time as `from` takes it), named `label`: two points, 1 s apart."""
    at = context.time_s(ts, "verticalLine")
    if not context.from_s <= at <= context.until_s:
        raise TargetError(f"verticalLine: {at} is outside the range ({context.from_s} to {context.until_s})")
    return [of_range(context, "None" if label is None else label, at, 1, np.ones(2))]

"""How a function's result is named and tagged, as graphite-web names it (Grafana users read those
names in legends and alias them by node), and the path elements of a series' name."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ramen.httpd.functions.context import Context
from ramen.httpd.regexes import RegexError, UserRegex
from ramen.httpd.series import DEFAULT_XFILES_FACTOR, Series
from ramen.httpd.target import Call, PathExpr, TargetError, parse


def path_expressions(series_list: Sequence[Series]) -> str:
    """The distinct path expressions of `series_list`, comma-joined: how aggregates are named."""
    return ",".join(dict.fromkeys(s.path_expression for s in series_list))


def named(series: Series, name: str, **changes) -> Series:
    """A copy renamed as a function's result; graphite-web makes the name its path expression too."""
    return series.copy(name=name, path_expression=name, **changes)


def tagged(series: Series, **tags: object) -> dict[str, str]:
    """The series' tags plus `tags`, values as strings (graphite-web's Tags stores str())."""
    return {**series.tags, **{key: str(value) for key, value in tags.items()}}


def fresh(name: str, start: int, step: int, values: np.ndarray, of: Sequence[Series] = ()) -> Series:
    """A series a function made from several (`of`; its tags only its name, as graphite-web's new
    TimeSeries), as strict about nulls as they are."""
    return Series(name=name, start=start, step=step, values=values, path_expression=name, tags={"name": name},
                  xfiles_factor=strictest_xfiles_factor(of) if of else DEFAULT_XFILES_FACTOR)


def of_range(context: Context, name: str, start: int, step: int, values: np.ndarray,
             path_expression: str | None = None) -> Series:
    """A series a function made of the render's range alone (a constant line, the time): its tags
    only its name, as strict about nulls as the render asks."""
    return Series(name=name, start=start, step=step, values=values, path_expression=path_expression or name,
                  tags={"name": name}, xfiles_factor=context.xfiles_factor)


def real_or_null(values: np.ndarray) -> np.ndarray:
    """The values, null where they are no real number (an overflow, a division by 0)."""
    return np.where(np.isfinite(values), values, np.nan)


def strictest_xfiles_factor(series_list: Sequence[Series]) -> float:
    """What a reduction across series needs of their values at a point: the strictest of theirs (the
    render's, or what setXFilesFactor set on them; graphite-web's request-wide value, there set by
    whichever setXFilesFactor ran last, even in another target)."""
    return max(s.xfiles_factor for s in series_list)


def node_of(series: Series, node: int | str) -> str:
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


def compiled(function: str, pattern: str) -> UserRegex:
    """A regular expression a function was given (matched within a time bound: ramen/httpd/regexes.py);
    TargetError naming the function if it is none."""
    try:
        return UserRegex(pattern, function)
    except RegexError as e:
        raise TargetError(str(e)) from None


def substituted(function: str, search: str, replace: str, names: Sequence[str]) -> list[str]:
    """Each name with the regular expression `search` replaced by `replace` (`\\1` for a group), as
    aliasSub, aliasQuery and useSeriesAbove make names; a bad expression or replacement is a
    one-line TargetError naming `function`."""
    pattern = compiled(function, search)
    try:
        return [pattern.sub(replace, name) for name in names]
    except RegexError as e:
        raise TargetError(str(e)) from None


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

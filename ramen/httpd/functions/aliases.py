"""Functions that name series: aliases (a fixed name, path elements, tags, a regular expression's
substitution) and names that carry values (legendValue, cactiStyle; aliasQuery, another series')."""

from __future__ import annotations

import math
import re

import numpy as np

from ramen.httpd.functions.context import Context, Evaluator
from ramen.httpd.functions.reductions import reduce_each
from ramen.httpd.functions.results import node_of, substituted
from ramen.httpd.series import Series
from ramen.httpd.target import TargetError


def alias(context: Context, seriesList: list[Series], newName: str) -> list[Series]:
    """Names every series `newName` in the legend."""
    return [s.copy(name=newName) for s in seriesList]


def alias_by_node(context: Context, seriesList: list[Series], nodes: list[int | str]) -> list[Series]:
    """Names each series by some elements of its path, joined by dots: `aliasByNode(prog.*.x, 1)`
    names each series by its function. Elements count from 0 (negative from the end); a name
    instead of a number takes that tag's value."""
    return [s.copy(name=".".join(node_of(s, node) for node in nodes)) for s in seriesList]


def to_upper_case(context: Context, seriesList: list[Series], pos: list[int]) -> list[Series]:
    """Names each series in upper case, or with the letters at positions `pos` alone (negative from
    the end; one past the name skipped): graphite-web 1.1.10's `upper`."""
    return [s.copy(name=_cased(s.name, pos, str.upper)) for s in seriesList]


def to_lower_case(context: Context, seriesList: list[Series], pos: list[int]) -> list[Series]:
    """Names each series in lower case, or with the letters at positions `pos` alone (negative from
    the end; one past the name skipped): graphite-web 1.1.10's `lower`."""
    return [s.copy(name=_cased(s.name, pos, str.lower)) for s in seriesList]


def _cased(name: str, positions: list[int], case) -> str:
    if not positions:
        return case(name)
    letters = list(name)
    for i in positions:
        if -len(letters) <= i < len(letters):
            letters[i] = case(letters[i])
    return "".join(letters)


def alias_sub(context: Context, seriesList: list[Series], search: str, replace: str) -> list[Series]:
    """Names each series by a regular expression's substitution in its name (`\\1` for a group)."""
    names = substituted("aliasSub", search, replace, [s.name for s in seriesList])
    return [s.copy(name=name) for s, name in zip(seriesList, names)]


_PRINTF_SPEC = re.compile(r"%(?:%|[-+ #0]*\d{0,3}(?:\.\d{1,2})?[diouxXeEfFgGcrsa]|)")
"""A %-format conversion of one value, its width at most 3 digits and its precision 2 (a name of a
megabyte of spaces is refused); or, matching only "%", anything else after a %."""


def alias_query(context: Context, seriesList: list[Series], search: str, replace: str, newName: str, *,
                evaluator: Evaluator) -> list[Series]:
    """Names each series by `newName`, %-formatted with the last value of another series: the one
    its name makes with the regular expression `search` replaced by `replace`
    (`aliasQuery(channel.power.*, "channel\\.power\\.([0-9]+)", "channel.frequency.\\1", "Channel %d MHz")`)."""
    for spec in _PRINTF_SPEC.finditer(newName):
        if spec.group() == "%":
            raise TargetError(f"aliasQuery: newName {newName!r} has a % that is no conversion such as %d or %.1f")
    queries = substituted("aliasQuery", search, replace, [s.name for s in seriesList])
    named = []
    for s, query, found in zip(seriesList, queries, evaluator.targets(queries)):
        if not found:
            raise TargetError(f"aliasQuery: no series found with query {query!r}")
        present = found[0].values[~np.isnan(found[0].values)]
        if not len(present):
            raise TargetError(f"aliasQuery: {query!r} has no value to name {s.name!r} by")
        try:
            named.append(s.copy(name=newName % present[-1]))
        except (TypeError, ValueError, OverflowError) as e:
            raise TargetError(f"aliasQuery: newName {newName!r} cannot be formatted with one value: {e}") from None
    return named


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


def alias_by_tags(context: Context, seriesList: list[Series], tags: list[int | str]) -> list[Series]:
    """aliasByNode by tag names (`name`; a tag query's series have their factors too) or path elements."""
    return alias_by_node(context, seriesList, tags)


UNIT_SYSTEMS = {"si": (("P", 1000.0 ** 5), ("T", 1000.0 ** 4), ("G", 1000.0 ** 3), ("M", 1000.0 ** 2), ("k", 1000.0)),
                "binary": (("Pi", 1024.0 ** 5), ("Ti", 1024.0 ** 4), ("Gi", 1024.0 ** 3), ("Mi", 1024.0 ** 2),
                           ("Ki", 1024.0))}
"""legendValue's unit prefixes, as graphite-web's glyph.UnitSystems."""


def _with_unit(value: float, system: str, *, units: str | None = None, space: bool = False) -> str:
    """`value` as graphite-web's legends print it in a unit system: 2 decimals and a prefix (and
    `units` after it; `space`: a space between)."""
    prefix = next(((p, size) for p, size in UNIT_SYSTEMS[system] if abs(value) >= size), None)
    scaled, unit = (value / prefix[1], prefix[0]) if prefix else (value, "")
    if scaled - math.floor(scaled) < 1e-11 and value > 1:
        scaled = float(math.floor(scaled))
    unit += units or ""
    return f"{scaled:.2f}{' ' if space else ''}{unit}"


def legend_value(context: Context, seriesList: list[Series], valuesTypes: list[str]) -> list[Series]:
    """Appends to each name the series' value of each aggregation (`legendValue(x, "avg", "max")`:
    `x (avg: 3.5) (max: 8.0)`); a last "si" or "binary" prints them in columns with unit prefixes
    (1.20k, 3.00Mi)."""
    types, system = list(valuesTypes), None
    if types and types[-1] in UNIT_SYSTEMS:
        system = types.pop()
    names = [s.name for s in seriesList]
    for value_type in types:
        func = value_type[:-len("Series")] if value_type.endswith("Series") else value_type
        values = [None if math.isnan(v) else v for v in reduce_each(seriesList, func)]
        for index, value in enumerate(values):
            if system is None:
                names[index] += f" ({value_type}: {value})"
            else:
                shown = "None" if value is None else _with_unit(value, system)
                names[index] = f"{names[index]:<20}{value_type:<5}{shown:<10}"
    return [s.copy(name=name) for s, name in zip(seriesList, names)]


def substr(context: Context, seriesList: list[Series], start: int = 0, stop: int = 0) -> list[Series]:
    """Names each series by the elements [start, stop) of its path (stop 0: to the end), also
    inside a function's result name: aliasByNode's ancestor."""
    renamed = []
    for s in seriesList:
        left, right = s.name.rfind("(") + 1, s.name.find(")")
        inner = s.name[left:right if right >= 0 else len(s.name)]
        parts = inner.split(".")[start:stop or None]
        renamed.append(s.copy(name=re.sub(",.*$", "", ".".join(parts))))
    return renamed


def cacti_style(context: Context, seriesList: list[Series], system: str | None = None, units: str | None = None
                ) -> list[Series]:
    """Each name padded into a column and followed by the last, largest and smallest values, as
    Cacti's legends: `x   Current:3.00  Max:8.00  Min:1.00 `, in a unit system (si, binary) and
    `units` if given."""
    def shown(value: float) -> str:
        if system:
            return _with_unit(value, system, units=units, space=bool(units))
        return f"{value:.2f}" + (f" {units}" if units else "")

    def width(values: list[float]) -> int:  # graphite-web sizes each column by the integer parts
        return max([0] + [len(shown(float(int(v if not math.isnan(v) and v else 3)))) for v in values]) + 3
    lasts, maxima, minima = (reduce_each(seriesList, func) for func in ("last", "max", "min"))
    name_width = max([0] + [len(s.name) for s in seriesList])
    widths = [width(values) for values in (lasts, maxima, minima)]
    renamed = []
    for s, *values in zip(seriesList, lasts, maxima, minima):
        cells = ["nan" if math.isnan(v) else shown(v) for v in values]
        renamed.append(s.copy(name=f"{s.name:<{name_width}} Current:{cells[0]:<{widths[0]}} "
                                   f"Max:{cells[1]:<{widths[1]}} Min:{cells[2]:<{widths[2]}} "))
    return renamed

"""A parsed target evaluated over the series fetched for it: `fetches` lists every (path, shift) to
fetch, `evaluate` binds each call's arguments (checked as graphite-web's validateParams) and
runs it."""

from __future__ import annotations

import math

from ramen.httpd.functions.context import Context, MICROS_PER_SECOND, parse_interval_s
from ramen.httpd.functions.table import FUNCTIONS, FunctionSpec, Param
from ramen.httpd.functions.transform import time_shift_s
from ramen.httpd.series import Series
from ramen.httpd.target import Call, Literal, Node, PathExpr, TargetError
from ramen.times import MAX_TIME_US


Fetched = dict[tuple[str, int], list[Series]]
"""(path expression, shift_s) -> the series it matched over the range moved by shift_s (`fetches`)."""


def fetches(node: Node, context: Context) -> list[tuple[str, int]]:
    """Every (path expression, shift in seconds) the target needs fetched, once each: a path under
    timeShift over the range moved by its shift (nested ones add up), under timeStack over each of
    its moved ranges, any other over the range. A shift that is not a literal interval is a
    TargetError here, before any fetch."""
    found: dict[tuple[str, int], None] = {}
    stack = [(node, context)]
    while stack:
        current, where = stack.pop()
        if isinstance(current, PathExpr):
            found.setdefault((current.text, where.shift_s))
        elif isinstance(current, Call):
            args, kwargs = _scoped_args(current, where)
            scoped = [*args, *((arg, scope) for _, arg, scope in kwargs)]
            stack.extend(reversed([(arg, each) for arg, scope in scoped
                                   for each in (scope if isinstance(scope, list) else [scope])]))
    return list(found)


TIME_SHIFT, TIME_STACK = "timeShift", "timeStack"
MAX_STACKED_RANGES = 100
"""Ranges one timeStack may draw, each replayed: a year of weeks fits, two years do not."""


Scope = Context | list[Context]
"""Where an argument is evaluated: a context, or (a timeStack's series) each of a list of them."""


def _scoped_args(node: Call, context: Context) -> tuple[list[tuple[Node, Scope]], list[tuple[str, Node, Scope]]]:
    """A call's arguments, each with where it is evaluated: a timeShift's series (its first, or
    `seriesList=`) in the moved range, a timeStack's in each of its moved ranges (its argument is
    then their series lists, one a range), everything else in the call's own context."""
    series_scope: Scope = context
    if node.name == TIME_SHIFT:
        series_scope = context.shifted(_shift_of(node, context))
    elif node.name == TIME_STACK:
        series_scope = [context.shifted(shift) for shift in _stack_shifts(node, context)]
    args = [(arg, series_scope if index == 0 else context) for index, arg in enumerate(node.args)]
    return args, [(name, arg, series_scope if name == "seriesList" else context) for name, arg in node.kwargs]


def _literals(node: Call) -> dict:
    """A call's literal arguments bound to its parameters (its series left out): what a timeShift
    or timeStack needs to know its ranges before anything is fetched."""
    spec = FUNCTIONS[node.name]
    literals = [arg.value if isinstance(arg, Literal) else [] for arg in node.args]
    kwargs = {name: arg.value if isinstance(arg, Literal) else [] for name, arg in node.kwargs}
    if node.args:
        literals[0] = []  # the series: not needed to know the ranges
    kwargs.pop("seriesList", None)
    bound = _bind(spec, literals if node.args else [[]], kwargs)
    return {**{p.name: p.default for p in spec.params if p.default is not None}, **bound}


def _checked_shift(node: Call, context: Context, shift: int, text: str) -> int:
    if context.from_s + shift < 0 or (context.until_s + shift) * MICROS_PER_SECOND > MAX_TIME_US:
        raise TargetError(f"{node.name}: {text!r} moves the range out of 1970 to 9999")
    return shift


def _shift_of(node: Call, context: Context) -> int:
    """The seconds a timeShift call moves its series' range by, from its literal arguments."""
    bound = _literals(node)
    return _checked_shift(node, context, time_shift_s(context, bound["timeShift"], bound["alignDst"]),
                          bound["timeShift"])


def _stack_shifts(node: Call, context: Context) -> list[int]:
    """The seconds each range of a timeStack call is moved by, from its literal arguments."""
    bound = _literals(node)
    unit, first, end = bound["timeShiftUnit"], bound["timeShiftStart"], bound["timeShiftEnd"]
    if end - first > MAX_STACKED_RANGES:
        raise TargetError(f"timeStack: {end - first} ranges, more than {MAX_STACKED_RANGES}")
    step = time_shift_s(context, unit)
    return [_checked_shift(node, context, step * k, f"{unit} x {k}") for k in range(first, end)]


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
    args = [_scoped_value(arg, fetched, scope) for arg, scope in scoped_args]
    kwargs = {name: _scoped_value(arg, fetched, scope) for name, arg, scope in scoped_kwargs}
    return spec.call(context, **_bind(spec, args, kwargs))


def _scoped_value(node: Node, fetched: Fetched, scope: Scope) -> object:
    if isinstance(scope, list):
        return [_value(node, fetched, each) for each in scope]
    return _value(node, fetched, scope)


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

"""A parsed target evaluated over the series fetched for it: `fetches` lists every (path, range)
to fetch, `evaluate` runs each call with its arguments bound by its FunctionSpec (checked as
graphite-web's validateParams)."""

from __future__ import annotations

from collections.abc import Callable

from ramen.httpd.functions.context import Context, MICROS_PER_SECOND, parse_interval_s
from ramen.httpd.functions.forecasts import regression_source
from ramen.httpd.functions.table import FUNCTIONS, FunctionSpec
from ramen.httpd.functions.transform import time_shift_s
from ramen.httpd.series import Series, SeriesLists
from ramen.httpd.tags import TagError, TagQuery
from ramen.httpd.target import Call, Literal, Node, PathExpr, TargetError, parse as parse_target
from ramen.times import MAX_TIME_US, unit_start


Fetched = dict[tuple[str, int, int], list[Series]]
"""(path expression, from_s, until_s) -> the series it matched over that range (`fetches`)."""


def fetches(node: Node, context: Context) -> list[tuple[str, int, int]]:
    """Every (path expression, from_s, until_s) the target needs fetched, once each: a path over
    the range of its scope (SERIES_SCOPES: moved by a timeShift, reaching back for a moving
    window's first points, ...), any other over the render's range. A scope that is not made of
    literals is a TargetError here, before any fetch."""
    found: dict[tuple[str, int, int], None] = {}
    stack = [(node, context)]
    while stack:
        current, where = stack.pop()
        expression = _fetched_expression(current)
        if expression is not None:
            found.setdefault((expression, where.from_s, where.until_s))
        elif isinstance(current, Call):
            args, kwargs = _scoped_args(current, where)
            scoped = [*args, *((arg, scope) for _, arg, scope in kwargs)]
            stack.extend(reversed([(arg, each) for arg, scope in scoped
                                   for each in (scope if isinstance(scope, list) else [scope])]))
    return list(found)


MAX_STACKED_RANGES = 100
"""Ranges one timeStack may draw, each replayed: a year of weeks fits, two years do not."""


Scope = Context | list[Context]
"""Where an argument is evaluated: a context, or (a timeStack's series) each of a list of them."""


def _scoped_args(node: Call, context: Context) -> tuple[list[tuple[Node, Scope]], list[tuple[str, Node, Scope]]]:
    """A call's arguments, each with where it is evaluated: its series (its first, or
    `seriesList=`) where SERIES_SCOPES says, everything else in the call's own context."""
    scope_of = SERIES_SCOPES.get(node.name)
    series_scope: Scope = context if scope_of is None else scope_of(node, context)
    args = [(arg, series_scope if index == 0 else context) for index, arg in enumerate(node.args)]
    return args, [(name, arg, series_scope if name == "seriesList" else context) for name, arg in node.kwargs]


def _literals(node: Call) -> dict:
    """A call's literal arguments bound to its parameters (its series left out): what a function
    needs to know the range of its series before anything is fetched."""
    spec = FUNCTIONS[node.name]
    literals = [arg.value if isinstance(arg, Literal) else [] for arg in node.args]
    kwargs = {name: arg.value if isinstance(arg, Literal) else [] for name, arg in node.kwargs}
    if node.args:
        literals[0] = []  # the series: not needed to know the ranges
    kwargs.pop("seriesList", None)
    bound = spec.bind(literals if node.args else [[]], kwargs)
    return {**{p.name: p.default for p in spec.params if p.default is not None}, **bound}


def _reaching_back(context: Context, seconds: int) -> Context:
    """The range from `seconds` before it (none before 1970: nothing is archived there)."""
    return context.ranging(max(0, context.from_s - seconds), context.until_s)


def _checked_range(node: Call, context: Context, from_s: int, until_s: int, text: str) -> Context:
    if from_s < 0 or until_s * MICROS_PER_SECOND > MAX_TIME_US:
        raise TargetError(f"{node.name}: {text!r} moves the range out of 1970 to 9999")
    return context.ranging(from_s, until_s)


def _time_shift_scope(node: Call, context: Context) -> Context:
    """timeShift's series: over the range moved by its shift."""
    bound = _literals(node)
    shift = time_shift_s(context, bound["timeShift"], bound["alignDst"])
    return _checked_range(node, context, context.from_s + shift, context.until_s + shift, bound["timeShift"])


def _time_stack_scope(node: Call, context: Context) -> list[Context]:
    """timeStack's series: over each of its moved ranges (its argument is their series lists)."""
    bound = _literals(node)
    unit, first, end = bound["timeShiftUnit"], bound["timeShiftStart"], bound["timeShiftEnd"]
    if end - first > MAX_STACKED_RANGES:
        raise TargetError(f"timeStack: {end - first} ranges, more than {MAX_STACKED_RANGES}")
    step = time_shift_s(context, unit)
    return [_checked_range(node, context, context.from_s + step * k, context.until_s + step * k, f"{unit} x {k}")
            for k in range(first, end)]


def _moving_scope(node: Call, context: Context) -> Context:
    """A moving window's series: from one window before the range, so that its first points have
    their whole window (graphite-web's preview): the window's time, or its points at the coarsest
    step among the series."""
    size = _literals(node)["windowSize"]
    if isinstance(size, str):
        reach = abs(parse_interval_s(size))
    else:
        if context.step_of is None:
            raise ValueError("a moving window of points needs the series' steps (Context.step_of)")
        reach = size * _step_of(_series_arg(node), context)
    return _reaching_back(context, reach)


STEP_SETTERS = {"summarize": "intervalString", "smartSummarize": "intervalString", "hitcount": "intervalString"}
"""Functions whose series come at a step of their own: the parameter that sets it."""


def _step_of(node: Node | None, context: Context) -> int:
    """The coarsest step of the series `node` gives, as graphite-web's moving window of points
    counts it (the step of the series it is given): a summary's interval (summarize's, hitcount's;
    `movingAverage(summarize(x, "5min"), 3)` reaches 15 minutes back, not 3 raw steps), else its
    paths' steps."""
    expression = _fetched_expression(node)
    if expression is not None:
        return context.step_of(expression)
    if not isinstance(node, Call):
        return 0  # a literal
    if node.name in STEP_SETTERS:
        interval = _literals(node).get(STEP_SETTERS[node.name])
        if isinstance(interval, str):
            return abs(parse_interval_s(interval))
    return max((_step_of(arg, context) for arg in (*node.args, *(arg for _, arg in node.kwargs))), default=0)


def _bootstrap_scope(node: Call, context: Context) -> Context:
    """A Holt-Winters forecast's series: from its bootstrapInterval (a week) before the range."""
    return _reaching_back(context, abs(parse_interval_s(_literals(node)["bootstrapInterval"])))


def _regression_scope(node: Call, context: Context) -> list[Context]:
    """linearRegression's series: over the range (the line is drawn there), and over its source
    range (startSourceAt to endSourceAt, the range's ends by default), where the line is fitted."""
    bound = _literals(node)
    since_s, until_s = regression_source(context, bound.get("startSourceAt"), bound.get("endSourceAt"))
    if since_s >= until_s:
        raise TargetError(f"linearRegression: its source range [{since_s}, {until_s}) is empty")
    return [context, _checked_range(node, context, since_s, until_s, "its source range")]


def _smart_summarize_scope(node: Call, context: Context) -> Context:
    """smartSummarize's series, with alignTo: from the start of alignTo's unit (years, months,
    weeks, days, hours, minutes, seconds; UTC) that holds the range's start."""
    align_to = _literals(node).get("alignTo")
    if not isinstance(align_to, str):  # graphite-web ignores the old alignToFrom, a boolean
        return context
    return _from_start_of(context, align_to)


def _hitcount_scope(node: Call, context: Context) -> Context:
    """hitcount's series, with alignToInterval: from the start of the day, hour or minute (by the
    interval's length; UTC) that holds the range's start."""
    bound = _literals(node)
    if not bound["alignToInterval"]:
        return context
    interval = abs(parse_interval_s(bound["intervalString"]))
    unit = "days" if interval >= 86400 else "hours" if interval >= 3600 else "minutes" if interval >= 60 else None
    if unit is None:
        return context
    return _from_start_of(context, unit)


def _from_start_of(context: Context, unit: str) -> Context:
    """The range from the start of the `unit` (UTC) that holds its start, as `now/d` rounds a time."""
    return context.ranging(unit_start(context.from_s * MICROS_PER_SECOND, unit) // MICROS_PER_SECOND, context.until_s)


SERIES_SCOPES: dict[str, Callable[[Call, Context], Scope]] = {
    "timeShift": _time_shift_scope,
    "timeStack": _time_stack_scope,
    **{name: _moving_scope for name in ("movingWindow", "movingAverage", "movingSum", "movingMin", "movingMax",
                                        "movingMedian", "exponentialMovingAverage")},
    **{name: _bootstrap_scope for name in ("holtWintersForecast", "holtWintersConfidenceBands",
                                           "holtWintersConfidenceArea", "holtWintersAberration")},
    "linearRegression": _regression_scope,
    "smartSummarize": _smart_summarize_scope,
    "hitcount": _hitcount_scope,
}
"""Where a function's series are fetched, when not over its own range: it computes from points
before the range, or over other ranges, as graphite-web's function fetches them again."""


def _series_arg(node: Call) -> Node | None:
    if node.args:
        return node.args[0]
    return next((arg for name, arg in node.kwargs if name == "seriesList"), None)


def _paths(node: Node | None) -> list[str]:
    """The path expressions (and tag queries) under a node."""
    found, stack = [], [node]
    while stack:
        current = stack.pop()
        expression = _fetched_expression(current)
        if expression is not None:
            found.append(expression)
        elif isinstance(current, Call):
            stack.extend([*current.args, *(arg for _, arg in current.kwargs)])
    return found


class FetchesNeeded(Exception):
    """Targets made at evaluation (applyByNode's, useSeriesAbove's) name paths not fetched yet: the
    render fetches `wanted` ((path expression, from_s, until_s), as `fetches` lists them) and
    evaluates again, as graphite-web's evaluateTarget fetches before it evaluates a made target."""

    def __init__(self, wanted: list[tuple[str, int, int]]) -> None:
        super().__init__(f"{len(wanted)} path expressions to fetch")
        self.wanted = wanted


def evaluate_all(nodes: list[Node], fetched: Fetched, context: Context) -> list[Series]:
    """The series of a render's targets, in order; FetchesNeeded with what every target made at
    evaluation still needs, so that one more round of fetches serves them all."""
    results, wanted = [], {}
    for node in nodes:
        try:
            results.extend(evaluate(node, fetched, context))
        except FetchesNeeded as more:
            wanted.update(dict.fromkeys(more.wanted))
    if wanted:
        raise FetchesNeeded(list(wanted))
    return results


def evaluate(node: Node, fetched: Fetched, context: Context) -> list[Series]:
    """The series a target yields. `fetched` holds the series each (path expression, range) of
    `fetches` matched (a path absent or matching nothing yields no series, as in graphite-web).
    The fetched series are not modified."""
    value = _value(node, fetched, context)
    if isinstance(value, SeriesLists):
        raise TargetError(f"a target must yield series, not lists of them ({node.name}'s): reduce them with "
                          "reduceSeries")
    if not isinstance(value, list):
        raise TargetError(f"a target must yield series, not the literal {value!r}")
    return value


def _value(node: Node, fetched: Fetched, context: Context) -> object:
    if isinstance(node, Literal):
        return node.value
    expression = _fetched_expression(node)
    if expression is not None:
        return [s.copy(path_expression=str(expression), xfiles_factor=context.xfiles_factor)  # a str, to pickle
                for s in fetched.get((expression, context.from_s, context.until_s), [])]
    spec = FUNCTIONS.get(node.name)
    if spec is None:
        raise TargetError(f"unknown function {node.name!r}")
    scoped_args, scoped_kwargs = _scoped_args(node, context)
    args = [_scoped_value(arg, fetched, scope) for arg, scope in scoped_args]
    kwargs = {name: _scoped_value(arg, fetched, scope) for name, arg, scope in scoped_kwargs}
    return _call(spec, args, kwargs, fetched, context)


def _call(spec: FunctionSpec, args: list, kwargs: dict, fetched: Fetched, context: Context) -> object:
    bound = spec.bind(args, kwargs)
    if spec.evaluates:
        bound["evaluator"] = _Evaluator(fetched, context)
    return spec.call(context, **bound)


MAX_MADE_TARGETS = 1000
"""Targets one call may make (applyByNode's, one per prefix), each parsed and evaluated."""


class _Evaluator:
    """context.Evaluator over the render's fetched series, in a call's context."""

    def __init__(self, fetched: Fetched, context: Context) -> None:
        self.fetched = fetched
        self.context = context

    def apply(self, name: str, series_lists: list[list[Series]]) -> list[Series]:
        """A function that computes from points outside the range (SERIES_SCOPES) is refused: the
        series it would be given were fetched over the range alone."""
        spec = FUNCTIONS.get(name)
        if spec is None:
            raise TargetError(f"unknown function {name!r} to reduce with")
        if name in SERIES_SCOPES:
            raise TargetError(f"{name} computes from points outside the range: it cannot reduce mapSeries' lists")
        return _call(spec, series_lists, {}, self.fetched, self.context)

    def targets(self, texts: list[str]) -> list[list[Series]]:
        if len(texts) > MAX_MADE_TARGETS:
            raise TargetError(f"{len(texts)} targets made by one call, more than {MAX_MADE_TARGETS}")
        nodes = [parse_target(text, FUNCTIONS) for text in texts]
        wanted = {key: None for node in nodes for key in fetches(node, self.context) if key not in self.fetched}
        if wanted:
            raise FetchesNeeded(list(wanted))
        return [evaluate(node, self.fetched, self.context) for node in nodes]


SERIES_BY_TAG = "seriesByTag"


def _fetched_expression(node: Node | None) -> str | None:
    """What a node has fetched, as graphite-web's evaluator fetches it: a path's expression, a
    seriesByTag call's tag query; None for anything else."""
    if isinstance(node, PathExpr):
        return node.text
    if isinstance(node, Call) and node.name == SERIES_BY_TAG:
        return tag_query(node)
    return None


def tag_query(node: Call) -> TagQuery:
    """A seriesByTag call's expressions; TargetError unless they are strings that make a query."""
    if node.kwargs:
        raise TargetError(f"{SERIES_BY_TAG}: takes its tag expressions by position, not by name")
    values = [arg.value if isinstance(arg, Literal) else [] for arg in node.args]
    FUNCTIONS[SERIES_BY_TAG].bind(values, {})  # strings, at least one
    try:
        return TagQuery(values, node.text)
    except TagError as e:
        raise TargetError(f"{SERIES_BY_TAG}: {e}") from None


def _scoped_value(node: Node, fetched: Fetched, scope: Scope) -> object:
    if isinstance(scope, list):
        return [_value(node, fetched, each) for each in scope]
    return _value(node, fetched, scope)

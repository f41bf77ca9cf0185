"""The table of every function a target may call: its parameters as graphite-web's Param.toJSON
describes them (so Grafana's function editor offers them), and what `GET /functions` answers."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ramen.httpd.functions import aliases, calculate, combine, filters, forecasts, generators, graph, transform
from ramen.httpd.functions.context import parse_interval_s
from ramen.httpd.functions.reductions import aggregation_names
from ramen.httpd.series import Series, SeriesLists
from ramen.httpd.target import TargetError


MODULE_NAME = "ramen.httpd.functions"
"""What `/functions` says each function's module is (graphite-web: graphite.render.functions)."""


INTERVAL_SUGGESTIONS = ["10min", "1h", "1d"]
WINDOW_SUGGESTIONS = [5, 7, 10, "1min", "5min", "10min", "30min", "1hour"]
MAX_INTEGER_ARGUMENT = 2**31 - 1
"""Nodes, counts, points, seconds and digits are all far smaller; numpy takes some as a C int."""


@dataclass(frozen=True)
class Param:
    """One parameter, as graphite-web's Param.toJSON describes it."""
    name: str
    type: str
    """graphite-web's type names: seriesList, seriesLists, float, integer, intOrInf, intOrInterval,
    interval, string, boolean, aggFunc, node, nodeOrTag, any."""
    required: bool = False
    default: object = None
    multiple: bool = False
    options: tuple = ()
    suggestions: tuple = ()

    def to_json(self) -> dict:
        """Only what is set, as graphite-web writes it (Grafana reads absence as false/none)."""
        described: dict = {"name": self.name, "type": self.type}
        if self.required:
            described["required"] = True
        if self.default is not None:
            described["default"] = "inf" if self.default == math.inf else self.default
        if self.multiple:
            described["multiple"] = True
        if self.options:
            described["options"] = sorted(self.options, key=str)
        if self.suggestions:
            described["suggestions"] = list(self.suggestions)
        return described


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    call: Callable[..., list[Series]]
    group: str
    params: tuple[Param, ...]
    description: str = field(default="")
    evaluates: bool = False
    """Its call takes an `evaluator` too (context.Evaluator): it calls another function by name
    (reduceSeries), or evaluates targets it makes (applyByNode, useSeriesAbove, aliasQuery)."""

    def signature(self) -> str:
        """As graphite-web shows it: `summarize(seriesList, intervalString, func='sum', alignToFrom=False)`."""
        parts = []
        for param in self.params:
            if param.multiple:
                parts.append(f"*{param.name}")
            elif param.default is not None:
                parts.append(f"{param.name}={param.default!r}")
            elif not param.required and param.type != "seriesList":
                parts.append(f"{param.name}=None")
            else:
                parts.append(param.name)
        return f"{self.name}({', '.join(parts)})"

    def to_json(self) -> dict:
        return {"name": self.name, "function": self.signature(), "description": self.description,
                "module": MODULE_NAME, "group": self.group, "params": [p.to_json() for p in self.params]}

    def bind(self, args: list, kwargs: dict) -> dict:
        """Arguments by parameter name, checked and converted by type (graphite-web's validateParams)."""
        params = self.params
        bound: dict = {}
        for index, value in enumerate(args):
            if index < len(params) and not params[index].multiple:
                param = params[index]
                bound[param.name] = self._checked(param, value)
            elif params and params[-1].multiple:
                param = params[-1]
                bound.setdefault(param.name, []).append(self._checked(param, value))
            else:
                raise TargetError(f"{self.name}: too many arguments ({len(args)}; it takes {len(params)})")
        for name, value in kwargs.items():
            param = next((p for p in params if p.name == name), None)
            if param is None:
                raise TargetError(f"{self.name}: no parameter {name!r} (it takes {', '.join(p.name for p in params)})")
            if name in bound:
                raise TargetError(f"{self.name}: parameter {name!r} given twice")
            checked = self._checked(param, value)
            bound[name] = [checked] if param.multiple else checked
        for param in params:
            if param.required and param.name not in bound:
                raise TargetError(f"{self.name}: missing required parameter {param.name!r}")
            if param.multiple:
                bound.setdefault(param.name, [])
        return bound

    def _checked(self, param: Param, value: object) -> object:
        """`value` as `param` needs it; TargetError naming the function, parameter and value otherwise."""
        kind = param.type
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)

        def bad(expected: str) -> TargetError:
            shown = ("mapSeries' lists" if isinstance(value, SeriesLists) else
                     "a series list" if isinstance(value, list) else repr(value))
            return TargetError(f"{self.name}: parameter {param.name!r} must be {expected}, not {shown}")

        if value is None and not param.required:
            return param.default
        if kind != "float" and is_number and isinstance(value, int) and abs(value) > MAX_INTEGER_ARGUMENT:
            raise bad(f"an integer within -{MAX_INTEGER_ARGUMENT:,}..{MAX_INTEGER_ARGUMENT:,}")
        if kind == "seriesLists":
            if not isinstance(value, SeriesLists):
                raise bad("lists of series, as mapSeries makes them")
            return value
        if isinstance(value, SeriesLists) and kind in ("seriesList", "any"):  # only reduceSeries takes them
            raise bad("a series list")
        if kind == "seriesList":
            if not isinstance(value, list):
                raise bad("a series list (a path or a function of series)")
            return value
        if kind == "any":
            return value
        if isinstance(value, list):
            raise bad({"float": "a number", "integer": "an integer", "node": "an integer",
                       "intOrInf": "an integer or inf", "interval": 'an interval string such as "1h"',
                       "intOrInterval": "a number of points or an interval", "aggFunc": "a string",
                       "aggOrSeriesFunc": "a string"}.get(kind, f"a {kind}"))
        if kind == "float":
            if not is_number:
                raise bad("a number")
            # graphite-web 1.1.10's evaluator makes it a float before the call (validateParams):
            # `offset(x, 50)` is tagged `offset: 50.0`, `constantLine(42)` named `42.0`.
            return float(value)
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
        if kind in ("string", "tag", "aggFunc", "aggOrSeriesFunc"):
            if not isinstance(value, str):
                raise bad("a string")
            if param.options and value not in param.options:
                raise bad(f"one of {', '.join(o for o in param.options if isinstance(o, str))}")
            return value
        return value


_SERIES = Param("seriesList", "seriesList", required=True)
_SERIES_LISTS = Param("seriesLists", "seriesList", required=True, multiple=True)
_POSITIONS = Param("position", "node", multiple=True)
_SHIFT_SUGGESTIONS = ("1h", "6h", "12h", "1d", "2d", "7d", "14d", "30d")
_TWO_LISTS = (Param("seriesListFirstPos", "seriesList", required=True),
              Param("seriesListSecondPos", "seriesList", required=True))
_THRESHOLD = Param("n", "float", required=True)
_COUNT = Param("n", "integer", required=True)
_WINDOW = Param("windowSize", "intOrInterval", required=True, suggestions=tuple(WINDOW_SUGGESTIONS))
_HOLT_WINTERS = (Param("bootstrapInterval", "interval", default="7d", suggestions=("7d", "30d")),
                 Param("seasonality", "interval", default="1d", suggestions=("1d", "7d")))
_AGG_OPTIONS = tuple(aggregation_names())
_CONSOLIDATION_OPTIONS = ("sum", "average", "avg", "avg_zero", "min", "max", "first", "last")
_LEGEND_OPTIONS = (*_AGG_OPTIONS, *(f"{name}Series" for name in _AGG_OPTIONS), *aliases.UNIT_SYSTEMS)
_CALLBACK_OPTIONS = (*_AGG_OPTIONS, "averageSeries", "diffSeries", "maxSeries", "minSeries", "multiplySeries",
                     "sumSeries")
"""What groupByNode(s) combine a group with: an aggregation, or a function of ours that aggregates."""


def _series_by_tag(context, tagExpressions: list[str]) -> list[Series]:
    """The series whose tags match every expression: `tag=value`, `tag!=value`, `tag=~regex`,
    `tag!=~regex` (`seriesByTag('name=demo.per_minute.bytes', 'host=~host0[0-4]')`). A series' tags
    are `name` (`<program>.<function>.<field>`) and its function's factors; it is named
    `demo.per_minute.bytes;host=host00`. Fetched as a path is: evaluation never calls this."""
    raise AssertionError("seriesByTag is fetched as a path is (evaluation.tag_query), never called")


def _spec(name: str, call: Callable[..., list[Series]], group_name: str, *params: Param,
          evaluates: bool = False) -> FunctionSpec:
    return FunctionSpec(name, call, group_name, params, " ".join((call.__doc__ or "").split()), evaluates)


FUNCTIONS: dict[str, FunctionSpec] = {spec.name: spec for spec in (
    _spec("alias", aliases.alias, "Alias", _SERIES, Param("newName", "string", required=True)),
    _spec("aliasQuery", aliases.alias_query, "Alias", _SERIES, Param("search", "string", required=True),
          Param("replace", "string", required=True), Param("newName", "string", required=True), evaluates=True),
    _spec("aliasByNode", aliases.alias_by_node, "Alias", _SERIES,
          Param("nodes", "nodeOrTag", required=True, multiple=True)),
    _spec("aliasByMetric", aliases.alias_by_metric, "Alias", _SERIES),
    _spec("upper", aliases.to_upper_case, "Alias", _SERIES, Param("pos", "integer", multiple=True)),
    _spec("lower", aliases.to_lower_case, "Alias", _SERIES, Param("pos", "integer", multiple=True)),
    _spec("aliasSub", aliases.alias_sub, "Alias", _SERIES, Param("search", "string", required=True),
          Param("replace", "string", required=True)),
    _spec("aliasByTags", aliases.alias_by_tags, "Alias", _SERIES,
          Param("tags", "nodeOrTag", required=True, multiple=True)),
    _spec("legendValue", aliases.legend_value, "Alias", _SERIES,
          Param("valuesTypes", "string", multiple=True, options=_LEGEND_OPTIONS)),
    _spec("sumSeries", combine.sum_series, "Combine", _SERIES_LISTS),
    _spec("averageSeries", combine.average_series, "Combine", _SERIES_LISTS),
    _spec("maxSeries", combine.max_series, "Combine", _SERIES_LISTS),
    _spec("minSeries", combine.min_series, "Combine", _SERIES_LISTS),
    _spec("diffSeries", combine.diff_series, "Combine", _SERIES_LISTS),
    _spec("multiplySeries", combine.multiply_series, "Combine", _SERIES_LISTS),
    _spec("weightedAverage", combine.weighted_average, "Combine", Param("seriesListAvg", "seriesList", required=True),
          Param("seriesListWeight", "seriesList", required=True), Param("nodes", "nodeOrTag", multiple=True)),
    _spec("divideSeries", combine.divide_series, "Combine", Param("dividendSeriesList", "seriesList", required=True),
          Param("divisorSeries", "seriesList", required=True)),
    _spec("groupByNode", combine.group_by_node, "Combine", _SERIES, Param("nodeNum", "nodeOrTag", required=True),
          Param("callback", "aggOrSeriesFunc", default="average", options=_CALLBACK_OPTIONS)),
    _spec("groupByNodes", combine.group_by_nodes, "Combine", _SERIES,
          Param("callback", "aggOrSeriesFunc", required=True, options=_CALLBACK_OPTIONS),
          Param("nodes", "nodeOrTag", multiple=True)),
    _spec("aggregate", combine.aggregate, "Combine", _SERIES,
          Param("func", "aggFunc", required=True, options=_AGG_OPTIONS),
          Param("xFilesFactor", "float")),
    _spec("group", combine.group, "Combine", Param("seriesLists", "seriesList", multiple=True)),
    _spec("applyByNode", combine.apply_by_node, "Combine", _SERIES, Param("nodeNum", "node", required=True),
          Param("templateFunction", "string", required=True), Param("newName", "string"), evaluates=True),
    _spec("groupByTags", combine.group_by_tags, "Combine", _SERIES,
          Param("callback", "aggOrSeriesFunc", required=True, options=_CALLBACK_OPTIONS),
          Param("tags", "tag", required=True, multiple=True)),
    *(_spec(name, combine.map_series, "Combine", _SERIES, Param("mapNodes", "nodeOrTag", required=True, multiple=True))
      for name in ("mapSeries", "map")),
    *(_spec(name, combine.reduce_series, "Combine", Param("seriesLists", "seriesLists", required=True),
            Param("reduceFunction", "string", required=True), Param("reduceNode", "node", required=True),
            Param("reduceMatchers", "string", required=True, multiple=True), evaluates=True)
      for name in ("reduceSeries", "reduce")),
    _spec("rangeOfSeries", combine.range_of_series, "Combine", _SERIES_LISTS),
    _spec("stddevSeries", combine.stddev_series, "Combine", _SERIES_LISTS),
    _spec("countSeries", combine.count_series, "Combine", Param("seriesLists", "seriesList", multiple=True)),
    _spec("percentileOfSeries", combine.percentile_of_series, "Combine", _SERIES, Param("n", "float", required=True),
          Param("interpolate", "boolean", default=False)),
    _spec("aggregateWithWildcards", combine.aggregate_with_wildcards, "Combine", _SERIES,
          Param("func", "aggFunc", required=True, options=_AGG_OPTIONS), _POSITIONS),
    *(_spec(f"{func}SeriesWithWildcards", combine.with_wildcards(func), "Combine", _SERIES, _POSITIONS)
      for func in ("sum", "average", "multiply")),
    _spec("aggregateSeriesLists", combine.aggregate_series_lists, "Combine", *_TWO_LISTS,
          Param("func", "aggFunc", required=True, options=_AGG_OPTIONS), Param("xFilesFactor", "float")),
    *(_spec(f"{func}SeriesLists", combine.series_lists_by(func), "Combine", *_TWO_LISTS)
      for func in ("sum", "diff", "multiply")),
    _spec("divideSeriesLists", combine.divide_series_lists, "Combine",
          Param("dividendSeriesList", "seriesList", required=True),
          Param("divisorSeriesList", "seriesList", required=True)),
    _spec("powSeries", combine.pow_series, "Combine", Param("seriesList", "seriesList", required=True, multiple=True)),
    _spec("avg", combine.average_series, "Combine", _SERIES_LISTS),
    _spec("sum", combine.sum_series, "Combine", _SERIES_LISTS),
    _spec("asPercent", combine.as_percent, "Combine", _SERIES, Param("total", "any"),
          Param("nodes", "nodeOrTag", multiple=True)),
    _spec("pct", combine.as_percent, "Combine", _SERIES, Param("total", "any"),
          Param("nodes", "nodeOrTag", multiple=True)),
    _spec("add", transform.add, "Transform", _SERIES, Param("constant", "float", required=True)),
    _spec("round", transform.round_values, "Transform", _SERIES, Param("precision", "integer", default=0)),
    _spec("compressPeriodicGaps", transform.compress_periodic_gaps, "Transform", _SERIES),
    _spec("exp", transform.exponential, "Transform", _SERIES),
    _spec("logit", transform.logit, "Transform", _SERIES),
    _spec("sigmoid", transform.sigmoid, "Transform", _SERIES),
    _spec("minMax", transform.min_max, "Transform", _SERIES),
    _spec("scaleToSeconds", transform.scale_to_seconds, "Transform", _SERIES,
          Param("seconds", "float", required=True)),
    _spec("interpolate", transform.interpolate, "Transform", _SERIES, Param("limit", "intOrInf", default=math.inf)),
    _spec("integralByInterval", transform.integral_by_interval, "Transform", _SERIES,
          Param("intervalUnit", "string", required=True)),
    _spec("timeSlice", transform.time_slice, "Transform", _SERIES, Param("startSliceAt", "date", required=True),
          Param("endSliceAt", "date", default="now")),
    _spec("substr", aliases.substr, "Special", _SERIES, Param("start", "node", default=0),
          Param("stop", "node", default=0)),
    _spec("cumulative", transform.cumulative, "Special", _SERIES),
    _spec("fallbackSeries", transform.fallback_series, "Special", _SERIES,
          Param("fallback", "seriesList", required=True)),
    _spec("scale", transform.scale, "Transform", _SERIES, Param("factor", "float", required=True)),
    _spec("offset", transform.offset, "Transform", _SERIES, Param("factor", "float", required=True)),
    _spec("summarize", transform.summarize, "Transform", _SERIES,
          Param("intervalString", "interval", required=True, suggestions=tuple(INTERVAL_SUGGESTIONS)),
          Param("func", "aggFunc", default="sum", options=_AGG_OPTIONS),
          Param("alignToFrom", "boolean", default=False)),
    _spec("smartSummarize", transform.smart_summarize, "Transform", _SERIES,
          Param("intervalString", "interval", required=True, suggestions=tuple(INTERVAL_SUGGESTIONS)),
          Param("func", "aggFunc", default="sum", options=_AGG_OPTIONS),
          Param("alignTo", "string", options=(None, "years", "months", "weeks", "days", "hours", "minutes", "seconds",
                                              True, False))),
    _spec("transformNull", transform.transform_null, "Transform", _SERIES, Param("default", "float", default=0),
          Param("referenceSeries", "seriesList")),
    _spec("absolute", transform.absolute, "Transform", _SERIES),
    _spec("derivative", transform.derivative, "Transform", _SERIES),
    _spec("integral", transform.integral, "Transform", _SERIES),
    _spec("timeShift", transform.time_shift, "Transform", _SERIES,
          Param("timeShift", "interval", required=True,
                suggestions=_SHIFT_SUGGESTIONS),
          Param("resetEnd", "boolean", default=True), Param("alignDst", "boolean", default=False)),
    _spec("squareRoot", transform.square_root, "Transform", _SERIES),
    _spec("pow", transform.power, "Transform", _SERIES, Param("factor", "float", required=True)),
    _spec("invert", transform.invert, "Transform", _SERIES),
    _spec("log", transform.logarithm, "Transform", _SERIES, Param("base", "integer", default=10)),
    _spec("delay", transform.delay, "Transform", _SERIES, Param("steps", "integer", required=True)),
    _spec("offsetToZero", transform.offset_to_zero, "Transform", _SERIES),
    _spec("isNonNull", transform.is_non_null, "Transform", _SERIES),
    _spec("changed", transform.changed, "Special", _SERIES),
    _spec("constantLine", transform.constant_line, "Special", Param("value", "float", required=True)),
    _spec("color", graph.color, "Graph", _SERIES, Param("theColor", "string", required=True)),
    _spec("alpha", graph.alpha, "Graph", _SERIES, Param("alpha", "float", required=True)),
    _spec("lineWidth", graph.line_width, "Graph", _SERIES, Param("width", "float", required=True)),
    _spec("dashed", graph.dashed, "Graph", _SERIES, Param("dashLength", "integer", default=5)),
    _spec("secondYAxis", graph.second_y_axis, "Graph", _SERIES),
    _spec("drawAsInfinite", graph.draw_as_infinite, "Graph", _SERIES),
    _spec("areaBetween", graph.area_between, "Graph", _SERIES),
    _spec("verticalLine", graph.vertical_line, "Graph", Param("ts", "date", required=True), Param("label", "string"),
          Param("color", "string")),
    _spec("cactiStyle", aliases.cacti_style, "Special", _SERIES, Param("system", "string", options=("binary", "si")),
          Param("units", "string")),
    _spec("identity", generators.identity, "Calculate", Param("name", "string", required=True)),
    *(_spec(name, generators.time_function, "Transform", Param("name", "string", required=True),
            Param("step", "integer", default=60)) for name in ("timeFunction", "time")),
    *(_spec(name, generators.sin_function, "Transform", Param("name", "string", required=True),
            Param("amplitude", "integer", default=1), Param("step", "integer", default=60))
      for name in ("sinFunction", "sin")),
    *(_spec(name, generators.random_walk, "Special", Param("name", "string", required=True),
            Param("step", "integer", default=60)) for name in ("randomWalk", "randomWalkFunction")),
    _spec("stacked", graph.stacked, "Graph", _SERIES, Param("stack", "string")),
    _spec("events", generators.events, "Special", Param("tags", "string", required=True, multiple=True)),
    _spec("seriesByTag", _series_by_tag, "Special", Param("tagExpressions", "string", required=True, multiple=True)),
    _spec("threshold", graph.threshold, "Graph", Param("value", "float", required=True), Param("label", "string"),
          Param("color", "string")),
    _spec("hitcount", transform.hitcount, "Transform", _SERIES,
          Param("intervalString", "interval", required=True, suggestions=tuple(INTERVAL_SUGGESTIONS)),
          Param("alignToInterval", "boolean", default=False)),
    _spec("timeStack", transform.time_stack, "Transform", _SERIES,
          Param("timeShiftUnit", "interval", default="1d", suggestions=_SHIFT_SUGGESTIONS),
          Param("timeShiftStart", "integer", default=0), Param("timeShiftEnd", "integer", default=7)),
    _spec("keepLastValue", transform.keep_last_value, "Transform", _SERIES,
          Param("limit", "intOrInf", default=math.inf)),
    _spec("nonNegativeDerivative", transform.non_negative_derivative, "Transform", _SERIES, Param("maxValue", "float"),
          Param("minValue", "float")),
    _spec("perSecond", transform.per_second, "Transform", _SERIES, Param("maxValue", "float"),
          Param("minValue", "float")),
    _spec("consolidateBy", transform.consolidate_by, "Special", _SERIES,
          Param("consolidationFunc", "string", required=True, options=_CONSOLIDATION_OPTIONS)),
    *(_spec(name, transform.set_xfiles_factor, "Special", _SERIES, Param("xFilesFactor", "float", required=True))
      for name in ("setXFilesFactor", "xFilesFactor")),
    _spec("movingWindow", calculate.moving_window, "Calculate", _SERIES, _WINDOW,
          Param("func", "aggFunc", default="average", options=_AGG_OPTIONS), Param("xFilesFactor", "float")),
    *(_spec(f"moving{func.capitalize()}", calculate.moving_by(func), "Calculate", _SERIES, _WINDOW,
            Param("xFilesFactor", "float"))
      for func in ("average", "sum", "min", "max", "median")),
    _spec("stdev", calculate.stdev, "Calculate", _SERIES, Param("points", "integer", required=True),
          Param("windowTolerance", "float", default=0.1)),
    _spec("aggregateLine", calculate.aggregate_line, "Calculate", _SERIES,
          Param("func", "aggFunc", default="average", options=_AGG_OPTIONS),
          Param("keepStep", "boolean", default=False)),
    _spec("exponentialMovingAverage", calculate.exponential_moving_average, "Calculate", _SERIES,
          Param("windowSize", "intOrInterval", required=True, suggestions=tuple(WINDOW_SUGGESTIONS))),
    _spec("nPercentile", calculate.n_percentile, "Calculate", _SERIES, Param("n", "float", required=True)),
    _spec("holtWintersForecast", forecasts.holt_winters_forecast, "Calculate", _SERIES, *_HOLT_WINTERS),
    *(_spec(name, call, "Calculate", _SERIES, Param("delta", "integer", default=3), *_HOLT_WINTERS)
      for name, call in (("holtWintersConfidenceBands", forecasts.holt_winters_confidence_bands),
                         ("holtWintersConfidenceArea", forecasts.holt_winters_confidence_area),
                         ("holtWintersAberration", forecasts.holt_winters_aberration))),
    _spec("linearRegression", forecasts.linear_regression, "Calculate", _SERIES, Param("startSourceAt", "date"),
          Param("endSourceAt", "date")),
    _spec("highestAverage", filters.ranked_by("average"), "Filter Series", _SERIES, _COUNT),
    _spec("highestCurrent", filters.ranked_by("last"), "Filter Series", _SERIES, _COUNT),
    _spec("highestMax", filters.ranked_by("max"), "Filter Series", _SERIES, _COUNT),
    _spec("highest", filters.highest, "Filter Series", _SERIES, _COUNT,
          Param("func", "aggFunc", default="average", options=_AGG_OPTIONS)),
    _spec("lowestAverage", filters.ranked_by("average", lowest=True), "Filter Series", _SERIES, _COUNT),
    _spec("lowestCurrent", filters.ranked_by("last", lowest=True), "Filter Series", _SERIES, _COUNT),
    _spec("lowest", filters.lowest, "Filter Series", _SERIES, _COUNT,
          Param("func", "aggFunc", default="average", options=_AGG_OPTIONS)),
    _spec("filterSeries", filters.filter_series, "Filter Series", _SERIES,
          Param("func", "aggFunc", required=True, options=_AGG_OPTIONS),
          Param("operator", "string", required=True, options=tuple(filters.OPERATORS)),
          Param("threshold", "float", required=True)),
    *(_spec(f"{what}{'Above' if operator == '>' else 'Below'}", filters.filtered_by(func, operator), "Filter Series",
            _SERIES, _THRESHOLD)
      for what, func in (("current", "last"), ("average", "average"), ("maximum", "max"), ("minimum", "min"))
      for operator in (">", "<=")),
    _spec("exclude", filters.exclude, "Filter Series", _SERIES, Param("pattern", "string", required=True)),
    _spec("grep", filters.grep, "Filter Series", _SERIES, Param("pattern", "string", required=True)),
    _spec("useSeriesAbove", filters.use_series_above, "Filter Series", _SERIES, Param("value", "float", required=True),
          Param("search", "string", required=True), Param("replace", "string", required=True), evaluates=True),
    _spec("removeEmptySeries", filters.remove_empty_series, "Filter Series", _SERIES, Param("xFilesFactor", "float")),
    _spec("removeAbovePercentile", filters.remove_above_percentile, "Filter Data", _SERIES, _THRESHOLD),
    _spec("removeBelowPercentile", filters.remove_below_percentile, "Filter Data", _SERIES, _THRESHOLD),
    _spec("removeBetweenPercentile", filters.remove_between_percentile, "Filter Series", _SERIES, _THRESHOLD),
    _spec("averageOutsidePercentile", filters.average_outside_percentile, "Filter Series", _SERIES, _THRESHOLD),
    _spec("mostDeviant", filters.most_deviant, "Filter Series", _SERIES, _COUNT),
    _spec("unique", filters.unique, "Filter Series", _SERIES_LISTS),
    _spec("removeBelowValue", filters.remove_below_value, "Filter Data", _SERIES, _THRESHOLD),
    _spec("removeAboveValue", filters.remove_above_value, "Filter Data", _SERIES, _THRESHOLD),
    _spec("limit", filters.limit, "Filter Series", _SERIES, _COUNT),
    _spec("sortByMaxima", filters.sort_by_maxima, "Sorting", _SERIES),
    _spec("sortByName", filters.sort_by_name, "Sorting", _SERIES, Param("natural", "boolean", default=False),
          Param("reverse", "boolean", default=False)),
    _spec("sortByTotal", filters.sort_by_total, "Sorting", _SERIES),
    _spec("sortByMinima", filters.sort_by_minima, "Sorting", _SERIES),
    _spec("sortBy", filters.sort_by, "Sorting", _SERIES,
          Param("func", "aggFunc", default="average", options=_AGG_OPTIONS),
          Param("reverse", "boolean", default=False)),
)}
"""Every function a target may call, by the name a target calls it."""


PIE_FUNCTIONS = {name: {"name": name, "function": f"{name}(series)", "description": description,
                        "module": MODULE_NAME, "group": "Pie",
                        "params": [{"name": "series", "type": "series", "required": True}]}
                 for name, description in (("average", "Return the average"), ("maximum", "Return the maximum"),
                                           ("minimum", "Return the minimum"))}
"""What a pie chart reduces a series to, as graphite-web lists them for `/functions?type=pie`."""


def describe_functions(group_name: str | None = None, grouped: bool = False, pie: bool = False) -> dict:
    """What `GET /functions` answers (graphite-web's shape), optionally one group or grouped by group;
    `pie`: the pie functions (`type=pie`) instead of the series functions."""
    every = PIE_FUNCTIONS if pie else {name: spec.to_json() for name, spec in FUNCTIONS.items()}
    described: dict = {}
    for name, info in every.items():
        if group_name is not None and info["group"] != group_name:
            continue
        if grouped:
            described.setdefault(info["group"], {})[name] = info
        else:
            described[name] = info
    return described

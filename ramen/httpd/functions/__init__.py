"""Graphite's target functions over ramen's series: `evaluate` walks a parsed target, and
`FUNCTIONS` lists what it knows, described as graphite-web's `/functions` answers so Grafana's
function editor offers them.

Semantics and the names of results follow graphite-web's render/functions.py (Grafana users read
those names in legends and alias them by node), computed over whole numpy arrays with NaN as
Graphite's null: a reduction over nothing but nulls is null, never 0. Where graphite-web has a bug
we keep its names but not the bug; each such place says so.

The caller resolves globs and fetches: `evaluate` gets, for each path expression of the target
and each range it is needed over (`fetches`: the render's, or where evaluation.SERIES_SCOPES
says: moved by timeShift, reaching back for a moving window's first points or a forecast's
bootstrap, ...), the series it matched. Nothing here reads data but what it is given.

Each function takes the render's Context and its bound parameters, and returns a new list (the
series it is given are not modified). They live by graphite-web's groups: aliases, combine,
transform, calculate, forecasts, filters, graph; table lists them, evaluation runs a target
through them.
"""

from ramen.httpd.functions.context import Context, parse_interval_s
from ramen.httpd.functions.evaluation import Fetched, FetchesNeeded, evaluate, evaluate_all, fetches
from ramen.httpd.functions.reductions import AGGREGATIONS, aggregate_rows, consolidate_values
from ramen.httpd.functions.table import FUNCTIONS, FunctionSpec, Param, describe_functions
from ramen.httpd.target import TargetError


__all__ = ["AGGREGATIONS", "Context", "FUNCTIONS", "Fetched", "FetchesNeeded", "FunctionSpec", "Param",
           "aggregate_rows", "consolidate_values", "describe_functions", "evaluate", "evaluate_all", "fetches",
           "parse_interval_s", "TargetError"]

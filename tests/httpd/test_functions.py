"""Target functions against hand-computed values, and against graphite-web's own functions where
Debian's graphite-web can be imported."""

import copy
import dataclasses
import datetime
import math
import os
import time
import types

import numpy as np
import pytest

from ramen.httpd.functions import (AGGREGATIONS, FUNCTIONS, Context, FetchesNeeded, describe_functions, evaluate,
                                  evaluate_all, fetches, parse_interval_s)
from ramen.httpd.series import Series
from ramen.httpd.tags import tagged_name
from ramen.httpd.target import Literal, TargetError, parse as parse_target
from tests.httpd.graphite_web import graphite_modules

NAN = math.nan
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
CONTEXT = Context(from_s=0, until_s=60, now_s=60)
REQUIRED = ("alias", "aliasByNode", "aliasByMetric", "sumSeries", "averageSeries", "maxSeries", "minSeries", "scale",
            "offset", "summarize", "consolidateBy", "keepLastValue", "nonNegativeDerivative", "perSecond",
            "movingAverage", "highestAverage", "limit", "sortByMaxima", "asPercent", "group")


def parse(text):
    return parse_target(text, FUNCTIONS)


def series(name, values, start=0, step=10, **kw):
    return Series(name=name, start=start, step=step, values=np.array(values, dtype=np.float64), **kw)


def fetched():
    """prog.func.<host>.bytes for two hosts, a coarser prog.slow.x and a counter."""
    return {
        "prog.func.*.bytes": [series("prog.func.h1.bytes", [1, 2, NAN, 4, NAN, 6]),
                              series("prog.func.h2.bytes", [10, NAN, NAN, 40, 50, 60])],
        "prog.func.h1.bytes": [series("prog.func.h1.bytes", [1, 2, NAN, 4, NAN, 6])],
        "prog.slow.x": [series("prog.slow.x", [100, 200], step=30)],
        "x.*.used": [series("x.a.used", [1, 2]), series("x.b.used", [3, NAN])],
        "x.{a,c}.total": [series("x.a.total", [4, 0]), series("x.c.total", [8, 8])],
        "prog.counter.n": [series("prog.counter.n", [1, 3, 2, NAN, 10, 15])],
        "prog.wrap.n": [series("prog.wrap.n", [1, 9, 2, 0, 11, 13])],
        "nothing.*": [],
        # what applyByNode's, useSeriesAbove's and aliasQuery's targets name
        "x.a.used": [series("x.a.used", [1, 2])],
        "x.b.used": [series("x.b.used", [3, NAN])],
        "x.a.total": [series("x.a.total", [4, 0])],
        "x.b.total": [series("x.b.total", [6, 6])],
        "x.*.total": [series("x.a.total", [4, 0]), series("x.b.total", [6, 6])],
        # tagged series, as a tag query names them
        "seriesByTag('name=~t')": [tagged("t.bytes", [1, 2, NAN, 4, 5, 6], host="a", dc="w"),
                                   tagged("t.bytes", [3, 4, 5, NAN, 7, 8], host="b", dc="w"),
                                   tagged("t.pkts", [5, NAN, 1, 1, 2, 3], host="a", dc="e")],
    }


def tagged(name, values, **tags):
    tags["name"] = name
    return series(tagged_name(tags), values, tags=tags)


class at(dict):
    """Series by path expression as `evaluate` reads them, fetched over a range from `since`, and
    whatever range is asked: with nulls before them where a range starts sooner (a moving
    window's reach: no data there)."""

    def __init__(self, data, since=0):
        super().__init__(data)
        self.since = since

    def get(self, key, default=None):
        path, from_s, _ = key
        if path not in self:
            return default
        return [s.copy(start=s.start - ahead * s.step, values=np.concatenate((np.full(ahead, NAN), s.values)))
                for s in self[path] for ahead in [max(0, self.since // s.step - from_s // s.step)]]

    def __contains__(self, key):
        """Whether a path, or (path, from_s, until_s) as `evaluate` asks, was fetched (at any range)."""
        return dict.__contains__(self, key[0] if isinstance(key, tuple) else key)

    def step_of(self, path):
        """The coarsest step of a path's series (10 s for a path that has none)."""
        return max((s.step for s in dict.get(self, path, [])), default=10)


def run(target, data=None, context=CONTEXT):
    """The target's series, in a render of its own (stacked's totals start anew)."""
    data = at(fetched() if data is None else data)
    return evaluate(parse(target), data, dataclasses.replace(context, stacks={}, step_of=data.step_of))


def values(result):
    return [s.values.tolist() for s in result]


def same(actual, expected):
    """Lists of floats equal, NaN equal to NaN."""
    assert len(actual) == len(expected), (actual, expected)
    for a, e in zip(actual, expected):
        assert (math.isnan(a) and math.isnan(e)) or a == pytest.approx(e), (actual, expected)


# Combining


def test_sum_series_is_named_after_the_path_expression_and_skips_nulls():
    [result] = run("sumSeries(prog.func.*.bytes)")
    assert result.name == "sumSeries(prog.func.*.bytes)"
    assert (result.start, result.step) == (0, 10)
    same(result.values.tolist(), [11, 2, NAN, 44, 50, 66])
    assert result.tags == {"name": "sumSeries(prog.func.*.bytes)", "aggregatedBy": "sum"}


def test_all_null_point_stays_null_in_every_aggregate():
    for func in ("sumSeries", "averageSeries", "maxSeries", "minSeries"):
        [result] = run(f"{func}(prog.func.*.bytes)")
        assert math.isnan(result.values[2]), func


def test_average_max_min_series():
    same(run("averageSeries(prog.func.*.bytes)")[0].values.tolist(), [5.5, 2, NAN, 22, 50, 33])
    same(run("maxSeries(prog.func.*.bytes)")[0].values.tolist(), [10, 2, NAN, 40, 50, 60])
    same(run("minSeries(prog.func.*.bytes)")[0].values.tolist(), [1, 2, NAN, 4, 50, 6])
    assert run("maxSeries(prog.func.*.bytes)")[0].name == "maxSeries(prog.func.*.bytes)"


def test_series_of_different_steps_are_summed_at_their_lowest_common_multiple_step():
    [result] = run("sumSeries(prog.func.h1.bytes, prog.slow.x)")
    assert result.name == "sumSeries(prog.func.h1.bytes,prog.slow.x)"
    assert result.step == 30
    # h1 consolidated by average over 30 s: (1+2)/2, (4+6)/2; plus 100, 200
    same(result.values.tolist(), [101.5, 205])


def test_lcm_of_steps_that_do_not_divide_each_other():
    data = {"a": [series("a", [1] * 6, step=10)], "b": [series("b", [2] * 4, step=15)]}
    [result] = run("sumSeries(a, b)", data)
    assert result.step == 30
    same(result.values.tolist(), [3, 3])


def test_consolidate_by_sets_how_a_finer_series_meets_a_coarser_one():
    [result] = run('sumSeries(consolidateBy(prog.func.h1.bytes, "max"), prog.slow.x)')
    same(result.values.tolist(), [102, 206])
    assert result.name == 'sumSeries(consolidateBy(prog.func.h1.bytes,"max"),prog.slow.x)'


def test_aggregating_nothing_gives_no_series():
    assert run("sumSeries(nothing.*)") == []


def test_group_concatenates_and_as_percent_of_sum():
    assert [s.name for s in run("group(prog.func.h1.bytes, prog.slow.x)")] == ["prog.func.h1.bytes", "prog.slow.x"]
    result = run("asPercent(prog.func.*.bytes)")
    assert [s.name for s in result] == ["asPercent(prog.func.h1.bytes,sumSeries(prog.func.*.bytes))",
                                       "asPercent(prog.func.h2.bytes,sumSeries(prog.func.*.bytes))"]
    same(result[0].values.tolist(), [100 / 11, 100, NAN, 400 / 44, NAN, 600 / 66])
    same(result[1].values.tolist(), [1000 / 11, NAN, NAN, 4000 / 44, 100, 6000 / 66])


def test_as_percent_of_a_number_and_of_one_series_and_zero_total_is_null():
    [result] = run("asPercent(prog.func.h1.bytes, 8)")
    assert result.name == "asPercent(prog.func.h1.bytes,8)"
    same(result.values.tolist(), [12.5, 25, NAN, 50, NAN, 75])
    data = {"a": [series("a", [1, 2, 3])], "t": [series("t", [4, 0, NAN])]}
    [result] = run("asPercent(a, t)", data)
    assert result.name == "asPercent(a,t)"
    same(result.values.tolist(), [25, NAN, NAN])


def test_as_percent_pairs_series_with_as_many_totals_by_sorted_name():
    data = {"x.*.used": [series("x.b.used", [1]), series("x.a.used", [3])],
            "x.*.total": [series("x.a.total", [4]), series("x.b.total", [2])]}
    result = run("asPercent(x.*.used, x.*.total)", data)
    assert [(s.name, s.values.tolist()) for s in result] == [("asPercent(x.a.used,x.a.total)", [75.0]),
                                                           ("asPercent(x.b.used,x.b.total)", [50.0])]


def test_as_percent_refuses_a_total_of_another_count():
    data = {"a.*": [series("a.1", [1]), series("a.2", [1]), series("a.3", [1])],
            "t.*": [series("t.1", [1]), series("t.2", [1])]}
    with pytest.raises(TargetError, match="asPercent: total must be a number, one series or 3 series"):
        run("asPercent(a.*, t.*)", data)


# Transforming


def test_scale_and_offset_keep_nulls_and_name_with_g_format():
    [scaled] = run("scale(prog.func.h1.bytes, 2)")
    assert scaled.name == "scale(prog.func.h1.bytes,2)"
    same(scaled.values.tolist(), [2, 4, NAN, 8, NAN, 12])
    [shifted] = run("offset(prog.func.h1.bytes, -0.5)")
    assert shifted.name == "offset(prog.func.h1.bytes,-0.5)"
    same(shifted.values.tolist(), [0.5, 1.5, NAN, 3.5, NAN, 5.5])
    assert scaled.path_expression == scaled.name  # so sumSeries(scale(...)) names the scaled series


def test_sum_of_scaled_series_names_each_scaled_series():
    [result] = run("sumSeries(scale(prog.func.*.bytes, 2))")
    assert result.name == "sumSeries(scale(prog.func.h1.bytes,2),scale(prog.func.h2.bytes,2))"


def test_summarize_buckets_aligned_to_the_interval():
    data = {"a": [series("a", [1, 2, NAN, 4, 5, NAN, 7], start=20, step=10)]}  # 20..90
    [result] = run('summarize(a, "30s")', data)
    assert result.name == 'summarize(a, "30s", "sum")'
    assert (result.start, result.step) == (0, 30)
    # buckets [0,30): 1 ; [30,60): 2+4 ; [60,90): 5+7 ; [90,120): empty, as the series ends at 90
    same(result.values.tolist(), [1, 6, 12, NAN])
    [avg] = run('summarize(a, "30s", "avg")', data)
    same(avg.values.tolist(), [1, 3, 6, NAN])
    [last] = run('summarize(a, "30s", "last")', data)
    same(last.values.tolist(), [1, 4, 7, NAN])


def test_summarize_adds_an_empty_bucket_when_the_series_ends_on_a_boundary_as_graphite_does():
    data = {"a": [series("a", [1, 2, 3], start=0, step=10)]}  # ends at 30
    [result] = run('summarize(a, "30s", "max")', data)
    same(result.values.tolist(), [3, NAN])


def test_summarize_align_to_from_starts_buckets_at_the_series_start():
    data = {"a": [series("a", [1, 2, NAN, 4, 5, NAN, 7], start=20, step=10)]}
    [result] = run('summarize(a, "30s", "sum", true)', data)
    assert result.name == 'summarize(a, "30s", "sum", true)'
    assert (result.start, result.step) == (20, 30)
    same(result.values.tolist(), [3, 9, 7])


def test_summarize_of_an_all_null_bucket_is_null_not_zero():
    data = {"a": [series("a", [NAN, NAN, NAN, 1, 2, 3], step=10)]}
    [result] = run('summarize(a, "30s")', data)
    same(result.values.tolist(), [NAN, 6, NAN])


def test_xfiles_factor_of_the_render_and_of_set_xfiles_factor():
    data = {"a": [series("a", [1, 2, NAN, 4, 5, 6], step=10)], "b": [series("b", [1, NAN, NAN, 4, 5, 6], step=10)]}
    # [0,30): 2 of 3 values; [30,60): 3 of 3
    same(run('summarize(a, "30s")', data)[0].values.tolist(), [3, 15, NAN])
    strict = Context(from_s=0, until_s=60, now_s=60, xfiles_factor=0.7)  # the render's xFilesFactor
    same(run('summarize(a, "30s")', data, strict)[0].values.tolist(), [NAN, 15, NAN])
    [marked] = run("setXFilesFactor(a, 0.5)", data)
    assert (marked.xfiles_factor, marked.tags["xFilesFactor"], marked.name) == (0.5, "0.5", "a")
    same(run('summarize(xFilesFactor(a, 0.5), "30s")', data, strict)[0].values.tolist(), [3, 15, NAN])
    same(run("movingAverage(xFilesFactor(a, 1), 2)", data)[0].values.tolist(), [NAN, 1.5, NAN, NAN, 4.5, 5.5])
    # across series: the strictest of theirs, unless the call says
    same(run("sumSeries(a, b)", data)[0].values.tolist(), [2, 2, NAN, 8, 10, 12])
    same(run("sumSeries(a, xFilesFactor(b, 1))", data)[0].values.tolist(), [2, NAN, NAN, 8, 10, 12])
    same(run("aggregate(xFilesFactor(group(a, b), 1), 'sum', 0)", data)[0].values.tolist(), [2, 2, NAN, 8, 10, 12])
    [total] = run("sumSeries(a, xFilesFactor(b, 1))", data)
    assert total.xfiles_factor == 1  # and its consolidation then takes as much
    for bad in ("setXFilesFactor(a, 1.5)", "xFilesFactor(a, -0.1)"):
        with pytest.raises(TargetError, match="within 0..1"):
            run(bad, data)


def test_divide_group_by_node_and_their_mistakes():
    data = {"a": [series("a", [6, 4, NAN, 1])], "b": [series("b", [3, 0, 2, NAN])],
            "two": [series("c", [1]), series("d", [2])],
            "p.*.x": [series("p.h1.x", [1, 2]), series("p.h2.x", [3, NAN]), series("q.h1.x", [5, 5])]}
    [quotient] = run("divideSeries(a, b)", data)
    assert quotient.name == "divideSeries(a,b)"
    same(quotient.values.tolist(), [2, NAN, NAN, NAN])  # by 0, or a null on either side: null
    with pytest.raises(TargetError, match="exactly one series, not 2"):
        run("divideSeries(a, two)", data)
    by_host = run("groupByNode(p.*.x, 1, 'sum')", data)
    assert [s.name for s in by_host] == ["h1", "h2"]
    same([v for s in by_host for v in s.values.tolist()], [6, 7, 3, NAN])
    assert [s.name for s in run("groupByNodes(p.*.x, 'averageSeries', 0, 1)", data)] == ["p.h1", "p.h2", "q.h1"]
    with pytest.raises(TargetError, match="parameter 'callback' must be one of"):
        run("groupByNode(p.*.x, 1, 'loudest')", data)
    with pytest.raises(TargetError, match="aliasSub: "):
        run("aliasSub(a, '(', 'x')", data)
    assert [s.name for s in run(r"aliasSub(p.*.x, '^(\w)\.(\w+)\..*', '\2 of \1')", data)] == \
        ["h1 of p", "h2 of p", "h1 of q"]


def test_time_shift_draws_the_series_of_the_moved_range_over_this_one():
    context = Context(from_s=1_000_000, until_s=1_000_060, now_s=1_000_060)
    day_before = {("a", 913_600, 913_660): [series("a", [10, 20, 30, 40, 50, 60, 70], start=913_600)]}
    [shifted] = evaluate(parse('timeShift(a, "1d")'), day_before, context)
    assert shifted.name == 'timeShift(a, "-1d")' and shifted.tags["timeShift"] == "-1d"
    assert (shifted.start, shifted.step) == (1_000_000, 10)
    same(shifted.values.tolist(), [10, 20, 30, 40, 50, 60])  # resetEnd: no more points than the range has
    [longer] = evaluate(parse('timeShift(a, "1d", false)'), day_before, context)
    assert len(longer.values) == 7
    [cut] = evaluate(parse('timeShift(a, "1d")'), {("a", 913_600, 913_651): day_before["a", 913_600, 913_660]},
                     Context(1_000_000, 1_000_051, 1_000_051))
    assert len(cut.values) == 6  # the last step begins before until

    nested = parse('sumSeries(a, timeShift(scale(timeShift(a, "30s"), 2), "1d"))')
    assert fetches(nested, context) == [("a", 1_000_000, 1_000_060), ("a", 913_570, 913_630)]  # shifts add up
    data = {("a", 1_000_000, 1_000_060): [series("a", [1, 2, 3, 4, 5, 6], start=1_000_000)],
            ("a", 913_570, 913_630): [series("a", [10, 20, 30, 40, 50, 60], start=913_570)]}
    [total] = evaluate(nested, data, context)
    assert total.start == 1_000_000
    same(total.values.tolist(), [21, 42, 63, 84, 105, 126])
    assert total.name == 'sumSeries(a,timeShift(scale(timeShift(a, "-30s"),2), "-1d"))'
    assert fetches(parse('timeShift(a, "+1h")'), context) == [("a", 1_003_600, 1_003_660)]
    for bad, reason in (('timeShift(a, b.c)', "must be an interval"), ('timeShift(a, "30d")', "out of 1970")):
        with pytest.raises(TargetError, match=reason):
            fetches(parse(bad), context)


def test_keep_last_value_fills_runs_up_to_the_limit_and_not_before_the_first_value():
    data = {"a": [series("a", [NAN, 1, NAN, NAN, 4, NAN, NAN, NAN, 8, NAN])]}
    same(run("keepLastValue(a)", data)[0].values.tolist(), [NAN, 1, 1, 1, 4, 4, 4, 4, 8, 8])
    [limited] = run("keepLastValue(a, 2)", data)
    assert limited.name == "keepLastValue(a)"
    same(limited.values.tolist(), [NAN, 1, 1, 1, 4, NAN, NAN, NAN, 8, 8])


def test_non_negative_derivative_nulls_resets_and_gaps():
    [result] = run("nonNegativeDerivative(prog.counter.n)")
    assert result.name == "nonNegativeDerivative(prog.counter.n)"
    # 1,3,2,null,10,15: +2, reset, null, no previous, +5
    same(result.values.tolist(), [NAN, 2, NAN, NAN, NAN, 5])


def test_non_negative_derivative_with_max_value_counts_the_wrap():
    data = {"a": [series("a", [250, 254, 3, 300])]}
    # 254 -> 3 wrapped at 255: 255 + 1 + 3 - 254; 300 is above maxValue: null
    same(run("nonNegativeDerivative(a, 255)", data)[0].values.tolist(), [NAN, 4, 5, NAN])


def test_per_second_divides_by_the_step():
    [result] = run("perSecond(prog.counter.n)")
    assert result.name == "perSecond(prog.counter.n)"
    same(result.values.tolist(), [NAN, 0.2, NAN, NAN, NAN, 0.5])


def test_moving_average_of_points_includes_the_point_itself_as_graphite_web_1_1_10():
    """graphite-web 1.1.8 left the point out (its issue #2632): every value one step late."""
    data = {"a": [series("a", [2, 4, NAN, 8, 10, 12])]}
    [result] = run("movingAverage(a, 2)", data)
    assert result.name == "movingAverage(a,2)"
    # windows [i-1, i]: [2], [2,4], [4,null], [null,8], [8,10], [10,12]
    same(result.values.tolist(), [2, 3, 4, 8, 9, 11])


def test_moving_average_of_a_time_window_and_its_xfiles_factor():
    data = {"a": [series("a", [2, 4, NAN, 8, 10, 12])]}
    [result] = run('movingAverage(a, "20s")', data)
    assert result.name == 'movingAverage(a,"20s")'
    same(result.values.tolist(), [2, 3, 4, 8, 9, 11])
    # xFilesFactor 1: every point of the window must be non-null
    same(run("movingAverage(a, 2, 1)", data)[0].values.tolist(), [NAN, 3, NAN, NAN, 9, 11])


def test_moving_windows_reduce_each_point_and_those_before_it_by_their_function():
    data = {"a": [series("a", [2, 4, NAN, 8, 10, 1])]}
    # windows [i-1, i]: [2], [2,4], [4,null], [null,8], [8,10], [10,1]
    for target, expected in (("movingSum(a, 2)", [2, 6, 4, 8, 18, 11]), ("movingMin(a, 2)", [2, 2, 4, 8, 8, 1]),
                             ("movingMax(a, '20s')", [2, 4, 4, 8, 10, 10]),
                             ("movingMedian(a, 3)", [2, 3, 3, 6, 9, 8]),
                             ("movingWindow(a, 2, 'range')", [0, 2, 0, 0, 2, 9]),
                             ("movingWindow(a, 2)", [2, 3, 4, 8, 9, 5.5]),
                             ("movingMax(a, 2, 1)", [NAN, 4, NAN, NAN, 10, 10])):
        [result] = run(target, data)
        same(result.values.tolist(), expected)
    names = [run(t, data)[0].name for t in ("movingSum(a, 2)", "movingMedian(a, '20s')", "movingWindow(a, 2, 'max')")]
    assert names == ["movingSum(a,2)", 'movingMedian(a,"20s")', "movingMax(a,2)"]
    assert run("movingMin(a, 2)", data)[0].tags == {"name": "a", "movingMin": "2"}


def test_a_long_moving_window_is_reduced_a_slice_at_a_time_to_the_same_values():
    rng = np.random.default_rng(7)
    values = rng.normal(size=20_000)
    values[rng.random(20_000) < 0.1] = NAN
    data = {"a": [series("a", values.tolist(), step=1)]}
    [result] = run("movingMedian(a, 300)", data)  # 6 M window cells: six slices
    padded = np.concatenate((np.full(300, NAN), values))
    expected = [float(np.nanmedian(padded[i + 1:i + 301])) for i in range(20_000)]  # [i - 299, i]
    same(result.values.tolist(), expected)


@pytest.mark.parametrize("func", [*AGGREGATIONS, "rangeOf", "avg", "total", "current"])
def test_moving_windows_of_every_aggregation_agree_with_graphite_webs_over_a_windows_non_null_values(graphite,
                                                                                                     func):
    """graphite-web's movingWindow hands each window's non-null values to its aggregation function:
    ours by running sums, van Herk's blocks, last indexes or laid-out windows, whichever fits the
    function, must agree with it, for windows shorter and longer than the series."""
    from graphite.functions import getAggFunc
    rng = np.random.default_rng(3)
    values = rng.integers(-50, 50, size=40).astype(np.float64)
    values[rng.random(40) < 0.3] = NAN
    values[10:16] = NAN  # a run of nulls longer than the shorter windows
    theirs = getAggFunc(func)
    for points in (1, 3, 7, 45):
        for xff in (0.0, 0.5):
            [result] = run(f"movingWindow(a, {points}, '{func}', {xff})", {"a": [series("a", values.tolist())]})
            expected = []
            for i in range(len(values)):
                present = [v for v in values[max(0, i - points + 1):i + 1].tolist() if not math.isnan(v)]
                ok = present and len(present) / points >= xff
                expected.append(theirs(present) if ok else NAN)
            same(result.values.tolist(), [NAN if v is None else v for v in expected])


def test_a_moving_median_too_long_to_compute_is_refused_in_one_line_and_a_moving_max_is_not():
    data = {"a": [series("a", np.arange(30_000, dtype=np.float64).tolist(), step=1)]}
    with pytest.raises(TargetError,
                       match="movingMedian: a window of 20,000 points over 30,000 points is 600,000,000 values"):
        run("movingMedian(a, 20000)", data)
    [result] = run("movingMax(a, 20000)", data)  # in time proportional to the points
    same(result.values[[0, 1, 25_000]].tolist(), [0, 1, 25_000])


def test_stacks_go_on_across_a_renders_targets_and_threshold_is_a_labelled_constant_line(graphite):
    functions, TimeSeries = graphite
    context = Context(from_s=0, until_s=60, now_s=60)
    data = at(fetched())
    first = evaluate(parse("stacked(prog.func.*.bytes, 'a')"), data, context)
    second = evaluate(parse("stacked(prog.wrap.n, 'a')"), data, context)
    theirs_context = {}
    converted = {p: [to_graphite(TimeSeries, s) for s in found] for p, found in fetched().items()}
    expected = (functions.stacked(theirs_context, converted["prog.func.*.bytes"], "a")
                + functions.stacked(theirs_context, converted["prog.wrap.n"], "a"))
    assert [s.name for s in first + second] == [s.name for s in expected]
    for mine, their in zip(first + second, expected):
        same(mine.values.tolist(), [NAN if v is None else v for v in their])
    [line] = run("threshold(5, 'limit', 'red')")
    assert (line.name, line.path_expression, line.values.tolist()) == ("limit", "constantLine(5.0)", [5, 5, 5])
    assert run("threshold(7)")[0].name == "7.0"  # its number a float, as graphite-web 1.1.10's evaluator makes it


def test_legend_value_computes_the_series_forms_graphite_web_offers_but_prints_as_unknown():
    [result] = run("legendValue(prog.func.h1.bytes, 'lastSeries', 'sumSeries')")
    assert result.name == "prog.func.h1.bytes (lastSeries: 6.0) (sumSeries: 13.0)"  # graphite-web: "(?)" each


def test_time_slice_nulls_the_points_outside_its_times_read_as_from_and_until_read_them():
    [result] = run("timeSlice(prog.func.h1.bytes, '20', '40')")  # epoch seconds; the range is [0, 60)
    assert result.name == "timeSlice(prog.func.h1.bytes, 20, 40)"
    assert result.tags == {"name": "prog.func.h1.bytes", "timeSliceStart": "20", "timeSliceEnd": "40"}
    same(result.values.tolist(), [NAN, NAN, NAN, 4, NAN, NAN])  # [1, 2, null, 4, null, 6] at 0, 10, ... 50
    [until_now] = run("timeSlice(prog.func.h1.bytes, '-30s')", context=Context(from_s=0, until_s=60, now_s=60))
    same(until_now.values.tolist(), [NAN, NAN, NAN, 4, NAN, 6])


@pytest.mark.parametrize("window", [3, 1, '"30s"'])
def test_exponential_moving_average_is_graphite_webs_over_a_window_of_nulls_before_the_range(graphite, window,
                                                                                            monkeypatch):
    """graphite-web fetches the window before the range again (evaluateTarget): given nulls there, as
    ramen has no data before `from`, its values after the first point are ours."""
    functions, TimeSeries = graphite
    [ours] = run(f"exponentialMovingAverage(prog.func.h1.bytes, {window})")
    [theirs] = [to_graphite(TimeSeries, s) for s in fetched()["prog.func.h1.bytes"]]
    points = 3 if window == '"30s"' else window
    preview_s = points * theirs.step
    before = TimeSeries(theirs.name, theirs.start - preview_s, theirs.end, theirs.step, [None] * points + list(theirs),
                        tags=dict(theirs.tags))
    monkeypatch.setattr(functions, "evaluateTarget", lambda context, target: [before])
    size = window.strip('"') if isinstance(window, str) else window
    [expected] = functions.exponentialMovingAverage({"startTime": EPOCH, "args": [None]}, [theirs], size)
    assert (ours.name, ours.start, ours.step) == (expected.name, expected.start, expected.step)
    assert math.isnan(ours.values[0]) and expected[0] == 0  # graphite-web's average of no value
    same(ours.values[1:].tolist(), [NAN if v is None else v for v in list(expected)[1:len(ours.values)]])
    assert ours.tags == dict(expected.tags)


def test_time_stack_draws_each_earlier_range_over_this_one_as_graphite_web_does(graphite, monkeypatch):
    functions, TimeSeries = graphite
    day = 86400
    context = Context(from_s=10 * day, until_s=10 * day + 60, now_s=10 * day + 60)
    assert fetches(parse('timeStack(a.b, "1d", 0, 3)'), context) == [("a.b", 10 * day - k * day, 10 * day + 60 - k * day)
                                                                     for k in range(3)]
    by_shift = {-k * day: [series("a.b", [k, k + 1, NAN, k + 3, k + 4, k + 5], start=10 * day - k * day)]
                for k in range(4)}
    fetched_at = {("a.b", 10 * day + shift, 10 * day + 60 + shift): found for shift, found in by_shift.items()}
    ours = evaluate(parse('timeStack(a.b, "1d", 1, 4)'), fetched_at, context)

    def evaluate_target(request, target):  # graphite-web fetches each moved range again
        shift = int(request["startTime"].timestamp()) - 10 * day
        return [to_graphite(TimeSeries, s) for s in by_shift[shift]]
    monkeypatch.setattr(functions, "evaluateTarget", evaluate_target)
    start = datetime.datetime.fromtimestamp(10 * day, datetime.timezone.utc)
    theirs = functions.timeStack({"startTime": start, "endTime": start + datetime.timedelta(seconds=60),
                                  "args": [None]}, [to_graphite(TimeSeries, s) for s in by_shift[0]], "1d", 1, 4)
    assert [s.name for s in ours] == [s.name for s in theirs] == [f"timeShift(a.b, -1d, {k})" for k in (1, 2, 3)]
    for mine, their in zip(ours, theirs):
        assert (mine.start, mine.step, mine.tags) == (their.start, their.step, dict(their.tags))
        same(mine.values.tolist(), [NAN if v is None else v for v in their])
    with pytest.raises(TargetError, match="timeStack: 101 ranges, more than 100"):
        fetches(parse('timeStack(a.b, "1h", 0, 101)'), context)
    with pytest.raises(TargetError, match="timeStack: '1d x 11' moves the range out of 1970 to 9999"):
        fetches(parse('timeStack(a.b, "1d", 0, 12)'), context)


@pytest.fixture
def utc():
    """The process's local time zone UTC for the test: graphite-web's time and sine read local time."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


def test_generators_and_vertical_line_are_graphite_webs_over_the_range(graphite, utc):
    functions, TimeSeries = graphite
    context = Context(from_s=1_700_000_000, until_s=1_700_000_600, now_s=1_700_000_600)
    start = datetime.datetime.fromtimestamp(context.from_s, datetime.timezone.utc)
    request = {"startTime": start, "endTime": start + datetime.timedelta(seconds=600), "tzinfo": datetime.timezone.utc}
    for target, theirs in (('identity("t")', lambda: functions.identity(request, "t")),
                           ('time("t", 120)', lambda: functions.timeFunction(request, "t", 120)),
                           ('sinFunction("s", 3, 90)', lambda: functions.sinFunction(request, "s", 3, 90)),
                           ("verticalLine('1700000300', 'deploy')",
                            lambda: functions.verticalLine(request, "1700000300", "deploy"))):
        [ours] = evaluate(parse(target), {}, context)
        [their] = theirs()
        assert (ours.name, ours.start, ours.step, ours.path_expression) == \
            (their.name, their.start, their.step, their.pathExpression), target
        same(ours.values.tolist(), list(their))
    [walk] = evaluate(parse('randomWalk("w", 30)'), {}, context)
    assert (walk.name, walk.step, len(walk.values), walk.values[0]) == ("w", 30, 20, 0)
    assert np.all(np.abs(np.diff(walk.values)) <= 0.5)
    with pytest.raises(TargetError, match="verticalLine: 1600000000 is outside the range"):
        evaluate(parse("verticalLine('1600000000')"), {}, context)
    year = Context(from_s=1_700_000_000, until_s=1_700_000_000 + 365 * 86400, now_s=1_700_000_000 + 365 * 86400)
    with pytest.raises(TargetError, match="timeFunction: a point every 1 s over the range is 31,536,000 points, more "
                                          "than 10,000,000"):
        evaluate(parse('time("t", 1)'), {}, year)
    data = {"a": [series("a", [1.0] * 10, start=year.from_s, step=365 * 8640)]}
    for function in ("summarize", "hitcount"):
        with pytest.raises(TargetError, match=f"{function}: an interval of 1 s over the range is 31,536,00[01] points"):
            evaluate(parse(f"{function}(a, '1s')"), at(data), year)


def test_every_function_of_one_series_takes_an_empty_one_and_an_all_null_one():
    """A series of no point (a range shorter than its step) or of nulls only: a result or a
    one-line TargetError (or, of a function making targets, the fetches they need), never another
    exception (changed() raised IndexError on an empty one)."""
    def argument(param):
        if param.type == "seriesList":
            return "e"
        if param.options:
            return "'sum'" if param.type == "aggOrSeriesFunc" else repr(sorted(param.options, key=str)[0])
        return {"interval": "'1min'", "string": "'x'", "aggFunc": "'sum'", "date": "'-30s'", "any": "None",
                "boolean": "true"}.get(param.type, "2")
    for values in ([], [NAN] * 6):
        data = at({"e": [series("a.b.c", values)]})
        for name, spec in FUNCTIONS.items():
            arguments = [argument(p) for p in spec.params if p.required or p.multiple or p.type == "seriesList"]
            try:
                evaluate(parse(f"{name}({', '.join(arguments)})"), data, dataclasses.replace(CONTEXT,
                                                                                             step_of=data.step_of))
            except (TargetError, FetchesNeeded):
                pass


def test_round_rounds_the_binary_value_as_pythons_round_and_graphite_web():
    """257.15 is 257.149999...: graphite-web's round gives 257.1; numpy's scaling by 10 gave 257.2."""
    data = {"a": [series("a", [257.15, 2.675, -0.125, 1e300, 0.5, 1.5, NAN])]}
    same(run("round(a, 1)", data)[0].values.tolist(), [257.1, 2.7, -0.1, 1e300, 0.5, 1.5, NAN])
    same(run("round(a, 2)", data)[0].values.tolist(), [257.15, 2.67, -0.12, 1e300, 0.5, 1.5, NAN])
    same(run("round(a)", data)[0].values.tolist(), [257, 3, 0, 1e300, 0, 2, NAN])
    rng = np.random.default_rng(5)
    values = np.round(rng.uniform(-1000, 1000, 20_000), 3)  # many a half at the last digit kept
    for digits in (-2, 0, 1, 2):
        [result] = run(f"round(a, {digits})", {"a": [series("a", values.tolist())]})
        assert result.values.tolist() == [round(v, digits) for v in values.tolist()], digits


def test_upper_and_lower_case_the_name_or_letters_of_it_as_graphite_web_1_1_10():
    data = {"a": [series("prog.Func.h1.bytes", [1, 2])]}
    assert [s.name for s in run("upper(a)", data)] == ["PROG.FUNC.H1.BYTES"]
    assert [s.name for s in run("upper(a, 0, -1, 99)", data)] == ["Prog.Func.h1.byteS"]  # 99: past the name
    assert [s.name for s in run("lower(a)", data)] == ["prog.func.h1.bytes"]
    assert [s.name for s in run("lower(a, 5)", data)] == ["prog.func.h1.bytes"]
    [upper] = run("upper(a)", data)  # its name alone: graphite-web leaves the path expression and tags
    assert (upper.path_expression, upper.tags) == ("a", {"name": "prog.Func.h1.bytes"})


def test_compress_periodic_gaps_takes_the_period_of_a_series_with_a_value_every_few_steps():
    """graphite-web 1.1.10's guess: a value every 3 steps from the second point on (the first, a 0,
    is no value to it) becomes a series of 30 s steps from that point, each interval's last value."""
    values = [0, 4, NAN, NAN, 5, NAN, NAN, 6, NAN, NAN, 7, NAN]
    [result] = run("compressPeriodicGaps(a)", {"a": [series("a", values, step=10)]})
    assert (result.name, result.path_expression, result.start, result.step) == (
        "compressPeriodicGaps(a)", "compressPeriodicGaps(a)", 10, 30)
    same(result.values.tolist(), [4, 5, 6, 7])
    dense = [1, 2, 3, 4, 5, 6]
    [kept] = run("compressPeriodicGaps(a)", {"a": [series("a", dense, step=10)]})  # no gaps: no period
    assert (kept.name, kept.start, kept.step) == ("compressPeriodicGaps(a)", 0, 10)
    same(kept.values.tolist(), dense)


def test_constant_line_and_count_series_of_nothing():
    [line] = run("constantLine(5)")  # named as graphite-web 1.1.10 names it: its number made a float
    assert (line.name, line.path_expression, line.start, line.step) == ("5.0", "constantLine(5.0)", 0, 30)
    same(line.values.tolist(), [5, 5, 5])
    [none] = run("countSeries()")
    assert (none.name, none.path_expression) == ("0", "countSeries()")
    same(none.values.tolist(), [0, 0, 0])
    [counted] = run("countSeries(nothing.*, prog.func.*.bytes)")
    assert counted.name == "countSeries(prog.func.*.bytes)"
    same(counted.values.tolist(), [2] * 6)


def test_highest_average_limit_and_sort_by_maxima():
    data = {"s.*": [series("s.a", [1, 1]), series("s.b", [NAN, NAN]), series("s.c", [5, 0]), series("s.d", [3, 3])]}
    assert [s.name for s in run("highestAverage(s.*, 2)", data)] == ["s.d", "s.c"]
    assert [s.name for s in run("sortByMaxima(s.*)", data)] == ["s.c", "s.d", "s.a", "s.b"]
    assert [s.name for s in run("limit(s.*, 3)", data)] == ["s.a", "s.b", "s.c"]
    # series of different lengths (steps) are ranked over their own points: s.e's mean is 4, not 4/3
    data["s.*"].append(series("s.e", [4], step=60))
    assert [s.name for s in run("highestAverage(s.*, 2)", data)] == ["s.e", "s.d"]
    assert [s.name for s in run("sortByMaxima(s.*)", data)] == ["s.c", "s.e", "s.d", "s.a", "s.b"]


# Naming


def test_alias_and_alias_by_node_and_metric():
    assert [s.name for s in run("alias(prog.func.*.bytes, 'traffic')")] == ["traffic", "traffic"]
    assert [s.name for s in run("aliasByNode(prog.func.*.bytes, 2)")] == ["h1", "h2"]
    assert [s.name for s in run("aliasByNode(prog.func.*.bytes, 1, -2)")] == ["func.h1", "func.h2"]
    assert [s.name for s in run("aliasByNode(scale(prog.func.*.bytes, 2), 2)")] == ["h1", "h2"]
    assert [s.name for s in run("aliasByMetric(prog.func.*.bytes)")] == ["bytes", "bytes"]
    assert [s.name for s in run("aliasByMetric(scale(prog.func.h1.bytes, 2))")] == ["bytes"]


def test_alias_by_node_reads_a_tag_by_name():
    data = {"a": [series("a.b", [1], tags={"name": "a.b", "host": "h9"})]}
    assert [s.name for s in run("aliasByNode(a, 'host', 0)", data)] == ["h9.a"]


def test_alias_keeps_the_path_expression_for_aggregates_naming():
    [result] = run("sumSeries(alias(prog.func.*.bytes, 'x'))")
    assert result.name == "sumSeries(prog.func.*.bytes)"


def test_evaluate_leaves_the_fetched_series_untouched():
    data = fetched()
    before = {path: [(s.name, s.values.tolist(), s.path_expression) for s in found] for path, found in data.items()}
    for target in ("scale(prog.func.*.bytes, 2)", "keepLastValue(prog.func.*.bytes)", "alias(prog.slow.x, 'y')",
                   "consolidateBy(prog.slow.x, 'sum')", "sortByMaxima(prog.func.*.bytes)"):
        evaluate(parse(target), at(data), CONTEXT)
    after = {path: [(s.name, s.values.tolist(), s.path_expression) for s in found] for path, found in data.items()}
    assert repr(after) == repr(before)


# Errors


@pytest.mark.parametrize("target, message", [
    ("scale(prog.slow.x, 'two')", "scale: parameter 'factor' must be a number, not 'two'"),
    ("scale(prog.slow.x)", "scale: missing required parameter 'factor'"),
    ("scale(2, 3)", "scale: parameter 'seriesList' must be a series list"),
    ("limit(prog.slow.x, 1.5)", "limit: parameter 'n' must be an integer, not 1.5"),
    ("consolidateBy(prog.slow.x, 'mean')", "consolidateBy: parameter 'consolidationFunc' must be one of sum, average"),
    ('summarize(prog.slow.x, "1x")', "bad interval '1x': no unit 'x'"),
    ('summarize(prog.slow.x, "hour")', "bad interval 'hour': expected a number and a unit"),
    ('summarize(prog.slow.x, "0h")', "summarize: interval '0h' must be longer than 0 s"),
    ('summarize(prog.slow.x, "1h", "mean")', "summarize: parameter 'func' must be one of average"),
    ("movingAverage(prog.slow.x, 0)", "movingAverage: parameter 'windowSize' must be a number of points (> 0)"),
    ("alias(prog.slow.x, 'a', 'b')", "alias: too many arguments (3; it takes 2)"),
    ("alias(prog.slow.x, nosuch='a')", "alias: no parameter 'nosuch'"),
    ("keepLastValue(prog.slow.x, 'x')", "keepLastValue: parameter 'limit' must be an integer or inf"),
    ("log(prog.slow.x, 1)", "log: the base must be above 0 and not 1, not 1"),
    ("nPercentile(prog.slow.x, 0)", "nPercentile: the percentile must be within (0, 100], not 0"),
    ("percentileOfSeries(prog.slow.x, 101)", "percentileOfSeries: the percentile must be within (0, 100], not 101"),
    ("grep(prog.slow.x, '(')", "grep: bad regular expression '(': missing )"),
    ("filterSeries(prog.slow.x, 'max', '=>', 1)", "filterSeries: parameter 'operator' must be one of"),
    ("movingWindow(prog.slow.x, 2, 'mean')", "movingWindow: parameter 'func' must be one of average"),
    ("sumSeriesLists(x.*.used, prog.slow.x)", "aggregateSeriesLists: the two lists hold 2 and 1 series"),
    ("weightedAverage(x.*.used, prog.slow.x)", "weightedAverage: 2 series to average and 1 weights"),
    ("divideSeriesLists(x.*.used, prog.slow.x)", "divideSeriesLists: the two lists hold 2 and 1 series"),
    ("integralByInterval(prog.slow.x, '0s')", "integralByInterval: interval '0s' must be longer than 0 s"),
    ("timeSlice(prog.slow.x, 'yesterdayish')", "timeSlice: "),
    ("removeAbovePercentile(prog.slow.x, 0)", "removeAbovePercentile: the percentile must be within (0, 100]"),
    ("mapSeries(x.*.used, 1)", "a target must yield series, not lists of them (mapSeries's): reduce them with"),
    ("sumSeries(map(x.*.used, 1))", "sumSeries: parameter 'seriesLists' must be a series list, not mapSeries' lists"),
    ("asPercent(x.*.used, map(x.*.used, 1))", "asPercent: parameter 'total' must be a series list, not mapSeries'"),
    ("scale(x.*.used, mapSeries(x.*.used, 1))", "scale: parameter 'factor' must be a number, not mapSeries' lists"),
    ("reduceSeries(x.*.used, 'sumSeries', 1, 'a')",
     "reduceSeries: parameter 'seriesLists' must be lists of series, as mapSeries makes them, not a series list"),
    ("reduceSeries(map(x.*.used, 1), 'nosuch', 1, 'a')", "unknown function 'nosuch' to reduce with"),
    ("reduce(map(x.*.used, 1), 'movingAverage', 1, 'a')",
     "movingAverage computes from points outside the range: it cannot reduce mapSeries' lists"),
    ("reduce(map(x.*.used, 1), 'timeStack', 1, 'a')", "timeStack computes from points outside the range"),
    ("reduce(map(x.*.used, 1), 'scale', 1, 'a')", "scale: missing required parameter 'factor'"),
    ("reduce(map(x.*.used, 1), 'reduce', 1, 'a')", "reduce: parameter 'seriesLists' must be lists of series"),
    ("applyByNode(x.*.used, 1, 'sumSeries(%.used')", "target 'sumSeries(x.a.used': column 19: expected ',' or ')'"),
    ("applyByNode(x.*.used, 1, 'nosuch(%.used)')", "target 'nosuch(x.a.used)': column 1: unknown function 'nosuch'"),
    ("useSeriesAbove(x.*.used, 0, '(', 'x')", "useSeriesAbove: bad regular expression '('"),
    ("aliasQuery(x.a.used, 'used', 'used', '%(x)s')", "aliasQuery: newName '%(x)s' has a % that is no"),
    ("aliasQuery(x.a.used, 'used', 'used', '%9999d')", "aliasQuery: newName '%9999d' has a % that is no"),
    ("aliasQuery(x.a.used, 'used', 'used', '%d of %d')", "aliasQuery: newName '%d of %d' cannot be "
                                                                    "formatted with one value: not enough arguments"),
    ("aliasQuery(x.a.used, 'used', 'used', '%c')", "aliasQuery: newName '%c' cannot be formatted"),
    ("aliasQuery(x.a.used, '(', 'x', '%d')", "aliasQuery: bad regular expression '('"),
    ("aliasQuery(x.a.used, 'x.a.used', 'nothing.*', '%d')", "aliasQuery: no series found with query 'nothing.*'"),
    ("aliasByNode(x.a.used, 3000000000)", "aliasByNode: parameter 'nodes' must be an integer within "
                                           "-2,147,483,647..2,147,483,647, not 3000000000"),
    ("timeFunction('t', 99999999999999999999)", "timeFunction: parameter 'step' must be an integer, not 1e+20"),
    ("useSeriesAbove(x.*.used, 0, 'used', '\\2')",
     "useSeriesAbove: bad replacement '\\\\2': invalid group reference"),
])
def test_bad_arguments_raise_one_line_target_errors(target, message):
    with pytest.raises(TargetError) as raised:
        run(target)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_map_and_reduce_series_reduce_each_group_by_a_function_named_in_its_matchers_order():
    data = {"s.*.disk.*": [series("s.a.disk.used", [1, 2]), series("s.a.disk.total", [4, 8]),
                           series("s.b.disk.total", [10, 10]), series("s.b.disk.used", [5, NAN]),
                           series("s.c.disk.used", [1, 1]),  # no total: its group yields nothing
                           series("s.d.disk.free", [3, 3])]}  # matches no matcher: left out
    result = run("reduceSeries(mapSeries(s.*.disk.*, 1), 'asPercent', 3, 'used', 'total')", data)
    assert [s.name for s in result] == ["s.a.disk.reduce.asPercent", "s.b.disk.reduce.asPercent"]
    for got, expected in zip(values(result), [[25.0, 25.0], [50.0, NAN]]):
        same(got, expected)
    # the matchers' order is the arguments': total / used
    flipped = run("reduce(map(s.*.disk.*, 1), 'divideSeries', 3, 'total', 'used')", data)
    assert [s.name for s in flipped] == ["s.a.disk.reduce.divideSeries", "s.b.disk.reduce.divideSeries"]
    for got, expected in zip(values(flipped), [[4.0, 4.0], [2.0, NAN]]):
        same(got, expected)
    # a name too short for the node matches nothing, as one whose node is no matcher
    assert run("reduceSeries(mapSeries(s.*.disk.*, 1), 'sumSeries', 7, 'used')", data) == []


def test_targets_made_at_evaluation_are_fetched_in_a_round_of_their_own_over_the_ranges_they_need():
    context = Context(from_s=100, until_s=160, now_s=160, step_of=lambda path: 10)
    used = {("x.*.used", 100, 160): [series("x.a.used", [1, 2], start=100), series("x.b.used", [3, 5], start=100)]}
    nodes = [parse('applyByNode(x.*.used, 1, "movingAverage(%.total, 2)", "%.smooth")'),
             parse("useSeriesAbove(x.*.used, 4, 'used', 'free')"), parse("x.*.used")]
    with pytest.raises(FetchesNeeded) as needed:
        evaluate_all(nodes, used, context)
    # every target's, at once: the moving window's reach included
    assert needed.value.wanted == [("x.a.total", 80, 160), ("x.b.total", 80, 160), ("x.b.free", 100, 160)]
    made = {**used, ("x.a.total", 80, 160): [series("x.a.total", [2, 4, 6, 8, 10, 12, 14, 16], start=80)],
            ("x.b.total", 80, 160): [], ("x.b.free", 100, 160): [series("x.b.free", [7, 7], start=100)]}
    smooth, free, *plain = evaluate_all(nodes, made, context)
    assert (smooth.name, smooth.path_expression, smooth.start) == ("x.a.smooth", "x.a", 100)
    same(smooth.values.tolist(), [5, 7, 9, 11, 13, 15])  # from the point before 100 on
    assert (free.name, free.values.tolist()) == ("x.b.free", [7, 7])
    assert [s.name for s in plain] == ["x.a.used", "x.b.used"]
    assert evaluate_all([parse("useSeriesAbove(x.*.used, 5, 'used', 'free')")], used, context) == []


def test_a_tag_query_is_fetched_as_a_path_and_its_series_keep_their_tags():
    found = run("seriesByTag('name=~t')")
    assert [(s.name, s.tags["host"]) for s in found] == [("t.bytes;dc=w;host=a", "a"), ("t.bytes;dc=w;host=b", "b"),
                                                          ("t.pkts;dc=e;host=a", "a")]
    # a plain str (a graphite-web unpickles it), the call as written
    assert {type(s.path_expression) for s in found} == {str} and found[0].path_expression == "seriesByTag('name=~t')"
    assert fetches(parse("sumSeries(seriesByTag( 'name=~t' ))"), CONTEXT) == [("seriesByTag( 'name=~t' )", 0, 60)]


def test_events_are_a_null_series_each_second_since_ramen_keeps_none():
    [events] = run('events("deploy", "db")')
    assert (events.name, events.start, events.step, events.consolidate) == ('events("deploy", "db")', 0, 1, "sum")
    assert len(events.values) == 60 and np.isnan(events.values).all()


def test_a_literal_target_is_refused():
    with pytest.raises(TargetError, match="a target must yield series, not the literal 5"):
        evaluate(Literal(5), {}, CONTEXT)
    assert run("5") == []  # at the top, as in graphite-web, 5 is a metric path (matching nothing here)


def test_interval_units_follow_graphite_prefixes():
    assert [parse_interval_s(t) for t in ("30s", "5min", "5m", "1h", "2hours", "1d", "1w", "1mon", "1y", "1h30min",
                                          "-1h")] == [30, 300, 300, 3600, 7200, 86400, 604800, 30 * 86400, 365 * 86400,
                                                      5400, -3600]


def test_an_interval_past_year_9999_is_refused_before_numpy_overflows():
    assert parse_interval_s("8000y") == 8000 * 365 * 86400
    for text in ("9000y", "99999999999999999999999y", "-9000y"):
        with pytest.raises(TargetError, match=f"bad interval '{text}': longer than any time range"):
            parse_interval_s(text)
    with pytest.raises(TargetError, match="longer than any time range"):
        run("summarize(a.b, '99999999999999999999999y')")


# /functions


def test_functions_table_describes_every_required_function_in_graphite_webs_shape():
    described = describe_functions()
    for name in REQUIRED:
        info = described[name]
        assert set(info) == {"name", "function", "description", "module", "group", "params"}, name
        assert info["name"] == name and info["function"].startswith(name + "(") and info["description"]
        for param in info["params"]:
            assert set(param) <= {"name", "type", "required", "default", "multiple", "options", "suggestions"}
    assert described["summarize"]["function"] == "summarize(seriesList, intervalString, func='sum', alignToFrom=False)"
    assert described["sumSeries"]["function"] == "sumSeries(*seriesLists)"
    assert described["sumSeries"]["params"] == [{"name": "seriesLists", "type": "seriesList", "required": True,
                                                 "multiple": True}]
    assert described["consolidateBy"]["params"][1]["options"] == ["average", "avg", "avg_zero", "first", "last",
                                                                  "max", "min", "sum"]
    assert described["keepLastValue"]["params"][1] == {"name": "limit", "type": "intOrInf", "default": "inf"}
    assert set(describe_functions(grouped=True)) >= {"Alias", "Combine", "Transform", "Calculate", "Filter Series",
                                                     "Sorting", "Special"}
    assert set(describe_functions(group_name="Alias")) == {"alias", "aliasByNode", "aliasByMetric", "aliasSub",
                                                           "aliasByTags", "aliasQuery", "legendValue", "upper", "lower"}


NEWER_THAN_1_1_8 = {  # graphite-web 1.1.10's params (its source), which Debian's 1.1.8 has not
    "upper": [{"name": "seriesList", "type": "seriesList", "required": True},
              {"name": "pos", "type": "integer", "multiple": True}],
    "lower": [{"name": "seriesList", "type": "seriesList", "required": True},
              {"name": "pos", "type": "integer", "multiple": True}],
    "compressPeriodicGaps": [{"name": "seriesList", "type": "seriesList", "required": True}],
}


def test_function_params_match_graphite_webs_where_it_is_importable(graphite):
    from graphite.render import functions as graphite_functions
    for name, spec in FUNCTIONS.items():
        if name in NEWER_THAN_1_1_8:
            assert [p.to_json() for p in spec.params] == NEWER_THAN_1_1_8[name], name
            continue
        theirs = [p.toJSON() for p in graphite_functions.SeriesFunctions[name].params]
        ours = [p.to_json() for p in spec.params]
        for param in ours + theirs:
            param.pop("suggestions", None)
            if param.get("default") == math.inf:
                param["default"] = "inf"
        for mine, their in zip(ours, theirs):  # a callback: an aggregation, or one of our functions of theirs
            if mine["type"] == "aggOrSeriesFunc":
                assert set(mine.pop("options")) <= set(their.pop("options")), name
        assert ours == theirs, name


# Cross-check with graphite-web's own functions


@pytest.fixture(scope="module")
def graphite():
    """graphite-web's render functions, from Debian's graphite-web package, when importable."""
    functions, datalib = graphite_modules("graphite.render.functions", "graphite.render.datalib")
    return functions, datalib.TimeSeries



class FloatParams:
    """graphite-web's functions called as 1.1.10's evaluator calls them: a number given for a
    parameter of type float is made one first (validateParams; Debian's 1.1.8 evaluator does not),
    so `offset(x, 50)` is tagged `offset: 50.0` and `constantLine(42)` named `42.0`."""

    def __init__(self, functions) -> None:
        self._functions = functions
        (params,) = graphite_modules("graphite.functions.params")
        self._float = params.ParamTypes.float

    def __getattr__(self, name: str):
        function = getattr(self._functions, name)
        declared = getattr(function, "params", None)
        if not callable(function) or declared is None:
            return function

        def call(context, *args, **kwargs):
            args = [float(a) if i < len(declared) and declared[i].type == self._float and type(a) is int else a
                    for i, a in enumerate(args)]  # the context is not a param
            return function(context, *args, **kwargs)
        return call


def to_graphite(TimeSeries, s: Series):
    converted = TimeSeries(s.name, s.start, s.end, s.step, [None if math.isnan(v) else v for v in s.values.tolist()],
                           tags=dict(s.tags), xFilesFactor=0)
    converted.pathExpression = s.path_expression
    converted.consolidationFunc = s.consolidate
    return converted


CROSS_CHECKS = [
    # (target, graphite-web call given the converted series lists by path)
    ("sumSeries(prog.func.*.bytes)", lambda f, d: f.sumSeries({}, d["prog.func.*.bytes"])),
    ("averageSeries(prog.func.*.bytes, prog.slow.x)",
     lambda f, d: f.averageSeries({}, d["prog.func.*.bytes"], d["prog.slow.x"])),
    ("maxSeries(prog.func.*.bytes)", lambda f, d: f.maxSeries({}, d["prog.func.*.bytes"])),
    ("minSeries(prog.func.h1.bytes, prog.slow.x)",
     lambda f, d: f.minSeries({}, d["prog.func.h1.bytes"], d["prog.slow.x"])),
    ("scale(prog.func.*.bytes, 2.5)", lambda f, d: f.scale({}, d["prog.func.*.bytes"], 2.5)),
    ("offset(prog.func.*.bytes, -3)", lambda f, d: f.offset({}, d["prog.func.*.bytes"], -3)),
    ("alias(prog.slow.x, 'x')", lambda f, d: f.alias({}, d["prog.slow.x"], "x")),
    ("aliasByNode(prog.func.*.bytes, 1, 2)", lambda f, d: f.aliasByNode({}, d["prog.func.*.bytes"], 1, 2)),
    ("aliasByMetric(prog.func.*.bytes)", lambda f, d: f.aliasByMetric({}, d["prog.func.*.bytes"])),
    ('summarize(prog.func.*.bytes, "30s")', lambda f, d: f.summarize({}, d["prog.func.*.bytes"], "30s")),
    ('summarize(prog.func.*.bytes, "20s", "avg", true)',
     lambda f, d: f.summarize({}, d["prog.func.*.bytes"], "20s", "avg", True)),
    ('summarize(prog.counter.n, "1min", "max")', lambda f, d: f.summarize({}, d["prog.counter.n"], "1min", "max")),
    ("consolidateBy(prog.slow.x, 'sum')", lambda f, d: f.consolidateBy({}, d["prog.slow.x"], "sum")),
    ("keepLastValue(prog.func.*.bytes)", lambda f, d: f.keepLastValue({}, d["prog.func.*.bytes"])),
    ("keepLastValue(prog.func.*.bytes, 1)", lambda f, d: f.keepLastValue({}, d["prog.func.*.bytes"], 1)),
    ("nonNegativeDerivative(prog.counter.n)", lambda f, d: f.nonNegativeDerivative({}, d["prog.counter.n"])),
    # graphite-web compares a null with maxValue and fails (TypeError): checked on a series without nulls
    ("nonNegativeDerivative(prog.wrap.n, 12)", lambda f, d: f.nonNegativeDerivative({}, d["prog.wrap.n"], 12.0)),
    ("nonNegativeDerivative(prog.wrap.n, minValue=1)",
     lambda f, d: f.nonNegativeDerivative({}, d["prog.wrap.n"], None, 1.0)),
    ("perSecond(prog.wrap.n, 10, 1)", lambda f, d: f.perSecond({}, d["prog.wrap.n"], 10.0, 1.0)),
    ("perSecond(prog.counter.n)", lambda f, d: f.perSecond({}, d["prog.counter.n"])),
    ("highestAverage(prog.func.*.bytes, 1)", lambda f, d: f.highestAverage({}, d["prog.func.*.bytes"], 1)),
    ("limit(prog.func.*.bytes, 1)", lambda f, d: f.limit({}, d["prog.func.*.bytes"], 1)),
    ("sortByMaxima(prog.func.*.bytes)", lambda f, d: f.sortByMaxima({}, d["prog.func.*.bytes"])),
    ("asPercent(prog.func.*.bytes)", lambda f, d: f.asPercent({}, d["prog.func.*.bytes"])),
    ("asPercent(prog.func.*.bytes, 50)", lambda f, d: f.asPercent({}, d["prog.func.*.bytes"], 50)),
    ("asPercent(prog.func.*.bytes, prog.func.h1.bytes)",
     lambda f, d: f.asPercent({}, d["prog.func.*.bytes"], d["prog.func.h1.bytes"])),
    ("asPercent(prog.func.*.bytes, None, 2)", lambda f, d: f.asPercent({}, d["prog.func.*.bytes"], None, 2)),
    ("asPercent(x.*.used, x.{a,c}.total, 1)", lambda f, d: f.asPercent({}, d["x.*.used"], d["x.{a,c}.total"], 1)),
    ("asPercent(x.*.used, None, 2)", lambda f, d: f.asPercent({}, d["x.*.used"], None, 2)),
    ("group(prog.func.*.bytes, prog.slow.x)", lambda f, d: f.group({}, d["prog.func.*.bytes"], d["prog.slow.x"])),
    ("diffSeries(prog.func.*.bytes, prog.slow.x)",
     lambda f, d: f.diffSeries({}, d["prog.func.*.bytes"], d["prog.slow.x"])),
    ("multiplySeries(prog.func.*.bytes)", lambda f, d: f.multiplySeries({}, d["prog.func.*.bytes"])),
    ("multiplySeries(prog.slow.x)", lambda f, d: f.multiplySeries({}, d["prog.slow.x"])),
    ("divideSeries(prog.func.*.bytes, prog.slow.x)",
     lambda f, d: f.divideSeries({}, d["prog.func.*.bytes"], d["prog.slow.x"])),
    ("divideSeries(x.*.used, prog.func.h1.bytes)",
     lambda f, d: f.divideSeries({}, d["x.*.used"], d["prog.func.h1.bytes"])),
    ("divideSeries(prog.slow.x, nothing.*)", lambda f, d: f.divideSeries({}, d["prog.slow.x"], d["nothing.*"])),
    ("groupByNode(x.*.used, 2, 'sum')", lambda f, d: f.groupByNode({}, d["x.*.used"], 2, "sum")),
    # graphite-web's avg is its averageSeries here: tagged aggregatedBy average
    ("groupByNode(x.*.used, 2, 'avg')", lambda f, d: f.groupByNode({}, d["x.*.used"], 2, "avg")),
    ("groupByNode(prog.func.*.bytes, 1)", lambda f, d: f.groupByNode({}, d["prog.func.*.bytes"], 1)),
    ("groupByNodes(group(x.*.used, x.{a,c}.total), 'maxSeries', 1)",
     lambda f, d: f.groupByNodes({}, f.group({}, d["x.*.used"], d["x.{a,c}.total"]), "maxSeries", 1)),
    ("groupByNodes(sumSeries(prog.func.*.bytes), 'sum', 0, 2)",
     lambda f, d: f.groupByNodes({}, f.sumSeries({}, d["prog.func.*.bytes"]), "sum", 0, 2)),
    ("transformNull(prog.func.*.bytes)", lambda f, d: f.transformNull({}, d["prog.func.*.bytes"])),
    ("transformNull(prog.func.*.bytes, -1.5, x.*.used)",
     lambda f, d: f.transformNull({}, d["prog.func.*.bytes"], -1.5, d["x.*.used"])),
    ("absolute(offset(prog.func.*.bytes, -5))",
     lambda f, d: f.absolute({}, f.offset({}, d["prog.func.*.bytes"], -5))),
    ("derivative(prog.wrap.n)", lambda f, d: f.derivative({}, d["prog.wrap.n"])),
    ("derivative(prog.func.*.bytes)", lambda f, d: f.derivative({}, d["prog.func.*.bytes"])),
    ("integral(prog.func.*.bytes)", lambda f, d: f.integral({}, d["prog.func.*.bytes"])),
    ("lowestAverage(group(prog.func.*.bytes, nothing.*, x.*.used), 3)",
     lambda f, d: f.lowestAverage({}, f.group({}, d["prog.func.*.bytes"], d["nothing.*"], d["x.*.used"]), 3)),
    ("removeBelowValue(prog.func.*.bytes, 4)", lambda f, d: f.removeBelowValue({}, d["prog.func.*.bytes"], 4.0)),
    ("removeAboveValue(prog.func.*.bytes, 4.5)", lambda f, d: f.removeAboveValue({}, d["prog.func.*.bytes"], 4.5)),
    ("sortByName(group(x.*.used, prog.func.*.bytes), false, true)",
     lambda f, d: f.sortByName({}, f.group({}, d["x.*.used"], d["prog.func.*.bytes"]), False, True)),
    ("aliasSub(prog.func.*.bytes, '^prog\\.func\\.(\\w+)\\..*', 'host \\1')",
     lambda f, d: f.aliasSub({}, d["prog.func.*.bytes"], r"^prog\.func\.(\w+)\..*", r"host \1")),
    # graphite-web sets the request's xFilesFactor too, which its sumSeries then takes
    ("sumSeries(setXFilesFactor(prog.func.*.bytes, 1))",
     lambda f, d: (lambda context: f.sumSeries(context, f.setXFilesFactor(context, d["prog.func.*.bytes"], 1)))({})),
    ('summarize(xFilesFactor(prog.func.*.bytes, 0.6), "30s")',
     lambda f, d: f.summarize({}, f.setXFilesFactor({}, d["prog.func.*.bytes"], 0.6), "30s")),
    # filters and sorts over a whole series: x.b.used and nothing else has a null at its end
    ("lowest(group(prog.func.*.bytes, x.*.used), 2, 'max')",
     lambda f, d: f.lowest({}, f.group({}, d["prog.func.*.bytes"], d["x.*.used"]), 2, "max")),
    ("highestCurrent(group(prog.func.*.bytes, x.*.used), 2)",
     lambda f, d: f.highestCurrent({}, f.group({}, d["prog.func.*.bytes"], d["x.*.used"]), 2)),
    ("highestMax(prog.func.*.bytes, 1)", lambda f, d: f.highestMax({}, d["prog.func.*.bytes"], 1)),
    ("lowestCurrent(group(prog.func.*.bytes, x.*.used), 2)",
     lambda f, d: f.lowestCurrent({}, f.group({}, d["prog.func.*.bytes"], d["x.*.used"]), 2)),
    *((f"{name}(group(prog.func.*.bytes, x.*.used), {n})",
       lambda f, d, name=name, n=n: getattr(f, name)({}, f.group({}, d["prog.func.*.bytes"], d["x.*.used"]), float(n)))
      for name in ("currentAbove", "currentBelow", "averageAbove", "averageBelow", "maximumAbove", "maximumBelow",
                   "minimumAbove", "minimumBelow") for n in (2, 6)),
    *((f"filterSeries(group(prog.func.*.bytes, x.*.used), 'sum', '{op}', 13)",
       lambda f, d, op=op: f.filterSeries({}, f.group({}, d["prog.func.*.bytes"], d["x.*.used"]), "sum", op, 13.0))
      for op in ("=", "!=", ">", ">=", "<", "<=")),
    ("exclude(prog.func.*.bytes, 'h[2-9]')", lambda f, d: f.exclude({}, d["prog.func.*.bytes"], "h[2-9]")),
    ("grep(group(prog.func.*.bytes, x.*.used), 'used$')",
     lambda f, d: f.grep({}, f.group({}, d["prog.func.*.bytes"], d["x.*.used"]), "used$")),
    ("removeEmptySeries(group(transformNull(prog.slow.x, 1), removeAboveValue(x.*.used, 0)))",
     lambda f, d: f.removeEmptySeries({}, f.group({}, f.transformNull({}, d["prog.slow.x"], 1),
                                                  f.removeAboveValue({}, d["x.*.used"], 0.0)))),
    ("removeEmptySeries(prog.func.*.bytes, 0.7)", lambda f, d: f.removeEmptySeries({}, d["prog.func.*.bytes"], 0.7)),
    ("sortBy(group(prog.func.*.bytes, nothing.*, x.*.used), 'max')",
     lambda f, d: f.sortBy({}, f.group({}, d["prog.func.*.bytes"], d["nothing.*"], d["x.*.used"]), "max")),
    ("sortBy(group(prog.func.*.bytes, x.*.used), 'last', true)",
     lambda f, d: f.sortBy({}, f.group({}, d["prog.func.*.bytes"], d["x.*.used"]), "last", True)),
    ("sortByTotal(group(x.*.used, prog.func.*.bytes))",
     lambda f, d: f.sortByTotal({}, f.group({}, d["x.*.used"], d["prog.func.*.bytes"]))),
    ("sortByMinima(group(prog.func.*.bytes, offset(x.*.used, -3)))",
     lambda f, d: f.sortByMinima({}, f.group({}, d["prog.func.*.bytes"], f.offset({}, d["x.*.used"], -3)))),
    # combinations
    ("rangeOfSeries(prog.func.*.bytes, prog.slow.x)",
     lambda f, d: f.rangeOfSeries({}, d["prog.func.*.bytes"], d["prog.slow.x"])),
    ("stddevSeries(prog.func.*.bytes)", lambda f, d: f.stddevSeries({}, d["prog.func.*.bytes"])),
    ("countSeries(prog.func.*.bytes, x.*.used)", lambda f, d: f.countSeries({}, d["prog.func.*.bytes"], d["x.*.used"])),
    *((f"percentileOfSeries(group(prog.func.*.bytes, prog.counter.n, prog.wrap.n), {n}, {str(i).lower()})",
       lambda f, d, n=n, i=i: f.percentileOfSeries(
           {}, f.group({}, d["prog.func.*.bytes"], d["prog.counter.n"], d["prog.wrap.n"]), float(n), i))
      for n in (10, 50, 75, 99.9) for i in (False, True)),
    ("sumSeriesWithWildcards(group(x.*.used, x.{a,c}.total), 1)",
     lambda f, d: f.sumSeriesWithWildcards({}, f.group({}, d["x.*.used"], d["x.{a,c}.total"]), 1)),
    ("averageSeriesWithWildcards(group(x.*.used, x.{a,c}.total), 2)",
     lambda f, d: f.averageSeriesWithWildcards({}, f.group({}, d["x.*.used"], d["x.{a,c}.total"]), 2)),
    ("multiplySeriesWithWildcards(prog.func.*.bytes, 2)",
     lambda f, d: f.multiplySeriesWithWildcards({}, d["prog.func.*.bytes"], 2)),
    ("aggregateWithWildcards(group(x.*.used, x.{a,c}.total), 'max', 1, 2)",
     lambda f, d: f.aggregateWithWildcards({}, f.group({}, d["x.*.used"], d["x.{a,c}.total"]), "max", 1, 2)),
    # transforms
    ("squareRoot(offset(prog.func.*.bytes, -3))",
     lambda f, d: f.squareRoot({}, f.offset({}, d["prog.func.*.bytes"], -3))),
    ("pow(offset(prog.func.*.bytes, -3), 2)", lambda f, d: f.pow({}, f.offset({}, d["prog.func.*.bytes"], -3), 2)),
    ("pow(offset(prog.func.*.bytes, -4), -0.5)",
     lambda f, d: f.pow({}, f.offset({}, d["prog.func.*.bytes"], -4), -0.5)),
    ("invert(offset(prog.func.*.bytes, -4))", lambda f, d: f.invert({}, f.offset({}, d["prog.func.*.bytes"], -4))),
    ("log(offset(prog.func.*.bytes, -2))", lambda f, d: f.logarithm({}, f.offset({}, d["prog.func.*.bytes"], -2))),
    ("log(prog.func.*.bytes, 2)", lambda f, d: f.logarithm({}, d["prog.func.*.bytes"], 2)),
    *((f"delay(prog.func.*.bytes, {steps})", lambda f, d, steps=steps: f.delay({}, d["prog.func.*.bytes"], steps))
      for steps in (2, -1, 6, -9)),
    ("offsetToZero(group(prog.func.*.bytes, removeAboveValue(x.*.used, 0)))",
     lambda f, d: f.offsetToZero({}, f.group({}, d["prog.func.*.bytes"], f.removeAboveValue({}, d["x.*.used"], 0)))),
    ("changed(group(prog.func.*.bytes, prog.wrap.n, keepLastValue(prog.func.h1.bytes)))",
     lambda f, d: f.changed({}, f.group({}, d["prog.func.*.bytes"], d["prog.wrap.n"],
                                         f.keepLastValue({}, d["prog.func.h1.bytes"])))),
    ("isNonNull(prog.func.*.bytes)", lambda f, d: f.isNonNull({}, d["prog.func.*.bytes"])),
    # graphite-web's PNG styles: series kept, some renamed
    ("color(prog.func.*.bytes, 'red')", lambda f, d: f.color({}, d["prog.func.*.bytes"], "red")),
    ("alpha(prog.func.*.bytes, 0.5)", lambda f, d: f.alpha({}, d["prog.func.*.bytes"], 0.5)),
    ("lineWidth(prog.func.*.bytes, 2)", lambda f, d: f.lineWidth({}, d["prog.func.*.bytes"], 2)),
    ("dashed(prog.func.*.bytes)", lambda f, d: f.dashed({}, d["prog.func.*.bytes"])),
    ("dashed(prog.func.*.bytes, 3)", lambda f, d: f.dashed({}, d["prog.func.*.bytes"], 3)),
    ("secondYAxis(prog.func.*.bytes)", lambda f, d: f.secondYAxis({}, d["prog.func.*.bytes"])),
    ("drawAsInfinite(prog.wrap.n)", lambda f, d: f.drawAsInfinite({}, d["prog.wrap.n"])),
    ("stacked(group(prog.func.*.bytes, prog.wrap.n))",
     lambda f, d: f.stacked({}, f.group({}, d["prog.func.*.bytes"], d["prog.wrap.n"]))),
    ("stacked(group(prog.func.*.bytes, x.*.used), 'mine')",
     lambda f, d: f.stacked({}, f.group({}, d["prog.func.*.bytes"], d["x.*.used"]), "mine")),
    ("aliasByTags(prog.func.*.bytes, 'name', 2)", lambda f, d: f.aliasByTags({}, d["prog.func.*.bytes"], "name", 2)),
    ("legendValue(group(prog.func.*.bytes, removeAboveValue(x.*.used, 0)), 'avg', 'max', 'current')",
     lambda f, d: f.legendValue({}, f.group({}, d["prog.func.*.bytes"], f.removeAboveValue({}, d["x.*.used"], 0)),
                                "avg", "max", "current")),
    *((f"legendValue(group(scale(prog.func.*.bytes, {factor}), removeAboveValue(x.*.used, 0)), 'sum', 'min', "
       f"'{system}')",
       lambda f, d, factor=factor, system=system: f.legendValue(
           {}, f.group({}, f.scale({}, d["prog.func.*.bytes"], factor), f.removeAboveValue({}, d["x.*.used"], 0)),
           "sum", "min", system))
      for factor in (1, 1000, 123456789) for system in ("si", "binary")),
    # more transforms, filters and combinations
    ("add(prog.func.*.bytes, 2.5)", lambda f, d: f.add({}, d["prog.func.*.bytes"], 2.5)),
    ("round(scale(prog.func.*.bytes, 0.37))",
     lambda f, d: f.roundFunction({}, f.scale({}, d["prog.func.*.bytes"], 0.37))),
    ("round(scale(prog.func.*.bytes, 37), -1)",
     lambda f, d: f.roundFunction({}, f.scale({}, d["prog.func.*.bytes"], 37), -1)),
    *((f"round(scale(prog.func.*.bytes, 0.37), {digits})",  # numpy's scaling by 10**digits overflowed
       lambda f, d, digits=digits: f.roundFunction({}, f.scale({}, d["prog.func.*.bytes"], 0.37), digits))
      for digits in (306, 400, -400)),
    ("exp(scale(prog.func.*.bytes, 0.1))", lambda f, d: f.exp({}, f.scale({}, d["prog.func.*.bytes"], 0.1))),
    ("logit(scale(prog.counter.n, 0.1))", lambda f, d: f.logit({}, f.scale({}, d["prog.counter.n"], 0.1))),
    ("sigmoid(offset(prog.func.*.bytes, -3))", lambda f, d: f.sigmoid({}, f.offset({}, d["prog.func.*.bytes"], -3))),
    ("minMax(group(prog.func.*.bytes, prog.slow.x, removeAboveValue(x.*.used, 0)))",
     lambda f, d: f.minMax({}, f.group({}, d["prog.func.*.bytes"], d["prog.slow.x"],
                                       f.removeAboveValue({}, d["x.*.used"], 0)))),
    ("scaleToSeconds(prog.func.*.bytes, 60)", lambda f, d: f.scaleToSeconds({}, d["prog.func.*.bytes"], 60)),
    ("interpolate(group(prog.func.*.bytes, prog.counter.n))",
     lambda f, d: f.interpolate({}, f.group({}, d["prog.func.*.bytes"], d["prog.counter.n"]))),
    ("interpolate(prog.func.*.bytes, 1)", lambda f, d: f.interpolate({}, d["prog.func.*.bytes"], 1)),
    ("integralByInterval(prog.func.*.bytes, '20s')",
     lambda f, d: f.integralByInterval({"startTime": EPOCH}, d["prog.func.*.bytes"], "20s")),
    ("substr(prog.func.*.bytes, 1, 3)", lambda f, d: f.substr({}, d["prog.func.*.bytes"], 1, 3)),
    ("substr(sumSeries(prog.func.*.bytes), 2)", lambda f, d: f.substr({}, f.sumSeries({}, d["prog.func.*.bytes"]), 2)),
    ("cumulative(prog.slow.x)", lambda f, d: f.cumulative({}, d["prog.slow.x"])),
    ("fallbackSeries(nothing.*, prog.slow.x)", lambda f, d: f.fallbackSeries({}, d["nothing.*"], d["prog.slow.x"])),
    ("fallbackSeries(prog.wrap.n, prog.slow.x)", lambda f, d: f.fallbackSeries({}, d["prog.wrap.n"], d["prog.slow.x"])),
    ("stdev(prog.func.*.bytes, 3)", lambda f, d: f.stdev({}, d["prog.func.*.bytes"], 3)),
    ("stdev(prog.func.*.bytes, 2, 1)", lambda f, d: f.stdev({}, d["prog.func.*.bytes"], 2, 1.0)),
    ("aggregateLine(group(prog.func.*.bytes, removeAboveValue(x.*.used, 0)), 'max', true)",
     lambda f, d: f.aggregateLine({}, f.group({}, d["prog.func.*.bytes"], f.removeAboveValue({}, d["x.*.used"], 0)),
                                  "max", True)),
    *((f"{name}(group(prog.func.*.bytes, prog.counter.n, prog.wrap.n), {n})",
       lambda f, d, name=name, n=n: getattr(f, name)(
           {}, f.group({}, d["prog.func.*.bytes"], d["prog.counter.n"], d["prog.wrap.n"]), n))
      for name in ("removeAbovePercentile", "removeBelowPercentile") for n in (25, 50, 90)),
    *((f"{name}(group(prog.counter.n, prog.wrap.n, x.*.used, x.{{a,c}}.total), {n})",
       lambda f, d, name=name, n=n: getattr(f, name)(
           {}, f.group({}, d["prog.counter.n"], d["prog.wrap.n"], d["x.*.used"], d["x.{a,c}.total"]), n))
      for name in ("averageOutsidePercentile",) for n in (10, 60, 95)),
    # graphite-web compares a null with the percentiles and fails (TypeError): series without nulls
    *((f"removeBetweenPercentile(group(transformNull(prog.counter.n), prog.wrap.n, transformNull(prog.func.*.bytes)), "
       f"{n})",
       lambda f, d, n=n: f.removeBetweenPercentile({}, f.group(
           {}, f.transformNull({}, d["prog.counter.n"]), d["prog.wrap.n"], f.transformNull({}, d["prog.func.*.bytes"])),
           n)) for n in (30, 70, 95)),
    ("mostDeviant(group(prog.func.*.bytes, prog.counter.n, prog.wrap.n, removeAboveValue(x.*.used, 0)), 2)",
     lambda f, d: f.mostDeviant({}, f.group({}, d["prog.func.*.bytes"], d["prog.counter.n"], d["prog.wrap.n"],
                                              f.removeAboveValue({}, d["x.*.used"], 0)), 2)),
    ("unique(prog.func.*.bytes, prog.func.h1.bytes, prog.slow.x)",
     lambda f, d: f.unique({}, d["prog.func.*.bytes"], d["prog.func.h1.bytes"], d["prog.slow.x"])),
    ("aggregateSeriesLists(x.*.used, x.{a,c}.total, 'max')",
     lambda f, d: f.aggregateSeriesLists({}, d["x.*.used"], d["x.{a,c}.total"], "max")),
    *((f"{func}SeriesLists(x.*.used, x.{{a,c}}.total)",
       lambda f, d, func=func: getattr(f, f"{func}SeriesLists")({}, d["x.*.used"], d["x.{a,c}.total"]))
      for func in ("sum", "diff", "multiply", "divide")),
    ("powSeries(prog.wrap.n, offset(prog.counter.n, -2))",
     lambda f, d: f.powSeries({}, d["prog.wrap.n"], f.offset({}, d["prog.counter.n"], -2))),
    ("avg(prog.func.*.bytes)", lambda f, d: f.averageSeries({}, d["prog.func.*.bytes"])),
    ("sum(prog.func.*.bytes, prog.slow.x)", lambda f, d: f.sumSeries({}, d["prog.func.*.bytes"], d["prog.slow.x"])),
    ("pct(prog.func.*.bytes)", lambda f, d: f.asPercent({}, d["prog.func.*.bytes"])),
    *((f'hitcount(group(prog.func.*.bytes, prog.slow.x), "{interval}")',
       lambda f, d, interval=interval: f.hitcount({}, f.group({}, d["prog.func.*.bytes"], d["prog.slow.x"]), interval))
      for interval in ("20s", "25s", "5s", "7s", "1min")),
    ("weightedAverage(x.*.used, x.{a,c}.total, 1)",
     lambda f, d: f.weightedAverage({}, d["x.*.used"], d["x.{a,c}.total"], 1)),
    ("weightedAverage(prog.func.*.bytes, group(prog.counter.n, prog.wrap.n))",
     lambda f, d: f.weightedAverage({}, d["prog.func.*.bytes"], f.group({}, d["prog.counter.n"], d["prog.wrap.n"]))),
    ("areaBetween(group(prog.func.h1.bytes, prog.wrap.n))",
     lambda f, d: f.areaBetween({}, f.group({}, d["prog.func.h1.bytes"], d["prog.wrap.n"]))),
    *((f"cactiStyle(group(scale(prog.func.*.bytes, {factor}), prog.wrap.n, removeAboveValue(x.*.used, 0)){extra})",
       lambda f, d, factor=factor, args=args: f.cactiStyle(
           {}, f.group({}, f.scale({}, d["prog.func.*.bytes"], factor), d["prog.wrap.n"],
                       f.removeAboveValue({}, d["x.*.used"], 0)), *args))
      for factor in (1, 0.1, 1234.5)
      for extra, args in (("", ()), (", 'si'", ("si",)), (", 'binary', 'B'", ("binary", "B")),
                          (", None, 'ms'", (None, "ms")))),
    *((f"reduceSeries(mapSeries(prog.func.*.bytes, 1), '{func}', 2, 'h1', 'h2')",
       lambda f, d, func=func: f.reduceSeries({}, f.mapSeries({}, d["prog.func.*.bytes"], 1), func, 2, "h1", "h2"))
      for func in ("sumSeries", "divideSeries", "asPercent", "diffSeries")),
    *((f"groupByTags(seriesByTag('name=~t'), '{callback}', {', '.join(map(repr, tags))})",
       lambda f, d, callback=callback, tags=tags: f.groupByTags({}, d["seriesByTag('name=~t')"], callback, *tags))
      for callback, tags in (("sum", ("dc",)), ("average", ("name",)), ("sumSeries", ("host", "dc")),
                             ("max", ("name", "host")))),
    ("aliasByTags(seriesByTag('name=~t'), 'host', 'name')",
     lambda f, d: f.aliasByTags({}, d["seriesByTag('name=~t')"], "host", "name")),
    ("sumSeries(seriesByTag('name=~t'))", lambda f, d: f.sumSeries({}, d["seriesByTag('name=~t')"])),
    *((target, lambda f, d, args=args: f.applyByNode({}, d["x.*.used"], *args)) for target, args in (
        ("applyByNode(x.*.used, 1, 'divideSeries(%.used, %.total)')", (1, "divideSeries(%.used, %.total)")),
        ("applyByNode(x.*.used, 1, 'asPercent(%.used, sumSeries(x.*.used))', '%.share')",
         (1, "asPercent(%.used, sumSeries(x.*.used))", "%.share")),
        ("applyByNode(x.*.used, 0, 'sumSeries(%.*.total)')", (0, "sumSeries(%.*.total)")))),
    *((f"aliasQuery(x.*.used, 'used', 'total', '{name}')",
       lambda f, d, name=name: f.aliasQuery({}, d["x.*.used"], "used", "total", name))
      for name in ("%d total", "%.1f%% of it", "%s at most", "%05.2f")),
    ("aliasQuery(prog.func.h1.bytes, 'func.h1.bytes', 'counter.n', 'counter at %g')",
     lambda f, d: f.aliasQuery({}, d["prog.func.h1.bytes"], "func.h1.bytes", "counter.n", "counter at %g")),
    # graphite-web's useSeriesAbove fails on a null (max() of None and numbers): series without
    *((f"useSeriesAbove(prog.wrap.n, {value}, 'wrap', 'counter')",
       lambda f, d, value=value: f.useSeriesAbove({}, d["prog.wrap.n"], value, "wrap", "counter"))
      for value in (0, 12.5, 13)),
    ("useSeriesAbove(x.a.used, 1.5, '(x.a).used', '\\1.total')",
     lambda f, d: f.useSeriesAbove({}, d["x.a.used"], 1.5, "(x.a).used", "\\1.total")),
    *((f"nPercentile(group(prog.func.*.bytes, nothing.*, prog.wrap.n), {n})",
       lambda f, d, n=n: f.nPercentile({}, f.group({}, d["prog.func.*.bytes"], d["nothing.*"], d["prog.wrap.n"]), n))
      for n in (25, 50, 90, 100)),
]


@pytest.mark.parametrize("target, theirs", CROSS_CHECKS, ids=[target for target, _ in CROSS_CHECKS])
def test_same_names_times_and_values_as_graphite_web(graphite, monkeypatch, target, theirs):
    functions, TimeSeries = graphite
    ours = run(target)
    converted = {path: [to_graphite(TimeSeries, s) for s in found] for path, found in fetched().items()}
    for path, found in converted.items():  # as graphite-web's fetchData marks them
        for s in found:
            s.pathExpression = path
    # graphite-web's evaluateTarget fetching from the same data (applyByNode's, useSeriesAbove's targets)
    evaluator, tag_utils = graphite_modules("graphite.render.evaluator", "graphite.tags.utils")
    monkeypatch.setattr(evaluator, "prefetchData", lambda context, paths: None)
    # groupByTags' tag database: only its parse of tagged names
    monkeypatch.setattr(functions, "STORE", types.SimpleNamespace(
        tagdb=types.SimpleNamespace(parse=tag_utils.TaggedSeries.parse)))
    monkeypatch.setattr(evaluator, "fetchData", lambda context, path: copy.deepcopy(converted[path]))
    expected = theirs(FloatParams(functions), converted)
    assert [s.name for s in ours] == [s.name for s in expected]
    for mine, their in zip(ours, expected):
        their_values = [NAN if v is None else v for v in their]
        assert (mine.start, mine.step) == (their.start, their.step * their.valuesPerPoint), mine.name
        same(mine.values.tolist(), their_values)
        assert {k: v for k, v in mine.tags.items()} == dict(their.tags), mine.name

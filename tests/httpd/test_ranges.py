"""Target functions whose series are fetched over other ranges than the render's (a moving
window's reach before it, a forecast's bootstrap, a regression's source, an aligned start), each
against graphite-web's own function with its evaluateTarget answering from the same archive."""

import datetime
import math

import numpy as np
import pytest

from ramen.httpd.functions import FUNCTIONS, Context, TargetError, evaluate, fetches, forecasts
from ramen.httpd.series import Series
from ramen.httpd.target import parse as parse_target
from tests.httpd.graphite_web import graphite_modules

NAN = math.nan
UTC = datetime.timezone.utc
STEP = 10
FROM, UNTIL = 1_800_000_000, 1_800_000_600
"""The render's range (a Friday, 08:00 UTC): 60 points of STEP, with data for a day before it."""
DAY = 86_400


def parse(text):
    return parse_target(text, FUNCTIONS)


def archived(path, seed, start=FROM - DAY, stop=UNTIL, step=STEP, nulls=0.1):
    """A series as the archive holds it: a daily wave, noise and a few nulls."""
    rng = np.random.default_rng(seed)
    times = np.arange(start, stop, step)
    values = 100 + 30 * np.sin(2 * np.pi * times / 3600) + rng.normal(0, 3, len(times))
    values[rng.random(len(times)) < nulls] = NAN
    return Series(path, start, step, values)


ARCHIVE = {"a.b": [archived("a.b", 1)],
           "a.*": [archived("a.x", 2), archived("a.y", 3, nulls=0.3)],
           "slow": [archived("slow", 4, step=60)]}


def fetched_over(path, from_s, until_s):
    """What a render fetches of `path` over [from_s, until_s): the grid of its steps there."""
    out = []
    for s in ARCHIVE.get(path, []):
        start = from_s // s.step * s.step
        count = -(-until_s // s.step) - start // s.step
        at = (start - s.start) // s.step
        values = np.full(count, NAN)
        low, high = max(at, 0), min(at + count, len(s.values))
        if low < high:
            values[low - at:high - at] = s.values[low:high]
        out.append(Series(s.name, start, s.step, values))
    return out


def steps(path):
    return max((s.step for s in ARCHIVE.get(path, [])), default=0)


CONTEXT = Context(FROM, UNTIL, UNTIL, step_of=steps)


def run(target, context=CONTEXT):
    """The target evaluated as a render does: each (path, range) it asks for fetched first."""
    node = parse(target)
    data = {(path, since, until): fetched_over(path, since, until) for path, since, until in fetches(node, context)}
    return evaluate(node, data, context)


@pytest.fixture(scope="module")
def graphite():
    functions, datalib = graphite_modules("graphite.render.functions", "graphite.render.datalib")
    return functions, datalib.TimeSeries


def theirs(graphite, monkeypatch, name, path, *args, context=CONTEXT):
    """graphite-web's function `name` over `path`, its evaluateTarget fetching from the archive."""
    functions, TimeSeries = graphite

    def to_graphite(s):
        converted = TimeSeries(s.name, s.start, s.end, s.step,
                               [None if math.isnan(v) else v for v in s.values.tolist()], tags={"name": s.name},
                               xFilesFactor=0)
        converted.pathExpression = path
        return converted

    def evaluate_target(request, target):
        return [to_graphite(s) for s in fetched_over(path, int(request["startTime"].timestamp()),
                                                        int(request["endTime"].timestamp()))]
    monkeypatch.setattr(functions, "evaluateTarget", evaluate_target)
    start = datetime.datetime.fromtimestamp(context.from_s, UTC)
    request = {"startTime": start, "endTime": datetime.datetime.fromtimestamp(context.until_s, UTC),
               "now": datetime.datetime.fromtimestamp(context.now_s, UTC), "args": [path], "prefetch": {},
               "localOnly": True, "tzinfo": UTC}
    return getattr(functions, name)(request, evaluate_target(request, path), *args)


def same_series(ours, expected, *, points=None, later=False):
    """Names, starts, steps, tags and values alike (the first `points` values where graphite-web
    draws more than the range holds). `later`: `expected` is of the range a step later."""
    assert [s.name for s in ours] == [s.name for s in expected]
    for mine, their in zip(ours, expected):
        assert (mine.start + mine.step * later, mine.step) == (their.start, their.step), mine.name
        assert mine.tags == {key: str(value) for key, value in their.tags.items()}, mine.name
        values = [NAN if v is None else v for v in list(their)]
        values = values[:len(mine.values)] if points is None else values[:points]
        assert len(mine.values) == len(values), mine.name
        np.testing.assert_allclose(mine.values, values, rtol=1e-9, equal_nan=True, err_msg=mine.name)


def test_a_moving_window_reaches_back_one_window_for_its_first_points():
    assert fetches(parse("movingAverage(a.b, '5min')"), CONTEXT) == [("a.b", FROM - 300, UNTIL)]
    assert fetches(parse("movingAverage(slow, 5)"), CONTEXT) == [("slow", FROM - 300, UNTIL)]  # 5 points of 60 s
    assert fetches(parse("movingAverage(group(a.b, slow), 5)"), CONTEXT) == [("a.b", FROM - 300, UNTIL),
                                                                              ("slow", FROM - 300, UNTIL)]
    nested = parse("movingSum(movingAverage(a.b, 3), '1min')")
    assert fetches(nested, CONTEXT) == [("a.b", FROM - 90, UNTIL)]  # the windows add up
    early = Context(100, 160, 160, step_of=steps)
    assert fetches(parse("movingAverage(a.b, '5min')"), early) == [("a.b", 0, 160)]  # nothing before 1970
    [average] = run("movingAverage(a.b, '5min')")
    assert (average.start, len(average.values)) == (FROM, 60)
    [before] = fetched_over("a.b", FROM - 300 + STEP, FROM + STEP)  # the window that ends with the first point
    assert average.values[0] == pytest.approx(np.nanmean(before.values))


def test_a_moving_window_of_points_over_a_summary_reaches_back_its_points_at_the_summarys_step():
    """graphite-web counts a window of points at the step of the series it is given: 3 points of a
    5 min summary reach 15 minutes back (ramen reached 3 raw steps, 30 s, and the first points
    were wrong: 2,319 against 23,714)."""
    assert fetches(parse("movingAverage(summarize(a.b, '5min', 'sum'), 3)"), CONTEXT) == [("a.b", FROM - 900, UNTIL)]
    assert fetches(parse("movingSum(hitcount(slow, '10min'), 2)"), CONTEXT) == [("slow", FROM - 1200, UNTIL)]
    assert fetches(parse("movingAverage(scale(a.b, 2), 3)"), CONTEXT) == [("a.b", FROM - 3 * STEP, UNTIL)]
    [smooth] = run("movingAverage(summarize(a.b, '5min', 'sum'), 3)")
    [series] = fetched_over("a.b", FROM - 600, FROM + 300)  # the summary's buckets ending with the first
    sums = [np.nansum(series.values[k * 30:(k + 1) * 30]) for k in range(3)]
    assert (smooth.start, smooth.step) == (FROM, 300)
    assert smooth.values[0] == pytest.approx(np.mean(sums))


@pytest.mark.parametrize("target, call", [
    ("movingAverage(a.*, '5min')", ("movingWindow", "5min")),
    ("movingWindow(a.*, 7, 'median')", ("movingWindow", 7, "median")),
    ("movingMax(a.b, 12, 0.9)", ("movingWindow", 12, "max", 0.9)),
    ("movingSum(slow, 3)", ("movingWindow", 3, "sum")),
    ("exponentialMovingAverage(a.*, 6)", ("exponentialMovingAverage", 6)),
    ("exponentialMovingAverage(a.b, '1min')", ("exponentialMovingAverage", "1min")),
])
def test_moving_windows_over_the_points_before_the_range_are_graphite_webs(graphite, monkeypatch, target, call):
    """graphite-web 1.1.10's, whose windows end with the point they are drawn at (its issue #2632).
    The tests have Debian's 1.1.8, whose point t is 1.1.10's point t - step: 1.1.8 over the range a
    step later draws 1.1.10's windows over this one. Its exponential average is 1.1.8's (1.1.10's
    source is the same), the average through each point drawn at the next."""
    path = parse(target).args[0].text
    ours = run(target)
    step = ours[0].step
    if call[0] == "exponentialMovingAverage":
        # graphite-web draws the exponential average one step past the range
        same_series(ours, theirs(graphite, monkeypatch, call[0], path, *call[1:]))
    else:
        later = Context(CONTEXT.from_s + step, CONTEXT.until_s + step, CONTEXT.now_s + step, step_of=steps)
        expected = theirs(graphite, monkeypatch, call[0], path, *call[1:], context=later)
        same_series(ours, expected, later=True)


@pytest.mark.parametrize("scalar_max_series", [100, 0])
def test_holt_winters_forecast_bands_aberration_and_area_are_graphite_webs(graphite, monkeypatch, scalar_max_series):
    """Series analysed one by one, or (scalar_max_series 0) as vectors, all of them at once."""
    monkeypatch.setattr(forecasts, "SCALAR_MAX_SERIES", scalar_max_series)
    args = (3, "2h", "1h")
    assert fetches(parse("holtWintersForecast(a.b, '2h', '1h')"), CONTEXT) == [("a.b", FROM - 7200, UNTIL)]
    assert fetches(parse("holtWintersForecast(a.b)"), CONTEXT) == [("a.b", FROM - 7 * DAY, UNTIL)]  # a week
    same_series(run("holtWintersForecast(a.*, '2h', '1h')"),
                theirs(graphite, monkeypatch, "holtWintersForecast", "a.*", "2h", "1h"))
    same_series(run("holtWintersConfidenceBands(a.*, 3, '2h', '1h')"),
                theirs(graphite, monkeypatch, "holtWintersConfidenceBands", "a.*", *args))
    same_series(run("holtWintersAberration(a.*, 3, '2h', '1h')"),
                theirs(graphite, monkeypatch, "holtWintersAberration", "a.*", *args))
    same_series(run("holtWintersConfidenceArea(a.b, 3, '2h', '1h')"),
                theirs(graphite, monkeypatch, "holtWintersConfidenceArea", "a.b", *args))
    [aberration] = run("holtWintersAberration(a.b, 1, '2h', '1h')")
    assert (aberration.values != 0).any()  # a narrow band: the noise goes past it


def test_a_forecast_too_long_to_run_is_refused_in_one_line():
    with pytest.raises(TargetError, match=r"holtWintersForecast: [\d,]+ points to analyse, bootstrap included, "
                                          r"about \d+ s, more than 5"):
        run("holtWintersForecast(a.b, '5y')")


def test_linear_regression_fits_its_source_range_and_draws_over_the_range(graphite, monkeypatch):
    source = (FROM - 3600, FROM)
    target = f"linearRegression(a.*, {source[0]}, {source[1]})"
    assert fetches(parse(target), CONTEXT) == [("a.*", FROM, UNTIL), ("a.*", *source)]
    ours = run(target)
    functions, _ = graphite
    expected = theirs(graphite, monkeypatch, "linearRegression", "a.*", str(source[0]), str(source[1]))
    same_series(ours, expected)
    assert ours[0].name == f"linearRegression(a.x, {source[0]}, {source[1]})"
    same_series(run("linearRegression(a.b)"), theirs(graphite, monkeypatch, "linearRegression", "a.b"))
    with pytest.raises(TargetError, match="linearRegression: its source range .* is empty"):
        run(f"linearRegression(a.b, {FROM}, {FROM - 60})")


@pytest.mark.parametrize("align_to, start", [("hours", FROM), ("days", FROM - 8 * 3600),
                                             ("weeks", FROM - 8 * 3600 - 4 * DAY), ("months", 1_798_761_600),
                                             ("years", 1_798_761_600), ("minutes", FROM + 1200),
                                             ("seconds", FROM + 1234)])
def test_smart_summarize_aligned_starts_at_its_unit_as_graphite_web_does(graphite, monkeypatch, align_to, start):
    """FROM is Friday 2027-01-15 08:00 UTC: its week started on Monday the 11th, its month and
    year on 2027-01-01."""
    context = Context(FROM + 1234, UNTIL + 3600, UNTIL + 3600, step_of=steps)
    target = f"smartSummarize(a.*, '1h', 'avg', '{align_to}')"
    assert fetches(parse(target), context) == [("a.*", start, UNTIL + 3600)]
    same_series(run(target, context),
                theirs(graphite, monkeypatch, "smartSummarize", "a.*", "1h", "avg", align_to, context=context))


def test_smart_summarize_without_alignment_and_hitcount_aligned_are_graphite_webs(graphite, monkeypatch):
    context = Context(FROM + 1234, UNTIL + 3600, UNTIL + 3600, step_of=steps)
    same_series(run("smartSummarize(a.*, '10min')", context),
                theirs(graphite, monkeypatch, "smartSummarize", "a.*", "10min", context=context))
    assert fetches(parse("hitcount(a.b, '1h', true)"), context) == [("a.b", FROM, UNTIL + 3600)]
    same_series(run("hitcount(a.*, '1h', true)", context),
                theirs(graphite, monkeypatch, "hitcount", "a.*", "1h", True, context=context))
    same_series(run("hitcount(a.*, '5min', true)", context),
                theirs(graphite, monkeypatch, "hitcount", "a.*", "5min", True, context=context))
    with pytest.raises(TargetError, match="smartSummarize: parameter 'alignTo' must be one of"):
        run("smartSummarize(a.b, '1h', 'sum', 'fortnights')")

"""Functions that map each series to one other: arithmetic, counters' derivatives,
summarize, timeShift, nulls filled or marked."""

from __future__ import annotations

import math
import time

import numpy as np

from ramen.httpd.functions.context import Context, check_made_points, parse_interval_s
from ramen.httpd.functions.reductions import AGGREGATIONS, AGGREGATION_ALIASES, aggregate_rows, aggregation_names
from ramen.httpd.functions.results import named, of_range, real_or_null, tagged
from ramen.httpd.series import Series
from ramen.httpd.target import TargetError

FLOAT_DECIMALS = 308
"""Past it, 10 ** decimals is no float: rounding to more (or fewer) decimals is that much."""


def scale(context: Context, seriesList: list[Series], factor: float) -> list[Series]:
    """Multiplies every value by `factor`; nulls stay null."""
    return [named(s, f"scale({s.name},{factor:g})", values=s.values * factor, tags=tagged(s, scale=factor))
            for s in seriesList]


def offset(context: Context, seriesList: list[Series], factor: float) -> list[Series]:
    """Adds `factor` to every value; nulls stay null."""
    return [named(s, f"offset({s.name},{factor:g})", values=s.values + factor, tags=tagged(s, offset=factor))
            for s in seriesList]


def summarize(context: Context, seriesList: list[Series], intervalString: str, func: str = "sum",
              alignToFrom: bool = False) -> list[Series]:
    """Reduces each series to one point per interval (`"1h"`, `"10min"`) by `func` (sum by default;
    average, max, min, last, ...). Buckets start at multiples of the interval since the epoch, or at
    the series' start with alignToFrom=true. Named `summarize(<name>, "<interval>", "<func>")`.
    As in graphite-web, when the series ends on a bucket boundary the last bucket is an empty one."""
    interval = _summary_interval("summarize", intervalString, func)
    results = []
    for s in seriesList:
        if alignToFrom:
            new_start = s.start
            buckets = -(-(s.end - s.start) // interval)
        else:
            new_start = s.start - s.start % interval
            buckets = (s.end - s.end % interval + interval - new_start) // interval
        name = f'summarize({s.name}, "{intervalString}", "{func}"{", true" if alignToFrom else ""})'
        results.append(named(s, name, start=new_start, step=interval,
                             values=_summarized("summarize", s, func, interval, new_start, buckets),
                             tags=tagged(s, summarize=intervalString, summarizeFunction=func)))
    return results


def smart_summarize(context: Context, seriesList: list[Series], intervalString: str, func: str = "sum",
                    alignTo: str | bool | None = None) -> list[Series]:
    """Reduces each series to one point per interval by `func`, the intervals starting with the
    series: with alignTo (years, months, weeks, days, hours, minutes, seconds), the series are
    fetched from the start of that unit (UTC) holding the range's start (evaluation.SERIES_SCOPES).
    Named `smartSummarize(<name>, "<interval>", "<func>")`."""
    interval = _summary_interval("smartSummarize", intervalString, func)
    results = []
    for s in seriesList:
        buckets = -(-(s.end - s.start) // interval)
        name = f'smartSummarize({s.name}, "{intervalString}", "{func}")'
        results.append(named(s, name, step=interval,
                             values=_summarized("smartSummarize", s, func, interval, s.start, buckets),
                             tags=tagged(s, smartSummarize=intervalString, smartSummarizeFunction=func)))
    return results


def _summary_interval(name: str, intervalString: str, func: str) -> int:
    """The seconds of a summary's interval, its function checked."""
    interval = parse_interval_s(intervalString)
    if interval <= 0:
        raise TargetError(f"{name}: interval {intervalString!r} must be longer than 0 s")
    func_known = AGGREGATION_ALIASES.get(func, func)
    if func_known not in AGGREGATIONS:
        raise TargetError(f"{name}: unknown function {func!r} (known: {', '.join(aggregation_names())})")
    return interval


def _summarized(name: str, s: Series, func: str, interval: int, new_start: int, buckets: int) -> np.ndarray:
    """`func` over the points of each of `buckets` intervals from `new_start`."""
    check_made_points(name, buckets, f"an interval of {interval} s")
    bucket_of = (s.timestamps() - new_start) // interval
    counts = np.bincount(bucket_of, minlength=buckets)[:buckets]
    width = int(counts.max(initial=0))
    matrix = np.full((buckets, max(width, 1)), np.nan)
    real = np.zeros(matrix.shape, dtype=bool)
    first_of = np.concatenate(([0], np.cumsum(counts)[:-1]))
    position = np.arange(len(s.values)) - first_of[bucket_of]
    matrix[bucket_of, position] = s.values
    real[bucket_of, position] = True
    return aggregate_rows(func, matrix, real=real, denominator=interval / s.step, xfiles_factor=s.xfiles_factor)


def compress_periodic_gaps(context: Context, seriesList: list[Series]) -> list[Series]:
    """Each series with periodic nulls (a value every n steps) as a series of step n steps, its
    last value of each interval from its first value on: graphite-web 1.1.10's guess, from the
    positions of its first values, taken as it takes them (a 0 counts as no value there); a series
    whose period it cannot guess is left as it is, but named `compressPeriodicGaps(<name>)`."""
    results = []
    for s in seriesList:
        name = f"compressPeriodicGaps({s.name})"
        guessed = _periodic_gaps(s)
        if guessed is None:
            results.append(s.copy(name=name, path_expression=name))
            continue
        first, interval = guessed
        # graphite-web's summarize of the points from the first value on, 'last' of each interval
        from_first = s.copy(start=s.start + first * s.step, values=s.values[first:])
        buckets = -(-(from_first.end - from_first.start) // interval)
        results.append(s.copy(name=name, path_expression=name, start=from_first.start, step=interval,
                              values=_summarized("compressPeriodicGaps", from_first, "last", interval,
                                                 from_first.start, buckets)))
    return results


def _periodic_gaps(s: Series) -> tuple[int, int] | None:
    """(index of the first value, the interval in seconds) as graphite-web guesses them, or None.
    Its first value is the last of a run of values that began the series (its `firstSeen` is
    taken again while it is 0), its period the distance to the next value, confirmed when the
    value a period later has nulls on both sides."""
    present = np.flatnonzero(~np.isnan(s.values) & (s.values != 0)).tolist()
    first = second = 0
    for i in present:
        if first > 0:
            second = i
            break
        first = i
    guess = second - first
    third = second + guess
    n = len(s.values)
    if guess > 1 and third <= n - 2 and not math.isnan(s.values[third]) and s.values[third] != 0 \
            and math.isnan(s.values[third - 1]) and math.isnan(s.values[third + 1]):
        return first, guess * s.step
    return None


def consolidate_by(context: Context, seriesList: list[Series], consolidationFunc: str) -> list[Series]:
    """Sets how a series is consolidated when it has more points than the chart has room for
    (maxDataPoints) or is combined with a coarser series: average (the default), sum, min, max,
    first, last."""
    return [named(s, f'consolidateBy({s.name},"{consolidationFunc}")', consolidate=consolidationFunc,
                   tags=tagged(s, consolidateBy=consolidationFunc)) for s in seriesList]


def set_xfiles_factor(context: Context, seriesList: list[Series], xFilesFactor: float) -> list[Series]:
    """Sets the share (0 to 1) of a run of values that must not be null for its reduction to be: when
    the series is consolidated (maxDataPoints, a coarser series beside it), summarised, averaged over
    a moving window, or combined with others (sumSeries & co take the strictest of their series').
    0, the default: one value is enough; 1: all of them. Short form: xFilesFactor."""
    if not 0 <= xFilesFactor <= 1:
        raise TargetError(f"setXFilesFactor: xFilesFactor must be within 0..1, not {xFilesFactor:g}")
    return [s.copy(xfiles_factor=xFilesFactor, tags=tagged(s, xFilesFactor=xFilesFactor)) for s in seriesList]


def transform_null(context: Context, seriesList: list[Series], default: float = 0,
                   referenceSeries: list[Series] | None = None) -> list[Series]:
    """Nulls become `default` (0); with reference series, only at the points where one of them
    has a value."""
    results = []
    for s in seriesList:
        fill = np.isnan(s.values)
        if referenceSeries:
            present = np.zeros(len(s.values), dtype=bool)
            for reference in referenceSeries:  # by position, as graphite-web zips them
                length = min(len(reference.values), len(present))
                present[:length] |= ~np.isnan(reference.values[:length])
            fill &= present
        text = f"transformNull({s.name},{default:g}{',referenceSeries' if referenceSeries else ''})"
        tags = tagged(s, transformNull=default, **({"referenceSeries": 1} if referenceSeries else {}))
        results.append(named(s, text, values=np.where(fill, float(default), s.values), tags=tags))
    return results


def absolute(context: Context, seriesList: list[Series]) -> list[Series]:
    """Each value's absolute value."""
    return [named(s, f"absolute({s.name})", values=np.abs(s.values), tags=tagged(s, absolute=1))
            for s in seriesList]


def derivative(context: Context, seriesList: list[Series]) -> list[Series]:
    """Each value less the one before it (null after a null); see nonNegativeDerivative and
    perSecond for counters."""
    return [named(s, f"derivative({s.name})", values=np.concatenate(([np.nan], np.diff(s.values)))[:len(s.values)],
                   tags=tagged(s, derivative=1)) for s in seriesList]


def integral(context: Context, seriesList: list[Series]) -> list[Series]:
    """The running sum of the values from `from` on; a null stays null (and adds nothing)."""
    results = []
    for s in seriesList:
        present = ~np.isnan(s.values)
        values = np.where(present, np.cumsum(np.where(present, s.values, 0.0)), np.nan)
        results.append(named(s, f"integral({s.name})", values=values, tags=tagged(s, integral=1)))
    return results


def _power(seriesList: list[Series], exponent: float, name: str, **tags: object) -> list[Series]:
    """Each value to `exponent`; null where that is not a real number (a negative's root, 1/0)."""
    return _mapped(seriesList, name, lambda v: real_or_null(np.power(v, exponent)), **tags)


def square_root(context: Context, seriesList: list[Series]) -> list[Series]:
    """Each value's square root; null for a negative one."""
    return _power(seriesList, 0.5, "squareRoot({})", squareRoot=1)


def power(context: Context, seriesList: list[Series], factor: float) -> list[Series]:
    """Each value to the power `factor`; null where that is no real number."""
    return _power(seriesList, factor, f"pow({{}},{factor:g})", pow=factor)


def invert(context: Context, seriesList: list[Series]) -> list[Series]:
    """1 divided by each value; null for 0."""
    return _power(seriesList, -1.0, "invert({})", invert=1)


def logarithm(context: Context, seriesList: list[Series], base: int = 10) -> list[Series]:
    """Each value's logarithm in `base` (10); null for a value of 0 or less."""
    if base <= 0 or base == 1:
        raise TargetError(f"log: the base must be above 0 and not 1, not {base}")
    results = []
    for s in seriesList:
        with np.errstate(invalid="ignore", divide="ignore"):
            values = np.where(s.values > 0, np.log(s.values) / math.log(base), np.nan)
        results.append(named(s, f"log({s.name}, {base})", values=values, tags=tagged(s, log=base)))
    return results


def delay(context: Context, seriesList: list[Series], steps: int) -> list[Series]:
    """Each value moved `steps` points later (earlier if negative), nulls where nothing moved in:
    unlike timeShift, no other range is fetched."""
    results = []
    for s in seriesList:
        values = np.full(len(s.values), np.nan)
        if steps >= 0:
            values[steps:] = s.values[:len(s.values) - steps] if steps < len(s.values) else []
        else:
            values[:steps] = s.values[-steps:] if -steps < len(s.values) else []
        results.append(named(s, f"delay({s.name},{steps})", values=values, tags=tagged(s, delay=steps)))
    return results


def offset_to_zero(context: Context, seriesList: list[Series]) -> list[Series]:
    """Each series less its smallest value, so that its lowest point is 0."""
    results = []
    for s in seriesList:
        present = s.values[~np.isnan(s.values)]
        minimum = float(present.min()) if len(present) else None
        values = s.values - minimum if minimum is not None else s.values
        results.append(named(s, f"offsetToZero({s.name})", values=values,
                              tags=tagged(s, offsetToZero=minimum)))
    return results


def changed(context: Context, seriesList: list[Series]) -> list[Series]:
    """1 where the value differs from the last value before it, else 0 (also where null, and at the
    first value)."""
    results = []
    for s in seriesList:
        present, _, last, _ = _around(s.values)
        before = np.concatenate(([-1], last))[:len(last)]  # the last value before each point
        previous = s.values[np.maximum(before, 0)]
        values = (present & (before >= 0) & (s.values != previous)).astype(np.float64)
        results.append(named(s, f"changed({s.name})", values=values))
    return results


def is_non_null(context: Context, seriesList: list[Series]) -> list[Series]:
    """1 where there is a value, 0 where it is null: count series with sumSeries(isNonNull(...))."""
    return [named(s, f"isNonNull({s.name})", values=(~np.isnan(s.values)).astype(np.float64),
                   tags=tagged(s, isNonNull=1)) for s in seriesList]


def constant_line(context: Context, value: float) -> list[Series]:
    """A flat line at `value` across the range (three points, as graphite-web draws it)."""
    step = max((context.until_s - context.from_s) // 2, 1)
    return [of_range(context, str(value), context.from_s, step, np.full(3, float(value)), f"constantLine({value})")]


def time_shift_text(timeShift: str) -> str:
    """graphite-web's reading: back in time unless it says + ("1d" is "-1d")."""
    return "-" + timeShift if timeShift[:1].isdigit() else timeShift


def time_shift_s(context: Context, timeShift: str, alignDst: bool = False) -> int:
    """Seconds timeShift moves the range by (negative: back); with alignDst, an hour more or less
    when the range and the moved one are each wholly in or out of daylight saving time, and not
    alike (local time, as graphite-web's server reads it)."""
    shift = parse_interval_s(time_shift_text(timeShift))
    if alignDst:
        def in_dst(epoch_s: int) -> bool:
            return time.localtime(epoch_s).tm_isdst > 0
        now = (in_dst(context.from_s), in_dst(context.until_s))
        then = (in_dst(context.from_s + shift), in_dst(context.until_s + shift))
        if all(now) and not any(then):
            shift += 3600
        elif not any(now) and all(then):
            shift -= 3600
    return shift


def time_shift(context: Context, seriesList: list[Series], timeShift: str, resetEnd: bool = True,
               alignDst: bool = False) -> list[Series]:
    """The series as they were at another time, drawn over this range: `timeShift(x, "7d")` beside
    `x` compares with a week before (back in time unless the shift says +). Named
    `timeShift(<name>, "-7d")`. resetEnd: no more points than the range has (the default)."""
    text = time_shift_text(timeShift)
    shift = time_shift_s(context, timeShift, alignDst)
    results = []
    for s in seriesList:  # fetched over the moved range (evaluate): moved back by whole steps
        start = s.start - shift // s.step * s.step
        values = s.values[:max(0, -((start - context.until_s) // s.step))] if resetEnd else s.values
        results.append(named(s, f'timeShift({s.name}, "{text}")', start=start, values=values.copy(),
                              tags=tagged(s, timeShift=text)))
    return results


def time_stack(context: Context, seriesList: list[list[Series]], timeShiftUnit: str = "1d", timeShiftStart: int = 0,
               timeShiftEnd: int = 7) -> list[Series]:
    """The series as they were `timeShiftUnit` ago, 2 x ago, ... (from timeShiftStart to timeShiftEnd,
    its end left out), each drawn over this range: `timeStack(x, "1d", 0, 7)` is the last seven
    days on top of each other. Named `timeShift(<name>, -1d, <k>)` as graphite-web names them."""
    unit = time_shift_text(timeShiftUnit)
    shift = time_shift_s(context, timeShiftUnit)
    results = []
    for k, series_list in zip(range(timeShiftStart, timeShiftEnd), seriesList):  # fetched moved by k units
        for s in series_list:
            results.append(named(s, f"timeShift({s.name}, {unit}, {k})", start=s.start - shift * k // s.step * s.step,
                                 values=s.values.copy(), tags=tagged(s, timeShiftUnit=unit, timeShift=k)))
    return results


def hitcount(context: Context, seriesList: list[Series], intervalString: str, alignToInterval: bool = False
             ) -> list[Series]:
    """A rate per second turned into counts per `intervalString` ("1h"): each value times the
    seconds of its step that fall in each interval, the intervals ending with the series. With
    alignToInterval, the series are fetched from the start of the day, hour or minute (by the
    interval) that holds the range's start (evaluation.SERIES_SCOPES), and the intervals start
    there."""
    interval = abs(parse_interval_s(intervalString))
    if interval == 0:
        raise TargetError(f"hitcount: interval {intervalString!r} must be longer than 0 s")
    results = []
    for s in seriesList:
        end = s.start + (s.end - s.start) // interval * interval + interval if alignToInterval else s.end
        count = -(-(end - s.start) // interval)
        check_made_points("hitcount", count, f"an interval of {interval} s")
        new_start = end - count * interval
        present = ~np.isnan(s.values)
        values, at = s.values[present], s.timestamps()[present]
        first, first_mod = np.divmod(at - new_start, interval)
        last, last_mod = np.divmod(at + s.step - new_start, interval)
        beyond = last >= count
        last, last_mod = np.where(beyond, count - 1, last), np.where(beyond, interval, last_mod)
        sums, hits = np.zeros(count + 1), np.zeros(count + 1, dtype=np.int64)  # one more: a difference's end

        def put(bucket: np.ndarray, amount: np.ndarray, where: np.ndarray) -> None:
            np.add.at(sums, bucket[where], amount[where])
            np.add.at(hits, bucket[where], 1)
        one = first == last
        put(first, values * (last_mod - first_mod), one & (first >= 0))
        put(first, values * (interval - first_mod), ~one & (first >= 0))
        put(last, values * last_mod, ~one & (last_mod > 0))
        between = ~one & (last - first > 1)  # whole intervals within one step: a difference array
        spread, spread_hits = np.zeros(count + 1), np.zeros(count + 1, dtype=np.int64)
        np.add.at(spread, first[between] + 1, values[between] * interval)
        np.add.at(spread, last[between], -values[between] * interval)
        np.add.at(spread_hits, first[between] + 1, 1)
        np.add.at(spread_hits, last[between], -1)
        sums, hits = (sums + np.cumsum(spread))[:count], (hits + np.cumsum(spread_hits))[:count]
        name = f'hitcount({s.name}, "{intervalString}"{", true" if alignToInterval else ""})'
        results.append(named(s, name, start=new_start, step=interval, values=np.where(hits > 0, sums, np.nan),
                             tags=tagged(s, hitcount=intervalString)))
    return results


def add(context: Context, seriesList: list[Series], constant: float) -> list[Series]:
    """Adds `constant` to every value (offset's newer name); named `add(<name>,<constant>)` with the
    constant as an integer, as graphite-web prints it."""
    return [named(s, f"add({s.name},{int(constant)})", values=s.values + constant, tags=tagged(s, add=constant))
            for s in seriesList]


def round_values(context: Context, seriesList: list[Series], precision: int | None = None) -> list[Series]:
    """Each value rounded to `precision` decimals (0; negative: to tens, hundreds...), halves to even."""
    name = "round({})" if precision is None else f"round({{}},{precision})"
    digits = precision or 0
    return [named(s, name.format(s.name), values=_rounded(s.values, digits), tags=tagged(s, round=digits))
            for s in seriesList]


def _rounded(values: np.ndarray, digits: int) -> np.ndarray:
    """Each value as Python's round(value, digits) rounds it, as graphite-web does: the binary value
    rounded, so 257.15 (257.149999...) is 257.1. np.round scales by 10**digits first, and that
    product's own rounding can carry a value just below a half onto it (257.2): the values whose
    scaled form lies within a few units of the last place of a half are rounded by Python, one by
    one, the rest by numpy. The scaling overflows for many digits (a value of 774 rounded to 306
    decimals came out inf or null): a value it overflows has fewer decimals than that, and is kept."""
    digits = max(-FLOAT_DECIMALS, min(FLOAT_DECIMALS, digits))
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.round(values, digits)
        scaled = np.abs(values * 10.0 ** digits)
        near_half = np.abs(scaled - np.floor(scaled) - 0.5) <= 4 * np.spacing(scaled)
    for i in np.flatnonzero(near_half & np.isfinite(values)).tolist():
        rounded[i] = round(float(values[i]), digits)
    return np.where(np.isfinite(rounded) | ~np.isfinite(values), rounded, values)


def _mapped(seriesList: list[Series], name: str, apply, **tags: object) -> list[Series]:
    """Each value through `apply` (numpy, over the whole array: NaN, null, where it has no value)."""
    results = []
    for s in seriesList:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            values = apply(s.values)
        results.append(named(s, name.format(s.name), values=values, tags=tagged(s, **tags)))
    return results


def exponential(context: Context, seriesList: list[Series]) -> list[Series]:
    """e to the power of each value."""
    return _mapped(seriesList, "exp({})", np.exp, exp="e")


def logit(context: Context, seriesList: list[Series]) -> list[Series]:
    """log(v / (1 - v)) of each value: null outside (0, 1)."""
    return _mapped(seriesList, "logit({})",
                   lambda v: np.where((v > 0) & (v < 1), np.log(v / (1 - v)), np.nan), logit="logit")


def sigmoid(context: Context, seriesList: list[Series]) -> list[Series]:
    """1 / (1 + e^-v) of each value (graphite-web gives null where e^-v overflows; 0 here)."""
    return _mapped(seriesList, "sigmoid({})", lambda v: 1 / (1 + np.exp(-v)), sigmoid="sigmoid")


def min_max(context: Context, seriesList: list[Series]) -> list[Series]:
    """Each series scaled to 0..1 between its smallest and largest value (all 0 when they are equal)."""
    results = []
    for s in seriesList:
        present = s.values[~np.isnan(s.values)]
        low, high = (float(present.min()), float(present.max())) if len(present) else (0.0, 0.0)
        values = (s.values - low) / (high - low) if high != low else np.where(np.isnan(s.values), np.nan, 0.0)
        results.append(named(s, f"minMax({s.name})", values=values))
    return results


def scale_to_seconds(context: Context, seriesList: list[Series], seconds: float) -> list[Series]:
    """A value per step as a value per `seconds` (a count per minute from a 10 s step: times 6)."""
    return [named(s, f"scaleToSeconds({s.name},{int(seconds)})", values=np.round(s.values * (seconds / s.step), 6),
                  tags=tagged(s, scaleToSeconds=seconds)) for s in seriesList]


def _around(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where values are not null, their indexes, and for each point the index of the last non-null
    value at or before it (-1: none) and of the first at or after it (len: none)."""
    present = ~np.isnan(values)
    index = np.arange(len(values))
    if not len(values):
        return present, index, index, index
    before = np.maximum.accumulate(np.where(present, index, -1))
    after = np.minimum.accumulate(np.where(present, index, len(values))[::-1])[::-1]
    return present, index, before, after


def interpolate(context: Context, seriesList: list[Series], limit: float = math.inf) -> list[Series]:
    """Each run of nulls between two values, if at most `limit` points long, filled on the straight
    line between them (a run at the start or the end stays null)."""
    results = []
    for s in seriesList:
        values = s.values.copy()
        present, index, before, after = _around(values)
        fill = ~present & (before >= 0) & (after < len(values)) & (after - before - 1 <= limit)
        low, high = before[fill], after[fill]
        values[fill] = values[low] + (index[fill] - low) * (values[high] - values[low]) / (high - low)
        results.append(named(s, f"interpolate({s.name})", values=values))
    return results


def integral_by_interval(context: Context, seriesList: list[Series], intervalUnit: str) -> list[Series]:
    """integral that starts again from 0 at every `intervalUnit` ("1d") from the range's start: a
    running total per day, per hour."""
    interval = abs(parse_interval_s(intervalUnit))
    if interval == 0:
        raise TargetError(f"integralByInterval: interval {intervalUnit!r} must be longer than 0 s")
    results = []
    for s in seriesList:
        period = (s.timestamps() - context.from_s) // interval
        zeroed = np.where(np.isnan(s.values), 0.0, s.values)
        running = np.cumsum(zeroed)
        starts = np.flatnonzero(np.concatenate(([True], period[1:] != period[:-1])))
        before = np.concatenate(([0.0], running))[starts]  # the total before each period
        values = running - np.repeat(before, np.diff(np.concatenate((starts, [len(period)]))))
        results.append(named(s, f"integralByInterval({s.name},'{intervalUnit}')", values=values,
                             tags=tagged(s, integralByInterval=intervalUnit)))
    return results


def time_slice(context: Context, seriesList: list[Series], startSliceAt: str, endSliceAt: str = "now"
               ) -> list[Series]:
    """Nulls outside [startSliceAt, endSliceAt] (times as `from` and `until` take them: "-1h",
    "20261125", epoch seconds)."""
    start, end = context.time_s(startSliceAt, "timeSlice"), context.time_s(endSliceAt, "timeSlice")
    results = []
    for s in seriesList:
        at = context.from_s + np.arange(len(s.values)) * s.step  # graphite-web counts from the range's start
        values = np.where((at < start) | (at > end), np.nan, s.values)
        results.append(named(s, f"timeSlice({s.name}, {start}, {end})", values=values,
                             tags=tagged(s, timeSliceStart=start, timeSliceEnd=end)))
    return results


def cumulative(context: Context, seriesList: list[Series]) -> list[Series]:
    """consolidateBy(seriesList, "sum"): points that are merged for a chart add up."""
    return consolidate_by(context, seriesList, "sum")


def fallback_series(context: Context, seriesList: list[Series], fallback: list[Series]) -> list[Series]:
    """`seriesList`, or `fallback` when it has no series (a glob that matched nothing)."""
    return seriesList if seriesList else fallback


def keep_last_value(context: Context, seriesList: list[Series], limit: float = math.inf) -> list[Series]:
    """Fills each run of nulls with the value before it, if the run is at most `limit` points long
    (any length by default). A run at the very start has nothing to repeat and stays null."""
    results = []
    for s in seriesList:
        values = s.values.copy()
        present, _, last_before, next_after = _around(values)
        run = next_after - last_before - 1
        fill = ~present & (last_before >= 0) & (run <= limit)
        values[fill] = values[last_before[fill]]
        results.append(named(s, f"keepLastValue({s.name})", values=values))
    return results


def _non_negative_delta(values: np.ndarray, maxValue: float | None, minValue: float | None) -> np.ndarray:
    """graphite-web's counter deltas: a value out of [minValue, maxValue] is null (and no previous
    value for the next); a decrease is a wrap at maxValue, a reset to minValue, or null."""
    values = values.copy()
    with np.errstate(invalid="ignore"):
        if maxValue is not None:
            values[values > maxValue] = np.nan
        if minValue is not None:
            values[values < minValue] = np.nan
        previous = np.concatenate(([np.nan], values[:-1]))
        delta = values - previous
        wrapped = delta < 0
        if maxValue is not None:
            delta[wrapped] = maxValue + 1 + values[wrapped] - previous[wrapped] - (minValue or 0)
        elif minValue is not None:
            delta[wrapped] = values[wrapped] - minValue
        else:
            delta[wrapped] = np.nan
    return delta


def non_negative_derivative(context: Context, seriesList: list[Series], maxValue: float | None = None,
                            minValue: float | None = None) -> list[Series]:
    """The increase of a counter from each point to the next; a decrease (a reset) is null, unless
    maxValue says where the counter wraps (or minValue what it restarts from)."""
    return [named(s, f"nonNegativeDerivative({s.name})", values=_non_negative_delta(s.values, maxValue, minValue),
                   tags=tagged(s, nonNegativeDerivative=1)) for s in seriesList]


def per_second(context: Context, seriesList: list[Series], maxValue: float | None = None,
               minValue: float | None = None) -> list[Series]:
    """nonNegativeDerivative divided by the step in seconds: a counter's rate per second."""
    return [named(s, f"perSecond({s.name})", values=np.round(_non_negative_delta(s.values, maxValue, minValue)
                                                               / s.step, 6),
                   tags=tagged(s, perSecond=1)) for s in seriesList]

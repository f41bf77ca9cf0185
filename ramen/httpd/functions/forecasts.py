"""Functions that fit a model to each series and draw it: Holt-Winters forecasts (over a bootstrap
fetched before the range) and the least-squares line (over a source range of its own)."""

from __future__ import annotations

import math

import numpy as np

from ramen.httpd.functions.calculate import points_ahead
from ramen.httpd.functions.context import Context, parse_interval_s
from ramen.httpd.functions.graph import area_between
from ramen.httpd.functions.results import named, tagged
from ramen.httpd.series import Series
from ramen.httpd.target import TargetError

HOLT_WINTERS_ALPHA = HOLT_WINTERS_GAMMA = 0.1
HOLT_WINTERS_BETA = 0.0035
"""graphite-web's smoothing of the intercept and the seasonal parts, and of the slope."""
SCALAR_MAX_SERIES = 32
"""Series of one step and length analysed one at a time, in plain Python (0.7-1.3 us a point here);
more are analysed together, a numpy vector a point (about 35 us a point, whatever their number)."""
MAX_FORECAST_SECONDS = 5.0
"""What one Holt-Winters call may cost, by those figures, bootstrap included: the model runs point
after point (each needs the one before and the season before). A week of minutes is 10,080 points
a series, of 10 s steps 60,480: 2 s for 50 hosts."""
_SCALAR_POINT_S, _VECTOR_POINT_S = 1.0e-6, 35e-6


def _analysis(values: np.ndarray, season_points: int) -> tuple[np.ndarray, np.ndarray]:
    """graphite-web's holtWintersAnalysis of one series: each point's prediction and deviation (NaN
    for None). A null breaks the chain: its intercept is none, and the next value starts it again."""
    alpha, beta, gamma = HOLT_WINTERS_ALPHA, HOLT_WINTERS_BETA, HOLT_WINTERS_GAMMA
    count = len(values)
    seasonals, deviations = [0.0] * count, [0.0] * count
    predictions = [math.nan] * count
    intercept, slope = math.nan, 0.0  # the previous point's
    next_prediction = math.nan
    for i, actual in enumerate(values.tolist()):
        if actual != actual:  # null
            predictions[i] = next_prediction
            intercept, slope, next_prediction = math.nan, 0.0, math.nan
            continue
        if i == 0:
            last_intercept, last_slope, prediction = actual, 0.0, actual
        else:
            last_intercept = actual if intercept != intercept else intercept
            last_slope, prediction = slope, next_prediction
        back = i - season_points
        last_seasonal = seasonals[back] if back >= 0 else 0.0
        last_deviation = deviations[back] if back >= 0 else 0.0
        next_last_seasonal = seasonals[back + 1] if 0 <= back + 1 < i else 0.0
        intercept = alpha * (actual - last_seasonal) + (1 - alpha) * (last_intercept + last_slope)
        slope = beta * (intercept - last_intercept) + (1 - beta) * last_slope
        seasonals[i] = gamma * (actual - intercept) + (1 - gamma) * last_seasonal
        next_prediction = intercept + slope + next_last_seasonal
        deviations[i] = gamma * abs(actual - (0.0 if prediction != prediction else prediction)) \
            + (1 - gamma) * last_deviation
        predictions[i] = prediction
    return np.array(predictions), np.array(deviations)


def _analyses(values: np.ndarray, season_points: int) -> tuple[np.ndarray, np.ndarray]:
    """_analysis of each row of `values` (series of one step and length) at once: the same
    recurrence, each point a vector across the series."""
    alpha, beta, gamma = HOLT_WINTERS_ALPHA, HOLT_WINTERS_BETA, HOLT_WINTERS_GAMMA
    rows, count = values.shape
    seasonals, deviations = np.zeros((count, rows)), np.zeros((count, rows))
    predictions = np.full((count, rows), np.nan)
    intercept, slope, next_prediction = np.full(rows, np.nan), np.zeros(rows), np.full(rows, np.nan)
    zero = np.zeros(rows)
    for i, actual in enumerate(values.T):
        present = ~np.isnan(actual)
        if i == 0:
            last_intercept, last_slope, prediction = actual, zero, actual
        else:
            last_intercept = np.where(np.isnan(intercept), actual, intercept)
            last_slope, prediction = slope, next_prediction
        back = i - season_points
        last_seasonal = seasonals[back] if back >= 0 else zero
        last_deviation = deviations[back] if back >= 0 else zero
        next_last_seasonal = seasonals[back + 1] if 0 <= back + 1 < i else zero
        new_intercept = alpha * (actual - last_seasonal) + (1 - alpha) * (last_intercept + last_slope)
        new_slope = beta * (new_intercept - last_intercept) + (1 - beta) * last_slope
        seasonals[i] = np.where(present, gamma * (actual - new_intercept) + (1 - gamma) * last_seasonal, 0.0)
        deviations[i] = np.where(present, gamma * np.abs(actual - np.nan_to_num(prediction))
                                 + (1 - gamma) * last_deviation, 0.0)
        predictions[i] = np.where(present, prediction, next_prediction)
        intercept = np.where(present, new_intercept, np.nan)
        slope = np.where(present, new_slope, 0.0)
        next_prediction = np.where(present, new_intercept + new_slope + next_last_seasonal, np.nan)
    return predictions.T, deviations.T


def _forecasts(name: str, context: Context, seriesList: list[Series], seasonality: str
               ) -> list[tuple[Series, int, np.ndarray, np.ndarray]]:
    """Each series (fetched from the bootstrap on) with its points ahead of the range, and its
    predictions and deviations over the range."""
    season_s = abs(parse_interval_s(seasonality))
    alike: dict[tuple[int, int], list[int]] = {}  # (step, points) -> the series' indexes
    for index, s in enumerate(seriesList):
        alike.setdefault((s.step, len(s.values)), []).append(index)
    cost_s = sum(points * (_VECTOR_POINT_S if len(group) > SCALAR_MAX_SERIES else _SCALAR_POINT_S * len(group))
                 for (_, points), group in alike.items())
    if cost_s > MAX_FORECAST_SECONDS:
        total = sum(len(s.values) for s in seriesList)
        raise TargetError(f"{name}: {total:,} points to analyse, bootstrap included, about {cost_s:.0f} s, more "
                          f"than {MAX_FORECAST_SECONDS:g}: ask a shorter bootstrapInterval or range, or a coarser "
                          f"series")
    analysed: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for (step, _), group in alike.items():
        if len(group) > SCALAR_MAX_SERIES:
            predictions, deviations = _analyses(np.stack([seriesList[i].values for i in group]), season_s // step)
            analysed.update((i, (predictions[k], deviations[k])) for k, i in enumerate(group))
        else:
            analysed.update((i, _analysis(seriesList[i].values, season_s // step)) for i in group)
    results = []
    for index, s in enumerate(seriesList):
        ahead = points_ahead(s, context)
        predictions, deviations = analysed[index]
        results.append((s, ahead, predictions[ahead:], deviations[ahead:]))
    return results


def holt_winters_forecast(context: Context, seriesList: list[Series], bootstrapInterval: str = "7d",
                          seasonality: str = "1d") -> list[Series]:
    """Each series' Holt-Winters forecast (graphite-web's smoothing, seasons of `seasonality`),
    the model started `bootstrapInterval` before the range (those points fetched too)."""
    return [named(s, f"holtWintersForecast({s.name})", start=s.start + ahead * s.step, values=predictions,
                  tags=tagged(s, holtWintersForecast=1, holtWintersDeviation=1))
            for s, ahead, predictions, _ in _forecasts("holtWintersForecast", context, seriesList, seasonality)]


def holt_winters_confidence_bands(context: Context, seriesList: list[Series], delta: int = 3,
                                  bootstrapInterval: str = "7d", seasonality: str = "1d") -> list[Series]:
    """Each series' Holt-Winters forecast less and plus `delta` times its deviation: the lower band,
    then the upper one, named `holtWintersConfidenceLower(<name>)` and `...Upper(<name>)`."""
    results = []
    for s, ahead, predictions, deviations in _forecasts("holtWintersConfidenceBands", context, seriesList,
                                                        seasonality):
        # graphite-web's four tags land on both bands (one dict, shared)
        tags = tagged(s, holtWintersForecast=1, holtWintersDeviation=1, holtWintersConfidenceUpper=1,
                      holtWintersConfidenceLower=1)
        start = s.start + ahead * s.step
        for side, sign in (("Lower", -1), ("Upper", 1)):
            results.append(s.copy(name=f"holtWintersConfidence{side}({s.name})", start=start,
                                  values=predictions + sign * delta * deviations, tags=dict(tags)))
    return results


def holt_winters_confidence_area(context: Context, seriesList: list[Series], delta: int = 3,
                                 bootstrapInterval: str = "7d", seasonality: str = "1d") -> list[Series]:
    """The area between the confidence bands of exactly one series (areaBetween's), named
    `holtWintersConfidenceArea(<path expression>)`."""
    bands = holt_winters_confidence_bands(context, seriesList, delta, bootstrapInterval, seasonality)
    results = []
    for band in area_between(context, bands):
        name = band.name.replace("areaBetween", "holtWintersConfidenceArea", 1)
        tags = {key: value for key, value in band.tags.items() if key != "areaBetween"}
        results.append(named(band, name, tags={**tags, "holtWintersConfidenceArea": "1"}))
    return results


def holt_winters_aberration(context: Context, seriesList: list[Series], delta: int = 3,
                            bootstrapInterval: str = "7d", seasonality: str = "1d") -> list[Series]:
    """How far each series goes beyond its confidence bands (above the upper: positive, below the
    lower: negative), 0 within them and where the series is null."""
    results = []
    for s, ahead, predictions, deviations in _forecasts("holtWintersAberration", context, seriesList, seasonality):
        actual = s.values[ahead:]
        upper, lower = predictions + delta * deviations, predictions - delta * deviations
        with np.errstate(invalid="ignore"):
            values = np.where(actual > upper, actual - upper, np.where(actual < lower, actual - lower, 0.0))
        results.append(named(s, f"holtWintersAberration({s.name})", start=s.start + ahead * s.step,
                             values=np.where(np.isnan(actual), 0.0, values),
                             tags=tagged(s, holtWintersAberration=1)))
    return results


def linear_regression(context: Context, seriesList: list[list[Series]], startSourceAt: str | None = None,
                      endSourceAt: str | None = None) -> list[Series]:
    """Each series' least-squares line, fitted over the source range (startSourceAt to endSourceAt,
    times as `from` takes them; the range by default) and drawn over the range. Named
    `linearRegression(<name>, <source start>, <source end>)`; a series without two values to fit
    is left out. The series are paired with the source's in order, as graphite-web pairs them."""
    drawn, sources = seriesList  # evaluation.SERIES_SCOPES: over the range, then over the source range
    since_s, until_s = regression_source(context, startSourceAt, endSourceAt)
    results = []
    for source, s in zip(sources, drawn):
        fit = _least_squares(source)
        if fit is None:
            continue
        factor, offset = fit
        name = f"linearRegression({s.name}, {since_s}, {until_s})"
        results.append(named(s, name, values=offset + s.timestamps().astype(np.float64) * factor,
                             tags=tagged(s, linearRegressions=f"{since_s}, {until_s}")))
    return results


def regression_source(context: Context, startSourceAt: str | None, endSourceAt: str | None) -> tuple[int, int]:
    """linearRegression's source range, in epoch seconds: the render's ends unless given."""
    return (context.from_s if startSourceAt is None else context.time_s(startSourceAt, "linearRegression"),
            context.until_s if endSourceAt is None else context.time_s(endSourceAt, "linearRegression"))


def _least_squares(series: Series) -> tuple[float, float] | None:
    """The line value = factor * t + offset (t in epoch seconds) fitted to the series' values,
    None where it has fewer than two (graphite-web's _linearRegressionAnalysis)."""
    present = ~np.isnan(series.values)
    index = np.flatnonzero(present).astype(np.float64)
    values = series.values[present]
    n = len(values)
    sum_i, sum_v, sum_ii, sum_iv = index.sum(), values.sum(), (index * index).sum(), (index * values).sum()
    denominator = n * sum_ii - sum_i * sum_i
    if denominator == 0:
        return None
    factor = (n * sum_iv - sum_i * sum_v) / denominator / series.step
    return factor, (sum_ii * sum_v - sum_iv * sum_i) / denominator - factor * series.start

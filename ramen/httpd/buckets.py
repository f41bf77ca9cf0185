"""A function's rows as time buckets (ramen/replay/summary.py: one row per bucket and factor
values holding each numeric field's sum and count), and series drawn from them.

The bucket of a row is its event time floored to the function's step: its window (a windowed
function's rows carry their window's start) or DEFAULT_STEP_S.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ramen.httpd.names import numeric_fields
from ramen.httpd.series import Series
from ramen.program import Function
from ramen.replay import summary as summaries
from ramen.replay.contract import Summary
from ramen.replay.summary import BUCKET, COUNT, SUM, US_PER_S

DEFAULT_STEP_S = 10
"""The step of a function without a window: fine enough for a 15 min chart, 60 k points a week."""
_ROW = "__row"


def step_s(function: Function) -> int:
    """Seconds between a function's points: its window, at least a second."""
    if function.window is None:
        return DEFAULT_STEP_S
    return max(1, function.window.every_us // US_PER_S)


def summary_of(function: Function) -> Summary:
    """What a render replays of a function: its buckets at its step, by its factors, of its numbers."""
    return Summary(step_s(function), tuple(function.factors), tuple(numeric_fields(function)))


def empty(function: Function) -> pa.Table:
    """Buckets of no rows."""
    return summaries.empty(summary_of(function), function)


def combine(function: Function, tables: list[pa.Table]) -> pa.Table:
    """Buckets of several partial results as one, sorted by bucket (sums and counts add up)."""
    return summaries.combine(summary_of(function), function, tables)


def between(table: pa.Table, since_s: int, until_s: int) -> pa.Table:
    """The buckets that start in [since_s, until_s)."""
    buckets = table.column(BUCKET)
    return table.filter(pc.and_(pc.greater_equal(buckets, since_s), pc.less(buckets, until_s)))


def to_series(function: Function, table: pa.Table, wanted: list[tuple[tuple[str, ...], str, str]],
              since_s: int, until_s: int) -> list[Series]:
    """One series per wanted (factor values, field, path), over the steps of [since_s, until_s):
    the average of the bucket's values, NaN where it has none."""
    step = step_s(function)
    start = since_s // step * step
    count = max(0, -(-until_s // step) - start // step)
    index_all = ((table.column(BUCKET).to_numpy() - start) // step) if table.num_rows else np.empty(0, np.int64)
    groups = _factor_groups(function, table)
    out = []
    for values_wanted, field, path in wanted:
        values = np.full(count, np.nan)
        rows = groups.get(values_wanted)
        if rows is not None and len(rows):
            index = index_all[rows]
            keep = (index >= 0) & (index < count)
            sums = table.column(SUM + field).to_numpy(zero_copy_only=False)[rows][keep]
            counts = table.column(COUNT + field).to_numpy(zero_copy_only=False)[rows][keep]
            with np.errstate(invalid="ignore", divide="ignore"):
                values[index[keep]] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        out.append(Series(path, start, step, values))
    return out


def _factor_groups(function: Function, table: pa.Table) -> dict[tuple[str, ...], np.ndarray]:
    """Row indices per combination of factor values (as strings, as the tree names them), in
    order. Arrow's group_by over the buckets: a dashboard's renders ask this of tables of tens of
    thousands of buckets, where sorting Python strings took most of a render's CPU."""
    if table.num_rows == 0:
        return {}
    if not function.factors:
        return {(): np.arange(table.num_rows)}
    factors = list(function.factors)
    keys = {f: pc.cast(table.column(f), pa.string()).fill_null("") for f in factors}
    rows = pa.table({**keys, _ROW: pa.array(np.arange(table.num_rows))})
    grouped = rows.group_by(factors, use_threads=False).aggregate([(_ROW, "list")])
    lists = grouped.column(_ROW + "_list").combine_chunks()
    offsets, indices = lists.offsets.to_numpy(), lists.values.to_numpy()
    names = zip(*(grouped.column(f).to_pylist() for f in factors))
    return {tuple(name): np.sort(indices[start:end]) for name, start, end in zip(names, offsets[:-1], offsets[1:])}


def factor_values(function: Function, table: pa.Table) -> set[tuple[str, ...]]:
    """The combinations of factor values in buckets."""
    return set(_factor_groups(function, table)) if function.factors else set()

"""A function's rows as time buckets: one row per (bucket, factor values) holding each numeric
field's sum and count, so that partial results (batches, cached chunks, replays of holes) combine
exactly into averages. Vectorised with Arrow's group_by; no per-row Python.

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
from ramen.tuples import event_times_us

DEFAULT_STEP_S = 10
"""The step of a function without a window: fine enough for a 15 min chart, 60 k points a week."""
US_PER_S = 1_000_000
BUCKET = "__bucket_s"
SUM, COUNT = "__sum_", "__count_"
_ROW = "__row"


def step_s(function: Function) -> int:
    """Seconds between a function's points: its window, at least a second."""
    if function.window is None:
        return DEFAULT_STEP_S
    return max(1, function.window.every_us // US_PER_S)


def empty(function: Function) -> pa.Table:
    """Buckets of no rows, with the columns `aggregate` makes."""
    factor_fields = [function.schema.field(f) for f in function.factors]
    columns = [pa.field(BUCKET, pa.int64()), *factor_fields]
    for name in numeric_fields(function):
        columns += [pa.field(SUM + name, pa.float64()), pa.field(COUNT + name, pa.int64())]
    return pa.schema(columns).empty_table()


def aggregate(function: Function, table: pa.Table) -> pa.Table:
    """The rows of `table` (the function's output) as buckets of sums and counts."""
    if table.num_rows == 0:
        return empty(function)
    step = step_s(function)
    times = event_times_us(table, function.event_time)
    bucket = pa.array(np.floor_divide(times, step * US_PER_S) * step, pa.int64())
    fields = numeric_fields(function)
    columns = {BUCKET: bucket, **{f: table.column(f) for f in function.factors}}
    for name in fields:
        values = pc.cast(table.column(name), pa.float64())
        columns[SUM + name] = values
        columns[COUNT + name] = pc.if_else(pc.is_valid(values), 1, 0).cast(pa.int64())
    return _summed(function, pa.table(columns))


def combine(function: Function, tables: list[pa.Table]) -> pa.Table:
    """Buckets of several partial results as one, sorted by bucket (sums and counts add up)."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return empty(function)
    table = tables[0] if len(tables) == 1 else _summed(function, pa.concat_tables(tables))
    return table.sort_by(BUCKET)


def _summed(function: Function, table: pa.Table) -> pa.Table:
    """One row per bucket and factor values, its sums and counts added up; group_by's `<col>_sum`
    names back to ours, in `empty`'s order and types."""
    fields = numeric_fields(function)
    grouped = table.group_by([BUCKET, *function.factors], use_threads=False).aggregate(
        [(SUM + n, "sum") for n in fields] + [(COUNT + n, "sum") for n in fields])
    schema = empty(function).schema
    columns = []
    for field in schema:
        name = field.name if field.name == BUCKET or field.name in function.factors else field.name + "_sum"
        columns.append(grouped.column(name).cast(field.type))
    return pa.Table.from_arrays(columns, schema=schema)


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

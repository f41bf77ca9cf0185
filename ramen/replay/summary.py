"""A summarised replay's buckets (ramen.replay.contract.Summary): per bucket of event time and per
combination of factor values, each numeric field's sum and count, so that partial results (batches,
a target's flushes, cached chunks, replays of holes) combine exactly into averages. Written by the
target worker in place of its rows, read by the client; vectorised with Arrow's group_by.

The bucket of a row is its event time floored to the step, in seconds since the epoch (a windowed
function's rows carry their window's start).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ramen.program.model import Function
from ramen.replay.contract import Summary
from ramen.tuples import event_times_us

__all__ = ["BUCKET", "COUNT", "SUM", "SummaryError", "aggregate", "check", "combine", "empty", "numeric_fields",
           "rebucketed", "schema"]

US_PER_S = 1_000_000
BUCKET = "__bucket_s"
SUM, COUNT = "__sum_", "__count_"
_VALUE = "__value_"
"""A field's values as float64, while raw rows are grouped."""


class SummaryError(ValueError):
    """A summary the function cannot have (one line)."""


def numeric_fields(function: Function) -> list[str]:
    """The fields a chart draws: integers and floats, neither the event time nor a factor."""
    skip = {function.event_time, *function.factors}
    return [f.name for f in function.schema
            if f.name not in skip and (pa.types.is_integer(f.type) or pa.types.is_floating(f.type))]


def check(summary: Summary, function: Function) -> None:
    """SummaryError unless the function has the factors, and the fields as numbers, and an event time."""
    names = set(function.schema.names)
    if function.event_time is None:
        raise SummaryError(f"{function.qualified_name} has no event time to summarise over")
    for name in (*summary.factors, *summary.fields):
        if name not in names:
            raise SummaryError(f"{function.qualified_name} has no field {name!r} to summarise")
    for name in summary.fields:
        kind = function.schema.field(name).type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            raise SummaryError(f"{function.qualified_name}.{name} is {kind}, not a number to summarise")


def schema(summary: Summary, function: Function) -> pa.Schema:
    """The bucket, the factors as the function has them, then a sum and a count per field."""
    columns = [pa.field(BUCKET, pa.int64()), *(function.schema.field(f) for f in summary.factors)]
    for name in summary.fields:
        columns += [pa.field(SUM + name, pa.float64()), pa.field(COUNT + name, pa.int64())]
    return pa.schema(columns)


def empty(summary: Summary, function: Function) -> pa.Table:
    return schema(summary, function).empty_table()


def aggregate(summary: Summary, function: Function, table: pa.Table | pa.RecordBatch) -> pa.Table:
    """The rows of `table` (the function's output) as buckets.

    Grouped over contiguous arrays (a target gathers thousands of small batches: Arrow's group_by
    pays per chunk), each field's sum and count taken from its own column by the one group_by."""
    if table.num_rows == 0:
        return empty(summary, function)
    if isinstance(table, pa.Table):
        table = table.combine_chunks()
    times = event_times_us(table, function.event_time)
    step = summary.step_s
    columns = {BUCKET: pa.array(np.floor_divide(times, step * US_PER_S) * step, pa.int64()),
               **{f: table.column(f) for f in summary.factors},
               **{_VALUE + n: pc.cast(table.column(n), pa.float64()) for n in summary.fields}}
    return _grouped(summary, function, pa.table(columns), [(_VALUE + n, "sum") for n in summary.fields],
                    [(_VALUE + n, "count") for n in summary.fields])


def combine(summary: Summary, function: Function, tables: list[pa.Table]) -> pa.Table:
    """Buckets of several partial results as one, sorted by bucket (sums and counts add up)."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return empty(summary, function)
    table = tables[0] if len(tables) == 1 else _summed(summary, function, pa.concat_tables(tables))
    return table.sort_by(BUCKET)


def rebucketed(summary: Summary, function: Function, buckets: pa.Table) -> pa.Table:
    """Buckets of a step that divides the summary's, of its factors and of more fields (rollups),
    as the summary's: each bucket of the summary's step holds its finer ones' sums and counts
    (a fold of 10 s buckets from 1 s rollups writes a tenth of their rows, not all of them)."""
    step = summary.step_s
    buckets = buckets.combine_chunks()  # as in aggregate: a fold's rollups are hundreds of small tables
    columns = [pa.array(np.floor_divide(buckets.column(BUCKET).to_numpy(), step) * step, pa.int64()),
               *(buckets.column(f.name) for f in schema(summary, function) if f.name != BUCKET)]
    return _summed(summary, function, pa.Table.from_arrays(columns, schema=schema(summary, function)))


def _summed(summary: Summary, function: Function, table: pa.Table) -> pa.Table:
    """One row per bucket and factor values, its sums and counts added up."""
    return _grouped(summary, function, table, [(SUM + n, "sum") for n in summary.fields],
                    [(COUNT + n, "sum") for n in summary.fields])


def _grouped(summary: Summary, function: Function, table: pa.Table, sums: list, counts: list) -> pa.Table:
    """Group by bucket and factor values; group_by's `<column>_<aggregate>` names back to ours, in
    `schema`'s order and types (a group whose values are all null sums to null, counts 0)."""
    grouped = table.group_by([BUCKET, *summary.factors], use_threads=False).aggregate(sums + counts)
    names = {BUCKET: BUCKET, **{f: f for f in summary.factors}}
    for name, (column, kind), (count_column, count_kind) in zip(summary.fields, sums, counts):
        names[SUM + name], names[COUNT + name] = f"{column}_{kind}", f"{count_column}_{count_kind}"
    wanted = schema(summary, function)
    columns = [grouped.column(names[f.name]).cast(f.type) for f in wanted]
    return pa.Table.from_arrays(columns, schema=wanted)

"""The callables of examples/net.toml: light functions over pyarrow tables."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TOP_N = 10
"""How many hosts each minute keeps."""
OUTPUT = ["start", "host", "bytes"]


def top_talkers(table: pa.Table) -> pa.Table:
    """The TOP_N hosts by bytes in each minute of per_minute's output (start, host, bytes).

    Works on an empty table too: that is how ramen learns the output schema before running it.
    """
    table = table.filter(pc.is_valid(table.column("start")))
    ordered = table.sort_by([("start", "ascending"), ("bytes", "descending")])
    starts = ordered.column("start").cast(pa.int64()).to_numpy()
    rows = np.arange(len(starts))
    # Rows are grouped by start; a row's rank is its distance from the first row of its group.
    first_of_group = np.ones(len(starts), dtype=bool)
    first_of_group[1:] = starts[1:] != starts[:-1]
    group_start = np.maximum.accumulate(np.where(first_of_group, rows, 0)) if len(rows) else rows
    return ordered.filter(pa.array(rows - group_start < TOP_N)).select(OUTPUT)


def per_minute(table: pa.Table) -> pa.Table:
    """Bytes per host per minute of traffic rows (ts, host, bytes), as (start, host, bytes).

    With `window = { every = "1 minute" }` ramen calls it once per committed window with all of
    that window's rows; `start` is the minute each row falls in (the window's start), so the output
    carries the window's event time.
    """
    start = pc.floor_temporal(table.column("ts"), unit="minute")
    keyed = pa.table({"start": start, "host": table.column("host"), "bytes": table.column("bytes")})
    summed = keyed.group_by(["start", "host"]).aggregate([("bytes", "sum")])
    return summed.rename_columns({"bytes_sum": "bytes"}).select(OUTPUT).sort_by([("start", "ascending"),
                                                                                 ("host", "ascending")])

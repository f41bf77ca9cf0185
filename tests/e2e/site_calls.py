"""The callables of the programs of sites' tests: bytes per host per 10 s window (also slowly), and the input as it is."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

WINDOW_S = 10


def per_window(table: pa.Table) -> pa.Table:
    """(start, host, bytes) of traffic rows (ts, host, bytes), `start` the 10 s window each row is in."""
    start = pc.floor_temporal(table.column("ts"), multiple=WINDOW_S, unit="second")
    keyed = pa.table({"start": start, "host": table.column("host"), "bytes": table.column("bytes")})
    summed = keyed.group_by(["start", "host"]).aggregate([("bytes", "sum")])
    return summed.rename_columns({"bytes_sum": "bytes"}).select(["start", "host", "bytes"]).sort_by(
        [("start", "ascending"), ("host", "ascending")])


def same(table: pa.Table) -> pa.Table:
    """Its input as it is (a function computed from another, where only its placement matters)."""
    return table


def slowly(table: pa.Table) -> pa.Table:
    """per_window, 0.1 ms a row: a replay that takes seconds, for something to happen during it."""
    import time
    time.sleep(table.num_rows * 1e-4)
    return per_window(table)

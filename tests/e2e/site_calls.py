"""The callable of tests/e2e/test_sites.py's program: bytes per host per 10 s window."""

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

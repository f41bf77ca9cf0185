"""A function's rows as time buckets (ramen/replay/summary.py: one row per bucket and factor
values holding each numeric field's sum and count), and series drawn from them.

The bucket of a row is its event time floored to the function's step: its window (a windowed
function's rows carry their window's start; one fed by windowed parents alone is charted at their
window, ramen/httpd/names.py's _charted) or DEFAULT_STEP_S.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ramen.httpd.series import Series
from ramen.program import Function
from ramen.replay import summary as summaries
from ramen.replay.contract import Summary
from ramen.replay.summary import BUCKET, COUNT, SUM, US_PER_S, numeric_fields

DEFAULT_STEP_S = 10
"""The step of a function without a window: fine enough for a 15 min chart, 60 k points a week."""
DERIVED_KEPT = 16
"""Tables whose series' grids are kept (_derived)."""
DERIVED_MAX_BYTES = 64 * 1024 * 1024
"""The grids kept for all those tables together, at most: the least recently asked go first. They
had no bound in bytes, only DERIVED_KEPT tables, beside the result cache's 256 MiB."""
GRID_POINT_BYTES = 8
"""A grid's point: one float64."""
SHARED_GRID_MAX_BYTES = 8 * 1024 * 1024
"""A grid of every combination of factor values (a dashboard's renders of one range share it) is
made only up to this size (a million points: 50 hosts over 14 days of minutes); past it each render
computes the rows it draws alone, and keeps none: one series of per_minute over 56 years made a grid
of its 50 hosts, 12 GB."""
FACTOR_VALUE_BYTES = 16
"""A factor value in a bucket row, for an estimate: a string's offset and a host name's characters."""
_ROW = "__row"
_derived_kept: OrderedDict[int, "_Derived"] = OrderedDict()
_derived_lock = threading.Lock()


def step_s(function: Function) -> int:
    """Seconds between a function's points: its window, at least a second."""
    if function.window is None:
        return DEFAULT_STEP_S
    return max(1, function.window.every_us // US_PER_S)


def estimated_bytes(function: Function, groups: int, since_s: int, until_s: int) -> int:
    """What the buckets of `groups` combinations of factor values over [since_s, until_s) take,
    with a drawn point for each bucket and field: a render's estimate before it fetches. A row
    holds its bucket, its factor values, and a sum and a count of each numeric field."""
    step = step_s(function)
    steps = -(-(until_s - since_s) // step)
    fields = len(numeric_fields(function))
    row = 8 + len(function.factors) * FACTOR_VALUE_BYTES + fields * (16 + GRID_POINT_BYTES)
    return max(1, groups) * steps * row


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
    derived = _derived(function, table)
    out = []
    for values_wanted, field, path in wanted:
        row = derived.row_of.get(values_wanted)
        if row is None:
            values = np.full(count, np.nan)
        elif len(derived.row_of) * count * GRID_POINT_BYTES <= SHARED_GRID_MAX_BYTES:
            values = derived.grid(field, start, step, count)[row].copy()
        else:
            values = derived.averages(field, start, step, count, row)
        out.append(Series(path, start, step, values))
    return out


class _Derived:
    """What the renders draw from one function's buckets: the rows of each combination of factor
    values, and per field and range, every combination's averages as one grid. Each is computed
    once, by the first render to ask, while the others wait for it: a dashboard's renders all ask
    at the moment the function's replay ends, and each computing its own copy held up them all."""

    def __init__(self, function: Function, table: pa.Table) -> None:
        self.function = function
        self.table = table
        self._row_of: dict[tuple[str, ...], int] | None = None
        self._group: np.ndarray | None = None  # bucket -> its factor values' row of a grid
        self._grids: dict[tuple, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def row_of(self) -> dict[tuple[str, ...], int]:
        """Factor values (as strings, as the tree names them) -> their row of a grid."""
        return self._rows()[0]

    def _rows(self) -> tuple[dict[tuple[str, ...], int], np.ndarray]:
        """row_of, and each bucket's row: made once, by the first to ask."""
        with self._lock:
            if self._row_of is None:
                groups = _grouped_rows(self.function, self.table)
                self._group = np.empty(self.table.num_rows, np.int64)
                for row, rows in enumerate(groups.values()):
                    self._group[rows] = row
                self._row_of = {values: row for row, values in enumerate(groups)}
            return self._row_of, self._group

    @property
    def nbytes(self) -> int:
        """What its grids hold."""
        with self._lock:
            return sum(grid.nbytes for grid in self._grids.values())

    def grid(self, field: str, start: int, step: int, count: int) -> np.ndarray:
        """[factor values' row, step index] -> the average of the field, NaN without a value; kept
        for the next render (all tables' together bounded by DERIVED_MAX_BYTES)."""
        row_of, group = self._rows()
        key = (field, start, step, count)
        with self._lock:
            grid = self._grids.get(key)
            made = grid is None
            if made:
                grid = self._grids[key] = self._averages(field, start, step, count, len(row_of), group)
        if made:
            _trim_derived()
        return grid

    def averages(self, field: str, start: int, step: int, count: int, row: int) -> np.ndarray:
        """One row of the grid, made alone and kept by nobody: a grid of every row is too big."""
        return self._averages(field, start, step, count, 1, self._rows()[1], only_row=row)[0]

    def _averages(self, field: str, start: int, step: int, count: int, rows: int, group: np.ndarray,
                  only_row: int | None = None) -> np.ndarray:
        """`group`: each bucket's row; with `only_row`, the grid of that row alone."""
        grid = np.full((rows, count), np.nan)
        if self.table.num_rows and count:
            index = (self.table.column(BUCKET).to_numpy() - start) // step
            keep = (index >= 0) & (index < count)
            if only_row is not None:
                keep &= group == only_row
                group = np.zeros_like(group)
            sums = self.table.column(SUM + field).to_numpy(zero_copy_only=False)[keep]
            counts = self.table.column(COUNT + field).to_numpy(zero_copy_only=False)[keep]
            with np.errstate(invalid="ignore", divide="ignore"):
                grid[group[keep], index[keep]] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        return grid


def _derived(function: Function, table: pa.Table) -> _Derived:
    """Of the last DERIVED_KEPT tables asked, kept: a dashboard's renders chart the same few tables
    (a function's, shared by every render that needs it), each render several times."""
    with _derived_lock:
        held = _derived_kept.get(id(table))
        if held is not None and held.table is table:  # the table is held too: its id is not reused meanwhile
            _derived_kept.move_to_end(id(table))
            return held
        derived = _derived_kept[id(table)] = _Derived(function, table)
        while len(_derived_kept) > DERIVED_KEPT:
            _derived_kept.popitem(last=False)
        return derived


def _trim_derived() -> None:
    """The least recently asked tables' grids go while all of them hold over DERIVED_MAX_BYTES
    (the newest is kept, whatever its size: a render is drawing from it)."""
    with _derived_lock:
        total = _kept_bytes()
        while total > DERIVED_MAX_BYTES and len(_derived_kept) > 1:
            _, derived = _derived_kept.popitem(last=False)
            total -= derived.nbytes


def derived_bytes() -> int:
    """What the kept grids hold (httpd logs it as it gives memory back; tests read it)."""
    with _derived_lock:
        return _kept_bytes()


def _kept_bytes() -> int:
    """What the kept grids hold (called under _derived_lock)."""
    return sum(derived.nbytes for derived in _derived_kept.values())


def _grouped_rows(function: Function, table: pa.Table) -> dict[tuple[str, ...], np.ndarray]:
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
    return set(_derived(function, table).row_of) if function.factors else set()

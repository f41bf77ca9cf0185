"""A replay's rows in event-time order without holding the whole result: a reorder buffer as deep as
the disorder the target's output can have.

In which order rows reach the client (measured from the code, workers/ and ramen/archive/):
- A source replayed from its archive: in recorded order; no message's rows reach further back than
  the recording's disorder (its time index records it: `TimeIndex.disorder_us`) below the times
  before it.
- A windowed function: window by window, oldest first (a window commits once the watermark passes
  it, the rest at the end of the replay); a heavy function's Spark job covers many windows and
  sends its rows sorted by event time (workers/heavy.py). A window's rows are stamped with a time
  inside it, so no row reaches back further than one window (`every`).
- Any other function: its rows keep the order of its inputs, the largest disorder of its parents
  on the replay's paths (a callable that reorders its rows beyond that is not covered).

So with `disorder_us` from `disorder_bound_us`, a row is final once a row at least `disorder_us`
later has arrived. The guarantee: the rows come out sorted by event time (then, for a windowed
function, by its other columns, so that a window's rows are in a stable order whatever order
Spark gave them in), and memory holds only the rows within `disorder_us` of the newest. A row
that arrives later than that bound (a callable that reorders, a time index older than its data)
is not dropped: it goes out at once and is counted in `late`.
"""

from __future__ import annotations

import logging
from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ramen.program import Program
from ramen.replay.plan import ReplayPlan
from ramen.tuples import event_times_us

__all__ = ["ReorderBuffer", "disorder_bound_us", "stable_sort_keys"]

log = logging.getLogger(__name__)

_SORTABLE = (pa.types.is_integer, pa.types.is_floating, pa.types.is_string, pa.types.is_large_string,
             pa.types.is_timestamp, pa.types.is_boolean, pa.types.is_date)


def disorder_bound_us(plan: ReplayPlan, programs: Mapping[str, Program],
                      source_disorder_us: Mapping[str, int]) -> int:
    """How far back below the newest row so far a row of the replay's result can be (see the module
    docstring); `source_disorder_us`: each source's recordings' disorder over the range."""
    functions = {f.qualified_name: f for program in programs.values() for f in program}

    def bound(name: str) -> int:
        if name in plan.sources:
            return source_disorder_us.get(name, 0)
        function = functions[name]
        if function.window is not None:
            return function.window.every_us
        return max((bound(parent) for parent in plan.inputs_of(name)), default=0)
    return bound(plan.target)


def stable_sort_keys(schema: pa.Schema, event_time: str, windowed: bool) -> list[tuple[str, str]]:
    """Event time first; for a windowed function, then every other sortable column, so that the
    rows of one window (all of one time) have one order, whichever order they were computed in."""
    keys = [(event_time, "ascending")]
    if windowed:
        keys += [(f.name, "ascending") for f in schema
                 if f.name != event_time and any(test(f.type) for test in _SORTABLE)]
    return keys


class ReorderBuffer:
    """Takes batches in arrival order and gives back tables in event-time order (module docstring).
    Rows without an event time cannot be placed: they go out at once."""

    def __init__(self, schema: pa.Schema, event_time: str, disorder_us: int,
                 sort_keys: list[tuple[str, str]] | None = None) -> None:
        self.schema = schema
        self.event_time = event_time
        self.disorder_us = disorder_us
        self.sort_keys = sort_keys or [(event_time, "ascending")]
        self._held: list[pa.RecordBatch] = []
        self._held_min: int | None = None
        self._newest: int | None = None
        self.released_below: int | None = None
        """Every row before this time has gone out: a row older than it is late."""
        self.late = 0
        self.held_rows = 0

    def add(self, batch: pa.RecordBatch) -> list[pa.Table]:
        """The rows that can go out now, in order (a late row's table first)."""
        if batch.num_rows == 0:
            return []
        out: list[pa.Table] = []
        column = batch.column(self.event_time)
        if column.null_count:
            out.append(pa.Table.from_batches([batch.filter(column.is_null())], schema=self.schema))
            batch = batch.filter(column.is_valid())
            if batch.num_rows == 0:
                return out
        times = event_times_us(batch, self.event_time)
        if self.released_below is not None:
            late = times < self.released_below
            if late.any():
                self.late += int(late.sum())
                log.debug("%d rows later than the reorder bound of %d µs", int(late.sum()), self.disorder_us)
                out.append(self._sorted(pa.Table.from_batches([batch.filter(pa.array(late))], schema=self.schema)))
                keep = ~late
                batch, times = batch.filter(pa.array(keep)), times[keep]
                if batch.num_rows == 0:
                    return out
        self._held.append(batch)
        self.held_rows += batch.num_rows
        low, high = int(times.min()), int(times.max())
        self._held_min = low if self._held_min is None else min(self._held_min, low)
        self._newest = high if self._newest is None else max(self._newest, high)
        cutoff = self._newest - self.disorder_us
        if cutoff > self._held_min:
            out.append(self._release(cutoff))
        return out

    def finish(self) -> list[pa.Table]:
        """Every row still held, in order (the result has ended)."""
        if not self._held:
            return []
        table = self._sorted(pa.Table.from_batches(self._held, schema=self.schema))
        self._held, self._held_min, self.held_rows = [], None, 0
        return [table]

    def _release(self, cutoff: int) -> pa.Table:
        """Rows before `cutoff` go, sorted; the others stay (a row can still come before them)."""
        table = pa.Table.from_batches(self._held, schema=self.schema)
        times = event_times_us(table, self.event_time)
        if len(self.sort_keys) == 1 and (np.diff(times) >= 0).all():
            # In order already (a source's rows, as a rule): the rows that go are a prefix, sliced
            # without a copy: csv through the buffer went from 2.27 to 2.84 M rows/s (bench/replay_output.py).
            ready_rows = int(np.searchsorted(times, cutoff, side="left"))
            out, rest = table.slice(0, ready_rows), table.slice(ready_rows)
            self._held = rest.to_batches()
            self._held_min = int(times[ready_rows]) if rest.num_rows else None
        else:
            ready = times < cutoff
            staying = ~ready
            out = self._sorted(table.filter(pa.array(ready)))
            rest = table.filter(pa.array(staying))
            self._held = rest.combine_chunks().to_batches() if rest.num_rows else []
            self._held_min = int(times[staying].min()) if rest.num_rows else None
        self.held_rows = rest.num_rows
        self.released_below = cutoff
        return out

    def _sorted(self, table: pa.Table) -> pa.Table:
        if len(self.sort_keys) == 1 and table.num_rows > 1:
            times = event_times_us(table, self.event_time)
            if (np.diff(times) >= 0).all():  # the usual case for a source: in order already
                return table
        return table.take(pc.sort_indices(table, sort_keys=self.sort_keys))

"""Tumbling event-time windows of one channel: which rows go together, and when a window is done.

Windows are aligned to the epoch: window `w` holds event times [w·every, (w+1)·every). The
channel's watermark is the largest event time seen minus the lateness; a window commits once the
watermark reaches its end, and from then on rows for it (or for any older window) are *late*:
counted and dropped, never mixed into a later result. A replay channel flushes every open window
at its last END_OF_REPLAY (`flush`), since no more rows will come.

All of it works on whole batches with numpy: no Python step per row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa


@dataclass(frozen=True)
class ClosedWindow:
    start_us: int
    end_us: int
    batches: tuple[tuple[object, pa.RecordBatch], ...]
    """Every row of the window, in arrival order, each batch with the part (parent) it came from."""

    @property
    def table(self) -> pa.Table:
        """All the rows as one table (the parts must share a schema, as a python function's do)."""
        return pa.Table.from_batches([batch for _, batch in self.batches])


@dataclass
class WindowState:
    every_us: int
    lateness_us: int = 0
    open: dict[int, list[tuple[object, pa.RecordBatch]]] = field(default_factory=dict)
    """Window index -> the rows received for it so far."""
    max_event_us: int | None = None
    committed_below: int | None = None
    """Every window with an index below this has committed (None before the first row)."""
    late: int = 0
    resumed_below: int | None = None
    """Windows below this index a previous run of the worker wrote (resume): their rows, read again
    from where it resumes, are dropped without counting as late."""

    def resume(self, window: int) -> None:
        """Go on from window index `window`, the first a previous run did not write."""
        self.committed_below = self.resumed_below = window

    @property
    def watermark_us(self) -> int | None:
        return None if self.max_event_us is None else self.max_event_us - self.lateness_us

    def add(self, batch: pa.RecordBatch | pa.Table, event_time: str, part: object = None,
            bounds: tuple[int, int] | None = None) -> list[ClosedWindow]:
        """Take a batch's rows into their windows; returns the windows this commits, oldest first.
        Rows without an event time cannot be placed and count as late. `part` tags the rows (a
        Spark function's parents stay apart within a window). A table (many messages' batches at
        once) costs one pass where its batches one by one would cost one each.

        `bounds`, the (min, max) event time of the rows as their message headers give it, lets a
        batch that lies inside one open window go there whole, without a look at its rows: most
        messages do (a window holds dozens), and a worker that keeps up with its input gets them
        one or two a poll, where the pass over the rows costs about 0.1 ms each time."""
        if batch.num_rows == 0:
            return []
        column = batch.column(event_time)
        if bounds is not None and column.null_count == 0:
            window = bounds[0] // self.every_us
            if window == bounds[1] // self.every_us and (self.committed_below is None or window >= self.committed_below):
                self._keep(window, batch, part)
                return self._advance(bounds[1])
        times = column.cast(pa.timestamp("us")).cast(pa.int64()).to_numpy(zero_copy_only=False)
        valid = None
        if column.null_count:
            valid = np.asarray(column.is_valid())
            times = np.where(valid, times, 0)
        windows = times // self.every_us
        keep = np.ones(len(times), dtype=bool) if valid is None else valid.copy()
        if self.committed_below is not None:
            keep &= windows >= self.committed_below
        kept = int(keep.sum())
        self.late += len(times) - kept
        if self.resumed_below is not None and kept < len(times):
            self.late -= int((windows < self.resumed_below).sum() if valid is None
                             else (valid & (windows < self.resumed_below)).sum())
        if kept:
            if kept < len(times):
                indices = np.flatnonzero(keep)
                batch = batch.take(pa.array(indices))
                windows, times = windows[indices], times[indices]
            self._place(batch, windows, part)
            return self._advance(int(times.max()))
        return self._advance(None)

    def _advance(self, high_us: int | None) -> list[ClosedWindow]:
        """Take `high_us`, the largest event time just placed (None: nothing placed), into the
        watermark, and commit the windows it passes."""
        if high_us is not None and (self.max_event_us is None or high_us > self.max_event_us):
            self.max_event_us = high_us
        return self._commit(self.watermark_us // self.every_us if self.max_event_us is not None else None)

    def flush(self) -> list[ClosedWindow]:
        """Commit every open window (the channel's input has ended)."""
        return self._commit(None, everything=True)

    @property
    def open_rows(self) -> int:
        return sum(b.num_rows for batches in self.open.values() for _, b in batches)

    def _place(self, batch: pa.RecordBatch | pa.Table, windows: np.ndarray, part: object) -> None:
        first, last = int(windows.min()), int(windows.max())
        if first == last:  # the usual case for one message: a batch inside one window
            self._keep(first, batch, part)
            return
        steps = np.diff(windows)
        if (steps >= 0).all():  # in event-time order, as sources and replays send: slices, no copy
            cuts = (np.flatnonzero(steps) + 1).tolist()
            for begin, end in zip([0, *cuts], [*cuts, len(windows)]):
                self._keep(int(windows[begin]), batch.slice(begin, end - begin), part)
            return
        order = np.argsort(windows, kind="stable")
        ordered = windows[order]
        cuts = (np.flatnonzero(np.diff(ordered)) + 1).tolist()
        for begin, end in zip([0, *cuts], [*cuts, len(ordered)]):
            self._keep(int(ordered[begin]), batch.take(pa.array(order[begin:end])), part)

    def _keep(self, window: int, rows: pa.RecordBatch | pa.Table, part: object) -> None:
        kept = self.open.setdefault(window, [])
        if isinstance(rows, pa.Table):
            kept.extend((part, b) for b in rows.to_batches() if b.num_rows)
        else:
            kept.append((part, rows))

    def _commit(self, below: int | None, *, everything: bool = False) -> list[ClosedWindow]:
        if below is not None and (self.committed_below is None or below > self.committed_below):
            self.committed_below = below
        if not self.open:
            return []
        ready = sorted(w for w in self.open if everything or (self.committed_below is not None
                                                              and w < self.committed_below))
        closed = []
        for w in ready:
            batches = self.open.pop(w)
            closed.append(ClosedWindow(w * self.every_us, (w + 1) * self.every_us, tuple(batches)))
        if everything and ready:
            self.committed_below = max(ready[-1] + 1, self.committed_below or ready[-1] + 1)
        return closed

"""A summarised replay's output at its target (ramen.replay.contract.Summary): the rows folded into
buckets (ramen/replay/summary.py) every SUMMARY_ROWS rows and at the end, and written as such. The
client adds up the partial buckets. A message that carries the rollup of its rows (an archived
source's: ramen/rollup.py) gives its rollup instead, tens of buckets for its thousands of rows,
which are not even decoded (add_message).

A fold runs on a thread of its own (Arrow's group_by releases the GIL) while the duty cycle goes on
reading: a target that stopped to fold a million rows held the replayer, and with it every other
reader of the replay's messages (a dashboard's lazy functions over the same source), for as long.
One fold at a time per summariser, so memory stays bounded by twice SUMMARY_ROWS rows and the
buckets, and the buckets are written in the order of their rows."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa

from ramen.program.model import Function
from ramen.replay import summary
from ramen.replay.contract import Summary
from ramen.rollup import Rollup
from ramen.tuples import decode_tuples, tuple_count
from workers.defaults import SUMMARY_PARTS, SUMMARY_ROWS
from workers.outputs import tuple_messages

_folder: ThreadPoolExecutor | None = None
_folder_lock = threading.Lock()


def _fold_thread() -> ThreadPoolExecutor:
    """The worker's one folding thread, started by its first summarised replay."""
    global _folder
    with _folder_lock:
        if _folder is None:
            _folder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="summaries")
        return _folder


class Summariser:
    def __init__(self, spec: Summary, function: Function, channel: int, source_id: int,
                 max_message_length: int) -> None:
        self.spec = spec
        self.function = function
        self.channel = channel
        self.source_id = source_id
        self.max_message_length = max_message_length
        self._pending: list[pa.RecordBatch] = []
        self._rolled_up: list[pa.RecordBatch] = []
        self._rows = 0
        self._folding: Future | None = None
        self.rollups = 0
        """Messages whose rollup was folded instead of their rows."""
        rollup = Rollup.of(function)
        self._rollup = rollup if rollup is not None and rollup.serves(spec) else None

    def add(self, rows: pa.Table | pa.RecordBatch) -> list[tuple[bytes, int]]:
        """Gather rows (a computed table, or a message's batch); once SUMMARY_ROWS or SUMMARY_PARTS
        are in, they go to be folded, and the messages of the previous fold come back (the duty
        cycle writes them)."""
        self._pending.extend(rows.to_batches() if isinstance(rows, pa.Table) else [rows])
        return self._gathered(rows.num_rows)

    def add_message(self, message: bytes, schema: pa.Schema) -> tuple[list[tuple[bytes, int]], int]:
        """A TUPLES message of the function's rows (of `schema`): its rollup when it carries one
        the summary takes, its rows decoded only when it does not; with `add`'s messages, the
        message's row count."""
        rolled_up = self._rollup.decode(message) if self._rollup is not None else None
        rows = tuple_count(message) if rolled_up is not None else None
        if rows is None:  # no rollup taken (or metadata that does not read): the rows themselves
            batch = decode_tuples(message, schema)
            return self.add(batch), batch.num_rows
        return self._add_rolled_up(rolled_up), rows

    @property
    def takes_rollups(self) -> bool:
        """Whether the function's rollups make this summary's buckets (else every row is folded)."""
        return self._rollup is not None

    def add_rollup(self, tail) -> list[tuple[bytes, int]] | None:
        """A whole message's rollup, `tail` being its bytes from its header's rollup_offset on (a
        replayer's copy of them: the batch keeps referring to them); with `add`'s messages, or None
        when it holds no rollup this summary takes (its rows are to be added instead)."""
        rolled_up = self._rollup.decode_tail(tail) if self._rollup is not None else None
        return None if rolled_up is None else self._add_rolled_up(rolled_up)

    def _add_rolled_up(self, rolled_up: pa.RecordBatch) -> list[tuple[bytes, int]]:
        self.rollups += 1
        self._rolled_up.append(rolled_up)
        return self._gathered(rolled_up.num_rows)

    def finish(self) -> list[tuple[bytes, int]]:
        """The buckets of every row added and not written yet, as messages of this channel."""
        messages = self._hand_over() if self._pending or self._rolled_up else []
        return messages + self._folded()

    def _gathered(self, rows: int) -> list[tuple[bytes, int]]:
        self._rows += rows
        if self._rows >= SUMMARY_ROWS or len(self._pending) + len(self._rolled_up) >= SUMMARY_PARTS:
            return self._hand_over()
        return []

    def _hand_over(self) -> list[tuple[bytes, int]]:
        done = self._folded()
        rows, rolled_up = self._pending, self._rolled_up
        self._pending, self._rolled_up, self._rows = [], [], 0
        self._folding = _fold_thread().submit(self._fold, rows, rolled_up)
        return done

    def _folded(self) -> list[tuple[bytes, int]]:
        """The messages of the fold under way, once it is done (a bug in it raises here)."""
        if self._folding is None:
            return []
        folding, self._folding = self._folding, None
        return folding.result()

    def _fold(self, rows: list[pa.RecordBatch], rolled_up: list[pa.RecordBatch]) -> list[tuple[bytes, int]]:
        parts = [summary.rebucketed(self.spec, self.function, pa.Table.from_batches(rolled_up))] if rolled_up else []
        if rows:
            parts.append(summary.aggregate(self.spec, self.function, pa.Table.from_batches(rows)))
        buckets = summary.combine(self.spec, self.function, parts)
        return list(tuple_messages(buckets, self.max_message_length, None, self.channel, self.source_id))

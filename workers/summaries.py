"""A summarised replay's output at its target (ramen.replay.contract.Summary): the rows folded into
buckets (ramen/replay/summary.py) every SUMMARY_ROWS rows and at the end, and written as such. The
client adds up the partial buckets; memory stays bounded by SUMMARY_ROWS rows and the buckets."""

from __future__ import annotations

import pyarrow as pa

from ramen.program.model import Function
from ramen.replay import summary
from ramen.replay.contract import Summary
from workers.defaults import SUMMARY_ROWS
from workers.outputs import tuple_messages


class Summariser:
    def __init__(self, spec: Summary, function: Function, channel: int, source_id: int,
                 max_message_length: int) -> None:
        self.spec = spec
        self.function = function
        self.channel = channel
        self.source_id = source_id
        self.max_message_length = max_message_length
        self._pending: list[pa.Table] = []
        self._rows = 0

    def add(self, rows: pa.Table | pa.RecordBatch) -> list[tuple[bytes, int]]:
        """Gather the rows; the messages of their buckets once SUMMARY_ROWS are in."""
        self._pending.append(rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows]))
        self._rows += rows.num_rows
        return self.finish() if self._rows >= SUMMARY_ROWS else []

    def finish(self) -> list[tuple[bytes, int]]:
        """The buckets of the rows gathered, as messages of this channel."""
        if not self._rows:
            return []
        buckets = summary.aggregate(self.spec, self.function, pa.concat_tables(self._pending))
        self._pending, self._rows = [], 0
        return list(tuple_messages(buckets, self.max_message_length, None, self.channel, self.source_id))

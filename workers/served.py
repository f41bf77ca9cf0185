"""The replay channels a replayer is the target of (ChannelRange.recipient): summarised replays of its
own source, such as a dashboard's charts of it (ReplayRequest.served_by_replayer).

The replayer reads every message of the source anyway. For such a channel it folds each message
inside the channel's range by the rollup the message carries (ramen/rollup.py; copying only the
rollup out of the recorded frames), or by its rows where it carries none or the range cuts it, and
writes the buckets to the client's log and its riders', as the source's worker would have done
after reading every message from the replayer's log. Not reading the log saves that reader: the
copy of each message out of the log and a duty cycle paced by the log's slowest reader.

A channel ends as a target's does (workers/channels.py): its last buckets, one END_OF_REPLAY per
recipient, and then the riders' replay keys are deleted, and its own key last (the process does
that: `ended`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa

from ramen.program.model import Function
from ramen.replay import summary
from ramen.replay.contract import ChannelRange
from ramen.transport import CountersFile, LogBufferError
from ramen.tuples import end_of_replay, with_channel
from workers.outputs import Output
from workers.summaries import Summariser

log = logging.getLogger(__name__)


class ServedError(Exception):
    """A served channel that cannot be served (one line)."""


class ServedChannel:
    """One channel the replayer is the target of: its summariser and its recipients' outputs."""

    def __init__(self, spec: ChannelRange, function: Function, source_id: int, counters: CountersFile) -> None:
        if not spec.served:
            raise ValueError(f"channel {spec.channel} is not served by the replayer")
        try:
            summary.check(spec.summary, function)
        except summary.SummaryError as e:
            raise ServedError(f"replay {spec.channel}: {e}") from None
        self.spec = spec
        self.source_id = source_id
        self.outputs: list[tuple[int, Output]] = []
        """(channel, output): the recipient's, then each rider's; a client gone already has none."""
        for channel, recipient in [(spec.channel, spec.recipient), *((r.channel, r.recipient) for r in spec.also)]:
            try:
                self.outputs.append((channel, Output.open(Path(recipient), counters, create=False)))
            except (LogBufferError, OSError) as e:  # its client went before the replay began
                log.warning("replay %d: cannot open the recipient %s (%s): its client is gone", channel, recipient, e)
        # With no recipient left the buckets go nowhere, and any length does.
        max_message_length = min((o.publication.max_message_length for _, o in self.outputs), default=1 << 20)
        self.summariser = Summariser(spec.summary, function, spec.channel, source_id, max_message_length)
        self._unsent_ends: int | None = None
        """END_OF_REPLAYs queued and not written yet, once the channel is finishing."""

    @property
    def takes_rollups(self) -> bool:
        return self.summariser.takes_rollups

    def add_rollup(self, tail) -> bool:
        """A message inside the range whole, by its rollup (`tail`: the message's bytes from its
        rollup_offset on); False when it carries none this summary takes."""
        messages = self.summariser.add_rollup(tail)
        if messages is None:
            return False
        self._send(messages)
        return True

    def add_rows(self, rows: pa.RecordBatch) -> None:
        """Rows inside the range (a message without a rollup, or the part of one the range cuts)."""
        self._send(self.summariser.add(rows))

    def finish(self) -> None:
        """Every message is in: the last buckets, then the END_OF_REPLAYs."""
        self._send(self.summariser.finish())
        self._unsent_ends = len(self.outputs)
        for channel, output in self.outputs:
            output.send(end_of_replay(channel, self.source_id), on_sent=self._end_sent)

    def flush(self) -> int:
        return sum(output.flush() for _, output in self.outputs if output.pending)

    @property
    def ended(self) -> bool:
        """Every END_OF_REPLAY is written: its replay keys can go."""
        return self._unsent_ends == 0

    @property
    def channels(self) -> list[int]:
        """The riders' channels, then its own: the order their keys are deleted in, so that nobody
        takes the leader's end for theirs."""
        return [*(r.channel for r in self.spec.also), self.spec.channel]

    def close(self) -> None:
        for _, output in self.outputs:
            output.close()

    def _send(self, messages: list[tuple[bytes, int]]) -> None:
        for message, rows in messages:
            for channel, output in self.outputs:
                output.send(message if channel == self.spec.channel else with_channel(message, channel), rows)

    def _end_sent(self) -> None:
        self._unsent_ends -= 1

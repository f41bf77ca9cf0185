"""A worker's channel states: live (channel 0) and one per replay it takes part in, kept apart so
that replayed and live rows never mix (docs/runtime.md, "Replay, step by step").

For each `…/<prog>/<func>/replays/<channel>` key the supervisor writes, the worker reads the listed
input logs and keeps that channel's windows and counts; it writes to its replay output log or, as
the target, to the client's recipient log (and the same rows to the riders' recipients). After
`expect_eor` END_OF_REPLAYs the channel's windows are flushed (workers/dispatch.py), one
END_OF_REPLAY goes out per recipient, and the target deletes `replays/<channel>`.

A key with `via` names no inputs: its replay goes on from this worker's output for channel `via`
(the target of that one), which is written under its channel too, to the replay log, END_OF_REPLAY
included. Its key comes before the via channel's. Should the via replay's client go first, its
key is rewritten `carried` (its recipient gone) and the state goes on for the replays still going
on from it, writing only for them; a worker that had not read the key yet starts it so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa

from confserver import ConfClient
from ramen.message import LIVE_CHANNEL
from ramen.program.model import Function
from ramen.replay import summary
from ramen.replay.contract import WorkerReplay
from ramen.replay.end import end_replays
from ramen.transport import LogBufferError
from ramen.tuples import end_of_replay, with_channel
from workers.heavy import Gathered
from workers.inputs import Inputs
from workers.outputs import Output, Outputs
from workers.stats import WorkerCounters
from workers.summaries import Summariser
from workers.windows import WindowState

log = logging.getLogger(__name__)


@dataclass
class ChannelState:
    channel: int
    pass_through: bool = False
    expect_eor: int = 1
    windows: WindowState | None = None
    output: Output | None = None
    recipient: str | None = None
    riders: list[tuple[int, Output]] = field(default_factory=list)
    """Identical replays riding with this one: the target writes the same result to their
    recipients too, tagged with their channels (docs/runtime.md, "also")."""
    through: list[tuple[int, Output]] = field(default_factory=list)
    """Replays going on from this one's output (their keys' `via`): the same rows, tagged with their
    channels, to the replay log."""
    eor_received: int = 0
    eor_unsent: int = 0
    inputs: tuple[str, ...] = ()
    gathered: Gathered | None = None
    """A heavy worker's committed rows not run through Spark yet."""
    ending: bool = False
    """Every END_OF_REPLAY is in: the channel ends once its gathered rows have run."""
    retry_at: float = 0.0
    retries: int = 0
    unreachable_since: float | None = None
    summariser: Summariser | None = None
    """A summarised replay's target: its recipients get the buckets of its rows, not the rows."""

    def send(self, message: bytes, rows: int, on_sent: Callable[[], None] | None = None) -> None:
        """To the channel's output (none once its client went, see Channels.end), and the same
        tuples to every rider and replay going on from it, re-tagged with its channel; a summarised
        replay's recipients get theirs from `summarise`."""
        if self.summariser is None:
            self._to_recipients(message, rows, on_sent)
        for channel, output in self.through:
            output.send(with_channel(message, channel), rows)

    def summarise(self, rows: pa.Table | pa.RecordBatch) -> None:
        """A summarised replay's rows, folded into buckets (written once enough are in)."""
        for buckets, count in self.summariser.add(rows):
            self._to_recipients(buckets, count)

    def summarise_message(self, message: bytes, schema: pa.Schema) -> tuple[int, bool]:
        """A summarised replay's TUPLES message of the function's own rows, folded by its rollup
        when it carries one (Summariser.add_message); its row count, and whether its rollup was taken."""
        rollups = self.summariser.rollups
        messages, rows = self.summariser.add_message(message, schema)
        for buckets, count in messages:
            self._to_recipients(buckets, count)
        return rows, self.summariser.rollups != rollups

    def finish_summary(self) -> None:
        """The buckets of the rows not written yet, before the channel's end."""
        if self.summariser is not None:
            for message, count in self.summariser.finish():
                self._to_recipients(message, count)

    def _to_recipients(self, message: bytes, rows: int, on_sent: Callable[[], None] | None = None) -> None:
        if self.output is not None:
            self.output.send(message, rows, on_sent)
        for channel, output in self.riders:
            output.send(with_channel(message, channel), rows)

    @property
    def max_message_length(self) -> int:
        return (self.output or self.through[0][1]).publication.max_message_length


class Channels:
    """The channel states of one worker, and the start and end of its replays."""

    def __init__(self, client: ConfClient, site: str, function: Function, parents: dict[str, Function],
                 source_id: int, inputs: Inputs, outputs: Outputs, stats: WorkerCounters) -> None:
        self.client = client
        self.site = site
        self.function = function
        self.name = function.qualified_name
        self.parents = parents
        self.source_id = source_id
        """The `source` of the END_OF_REPLAYs this worker forwards."""
        self.inputs = inputs
        self.outputs = outputs
        self.stats = stats
        self.states: dict[int, ChannelState] = {}
        self.finished: set[int] = set()
        self.vias: dict[int, int] = {}
        """Channel of a replay going on from another's output -> that other channel (WorkerReplay.via)."""

    def get(self, channel: int) -> ChannelState | None:
        return self.states.get(channel)

    def is_current(self, state: ChannelState) -> bool:
        """The state is still its channel's (not a replay torn down since)."""
        return self.states.get(state.channel) is state

    def _windows(self) -> WindowState | None:
        window = self.function.window
        return WindowState(window.every_us, window.lateness_us) if window else None

    def open_live(self, output: Output) -> ChannelState:
        state = self.states[LIVE_CHANNEL] = ChannelState(LIVE_CHANNEL, output=output, expect_eor=0,
                                                         windows=self._windows())
        return state

    def recipients(self) -> list[Output]:
        """The outputs the replays' states hold: recipients, then riders."""
        outputs = [s.output for s in self.states.values() if s.recipient and s.output is not None]
        return outputs + [o for s in self.states.values() for _, o in s.riders]

    def start(self, channel: int, part: WorkerReplay) -> None:
        """A replay key written (or rewritten): the channel's state, output and inputs."""
        if channel in self.finished:
            return
        if part.via is not None:
            self.vias[channel] = part.via
            if (state := self.states.get(part.via)) is not None:
                self._go_on(state, channel)
            return
        if not part.pass_through and not self.parents:
            log.error("%s: replay %d asks a source to compute (not pass_through): ignored", self.name, channel)
            return
        if not part.pass_through and not set(part.parents) <= set(self.parents):
            log.error("%s: replay %d names parents %s, not this function's: ignored", self.name, channel,
                      ", ".join(sorted(set(part.parents) - set(self.parents))))
            return
        state = self.states.get(channel)
        if state is None:
            state = self.states[channel] = ChannelState(
                channel, pass_through=part.pass_through, windows=None if part.pass_through else self._windows())
            log.info("%s: replay %d (%s) from %s", self.name, channel,
                     "pass-through" if part.pass_through else "computed", list(part.inputs))
            for going_on in [c for c, via in self.vias.items() if via == channel]:
                self._go_on(state, going_on)
        state.expect_eor = part.expect_eor
        if part.carried:
            if state.output is not None:
                self._client_gone(state)
        elif state.output is None:
            try:
                state.output = self.outputs.for_replay(part.recipient)
            except LogBufferError as e:
                log.error("%s: replay %d: cannot open its output: %s", self.name, channel, e)
                del self.states[channel]
                return
            state.recipient = part.recipient
        if part.summary is not None and state.summariser is None and state.output is not None:
            try:
                summary.check(part.summary, self.function)
            except summary.SummaryError as e:
                log.error("%s: replay %d: %s: ignored", self.name, channel, e)
                self.end(channel)
                return
            state.summariser = Summariser(part.summary, self.function, channel, self.source_id,
                                          state.output.publication.max_message_length)
        if part.recipient and not state.riders:
            try:
                state.riders = [(also.channel, self.outputs.open_recipient(Path(also.recipient)))
                                for also in part.also]
            except LogBufferError as e:
                log.error("%s: replay %d: cannot open a rider's recipient: %s", self.name, channel, e)
        # Whose rows each input carries: this function's for a pass-through source, else the parent
        # the key names (a replayer's log says nothing of whose rows it holds).
        functions = [self.function] * len(part.inputs) if part.pass_through else \
            [self.parents[parent] for parent in part.parents]
        for path, function, tag in zip(part.inputs, functions, part.tags or (channel,) * len(part.inputs)):
            self.inputs.use(Path(path), function, channel, tag)
        for path in set(state.inputs) - set(part.inputs):
            self.inputs.release(Path(path), channel)
        state.inputs = part.inputs
        self.inputs.look_now()  # its inputs: at once, in this duty cycle

    def _go_on(self, state: ChannelState, channel: int) -> None:
        if all(c != channel for c, _ in state.through):
            state.through.append((channel, self.outputs.for_replay(None)))
            log.info("%s: replay %d goes on from replay %d", self.name, channel, state.channel)

    def end(self, channel: int, *, torn_down: bool = False) -> None:
        """The channel's state goes: it ended (its recipients still flush), or its key was deleted."""
        if torn_down:
            self.finished.discard(channel)
            self.outputs.tear_down(channel)
        if (via := self.vias.pop(channel, None)) is not None:
            if (state := self.states.get(via)) is not None:
                state.through = [(c, o) for c, o in state.through if c != channel]
                if state.output is None and not state.through:
                    self.end(via)  # its client went before, and now the last replay going on from it
            return
        state = self.states.get(channel)
        if state is None:
            return
        if torn_down and state.through and state.output is not None:
            self._client_gone(state)
            return
        del self.states[channel]
        if torn_down:
            log.info("%s: replay %d torn down", self.name, channel)
        if state.gathered is not None:
            state.gathered.discard()
        for path in state.inputs:
            self.inputs.release(Path(path), channel)
        if state.recipient and state.output is not None:
            recipients = [state.output, *(o for _, o in state.riders)]
            if torn_down:
                for output in recipients:
                    output.close()
            else:
                self.outputs.retire(channel, recipients)

    def _client_gone(self, state: ChannelState) -> None:
        """Its client went, but replays going on from its output still need it: it goes on for them."""
        if state.recipient:
            for output in [state.output, *(o for _, o in state.riders)]:
                output.close()
        state.output, state.recipient, state.riders = None, None, []
        log.info("%s: replay %d: its client went; it goes on for replays %s", self.name, state.channel,
                 ", ".join(str(c) for c, _ in state.through))

    def count_end_of_replay(self, channel: int, source: int, shared: bool) -> ChannelState | None:
        """One END_OF_REPLAY read; the channel's state once every one it expects is in."""
        state = self.states.get(channel)
        if state is None or channel == LIVE_CHANNEL:
            if not shared:  # on a replayer's log, another reader's replay ended
                log.warning("%s: END_OF_REPLAY of channel %d (from %d) nobody here expects", self.name, channel,
                            source)
            return None
        state.eor_received += 1
        self.stats.channel(channel).eor_received += 1
        if state.eor_received < state.expect_eor:
            return None
        state.ending = True
        return state

    def send_end_of_replay(self, state: ChannelState) -> None:
        """The channel's last message, to its output, its riders' and the replays going on from
        it; then its state goes."""
        channel = state.channel
        state.finish_summary()
        ends = [(rider, output) for rider, output in (*state.riders, *state.through)]
        if state.output is not None:
            ends.insert(0, (channel, state.output))
        state.eor_unsent = len(ends)
        for tagged, output in ends:
            output.send(end_of_replay(tagged, self.source_id), on_sent=lambda: self._replay_done(channel, state))
        log.info("%s: replay %d ended (%d END_OF_REPLAY)", self.name, channel, state.eor_received)
        self.finished.add(channel)
        for going_on, _ in state.through:
            self.vias.pop(going_on, None)
        self.end(channel)

    def _replay_done(self, channel: int, state: ChannelState) -> None:
        """One END_OF_REPLAY is written; once all are, the target ends the replay: the riders'
        keys first, so that nobody takes the leader's end for theirs."""
        state.eor_unsent -= 1
        if not state.recipient or state.eor_unsent > 0:
            return
        end_replays(self.client, [*(rider for rider, _ in state.riders), channel])

    def discard_gathered(self) -> None:
        """On stop: staged files go; the rows are the replayer's to send again."""
        for state in self.states.values():
            if state.gathered is not None:
                state.gathered.discard()

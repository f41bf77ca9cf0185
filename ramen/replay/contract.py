"""A replay's key values, one typed definition each: the schema of docs/runtime.md's replay keys.

Each is a ramen.key_value.KeyValue, which writer and reader both import: read with `from_value()`,
a value that does not follow its contract raises ContractError naming the key and the field.

    replays/<channel>                                      ReplayRequest (the client; `error` added
                                                           by a replayer or the supervisor: with_error)
    sites/<site>/workers/<prog>/<func>/replays/<channel>   WorkerReplay (the supervisor)
    sites/<site>/replayers/<id>                            ReplayerAssignment (the supervisor)
    sites/<site>/replayers/<id>/stats                      ReplayerStats (the replayer)
    sites/<site>/lent-replayers/<id>                       LentReplayer (another site's supervisor)
    replay-results/<channel>/<n>                           ResultPart (the supervisor, relaying)
    replay-results/<channel>/end                           ResultEnd (the supervisor, relaying)

Values are JSON-shaped: tuples are written as lists, a plan as its JSON string, the stats'
per-channel rows with the channel as a string key.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ramen import keyspace
from ramen.key_value import ContractError, KeyValue
from ramen.replay.plan import ReplayPlan

__all__ = ["ChannelRange", "ContractError", "LentReplayer", "RELAY_PART_BYTES", "ReplayRequest", "ReplayerAssignment", "ReplayerStats",
           "ResultEnd", "ResultPart", "Rider", "Summary", "WorkerReplay", "error_of", "with_error"]


# -- replays/<channel> ----------------------------------------------------------------------------

DEFAULT_REPLAY_TIMEOUT_S = 300.0
"""A replay nobody finishes is torn down by the supervisor this long after it was asked: the
client's default `timeout_s`, and the supervisor's for a request it cannot read."""


@dataclass(frozen=True)
class Summary(KeyValue):
    """A summarised replay: instead of its rows the target writes, per `step_s` bucket of event
    time and per combination of `factors`' values, each of `fields`' sum and count (the columns
    ramen/replay/summary.py makes). What a chart draws of a million rows is a few thousand buckets:
    the rows then never leave the target (a dashboard's replays of a source)."""

    KEY: ClassVar[str] = "summary"
    step_s: int
    factors: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()

    def _check(self, key: str) -> None:
        if self.step_s < 1:
            raise ContractError(f"{key}: summary step of {self.step_s} s, not a positive number of seconds")


@dataclass(frozen=True)
class ReplayRequest(KeyValue):
    """replays/<channel>: a client's request (ephemeral, so it goes with the client)."""

    KEY: ClassVar[str] = "replays/<channel>"
    target: str
    since_us: int
    until_us: int
    plan: ReplayPlan
    recipient: str
    """The client's log buffer, which the target writes the result to."""
    created_us: int
    """Wall-clock time of the request: the supervisor deletes it `timeout_s` later."""
    timeout_s: float
    no_merge: bool
    """No merge window: neither wait for nor merge with concurrent replays (for measurements)."""
    pid: int | None = None
    """The client's process."""
    error: str | None = None
    """Why the replay failed, one line for the user (see with_error)."""
    lost: bool = False
    """The error is a process on its path that died under it (killed, crashed: ended by a signal),
    not an error of its own (a worker's failing Spark job, a damaged archive) nor of the request:
    the same replay asked again may well succeed."""
    summary: Summary | None = None
    """The target writes the result's buckets, not its rows."""
    site: str = keyspace.DEFAULT_SITE
    """The site that serves it (the client's): its choreographer marks the functions, its
    supervisor wires them, its archives answer. Other sites sharing the confserver leave it alone."""
    relay: bool = False
    """The result comes through the confserver (`replay-results/<channel>/...`, written by the
    site's supervisor from a log of its own), not through `recipient`, which is then empty: for a
    client on a host that cannot map the serving site's files."""
    source_sites: dict[str, str] = field(default_factory=dict)
    """Sources archived on another site, by name: that site's supervisor runs their replayers
    (LentReplayer) and its netd sends their logs to this site's, which rebuilds them for our workers."""

    def _check(self, key: str) -> None:
        if self.until_us <= self.since_us:
            raise ContractError(f"{key}: empty range [{self.since_us}, {self.until_us})")
        if self.relay and self.recipient:
            raise ContractError(f"{key}: a relayed replay names no recipient, not {self.recipient!r}")
        if strays := set(self.source_sites) - set(self.plan.sources):
            raise ContractError(f"{key}: source_sites names {', '.join(sorted(strays))}, not sources of its plan")
        if self.site in self.source_sites.values():
            raise ContractError(f"{key}: source_sites names the replay's own site {self.site}")

    @property
    def served_by_replayer(self) -> bool:
        """A summarised replay of a source archived on this site is served by the source's replayer
        itself (ChannelRange.recipient): it reads every message anyway, so it folds them (their
        rollups) and writes the buckets to the recipient, and the source's worker takes no part.
        A dashboard's charts of a source then cost no reader of the replayer's log, no copy of
        each message out of it, and no duty cycle waiting on its slowest reader."""
        return (self.summary is not None and self.plan.target in self.plan.sources
                and self.plan.target not in self.source_sites)

    @property
    def workers(self) -> tuple[str, ...]:
        """Sorted: the functions whose processes the replay goes through (ReplayPlan.workers, less a
        source target its replayer serves)."""
        if self.served_by_replayer:
            return tuple(name for name in self.plan.workers if name != self.plan.target)
        return self.plan.workers


def error_of(value: Any) -> str | None:
    """The error of replays/<channel>, read even when the rest of it does not follow the contract
    (the first error stays: see with_error)."""
    return (value.get("error") or None) if isinstance(value, dict) else None


def with_error(value: Any, message: str, *, lost: bool = False) -> dict:
    """replays/<channel> with `error` set (and `lost`, for a process that died under it), the rest
    kept: the one way a replayer or the supervisor fails a replay. A request too broken to read gets
    its error too, so that its client hears why."""
    try:
        return dataclasses.replace(ReplayRequest.from_value(value), error=message, lost=lost).to_value()
    except ContractError:
        return dict(value, error=message) if isinstance(value, dict) else {"request": value, "error": message}


# -- replay-results/<channel>/... ----------------------------------------------------------------

RELAY_PART_BYTES = 256 * 1024
"""The most base64 characters in one ResultPart's `data`: well under the confserver's value limit
(512 KiB), and a key write per quarter MiB keeps the confserver's journal writes few."""


RESULT_MESSAGE_LENGTH = struct.Struct("<I")
"""The length that precedes each message in a relayed result's byte stream (see ResultPart)."""


@dataclass(frozen=True)
class ResultPart(KeyValue):
    """replay-results/<channel>/<n>: part n (0, 1, ...) of a relayed replay's result.

    The result is one byte stream, each TUPLES message of the channel (ramen/message.py,
    ramen/tuples.py: header and Arrow IPC record batch, as the target wrote it) preceded by its
    length (u32, little endian); `data` is base64 of the next at most RELAY_PART_BYTES * 3 / 4
    bytes of that stream. A message may go on in the next part: the reader concatenates the parts in
    order. Raw messages, not an Arrow IPC stream, so that the relay decodes nothing (it does not
    know the target's schema) and the client decodes them as it decodes its own log's."""

    KEY: ClassVar[str] = "replay-results/<channel>/<n>"
    rows: int
    """Rows of the messages that begin in this part."""
    data: str


@dataclass(frozen=True)
class ResultEnd(KeyValue):
    """replay-results/<channel>/end: the result is whole in parts 0..parts-1 (the target's
    END_OF_REPLAY came), or, with `error`, will never be (torn down before its end)."""

    KEY: ClassVar[str] = "replay-results/<channel>/end"
    parts: int
    rows: int
    error: str | None = None


# -- sites/<site>/workers/<prog>/<func>/replays/<channel> ---------------------------------------------

@dataclass(frozen=True)
class Rider(KeyValue):
    """An identical replay riding on another's channel: the target writes the same result to it."""

    KEY: ClassVar[str] = "also"
    channel: int
    recipient: str


@dataclass(frozen=True)
class WorkerReplay(KeyValue):
    """sites/<site>/workers/<prog>/<func>/replays/<channel>: how one worker takes part in a replay."""

    KEY: ClassVar[str] = "sites/<site>/workers/<prog>/<func>/replays/<channel>"
    channel: int
    since_us: int
    until_us: int
    inputs: tuple[str, ...]
    """Logs carrying this channel for this worker."""
    expect_eor: int
    """END_OF_REPLAYs of this channel to wait for (one per input)."""
    parents: tuple[str, ...] = ()
    """Whose rows each input carries (a replayer's log: its source's); empty for a pass-through."""
    pass_through: bool = False
    """This worker is the plan's target and a source: the replayed tuples already are its output."""
    recipient: str | None = None
    """The target only: the client's log buffer."""
    also: tuple[Rider, ...] = ()
    """The target only: identical replays riding on this one."""
    summary: Summary | None = None
    """The target only: it writes the buckets of its output to its recipients, not the rows."""
    tags: tuple[int, ...] = ()
    """Per input, the channel this channel's rows are tagged with there (ChannelRange.tag: a
    replayer writes the rows of channels of one range once); empty: this channel, on every input."""
    via: int | None = None
    """This worker's output for this channel is its output for channel `via`, a replay of this
    worker over the same range and the same archives whose target it is: computed once, it is also
    written under this channel to the worker's replay log, for this replay's next workers. Such a
    key has no inputs of its own."""
    carried: bool = False
    """The target's key of a replay whose client went while replays go on from its output (their
    keys' `via`): kept, without recipient, riders or summary, until those end, so that the worker
    computes for them (one that had not read the key yet reads it then, and its inputs)."""

    def _check(self, key: str) -> None:
        if not self.pass_through and len(self.parents) != len(self.inputs):
            raise ContractError(f"{key}: {len(self.inputs)} inputs but {len(self.parents)} parents")
        if self.tags and len(self.tags) != len(self.inputs):
            raise ContractError(f"{key}: {len(self.inputs)} inputs but {len(self.tags)} tags")
        if self.via is not None and (self.inputs or self.pass_through or self.recipient):
            raise ContractError(f"{key}: a replay via channel {self.via} has no inputs, recipient or pass-through")
        if self.carried and (self.via is not None or self.recipient or self.also or self.summary):
            raise ContractError(f"{key}: a carried replay has no via, recipient, riders or summary")


# -- sites/<site>/replayers/<id> ------------------------------------------------------------------

@dataclass(frozen=True)
class ChannelRange(KeyValue):
    """One replay channel a replayer serves and the event times [since_us, until_us) it wants."""

    KEY: ClassVar[str] = "channels"
    channel: int
    since_us: int
    until_us: int
    tag: int | None = None
    """The channel its rows are tagged with on the log, when another channel of the same range
    leads (the lowest): the rows of channels of one range are written once, for them all."""
    recipient: str | None = None
    """The replayer is this channel's target (ReplayRequest.served_by_replayer): it writes the
    buckets of the channel's rows (`summary`) to this client's log, and to its riders' (`also`),
    then their END_OF_REPLAYs, and deletes their replay keys; nothing of the channel goes to its
    own log."""
    also: tuple[Rider, ...] = ()
    summary: Summary | None = None

    def _check(self, key: str) -> None:
        if self.until_us <= self.since_us:
            raise ContractError(f"{key}: channel {self.channel}: empty range [{self.since_us}, {self.until_us})")
        if (self.recipient is None) != (self.summary is None):
            raise ContractError(f"{key}: channel {self.channel}: a recipient and a summary go together "
                                f"(the replayer serves summarised replays only)")
        if self.recipient is None and self.also:
            raise ContractError(f"{key}: channel {self.channel}: riders without a recipient")
        if self.recipient is not None and self.tag is not None:
            raise ContractError(f"{key}: channel {self.channel}: a channel the replayer serves is not on its log")

    @property
    def tagged(self) -> int:
        return self.channel if self.tag is None else self.tag

    @property
    def served(self) -> bool:
        """The replayer is its target: its rows go to no reader of the log."""
        return self.recipient is not None


@dataclass(frozen=True)
class ReplayerAssignment(KeyValue):
    """sites/<site>/replayers/<id>: what a replayer reads and for which channels."""

    KEY: ClassVar[str] = "sites/<site>/replayers/<id>"
    id: int
    source: str
    log: str
    archive_dir: str
    channels: tuple[ChannelRange, ...]
    readers: int = 1
    """How many workers subscribe to the log: the replay starts once they all have. 0: every
    channel is served by the replayer itself, which then writes no log."""
    riders: tuple[int, ...] = ()
    """Replays that need this replayer without it writing their channels (identical ones riding on
    its channels, and those going on from their targets' output): a restarted supervisor takes them
    as launched too, and does not launch them a second time."""
    pid: int | None = None
    started_us: int | None = None
    """The process serving it, once spawned: what a restarted supervisor adopts."""
    sent_to: str | None = None
    """Lent to a replay of that site (LentReplayer): its one reader is this site's netd, which
    sends the log there."""
    stream_id: int = 0
    """The log's stream (and session) id: lent, the LentReplayer's id, which the borrowing site's
    netd receives (the streams sent to one endpoint are told apart by it)."""

    def _check(self, key: str) -> None:
        if not self.channels:
            raise ContractError(f"{key}: no channels")
        if (self.sent_to is None) != (self.stream_id == 0):
            raise ContractError(f"{key}: a lent replayer has a stream id, and only a lent one")
        if self.readers < 0 or (self.readers == 0) != all(c.served for c in self.channels):
            raise ContractError(f"{key}: {self.readers} readers of its log: 0 exactly when the replayer "
                                f"serves every channel itself")
        if self.sent_to is not None and any(c.served for c in self.channels):
            raise ContractError(f"{key}: a lent replayer serves no channel itself")

    @property
    def since_us(self) -> int:
        return min(c.since_us for c in self.channels)

    @property
    def until_us(self) -> int:
        return max(c.until_us for c in self.channels)


@dataclass(frozen=True)
class LentReplayer(KeyValue):
    """sites/<site>/lent-replayers/<id>: a replayer that a replay served by site `to_site` needs
    from this site's archive. Written by that site's supervisor, ephemeral (it goes with that
    supervisor), which also has its netd receive stream `id` into its workers' input; this site's
    supervisor runs the replayer (`sites/<site>/replayers/<id>`, `sent_to`) and has its own netd
    send the log there, until the key is deleted."""

    KEY: ClassVar[str] = "sites/<site>/lent-replayers/<id>"
    id: int
    source: str
    channels: tuple[ChannelRange, ...]
    to_site: str

    def _check(self, key: str) -> None:
        if not self.channels:
            raise ContractError(f"{key}: no channels")


@dataclass(frozen=True)
class ReplayerStats(KeyValue):
    """sites/<site>/replayers/<id>/stats: what a replayer has done so far."""

    KEY: ClassVar[str] = "sites/<site>/replayers/<id>/stats"
    bytes_read: int
    messages: int
    rows_out: int
    channels: dict[int, int]
    """Rows written, per channel."""
    done: bool
    """Every channel ended: what a supervisor that adopted this replayer (and so cannot read its
    exit status) checks once the process is gone."""
    rollups: int = 0
    """Messages folded by their rollups for the channels it serves itself (ChannelRange.recipient)."""

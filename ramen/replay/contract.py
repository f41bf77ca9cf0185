"""A replay's key values, one typed definition each: the schema of docs/runtime.md's replay keys.

Writer and reader import the same class, as Ramen's RamenSync values are one type on both sides: a
value is built as a frozen dataclass and written with `to_value()`; it is read with
`from_value()`, which checks every field (present, known, of its type) and raises ContractError
naming the key and the field in one line. A field renamed on one side then fails loudly on the
other, instead of reading as a default.

    replays/<channel>                                      ReplayRequest (the client; `error` added
                                                           by a replayer or the supervisor: with_error)
    sites/<site>/workers/<prog>/<func>/replays/<channel>   WorkerReplay (the supervisor)
    sites/<site>/replayers/<id>                            ReplayerAssignment (the supervisor)
    sites/<site>/replayers/<id>/stats                      ReplayerStats (the replayer)

Values are JSON-shaped: tuples are written as lists, a plan as its JSON string, the stats'
per-channel rows with the channel as a string key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from ramen.replay.plan import ReplayPlan

__all__ = ["ChannelRange", "ContractError", "ReplayRequest", "ReplayerAssignment", "ReplayerStats", "Rider", "Summary",
           "WorkerReplay", "error_of", "with_error"]


class ContractError(Exception):
    """A key value that does not follow its contract: one line naming the key and the field."""


class _Value:
    """to_value()/from_value() for a frozen dataclass of JSON-shaped fields."""

    KEY: ClassVar[str]
    """The key pattern, for errors when the caller does not say which key it read."""

    def to_value(self) -> dict:
        """Optional fields left unset (None, empty) are left out, as readers take them as such."""
        return {f.name: _to_json(value) for f in dataclasses.fields(self)
                if not ((value := getattr(self, f.name)) in (None, ()) and f.default is not dataclasses.MISSING)}

    @classmethod
    def from_value(cls, value: Any, key: str | None = None):
        """The value read from `key`; ContractError names the key and the missing, unknown or
        wrongly typed field."""
        key = key or cls.KEY
        if not isinstance(value, dict):
            raise ContractError(f"{key}: not a mapping but {_shown(value)}")
        fields = dataclasses.fields(cls)
        unknown = sorted(set(value) - {f.name for f in fields})
        if unknown:
            raise ContractError(f"{key}: unknown field{'s' if len(unknown) > 1 else ''} "
                                f"{', '.join(map(repr, unknown))}")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for f in fields:
            if f.name in value:
                kwargs[f.name] = _from_json(key, f.name, hints[f.name], value[f.name])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ContractError(f"{key}: missing field {f.name!r}")
        made = cls(**kwargs)
        made._check(key)
        return made

    def _check(self, key: str) -> None:
        """Rules across fields, beyond each field's type."""


def _to_json(field: Any) -> Any:
    if isinstance(field, _Value):
        return field.to_value()
    if isinstance(field, tuple):
        return [_to_json(item) for item in field]
    if isinstance(field, dict):
        return {str(k): v for k, v in field.items()}
    if isinstance(field, ReplayPlan):
        return field.to_json()
    return field


def _from_json(key: str, name: str, hint: Any, raw: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is types.UnionType and type(None) in args:  # X | None
        if raw is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        if not isinstance(raw, (list, tuple)):
            raise _wrong(key, name, raw, "a list")
        return tuple(_from_json(key, f"{name}[{i}]", args[0], item) for i, item in enumerate(raw))
    if origin is dict:  # channel -> count, channels written as strings (JSON keys)
        if not isinstance(raw, dict):
            raise _wrong(key, name, raw, "a mapping")
        try:
            return {int(k): _from_json(key, f"{name}[{k}]", args[1], v) for k, v in raw.items()}
        except ValueError:
            raise _wrong(key, name, raw, "a mapping of channel numbers") from None
    if isinstance(hint, type) and issubclass(hint, _Value):
        return hint.from_value(raw, f"{key}: {name}")
    if hint is ReplayPlan:
        try:
            return ReplayPlan.from_dict(raw) if isinstance(raw, dict) else ReplayPlan.from_json(raw)
        except (ValueError, KeyError, TypeError) as e:
            raise ContractError(f"{key}: field {name!r} is not a replay plan ({type(e).__name__}: {e})") from None
    if hint is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if not isinstance(raw, hint) or (hint is int and isinstance(raw, bool)):
        raise _wrong(key, name, raw, f"{'an' if hint is int else 'a'} {hint.__name__}")
    return raw


def _wrong(key: str, name: str, raw: Any, expected: str) -> ContractError:
    return ContractError(f"{key}: field {name!r} is {_shown(raw)}, not {expected}")


def _shown(raw: Any) -> str:
    text = repr(raw)
    return f"{type(raw).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


# -- replays/<channel> ----------------------------------------------------------------------------

DEFAULT_REPLAY_TIMEOUT_S = 300.0
"""A replay nobody finishes is torn down by the supervisor this long after it was asked: the
client's default `timeout_s`, and the supervisor's for a request it cannot read."""


@dataclass(frozen=True)
class Summary(_Value):
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
class ReplayRequest(_Value):
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
    summary: Summary | None = None
    """The target writes the result's buckets, not its rows."""

    def _check(self, key: str) -> None:
        if self.until_us <= self.since_us:
            raise ContractError(f"{key}: empty range [{self.since_us}, {self.until_us})")


def error_of(value: Any) -> str | None:
    """The error of replays/<channel>, read even when the rest of it does not follow the contract
    (the first error stays: see with_error)."""
    return (value.get("error") or None) if isinstance(value, dict) else None


def with_error(value: Any, message: str) -> dict:
    """replays/<channel> with `error` set, the rest kept: the one way a replayer or the supervisor
    fails a replay. A request too broken to read gets its error too, so that its client hears why."""
    try:
        return dataclasses.replace(ReplayRequest.from_value(value), error=message).to_value()
    except ContractError:
        return dict(value, error=message) if isinstance(value, dict) else {"request": value, "error": message}


# -- sites/<site>/workers/<prog>/<func>/replays/<channel> ---------------------------------------------

@dataclass(frozen=True)
class Rider(_Value):
    """An identical replay riding on another's channel: the target writes the same result to it."""

    KEY: ClassVar[str] = "also"
    channel: int
    recipient: str


@dataclass(frozen=True)
class WorkerReplay(_Value):
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

    def _check(self, key: str) -> None:
        if not self.pass_through and len(self.parents) != len(self.inputs):
            raise ContractError(f"{key}: {len(self.inputs)} inputs but {len(self.parents)} parents")
        if self.tags and len(self.tags) != len(self.inputs):
            raise ContractError(f"{key}: {len(self.inputs)} inputs but {len(self.tags)} tags")
        if self.via is not None and (self.inputs or self.pass_through or self.recipient):
            raise ContractError(f"{key}: a replay via channel {self.via} has no inputs, recipient or pass-through")


# -- sites/<site>/replayers/<id> ------------------------------------------------------------------

@dataclass(frozen=True)
class ChannelRange(_Value):
    """One replay channel a replayer serves and the event times [since_us, until_us) it wants."""

    KEY: ClassVar[str] = "channels"
    channel: int
    since_us: int
    until_us: int
    tag: int | None = None
    """The channel its rows are tagged with on the log, when another channel of the same range
    leads (the lowest): the rows of channels of one range are written once, for them all."""

    def _check(self, key: str) -> None:
        if self.until_us <= self.since_us:
            raise ContractError(f"{key}: channel {self.channel}: empty range [{self.since_us}, {self.until_us})")

    @property
    def tagged(self) -> int:
        return self.channel if self.tag is None else self.tag


@dataclass(frozen=True)
class ReplayerAssignment(_Value):
    """sites/<site>/replayers/<id>: what a replayer reads and for which channels."""

    KEY: ClassVar[str] = "sites/<site>/replayers/<id>"
    id: int
    source: str
    log: str
    archive_dir: str
    channels: tuple[ChannelRange, ...]
    readers: int = 1
    """How many workers subscribe to the log: the replay starts once they all have."""
    riders: tuple[int, ...] = ()
    """Replays that need this replayer without it writing their channels (identical ones riding on
    its channels, and those going on from their targets' output): a restarted supervisor takes them
    as launched too, and does not launch them a second time."""
    pid: int | None = None
    started_us: int | None = None
    """The process serving it, once spawned: what a restarted supervisor adopts."""

    def _check(self, key: str) -> None:
        if not self.channels:
            raise ContractError(f"{key}: no channels")

    @property
    def since_us(self) -> int:
        return min(c.since_us for c in self.channels)

    @property
    def until_us(self) -> int:
        return max(c.until_us for c in self.channels)


@dataclass(frozen=True)
class ReplayerStats(_Value):
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

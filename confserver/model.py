"""What the key tree holds and what a watch delivers, as plain values shared by every backend."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from confserver.errors import BadRequest

#: Largest value accepted, once serialised as JSON. ZooKeeper's own limit is just under 1 MiB.
MAX_VALUE_BYTES = 512 * 1024
#: Deepest nesting of lists and objects accepted in a value (levels; a scalar is 0). Far below
#: Python's recursion limit, so that no encoder or decoder a value passes through (the wire, the
#: journal, the snapshot, a ZooKeeper envelope) can overflow the stack on it.
MAX_VALUE_DEPTH = 100


@dataclass(frozen=True)
class Entry:
    """One key's value and its metadata.

    `version` is 0 when the key is created and grows by one with each write, as ZooKeeper's
    data version does; compare-and-set compares it. `owner` is the identity that last wrote the
    key; `ephemeral` says the key dies with the session that created it.
    """

    key: str
    value: Any
    version: int
    owner: str
    mtime: float
    ephemeral: bool = False

    def to_json(self) -> dict:
        return {"key": self.key, "value": self.value, "version": self.version, "owner": self.owner,
                "mtime": self.mtime, "ephemeral": self.ephemeral}

    @classmethod
    def from_json(cls, obj: dict) -> Entry:
        return cls(obj["key"], obj["value"], obj["version"], obj["owner"], obj["mtime"], obj.get("ephemeral", False))


class EventKind(str, enum.Enum):
    #: A key that matched when the watch started (or was re-established after a reconnect).
    EXISTING = "existing"
    #: Every EXISTING event has been delivered; what follows are changes.
    SYNCED = "synced"
    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"


@dataclass(frozen=True)
class Event:
    """One change seen by a watch. `entry` is the new state, or the last one for DELETED."""

    kind: EventKind
    key: str
    entry: Entry | None

    def to_json(self) -> dict:
        return {"kind": self.kind.value, "key": self.key,
                "entry": self.entry.to_json() if self.entry is not None else None}

    @classmethod
    def from_json(cls, obj: dict) -> Event:
        entry = obj.get("entry")
        return cls(EventKind(obj["kind"]), obj["key"], Entry.from_json(entry) if entry else None)


def encode_value(value: Any) -> bytes:
    """JSON bytes of a value, refusing what cannot round-trip, is too large or too deeply nested."""
    try:
        data = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except RecursionError:
        raise _too_deep() from None
    except (TypeError, ValueError) as e:
        raise BadRequest(f"value is not JSON-serialisable: {e}") from None
    if len(data) > MAX_VALUE_BYTES:
        raise BadRequest(f"value of {len(data)} bytes is larger than the {MAX_VALUE_BYTES}-byte limit")
    # Fewer opening brackets than the bound (in strings too) cannot nest deeper: most values are
    # decided by two counts in C, and only the rest are walked.
    if data.count(b"[") + data.count(b"{") > MAX_VALUE_DEPTH and nesting_depth(value) > MAX_VALUE_DEPTH:
        raise _too_deep()
    return data


def nesting_depth(value: Any) -> int:
    """How many lists and objects deep value goes (0 for a scalar), without recursion; stops
    counting once past MAX_VALUE_DEPTH."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > deepest:
            deepest = depth
            if deepest > MAX_VALUE_DEPTH:
                return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return deepest


def _too_deep() -> BadRequest:
    return BadRequest(f"value is nested deeper than the {MAX_VALUE_DEPTH}-level limit")

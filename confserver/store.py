"""The built-in server's state machine: keys, sessions and lock holders, changed only by records.

Every change is a record (a small dict) that the server writes to the journal before it
acknowledges it, then applies here; replaying the same records after a restart rebuilds the same
state, so this module does no I/O and reads no clock: the server puts the owner, time and session
into each record. Applying a record returns the watch events it caused, in commit order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confserver.keys import matches, prefix_of
from confserver.model import Entry, Event, EventKind

# Record types.
PUT, DELETE, OPEN, END, LOCK, UNLOCK = "put", "del", "open", "end", "lock", "unlock"


@dataclass
class Session:
    sid: int
    secret: str
    identity: str
    timeout_s: float
    ephemerals: set[str] = field(default_factory=set)

    def to_json(self) -> dict:
        return {"sid": self.sid, "secret": self.secret, "identity": self.identity, "timeout_s": self.timeout_s}


@dataclass
class LockHolder:
    sid: int
    count: int


class Store:
    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.ephemeral_sid: dict[str, int] = {}
        self.sessions: dict[int, Session] = {}
        self.locks: dict[str, LockHolder] = {}
        self.last_sid = 0
        # parent key ("" for the root) -> child name -> number of valued keys at or under it
        self._children: dict[str, dict[str, int]] = {}

    # -- reads ---------------------------------------------------------------------------------

    def get(self, key: str) -> Entry | None:
        return self.entries.get(key)

    def children(self, key: str) -> list[str]:
        return sorted(self._children.get(key, ()))

    def glob(self, pattern: str) -> list[Entry]:
        out = []
        for key in self._keys_under(prefix_of(pattern)):
            if matches(pattern, key):
                out.append(self.entries[key])
        out.sort(key=lambda e: e.key)
        return out

    def _keys_under(self, prefix: str):
        """Valued keys at or below prefix, found through the children index, not a full scan."""
        if prefix in self.entries:
            yield prefix
        stack = [prefix]
        while stack:
            node = stack.pop()
            for name in self._children.get(node, ()):
                child = f"{node}/{name}" if node else name
                if child in self.entries:
                    yield child
                stack.append(child)

    # -- records -------------------------------------------------------------------------------

    def apply(self, record: dict) -> list[Event]:
        kind = record["t"]
        if kind == PUT:
            return [self._put(record)]
        if kind == DELETE:
            return [event for key in record["keys"] if (event := self._delete(key)) is not None]
        if kind == OPEN:
            self.sessions[record["sid"]] = Session(record["sid"], record["secret"], record["identity"],
                                                   record["timeout_s"])
            self.last_sid = max(self.last_sid, record["sid"])
            return []
        if kind == END:
            return self._end(record["sid"])
        if kind == LOCK:
            holder = self.locks.get(record["key"])
            if holder is None:
                self.locks[record["key"]] = LockHolder(record["sid"], 1)
            else:
                holder.count += 1
            return []
        if kind == UNLOCK:
            holder = self.locks.get(record["key"])
            if holder is not None:
                holder.count -= 1
                if holder.count <= 0:
                    del self.locks[record["key"]]
            return []
        raise ValueError(f"unknown journal record type {kind!r}")

    def _put(self, record: dict) -> Event:
        key = record["key"]
        old = self.entries.get(key)
        if old is None:
            sid = record.get("eph")
            entry = Entry(key, record["value"], 0, record["owner"], record["mtime"], sid is not None)
            if sid is not None:
                self.ephemeral_sid[key] = sid
                self.sessions[sid].ephemerals.add(key)
            self._index(key, +1)
            kind = EventKind.CREATED
        else:
            entry = Entry(key, record["value"], old.version + 1, record["owner"], record["mtime"], old.ephemeral)
            kind = EventKind.UPDATED
        self.entries[key] = entry
        return Event(kind, key, entry)

    def _delete(self, key: str) -> Event | None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return None
        sid = self.ephemeral_sid.pop(key, None)
        if sid is not None and sid in self.sessions:
            self.sessions[sid].ephemerals.discard(key)
        self._index(key, -1)
        return Event(EventKind.DELETED, key, entry)

    def _end(self, sid: int) -> list[Event]:
        session = self.sessions.pop(sid, None)
        if session is None:
            return []
        events = [event for key in sorted(session.ephemerals) if (event := self._delete(key)) is not None]
        for key in [k for k, holder in self.locks.items() if holder.sid == sid]:
            del self.locks[key]
        return events

    def _index(self, key: str, delta: int) -> None:
        """Count key in every ancestor's child map, so children() and glob() need no scan."""
        node = ""
        for segment in key.split("/"):
            names = self._children.setdefault(node, {})
            count = names.get(segment, 0) + delta
            if count > 0:
                names[segment] = count
            else:
                names.pop(segment, None)
                if not names:
                    del self._children[node]
            node = f"{node}/{segment}" if node else segment

    # -- snapshots -----------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {
            "entries": [dict(e.to_json(), eph=self.ephemeral_sid.get(e.key)) for e in self.entries.values()],
            "sessions": [s.to_json() for s in self.sessions.values()],
            "locks": [{"key": k, "sid": h.sid, "count": h.count} for k, h in self.locks.items()],
            "last_sid": self.last_sid,
        }

    @classmethod
    def from_json(cls, obj: dict) -> Store:
        store = cls()
        store.last_sid = obj["last_sid"]
        for s in obj["sessions"]:
            store.sessions[s["sid"]] = Session(s["sid"], s["secret"], s["identity"], s["timeout_s"])
        for e in obj["entries"]:
            entry = Entry.from_json(e)
            store.entries[entry.key] = entry
            store._index(entry.key, +1)
            if e.get("eph") is not None and e["eph"] in store.sessions:
                store.ephemeral_sid[entry.key] = e["eph"]
                store.sessions[e["eph"]].ephemerals.add(entry.key)
        for lock in obj["locks"]:
            store.locks[lock["key"]] = LockHolder(lock["sid"], lock["count"])
        return store

"""The one client interface every backend implements, and the watch and lock handles it returns.

Every call is synchronous and thread-safe: services are agents that call it from their duty cycle
or from a helper thread. Watches push their events into a queue owned by the Watch handle, so a
caller drains them when it likes (`drain()` never blocks, which suits `do_work`), or blocks on
`next()`, or gives a callback that runs on the backend's event thread.
"""

from __future__ import annotations

import abc
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from confserver.errors import NoSuchKey
from confserver.model import Entry, Event
from ramen.wait_queue import wait_queue

log = logging.getLogger(__name__)

#: How long a lock waits when the caller gives no timeout.
DEFAULT_LOCK_TIMEOUT_S = 10.0


class Watch:
    """Events for the keys matching one pattern: first EXISTING ones and SYNCED, then changes in
    commit order. After a reconnect the backend re-establishes the watch and delivers what changed
    meanwhile as CREATED/UPDATED/DELETED events, so a follower never needs to re-read the tree."""

    def __init__(self, pattern: str, callback: Callable[[Event], None] | None = None,
                 on_close: Callable[[Watch], None] | None = None):
        self.pattern = pattern
        self._callback = callback
        self._on_close = on_close
        self._events: queue.Queue[Event | None] = wait_queue()
        self.closed = False

    def deliver(self, event: Event) -> None:
        """Called by the backend, in commit order."""
        if self.closed:
            return
        if self._callback is not None:
            self._callback(event)
        else:
            self._events.put(event)

    def next(self, timeout_s: float | None = None) -> Event | None:
        """The next event, waiting up to timeout_s; None on timeout or once closed."""
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def drain(self) -> list[Event]:
        """Every event already received, without waiting.

        A duty cycle drains its watches on every turn, nearly always empty: looking at the queue's
        length first (atomic under the GIL; an event appended meanwhile waits one turn) costs 0.1 us
        where the get_nowait below, its lock and its Empty raised, cost 1.8 us a watch."""
        if not self._events.queue:
            return []
        out = []
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return out
            if event is not None:
                out.append(event)

    def __iter__(self) -> Iterator[Event]:
        while not self.closed:
            event = self._events.get()
            if event is None:
                return
            yield event

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._events.put(None)
        if self._on_close is not None:
            self._on_close(self)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Dispatcher:
    """Delivers watch events on a thread of its own, in the order given, so that a callback may call
    the client (a blocking call from the backend's reader thread would wait for itself)."""

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def put(self, watch: Watch, event: Event) -> None:
        self._queue.put((watch, event))

    def close(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            watch, event = item
            try:
                watch.deliver(event)
            except Exception:
                log.exception("watch callback for %s failed", watch.pattern)


class Lock:
    """A held lock on one key (or, from lock_all, on several). Release it, or leave the `with`."""

    def __init__(self, release: Callable[[], None], keys: tuple[str, ...]):
        self._release = release
        self.keys = keys
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self._release()

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class ConfClient(abc.ABC):
    """A session with a confserver, holding the caller's identity.

    Keys form a tree (`a/b/c`); a key may hold a value and have children at the same time, and
    the keys above a key need not hold values. Values are JSON-serialisable.
    """

    #: The identity the server authenticated (from the token), "anonymous" without one.
    identity: str

    # -- reads ---------------------------------------------------------------------------------

    @abc.abstractmethod
    def get(self, key: str) -> Entry:
        """The entry at key; NoSuchKey if it holds no value."""

    def get_or_none(self, key: str) -> Entry | None:
        try:
            return self.get(key)
        except NoSuchKey:
            return None

    @abc.abstractmethod
    def children(self, key: str) -> list[str]:
        """Names (last segments) of the keys directly below key, sorted; [] if none."""

    @abc.abstractmethod
    def glob(self, pattern: str) -> list[Entry]:
        """Entries of every key matching the pattern (see confserver.keys), sorted by key."""

    # -- writes --------------------------------------------------------------------------------

    @abc.abstractmethod
    def create(self, key: str, value: Any, *, ephemeral: bool = False) -> Entry:
        """Write a new key; KeyExists if it already holds a value."""

    @abc.abstractmethod
    def set(self, key: str, value: Any, *, ephemeral: bool = False) -> Entry:
        """Write key whether or not it exists (upsert). `ephemeral` applies when it is created."""

    @abc.abstractmethod
    def update(self, key: str, value: Any, *, version: int | None = None) -> Entry:
        """Overwrite an existing key; NoSuchKey if absent. With `version`, this is compare-and-set:
        VersionMismatch unless the key's version is still that one."""

    @abc.abstractmethod
    def delete(self, key: str, *, version: int | None = None) -> None:
        """Remove key's value; NoSuchKey if absent, VersionMismatch as for update."""

    def discard(self, key: str) -> bool:
        """Delete key if it holds a value; whether it did. For clean-ups that someone else (a
        client, a supervisor, a session's end) may have done first."""
        try:
            self.delete(key)
            return True
        except NoSuchKey:
            return False

    @abc.abstractmethod
    def delete_tree(self, key: str) -> int:
        """Remove key and every key below it; returns how many values were removed."""

    @abc.abstractmethod
    def next_sequence(self, key: str) -> int:
        """Atomically increment the counter at key and return the new value: 1, 2, 3, ...

        Values never repeat, across clients and server restarts, and 0 is never handed out,
        so 0 can mean "none" (the live channel)."""

    # -- watches and locks ---------------------------------------------------------------------

    @abc.abstractmethod
    def watch(self, pattern: str, callback: Callable[[Event], None] | None = None) -> Watch:
        """Follow the keys matching pattern (a prefix, or a glob). See Watch."""

    @abc.abstractmethod
    def _acquire(self, key: str, timeout_s: float) -> None:
        """Take the lock on key for this session, waiting in line up to timeout_s (LockTimeout).
        Taking it again from the same session nests; each take needs one release."""

    @abc.abstractmethod
    def _release(self, key: str) -> None:
        """Undo one _acquire of key by this session."""

    def lock(self, key: str, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Lock:
        """Lock key (a name in the lock space, which need not hold a value) for this session.

        The lock is released by Lock.release(), or by the server when the session ends."""
        self._acquire(key, timeout_s)
        return Lock(lambda: self._release(key), (key,))

    def lock_all(self, keys: Iterable[str], timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Lock:
        """Lock several keys, always in sorted order so two callers cannot deadlock; all or none."""
        ordered = tuple(sorted(set(keys)))
        taken: list[str] = []
        try:
            for key in ordered:
                self._acquire(key, timeout_s)
                taken.append(key)
        except BaseException:
            for key in reversed(taken):
                self._release(key)
            raise
        return Lock(lambda: [self._release(k) for k in reversed(ordered)], ordered)

    # -- session -------------------------------------------------------------------------------

    @abc.abstractmethod
    def close(self) -> None:
        """End the session: its ephemeral keys are deleted and its locks released."""

    def __enter__(self) -> ConfClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


"""The confserver on Apache ZooKeeper, through kazoo, for deployments that outgrow one machine.

Each key is a znode under the URL's root (`zk://h:2181/ramen` keeps `a/b` at `/ramen/a/b`), holding
a JSON envelope `{"owner": identity, "value": value}`; a znode with empty data is a key above
others that holds no value. Versions, modification times and ephemerality are ZooKeeper's own.
Locks live in a sibling tree, `/ramen~locks/<key>` (`~` cannot occur in a key, so no key can
collide with it and the lock churn stays out of every watch). kazoo's recipes do the hard parts:
TreeCache for watches, Lock for locks, Counter for sequences. docs/confserver-zookeeper.md says
where this backend's semantics differ from the built-in server's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.exceptions import LockTimeout as KazooLockTimeout
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState, ZnodeStat
from kazoo.recipe.cache import TreeCache, TreeEvent
from kazoo.retry import KazooRetry, RetryFailedError

from confserver import auth
from confserver.client import ConfClient, Dispatcher, Watch
from confserver.errors import (
    BadRequest,
    Disconnected,
    KeyExists,
    LockTimeout,
    NoSuchKey,
    PermissionDenied,
    SessionExpired,
    VersionMismatch,
)
from confserver.keys import (
    check_key,
    check_pattern,
    is_pattern,
    matches,
    parent,
    prefix_of,
)
from confserver.model import Entry, Event, EventKind, encode_value
from confserver.url import ConfServerURL
from confserver.zk_acl import LOCK_ACL, OPEN_ACL, AclMaker

log = logging.getLogger(__name__)

LOCKS_SUFFIX = "~locks"
#: With no root in the URL, keys share `/` with ZooKeeper's own `/zookeeper` tree: hide it.
ZOOKEEPER_SYSTEM_NODE = "zookeeper"
#: Reconnect attempts back off to at most this, so a restarted server is found again quickly.
RECONNECT_MAX_DELAY_S = 1.0
#: Counter's compare-and-set retries under contention: short, jittered, growing waits.
COUNTER_RETRY_DELAY_S = 0.005
COUNTER_RETRY_MAX_DELAY_S = 0.2
#: A write racing with others (create on an intermediate node, pruning) retries this many times.
MAX_RACE_RETRIES = 50


def _segment_ok(name: str) -> bool:
    try:
        check_key(name)
    except BadRequest:
        return False
    return "/" not in name


def _envelope(value: Any, owner: str) -> bytes:
    """The znode data for a value: its JSON inside a small object that also names the writer."""
    return b'{"owner":%s,"value":%s}' % (json.dumps(owner).encode(), encode_value(value))


def _unwrap(data: bytes) -> tuple[Any, str]:
    """(value, owner) of non-empty znode data. A Counter's bare number, or data written by something
    else than this backend, is a value with no known owner."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than this stack allows
        return data.decode(errors="replace"), ""
    if isinstance(obj, dict) and obj.keys() == {"owner", "value"}:
        return obj["value"], obj["owner"]
    return obj, ""


def _entry(key: str, data: bytes, stat: ZnodeStat) -> Entry | None:
    """The entry a znode holds, or None for one that only has children."""
    if not data:
        return None
    value, owner = _unwrap(data)
    return Entry(key, value, stat.version, owner, stat.mtime / 1000.0, stat.ephemeralOwner != 0)


def _load_auth(auth_file: str | os.PathLike | None) -> tuple[auth.AuthConfig | None, str | None]:
    """The auth file's rules, or None and why not: said once connected (a client that cannot
    connect says that alone, in one line)."""
    from confserver import default_auth_file
    path = Path(auth_file) if auth_file else default_auth_file()
    if not path.exists():
        return None, f"no auth file at {path}: ZooKeeper nodes get open ACLs and no rule is checked"
    try:
        return auth.load(path), None
    except PermissionError:
        return None, f"auth file {path} is unreadable: ZooKeeper nodes get open ACLs"


def _identify(config: auth.AuthConfig | None, identity: str | None, token: str | None) -> str:
    """Who this client is: the token decides where the auth file knows it (as on the built-in
    server), else the identity given, which ZooKeeper's digest auth then proves with the token."""
    if not token:
        return auth.ANONYMOUS
    if config is not None:
        return config.identify(token)
    if not identity:
        raise BadRequest("zk: a token without an auth file needs its identity (identity=...)")
    return identity


class _WatchFeed:
    """Turns one TreeCache's events into a Watch's: EXISTING (sorted by key) and SYNCED once the
    cache is initialised, then CREATED/UPDATED/DELETED as the cache learns of changes. Runs on the
    cache's own event thread, one event at a time, so it needs no lock; the client's dispatcher
    thread delivers them, so a callback may call the client."""

    def __init__(self, client: ZkClient, watch: Watch):
        self._client = client
        self._watch = watch
        self._known: dict[str, Entry] = {}
        self._synced = False
        self.synced = threading.Event()
        """Set once the initial keys are known: watch() returns then, as the built-in client's
        does, so that a change made after it returns is delivered as a change, not as EXISTING."""

    def _deliver(self, event: Event) -> None:
        self._client._dispatcher.put(self._watch, event)

    def __call__(self, event: TreeEvent) -> None:
        kind = event.event_type
        if kind == TreeEvent.INITIALIZED:
            if not self._synced:  # it comes again after a lost session is replaced; deliver once
                for key in sorted(self._known):
                    self._deliver(Event(EventKind.EXISTING, key, self._known[key]))
                self._deliver(Event(EventKind.SYNCED, "", None))
                self._synced = True
                self.synced.set()
            return
        if kind not in (TreeEvent.NODE_ADDED, TreeEvent.NODE_UPDATED, TreeEvent.NODE_REMOVED):
            return
        node = event.event_data
        key = self._client._key_of(node.path)
        if key is None or not matches(self._watch.pattern, key):
            return
        entry = None if kind == TreeEvent.NODE_REMOVED else _entry(key, node.data, node.stat)
        old = self._known.pop(key, None)
        if entry is not None:
            self._known[key] = entry
        if not self._synced:
            return
        if entry is None:
            if old is not None:
                self._deliver(Event(EventKind.DELETED, key, old))
        elif old is None:
            self._deliver(Event(EventKind.CREATED, key, entry))
        else:
            self._deliver(Event(EventKind.UPDATED, key, entry))


class _HeldLock:
    def __init__(self, lock):
        self.lock = lock
        self.count = 1


class ZkClient(ConfClient):
    """A ZooKeeper session speaking the confserver's client interface (see ConfClient)."""

    def __init__(self, url: ConfServerURL, *, identity: str | None = None, token: str | None = None,
                 auth_file: str | os.PathLike | None = None, session_timeout_s: float = 10.0,
                 connect_timeout_s: float = 5.0):
        self._url = url
        self._base = "/" + url.root if url.root else ""
        self._lock_base = (self._base or "/") + LOCKS_SUFFIX
        config, without_rules = _load_auth(auth_file)
        self._rules = config
        self._acls = AclMaker(config) if config is not None else None
        self.identity = _identify(config, identity, token)
        #: How long one call waits for an answer, including while kazoo reconnects; after this
        #: long without the server, the session is likely gone anyway.
        self._request_timeout_s = session_timeout_s
        self._expired = False
        self._closed = False
        self._watches: set[Watch] = set()
        self._watch_caches: dict[Watch, TreeCache] = {}
        self._dispatcher = Dispatcher("zk-watch-dispatch")
        self._held: dict[str, _HeldLock] = {}
        self._taking: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._zk = KazooClient(
            hosts=url.hosts_string(), timeout=session_timeout_s,
            auth_data=[("digest", f"{self.identity}:{token}")] if token else None,
            default_acl=LOCK_ACL,  # used by the recipes' own ensure_path: only the lock tree
            connection_retry=KazooRetry(max_tries=-1, max_delay=RECONNECT_MAX_DELAY_S),
            command_retry=KazooRetry(max_tries=-1, delay=COUNTER_RETRY_DELAY_S,
                                     max_delay=COUNTER_RETRY_MAX_DELAY_S,
                                     deadline=session_timeout_s, ignore_expire=False))
        self._zk.add_listener(self._on_state)
        try:
            self._zk.start(timeout=connect_timeout_s)
        except KazooTimeoutError:
            self._zk.close()
            raise Disconnected(f"zookeeper at {url.hosts_string()} did not answer within "
                               f"{connect_timeout_s:g} s") from None
        try:
            with self._errors("create", "the root"):
                self._ensure("")
        except BaseException:
            self.close()
            raise
        if without_rules is not None:
            log.warning("%s", without_rules)
        log.debug("connected to %s as %s", url, self.identity)

    # -- plumbing --------------------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        """kazoo's connection listener (its own thread: must not block)."""
        if self._closed:
            return
        if state == KazooState.LOST:
            self._expired = True
            log.warning("zookeeper session of %s expired", self.identity)
        elif state == KazooState.SUSPENDED:
            log.info("connection to zookeeper %s lost; reconnecting", self._url.hosts_string())

    def _path(self, key: str) -> str:
        return f"{self._base}/{key}" if key else (self._base or "/")

    def _key_of(self, path: str) -> str | None:
        """The key a znode path stands for, None for a znode that cannot be a key."""
        key = path[len(self._base) + 1:] if path.startswith(self._base + "/") else None
        if not key or not all(_segment_ok(s) for s in key.split("/")):
            return None
        if not self._base and key.split("/", 1)[0] == ZOOKEEPER_SYSTEM_NODE:
            return None
        return key

    def _acl(self, key: str):
        return self._acls.acl(key) if self._acls is not None else OPEN_ACL

    def _check(self, operation: str, key: str) -> None:
        """Refuse early, with the same rules as the server, what ZooKeeper's ACLs cannot express
        (see confserver.zk_acl); ZooKeeper still checks everything its ACLs can."""
        if self._rules is not None:
            self._rules.check(self.identity, operation, key)

    def _wait(self, async_result):
        return async_result.get(timeout=self._request_timeout_s)

    @contextlib.contextmanager
    def _errors(self, operation: str, key: str) -> Iterator[None]:
        """Raise the confserver's error for whatever kazoo raised, naming the key."""
        if self._closed:
            raise SessionExpired(f"zk: {operation} {key}: this client is closed")
        if self._expired:
            raise SessionExpired(f"zk: {operation} {key}: the session expired; open a new client")
        hosts = self._url.hosts_string()
        try:
            yield
        except NoNodeError:
            raise NoSuchKey(f"no such key: {key}") from None
        except NodeExistsError:
            raise KeyExists(f"key exists: {key}") from None
        except BadVersionError:
            raise VersionMismatch(f"version mismatch on {key}") from None
        except NoAuthError:
            raise PermissionDenied(f"{auth.refusal(self.identity, operation, key)} (refused by ZooKeeper)") from None
        except NoChildrenForEphemeralsError:
            raise BadRequest(f"{operation} {key}: a key above it is ephemeral, and ZooKeeper "
                             "allows no children under ephemeral nodes") from None
        except (SessionExpiredError, ConnectionClosedError):
            self._expired = True
            raise SessionExpired(f"zk: {operation} {key}: the session expired; open a new "
                                 "client") from None
        except (ConnectionLoss, OperationTimeoutError, KazooTimeoutError, RetryFailedError):
            raise Disconnected(f"zookeeper at {hosts}: no answer to {operation} {key} "
                               "(it may or may not have been applied)") from None
        except KazooException as e:
            raise Disconnected(f"zookeeper at {hosts}: {operation} {key}: {e!r}") from None

    def _read(self, key: str) -> tuple[bytes, ZnodeStat] | None:
        try:
            return self._wait(self._zk.get_async(self._path(key)))
        except NoNodeError:
            return None

    def _ensure(self, key: str) -> None:
        """Make key's znode exist (valueless if new), and those above it, each with its own ACL."""
        for _ in range(MAX_RACE_RETRIES):
            try:
                self._wait(self._zk.create_async(self._path(key), b"", acl=self._acl(key)))
                return
            except NodeExistsError:
                return
            except NoNodeError:
                if key:
                    self._ensure(parent(key))
                else:
                    self._zk.ensure_path(self._base, acl=self._acl(""))
        raise Disconnected(f"zk: could not create the znodes above {key}: they keep being removed")

    def _create_node(self, key: str, data: bytes, ephemeral: bool) -> ZnodeStat:
        for _ in range(MAX_RACE_RETRIES):
            try:
                _, stat = self._wait(self._zk.create_async(
                    self._path(key), data, acl=self._acl(key), ephemeral=ephemeral,
                    include_data=True))
                return stat
            except NoNodeError:
                self._ensure(parent(key))
        raise Disconnected(f"zk: could not create {key}: the znodes above keep being removed")

    def _drop_placeholder(self, key: str, stat: ZnodeStat) -> bool:
        """Remove key's valueless znode if it has no children either: a watch started on the key
        before it existed made it (TreeCache needs its root), and it holds nothing, but ZooKeeper
        cannot turn it ephemeral. False if it stays (it has children, or this identity may not
        delete it); True if it went, or changed meanwhile (look again). The watch follows the key's
        new znode. Without children it is no key above others, so nothing is lost."""
        if stat.numChildren:
            return False
        try:
            self._wait(self._zk.delete_async(self._path(key), version=stat.version))
        except (NoNodeError, BadVersionError, NotEmptyError):
            pass
        except NoAuthError:
            return False
        return True

    def _prune(self, key: str) -> None:
        """Remove valueless, childless znodes from key upwards, so a deleted subtree leaves no
        empty keys behind in children(). Best effort: stops at the first that is still needed."""
        while key:
            got = self._read(key)
            if got is None:
                key = parent(key)
                continue
            data, stat = got
            if data or stat.numChildren:
                return
            try:
                self._wait(self._zk.delete_async(self._path(key), version=stat.version))
            except (BadVersionError, NotEmptyError, NoAuthError, NoNodeError):
                return
            key = parent(key)

    # -- reads -----------------------------------------------------------------------------------

    def get(self, key: str) -> Entry:
        check_key(key)
        self._check(auth.READ, key)
        with self._errors(auth.READ, key):
            got = self._read(key)
        entry = _entry(key, *got) if got is not None else None
        if entry is None:
            raise NoSuchKey(f"no such key: {key}")
        return entry

    def children(self, key: str) -> list[str]:
        check_key(key)
        self._check(auth.READ, key)
        with self._errors(auth.READ, key):
            try:
                names = self._wait(self._zk.get_children_async(self._path(key)))
            except NoNodeError:
                return []
        return sorted(n for n in names if _segment_ok(n))

    def glob(self, pattern: str) -> list[Entry]:
        """Walks the tree from the pattern's fixed prefix, one level at a time with all reads of
        a level in flight together, and no deeper than a pattern without `**` can reach."""
        check_pattern(pattern)
        start = prefix_of(pattern)
        if start:
            check_key(start)
        depth_limit = pattern.count("/") + 1 if is_pattern(pattern) and "**" not in pattern else None
        found: list[Entry] = []
        level = [start]
        with self._errors(auth.READ, pattern):
            while level:
                pending = [(key, self._zk.get_async(self._path(key)),
                            self._zk.get_children_async(self._path(key))) for key in level]
                level = []
                for key, data_result, children_result in pending:
                    try:
                        data, stat = self._wait(data_result)
                        names = self._wait(children_result)
                    except (NoNodeError, NoAuthError):
                        continue  # deleted meanwhile, or not readable by this identity
                    if key and matches(pattern, key) and self._key_of(self._path(key)):
                        entry = _entry(key, data, stat)
                        if entry is not None:
                            found.append(entry)
                    if depth_limit is None or key.count("/") + 1 < depth_limit or not key:
                        level.extend(f"{key}/{n}" if key else n for n in names if _segment_ok(n))
        return sorted(found, key=lambda e: e.key)

    # -- writes ----------------------------------------------------------------------------------

    def create(self, key: str, value: Any, *, ephemeral: bool = False) -> Entry:
        check_key(key)
        self._check(auth.WRITE, key)
        data = _envelope(value, self.identity)
        with self._errors(auth.WRITE, key):
            for _ in range(MAX_RACE_RETRIES):
                try:
                    return _entry(key, data, self._create_node(key, data, ephemeral))
                except NodeExistsError:
                    pass
                got = self._read(key)
                if got is None:
                    continue  # deleted in between: create it afresh
                old, stat = got
                if old:
                    raise KeyExists(f"key exists: {key}")
                if ephemeral and self._drop_placeholder(key, stat):
                    continue
                if ephemeral:
                    raise BadRequest(f"create {key}: it exists as a key above others, and "
                                     "ZooKeeper cannot make an existing node ephemeral")
                try:  # a key above others gets its value, unless someone else gave it one first
                    stat = self._wait(self._zk.set_async(self._path(key), data, stat.version))
                    return _entry(key, data, stat)
                except BadVersionError:
                    continue
        raise Disconnected(f"zk: create {key}: lost the race {MAX_RACE_RETRIES} times")

    def set(self, key: str, value: Any, *, ephemeral: bool = False) -> Entry:
        check_key(key)
        self._check(auth.WRITE, key)
        data = _envelope(value, self.identity)
        with self._errors(auth.WRITE, key):
            for _ in range(MAX_RACE_RETRIES):
                if ephemeral and (got := self._read(key)) is not None and not got[0]:
                    self._drop_placeholder(key, got[1])  # else setting it would make it persistent
                try:
                    return _entry(key, data, self._wait(self._zk.set_async(self._path(key), data)))
                except NoNodeError:
                    pass
                try:
                    return _entry(key, data, self._create_node(key, data, ephemeral))
                except NodeExistsError:
                    continue
        raise Disconnected(f"zk: set {key}: lost the race {MAX_RACE_RETRIES} times")

    def update(self, key: str, value: Any, *, version: int | None = None) -> Entry:
        check_key(key)
        self._check(auth.WRITE, key)
        data = _envelope(value, self.identity)
        with self._errors(auth.WRITE, key):
            while True:  # ends: a mismatch is final with `version`, and without it each loss is progress
                stat = self._stat_of_value(key, version)
                try:
                    stat = self._wait(self._zk.set_async(self._path(key), data, stat.version))
                    return _entry(key, data, stat)
                except BadVersionError:
                    if version is not None:
                        raise VersionMismatch(f"version mismatch on {key}: it is no longer "
                                              f"{version}") from None

    def _stat_of_value(self, key: str, version: int | None) -> ZnodeStat:
        """The stat of key's znode, which must hold a value (of `version`, if given)."""
        got = self._read(key)
        if got is None or not got[0]:
            raise NoSuchKey(f"no such key: {key}")
        stat = got[1]
        if version is not None and stat.version != version:
            raise VersionMismatch(f"version mismatch on {key}: it is {stat.version}, not {version}")
        return stat

    def delete(self, key: str, *, version: int | None = None) -> None:
        """A key with children keeps its znode (so its children stay) and loses only its value."""
        check_key(key)
        self._check(auth.DELETE, key)
        with self._errors(auth.DELETE, key):
            while True:
                stat = self._stat_of_value(key, version)
                try:
                    if stat.numChildren:
                        self._wait(self._zk.set_async(self._path(key), b"", stat.version))
                    else:
                        self._wait(self._zk.delete_async(self._path(key), stat.version))
                        self._prune(parent(key))
                    return
                except BadVersionError:
                    if version is not None:
                        raise VersionMismatch(f"version mismatch on {key}: it is no longer "
                                              f"{version}") from None
                except NotEmptyError:
                    continue  # a child appeared: clear the value instead

    def delete_tree(self, key: str) -> int:
        check_key(key)
        self._check(auth.DELETE, key)
        with self._errors(auth.DELETE, key):
            removed = self._remove_subtree(key)
            self._prune(parent(key))
        return removed

    def _remove_subtree(self, key: str) -> int:
        path = self._path(key)
        for _ in range(MAX_RACE_RETRIES):
            try:
                data, _ = self._wait(self._zk.get_async(path))
                names = self._wait(self._zk.get_children_async(path))
            except NoNodeError:
                return 0
            removed = sum(self._remove_subtree(f"{key}/{n}") for n in names)
            try:
                self._wait(self._zk.delete_async(path))
            except NoNodeError:
                return removed  # someone else removed it, and its value
            except NotEmptyError:
                continue  # a child was created meanwhile: go round again
            return removed + (1 if data else 0)
        raise Disconnected(f"zk: delete_tree {key}: keys keep appearing under it")

    def next_sequence(self, key: str) -> int:
        """kazoo's Counter (compare-and-set retried on contention) on the key's znode, which
        holds the last number handed out as a bare integer: get() reads it as the value."""
        check_key(key)
        self._check(auth.WRITE, key)
        with self._errors(auth.WRITE, key):
            self._ensure(key)
            counter = self._zk.Counter(self._path(key))
            try:
                counter += 1
            except ValueError:
                raise BadRequest(f"next_sequence {key}: it holds a value that is not a "
                                 "sequence") from None
            return counter.post_value

    # -- watches and locks -------------------------------------------------------------------------

    def watch(self, pattern: str, callback: Callable[[Event], None] | None = None) -> Watch:
        check_pattern(pattern)
        start = prefix_of(pattern)
        if start:
            check_key(start)
            self._check(auth.READ, start)
        with self._errors(auth.READ, pattern):
            start = self._watch_root(start)
        watch = Watch(pattern, callback, on_close=self._forget_watch)
        cache = TreeCache(self._zk, self._path(start))
        feed = _WatchFeed(self, watch)
        cache.listen(feed)
        cache.listen_fault(lambda e: log.warning("watch %s: %r", pattern, e))
        self._watches.add(watch)
        self._watch_caches[watch] = cache
        with self._errors(auth.READ, pattern):
            cache.start()
        if not feed.synced.wait(self._request_timeout_s):
            watch.close()
            raise Disconnected(f"zk: watch {pattern}: the initial keys did not come within "
                               f"{self._request_timeout_s:g} s")
        return watch

    def _watch_root(self, start: str) -> str:
        """Where the TreeCache starts. It insists on an existing root (kazoo would create it with
        the default ACL), so create the prefix's znode with its proper ACL, or where this identity
        may not, start from the nearest one that exists and filter."""
        try:
            self._ensure(start)
            return start
        except NoAuthError:
            while start and self._wait(self._zk.exists_async(self._path(start))) is None:
                start = parent(start)
            return start

    def _forget_watch(self, watch: Watch) -> None:
        self._watches.discard(watch)
        cache = self._watch_caches.pop(watch, None)
        if cache is not None:
            cache.close()

    def _acquire(self, key: str, timeout_s: float) -> None:
        """kazoo's Lock, one per key and session, with our own nesting count around it. Threads
        of one session share its locks (the session is the owner), so a second taker only waits
        for the first's kazoo acquire to finish."""
        check_key(key)
        with self._errors("lock", key):  # a lost session's locks are gone: refuse to nest on them
            pass
        with self._locks_guard:
            held = self._held.get(key)
            if held is not None:
                held.count += 1
                return
            taking = self._taking.setdefault(key, threading.Lock())
        if not taking.acquire(timeout=max(timeout_s, 0)):
            raise LockTimeout(f"lock {key}: not taken within {timeout_s:g} s")
        try:
            with self._locks_guard:
                held = self._held.get(key)
                if held is not None:
                    held.count += 1
                    return
            lock = self._zk.Lock(f"{self._lock_base}/{key}", identifier=self.identity)
            with self._errors("lock", key):
                try:
                    if not lock.acquire(timeout=timeout_s):
                        raise KazooLockTimeout()
                except KazooLockTimeout:
                    raise LockTimeout(f"lock {key}: held by {self._lock_holder(lock)}, not "
                                      f"released within {timeout_s:g} s") from None
            with self._locks_guard:
                self._held[key] = _HeldLock(lock)
        finally:
            taking.release()

    @staticmethod
    def _lock_holder(lock) -> str:
        try:
            contenders = lock.contenders()
        except KazooException:
            return "another session"
        return contenders[0] if contenders else "another session"

    def _release(self, key: str) -> None:
        with self._locks_guard:
            held = self._held.get(key)
            if held is None:
                return
            held.count -= 1
            if held.count:
                return
            del self._held[key]
        if self._closed or self._expired:
            return  # the session's end released it already
        with self._errors("unlock", key):
            held.lock.release()

    # -- session ---------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        for watch in list(self._watches):
            watch.close()
        self._dispatcher.close()
        self._closed = True
        try:
            self._zk.stop()
            self._zk.close()
        except KazooException as e:
            log.debug("closing the zookeeper session: %r", e)

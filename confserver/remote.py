"""The client of the built-in server (`ramen://`).

One I/O thread owns the socket's reading side: it connects, says hello, re-establishes watches
after a reconnect, and completes calls as their replies arrive. Callers send from their own thread
and wait on their call. Watch events go through a dispatcher thread, so a watch callback may itself
call the client without deadlocking the reader.

A dropped connection fails the calls in flight with Disconnected (they may or may not have been
applied); the I/O thread reconnects with backoff, however long the server is away, and resumes
the session, so ephemeral keys and locks survive a server restart. If the server says the session
has expired meanwhile, every later call raises SessionExpired and the watches end. A reply too long
for one frame comes in parts (see wire), which the I/O thread puts together.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from confserver import wire
from confserver.client import ConfClient, Dispatcher, Watch
from confserver.errors import (BadRequest, ConfError, Disconnected, PermissionDenied, SessionExpired,
                               error_from_code)
from confserver.keys import check_key, check_pattern
from confserver.model import Entry, Event, EventKind, encode_value
from confserver.url import ConfServerURL

log = logging.getLogger(__name__)

#: A reply that takes longer than this (plus any lock wait) means the server is gone.
REQUEST_TIMEOUT_S = 30.0
#: A call made while the client reconnects waits this long for the connection (or the connect
#: timeout, if longer): about the longest `ramen start` takes to restart a confserver that died or
#: got stuck (a backoff of up to 10 s, a stuck bound of 15 s, its start). A worker's call during a
#: confserver restart so waits instead of failing it, and its replays with it.
RECONNECT_WAIT_S = 30.0
#: A client closing while it reconnects waits this long, not RECONNECT_WAIT_S, to end its session
#: itself: enough for `ramen start` to restart a confserver that just died (its first backoffs and
#: start), and well within the 10 s a stopping service gets before it is killed. A server gone
#: for longer ends the session at its timeout; a stop must not hang on it.
CLOSE_RECONNECT_WAIT_S = 5.0
RECONNECT_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
#: However close the connect deadline, the server gets this long to answer the hello.
MIN_HELLO_WAIT_S = 0.1
#: Heartbeats per session timeout, so one lost beat never expires a live session.
HEARTBEATS_PER_TIMEOUT = 4


class _Call:
    __slots__ = ("done", "result", "error", "on_reply", "parts")

    def __init__(self, on_reply: Callable[[Any], Any] | None = None):
        self.done = threading.Event()
        self.result: Any = None
        self.error: ConfError | None = None
        self.on_reply = on_reply
        self.parts: list = []  # the items of a reply in several frames, before its last


class _WatchState:
    """A watch and the entries it has reported, so a re-watch can report only what changed."""

    def __init__(self, wid: int, watch: Watch):
        self.wid = wid
        self.watch = watch
        self.known: dict[str, Entry] = {}


class RemoteClient(ConfClient):
    def __init__(self, url: ConfServerURL, *, token: str | None, session_timeout_s: float,
                 connect_timeout_s: float):
        self.url = url
        self._token = token
        self._session_timeout_s = session_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._watches: dict[int, _WatchState] = {}
        self._lock = threading.Lock()  # guards _calls, _watches and sending
        self._sock: socket.socket | None = None
        self._connected = threading.Event()
        self._closed = False
        self._expired: SessionExpired | None = None
        self._dispatch = Dispatcher("confclient-dispatch")
        self.session: int | None = None
        self._secret: str | None = None
        self.identity = "anonymous"
        first_error: list[ConfError] = []
        self._connect_first(first_error)
        if first_error:
            raise first_error[0]
        self._io = threading.Thread(target=self._run_io, name=f"confclient-io-{self.session}", daemon=True)
        self._io.start()
        threading.Thread(target=self._run_heartbeat, name="confclient-heartbeat", daemon=True).start()

    # -- connection ----------------------------------------------------------------------------

    def _open_socket(self, deadline: float) -> socket.socket:
        delays = itertools.chain(RECONNECT_BACKOFF_S, itertools.repeat(RECONNECT_BACKOFF_S[-1]))
        while True:
            try:
                sock = socket.create_connection((self.url.host, self.url.port),
                                                timeout=max(0.1, deadline - time.monotonic()))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(None)
                return sock
            except OSError as e:
                delay = next(delays)
                if time.monotonic() + delay > deadline:
                    raise Disconnected(f"cannot reach the confserver at {self.url}: {e.strerror or e}") from None
                time.sleep(delay)

    def _hello(self, sock: socket.socket, deadline: float) -> None:
        """Open or resume the session on a fresh socket (before the I/O thread reads it); a server
        that accepts but does not answer by the deadline is as unreachable as one that refuses."""
        hello = {"id": 0, "op": "hello", "token": self._token, "timeout_s": self._session_timeout_s}
        if self.session is not None:
            hello.update(session=self.session, secret=self._secret)
        sock.settimeout(max(MIN_HELLO_WAIT_S, deadline - time.monotonic()))
        try:
            sock.sendall(wire.encode(hello))
            reply = _read_message(sock)
        except TimeoutError:
            raise Disconnected(f"the confserver at {self.url} accepted the connection but did not answer") from None
        sock.settimeout(None)
        if "error" in reply:
            raise error_from_code(reply["error"], reply.get("message", ""))
        result = reply["ok"]
        self.session, self._secret, self.identity = result["session"], result["secret"], result["identity"]
        self._session_timeout_s = result["timeout_s"]

    def _open_session(self, deadline: float) -> socket.socket:
        """A socket on which the session is open (or resumed), by the deadline."""
        sock = self._open_socket(deadline)
        try:
            self._hello(sock, deadline)
        except BaseException:
            sock.close()
            raise
        return sock

    def _connect_first(self, errors: list) -> None:
        """Connect and open the session within the connect timeout. A connection that drops
        during the hello (a server dying, or still starting) is tried again, as a refused one is."""
        deadline = time.monotonic() + self._connect_timeout_s
        pauses = itertools.chain(RECONNECT_BACKOFF_S, itertools.repeat(RECONNECT_BACKOFF_S[-1]))
        while True:
            try:
                sock = self._open_session(deadline)
            except (ConnectionError, EOFError) as e:
                pause = next(pauses)
                if time.monotonic() + pause < deadline:
                    log.debug("connection dropped during the hello, trying again: %s", e)
                    time.sleep(pause)
                    continue
                errors.append(Disconnected(f"confserver at {self.url}: {e}"))
                return
            except (ConfError, OSError) as e:
                errors.append(e if isinstance(e, ConfError) else Disconnected(f"confserver at {self.url}: {e}"))
                return
            self._sock = sock
            self._connected.set()
            return

    def _reconnect(self) -> bool:
        """Reconnect and resume the session; False once that is no longer possible.

        Only the server decides that a session has expired: one that was down or stuck, then
        restarted, gives every session a full timeout to come back, however long it was away, so
        this keeps trying until the server answers (or the client is closed)."""
        pauses = itertools.chain(RECONNECT_BACKOFF_S, itertools.repeat(RECONNECT_BACKOFF_S[-1]))
        while not self._closed:
            try:
                sock = self._open_session(time.monotonic() + self._connect_timeout_s)
            except SessionExpired as e:
                self._expire(e)
                return False
            except PermissionDenied as e:  # its token was revoked: it will not come back
                self._expire(SessionExpired(f"session {self.session} cannot be resumed: {e}"))
                return False
            except (OSError, ConfError, KeyError) as e:
                log.debug("reconnect attempt failed: %s", e)
                time.sleep(next(pauses))
                continue
            with self._lock:
                self._sock = sock
                for state in self._watches.values():  # re-watch before anyone else may send
                    self._send_watch(state, resumed=True)
            self._connected.set()
            log.info("reconnected to %s, session %d resumed", self.url, self.session)
            return True
        return False

    def _expire(self, error: SessionExpired) -> None:
        log.warning("%s", error)
        self._expired = error
        self._connected.set()  # wake waiters so they see the error
        with self._lock:
            watches = list(self._watches.values())
            self._watches.clear()
        for state in watches:
            state.watch.close()

    def _run_io(self) -> None:
        while not self._closed:
            sock = self._sock
            try:
                while True:
                    self._on_message(_read_message(sock))
            except (OSError, ConnectionError, EOFError, BadRequest):
                pass
            if self._closed:
                return
            self._connected.clear()
            with self._lock:
                sock.close()
                calls, self._calls = self._calls, {}
            for call in calls.values():
                call.error = Disconnected(f"connection to the confserver at {self.url} lost mid-call")
                call.done.set()
            log.warning("connection to the confserver at %s lost; reconnecting", self.url)
            if not self._reconnect():
                return

    def _on_message(self, message: dict) -> None:
        if "push" in message:
            if message["push"] == "event":
                state = self._watches.get(message.get("watch"))
                if state is not None:
                    event = Event.from_json(message["event"])
                    if event.kind is EventKind.DELETED:
                        state.known.pop(event.key, None)
                    else:
                        state.known[event.key] = event.entry
                    self._dispatch.put(state.watch, event)
            return
        if "part" in message:
            with self._lock:
                call = self._calls.get(message.get("id"))
            if call is not None:
                call.parts.extend(message["part"])
            return
        with self._lock:
            call = self._calls.pop(message.get("id"), None)
        if call is None:
            return
        if "error" in message:
            call.error = error_from_code(message["error"], message.get("message", ""))
        else:
            call.result = call.parts + message["ok"] if call.parts else message.get("ok")
            if call.on_reply is not None:
                call.on_reply(call.result)
        call.done.set()

    def _run_heartbeat(self) -> None:
        interval = self._session_timeout_s / HEARTBEATS_PER_TIMEOUT
        while not self._closed and self._expired is None:
            time.sleep(interval)
            if self._connected.is_set() and not self._closed:
                try:
                    with self._lock:
                        self._sock.sendall(wire.encode({"id": None, "op": "ping"}))
                except OSError:
                    pass  # the I/O thread notices and reconnects

    # -- calls ---------------------------------------------------------------------------------

    def _call(self, op: str, wait_s: float = 0.0, on_reply=None, reconnect_wait_s: float | None = None,
              **args) -> Any:
        """`reconnect_wait_s`: how long to wait for a connection being made again (by default the
        connect timeout or RECONNECT_WAIT_S, whichever is longer)."""
        if self._closed:
            raise Disconnected("this confserver client is closed")
        if reconnect_wait_s is None:
            reconnect_wait_s = max(self._connect_timeout_s, RECONNECT_WAIT_S)
        if not self._connected.wait(reconnect_wait_s):
            raise Disconnected(f"the confserver at {self.url} is unreachable")
        if self._expired is not None:
            raise self._expired
        call = _Call(on_reply)
        request_id = next(self._ids)
        args.update(id=request_id, op=op)
        frame = wire.encode(args)
        with self._lock:
            self._calls[request_id] = call
            try:
                self._sock.sendall(frame)
            except OSError as e:  # the I/O thread may have closed the socket as it saw it fail
                self._calls.pop(request_id, None)
                raise Disconnected(f"connection to the confserver at {self.url} lost: {e.strerror or e}") from None
        if not call.done.wait(REQUEST_TIMEOUT_S + wait_s):
            with self._lock:
                self._calls.pop(request_id, None)
            raise Disconnected(f"the confserver at {self.url} did not answer {op} in time")
        if call.error is not None:
            raise call.error
        return call.result

    def get(self, key: str) -> Entry:
        return Entry.from_json(self._call("get", key=check_key(key)))

    def children(self, key: str) -> list[str]:
        return self._call("children", key=check_key(key) if key else "")

    def glob(self, pattern: str) -> list[Entry]:
        return [Entry.from_json(e) for e in self._call("glob", pattern=check_pattern(pattern))]

    def create(self, key: str, value: Any, *, ephemeral: bool = False) -> Entry:
        encode_value(value)
        return Entry.from_json(self._call("create", key=check_key(key), value=value, ephemeral=ephemeral))

    def set(self, key: str, value: Any, *, ephemeral: bool = False) -> Entry:
        encode_value(value)
        return Entry.from_json(self._call("set", key=check_key(key), value=value, ephemeral=ephemeral))

    def update(self, key: str, value: Any, *, version: int | None = None) -> Entry:
        encode_value(value)
        return Entry.from_json(self._call("update", key=check_key(key), value=value, version=version))

    def delete(self, key: str, *, version: int | None = None) -> None:
        self._call("delete", key=check_key(key), version=version)

    def delete_tree(self, key: str) -> int:
        return self._call("delete_tree", key=check_key(key))

    def next_sequence(self, key: str) -> int:
        return self._call("next_sequence", key=check_key(key))

    # -- watches -------------------------------------------------------------------------------

    def watch(self, pattern: str, callback: Callable[[Event], None] | None = None) -> Watch:
        check_pattern(pattern)
        wid = next(self._ids)
        watch = Watch(pattern, callback, on_close=lambda _: self._unwatch(wid))
        state = _WatchState(wid, watch)
        with self._lock:
            self._watches[state.wid] = state
        try:
            self._call("watch", on_reply=lambda entries: self._on_watch_reply(state, entries, False),
                       watch=state.wid, pattern=pattern)
        except BaseException:
            with self._lock:
                self._watches.pop(state.wid, None)
            raise
        return watch

    def _send_watch(self, state: _WatchState, resumed: bool) -> None:
        """Register a watch on the current socket; called with self._lock held."""
        request_id = next(self._ids)
        self._calls[request_id] = _Call(lambda entries: self._on_watch_reply(state, entries, resumed))
        self._sock.sendall(wire.encode({"id": request_id, "op": "watch", "watch": state.wid,
                                        "pattern": state.watch.pattern}))

    def _on_watch_reply(self, state: _WatchState, entries: list[dict], resumed: bool) -> None:
        """Runs on the I/O thread before any later push, so events stay in commit order."""
        current = {e["key"]: Entry.from_json(e) for e in entries}
        if not resumed:
            for entry in current.values():
                self._dispatch.put(state.watch, Event(EventKind.EXISTING, entry.key, entry))
            self._dispatch.put(state.watch, Event(EventKind.SYNCED, state.watch.pattern, None))
        else:
            for key, old in state.known.items():
                if key not in current:
                    self._dispatch.put(state.watch, Event(EventKind.DELETED, key, old))
            for key, entry in current.items():
                old = state.known.get(key)
                if old is None:
                    self._dispatch.put(state.watch, Event(EventKind.CREATED, key, entry))
                elif (old.version, old.mtime) != (entry.version, entry.mtime):
                    self._dispatch.put(state.watch, Event(EventKind.UPDATED, key, entry))
        state.known = current

    def _unwatch(self, wid: int) -> None:
        with self._lock:
            state = self._watches.pop(wid, None)
        if state is not None and not self._closed and self._expired is None:
            try:  # not connected: the server forgot it with the connection, and a reconnect will not renew it
                self._call("unwatch", watch=wid, reconnect_wait_s=0.0)
            except ConfError:
                pass

    # -- locks and session ---------------------------------------------------------------------

    def _acquire(self, key: str, timeout_s: float) -> None:
        self._call("lock", wait_s=timeout_s, key=check_key(key), timeout_s=timeout_s)

    def _release(self, key: str) -> None:
        self._call("unlock", key=check_key(key))

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self._expired is None:
                self._call("close", reconnect_wait_s=CLOSE_RECONNECT_WAIT_S)
        except ConfError:
            pass
        self._closed = True
        self._connected.set()
        with self._lock:
            watches = list(self._watches.values())
            self._watches.clear()
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self._sock.close()
        for state in watches:
            state.watch.close()
        self._dispatch.close()


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("connection closed")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _read_message(sock: socket.socket) -> dict:
    (length,) = wire.LENGTH.unpack(_read_exactly(sock, wire.LENGTH.size))
    if length > wire.MAX_FRAME_BYTES:
        raise BadRequest(f"the confserver sent a {length}-byte message, over the limit")
    return wire.decode(_read_exactly(sock, length))

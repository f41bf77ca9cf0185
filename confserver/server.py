"""The built-in confserver: asyncio over TCP, durable through the journal.

One event loop serves every client. Requests are checked and applied at once, in arrival order,
which is the commit order watchers see. Replies and watch events wait until the journal batch
holding their write has been fsync'ed (in a worker thread, so the loop never blocks on the disk);
while a batch is in flight, later replies queue behind it, so no client ever sees state that a
crash could take back, and each connection's messages keep their order.

Everything sent is encoded when it is queued, where an error can still go back to the requester,
so the committer only writes bytes. An unexpected exception in any of the server's tasks (the
committer, session expiry, a connection's handler, a lock wait) is a bug: it is logged with its
traceback and the process exits with EXIT_BUG, to be restarted (`ramen start` does) from the
journal, which holds every acknowledged write. A `probe` is answered only through the committer,
so a dead or stuck committer fails it.

A session outlives its connection by its timeout, so a client can reconnect after a network blip or
a server restart and keep its ephemeral keys and locks; when it does not, the session ends and
they go. Lock waiters queue in arrival order, per key.

Run it with `ramen confserver` (or `python -m confserver.server`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import errno
import json
import logging
import os
import secrets
import signal
import sys
import time
from pathlib import Path

from confserver import auth as authn
from confserver import wire
from confserver.errors import (BadRequest, ConfError, KeyExists, LockTimeout, NoSuchKey, SessionExpired,
                               VersionMismatch)
from confserver.journal import SNAPSHOT_EVERY_RECORDS, Journal
from confserver.keys import check_key, check_pattern, matches
from confserver.model import encode_value
from confserver.store import DELETE, END, LOCK, OPEN, PUT, UNLOCK, Store
from ramen import listen, service_log
from ramen.paths import CONFSERVER_ADDRESS_FILE_NAME, write_atomically

log = logging.getLogger(__name__)

#: How often sessions are checked for expiry.
EXPIRY_CHECK_INTERVAL_S = 0.2
#: Bounds on what a client may ask for as its session timeout.
MIN_SESSION_TIMEOUT_S, MAX_SESSION_TIMEOUT_S = 0.5, 300.0
#: A client that lets this much of our output pile up unread is disconnected (not counting the
#: replies in several parts it asked for meanwhile: see Connection.send).
MAX_UNSENT_BYTES = 64 * 1024 * 1024
LISTEN_BACKLOG = 512
#: On stop, how long the closed connections' tasks get to end by themselves: one still running
#: when the loop ends is cancelled, and Python 3.11's asyncio logs a traceback for each.
STOP_CONNECTIONS_WAIT_S = 1.0
#: The exit status after a bug (sysexits' EX_SOFTWARE): the log has its traceback.
EXIT_BUG = 70
#: Operations a connection may send before its hello: a liveness probe needs no session.
SESSIONLESS_OPS = ("probe",)
#: What a handler returns when it will reply by itself later (a lock wait, a probe).
DEFERRED = object()


class Connection:
    def __init__(self, server: ConfServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.peer = writer.get_extra_info("peername")
        self.sid: int | None = None
        self.identity = authn.ANONYMOUS
        self.watches: dict[int, str] = {}
        self.waiting: set[asyncio.Future] = set()
        self.closed = False
        #: Bytes of replies in several parts written since the unsent output was last under
        #: MAX_UNSENT_BYTES: the client asked for them, so they do not make it a slow reader.
        self.requested_bytes = 0

    def send(self, data: bytes) -> None:
        """Write encoded frames (wire.encode*), or disconnect a client that does not read."""
        if self.closed:
            return
        unsent = self.writer.transport.get_write_buffer_size()
        if unsent <= MAX_UNSENT_BYTES:
            self.requested_bytes = 0
        elif unsent > MAX_UNSENT_BYTES + self.requested_bytes:
            log.warning("%s: client reads too slowly, disconnecting", self.peer)
            self.close()
            return
        if len(data) > wire.MAX_FRAME_BYTES:
            self.requested_bytes += len(data)
        self.writer.write(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()
            for future in self.waiting:
                future.cancel()


class ConfServer:
    def __init__(self, data_dir: str | os.PathLike, auth: authn.AuthConfig, *, fsync: bool = True,
                 snapshot_every_records: int = SNAPSHOT_EVERY_RECORDS):
        self.journal = Journal(data_dir, fsync=fsync, snapshot_every_records=snapshot_every_records)
        self.auth = auth
        self.store: Store | None = None
        self.connections: set[Connection] = set()
        self.by_session: dict[int, Connection] = {}
        self.last_seen: dict[int, float] = {}
        self.waiters: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self._outbox: list[tuple[Connection, dict]] = []
        self._in_flight = False
        self._wake_committer = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task] = []
        self._serving: set[asyncio.Task] = set()  # one a connection
        self.address: tuple[str, int] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self.store = await loop.run_in_executor(None, self.journal.load)
        now = time.monotonic()
        for sid in self.store.sessions:
            self.last_seen[sid] = now  # a restart gives every session a full timeout to come back
        self._server = await asyncio.start_server(self._serve, host, port, backlog=LISTEN_BACKLOG,
                                                  limit=wire.MAX_FRAME_BYTES)
        self.address = self._server.sockets[0].getsockname()[:2]
        self._tasks = [self._task(self._committer(), "committer"),
                       self._task(self._expire_sessions(), "session expiry")]
        log.info("confserver listening on %s:%d, data in %s", *self.address, self.journal.dir)

    def _task(self, coroutine, name: str) -> asyncio.Task:
        task = asyncio.create_task(coroutine, name=name)
        task.add_done_callback(_exit_if_failed)
        return task

    async def stop(self) -> None:
        """Stop serving; sessions stay in the journal so their clients can resume after a restart."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close()
        if self._serving:  # each sees its connection closed and returns
            await asyncio.wait(set(self._serving), timeout=STOP_CONNECTIONS_WAIT_S)
        async with self._flush_lock:  # so no task is cancelled halfway through a journal write
            for task in self._tasks:
                task.cancel()
        await self._flush()
        self.journal.close()

    # -- commit --------------------------------------------------------------------------------

    def commit(self, record: dict) -> None:
        """Log a record, apply it and queue the watch events it causes behind its batch."""
        self.journal.append(record)
        for event in self.store.apply(record):
            encoded = None  # once per event, whoever watches it
            for connection in self.connections:
                for wid, pattern in connection.watches.items():
                    if matches(pattern, event.key) and self._readable(connection, event.key):
                        if encoded is None:
                            encoded = json.dumps(event.to_json(), separators=(",", ":")).encode()
                        self._outbox.append(
                            (connection, wire.frame(b'{"push":"event","watch":%d,"event":%s}' % (wid, encoded))))
        self._wake_committer.set()

    def reply(self, connection: Connection, request_id: int | None, result) -> None:
        """Answer a request, in as many frames as the result takes; a result that cannot be sent
        is answered with the error saying why."""
        try:
            data = wire.encode_reply(request_id, result)
        except BadRequest as e:
            data = wire.encode_error(request_id, e)
        self._send(connection, data)

    def reply_error(self, connection: Connection, request_id: int | None, error: ConfError) -> None:
        self._send(connection, wire.encode_error(request_id, error))

    def _send(self, connection: Connection, data: bytes) -> None:
        if self._outbox or self._in_flight or self.journal.has_pending:
            self._outbox.append((connection, data))
            self._wake_committer.set()
        else:
            connection.send(data)

    async def _committer(self) -> None:
        while True:
            await self._wake_committer.wait()
            self._wake_committer.clear()
            await self._flush()

    async def _flush(self) -> None:
        async with self._flush_lock:  # one writer of the journal at a time
            await self._flush_locked()

    async def _flush_locked(self) -> None:
        loop = asyncio.get_running_loop()
        while self._outbox or self.journal.has_pending:
            self._in_flight = True
            batch, outbox, self._outbox = self.journal.take(), self._outbox, []
            snapshot = self.store.to_json() if self.journal.snapshot_due() else None
            try:
                if batch:
                    await loop.run_in_executor(None, self.journal.write, batch)
                if snapshot is not None:
                    await loop.run_in_executor(None, self.journal.write_snapshot, snapshot)
            except OSError:
                log.critical("cannot write the journal in %s; stopping", self.journal.dir, exc_info=True)
                os._exit(1)  # acknowledging writes we could not log would lose them
            finally:
                self._in_flight = False
            for connection, data in outbox:
                connection.send(data)

    # -- sessions ------------------------------------------------------------------------------

    def open_session(self, connection: Connection, message: dict) -> dict:
        identity = self.auth.identify(message.get("token"))
        timeout_s = float(message.get("timeout_s", 10.0))
        timeout_s = min(max(timeout_s, MIN_SESSION_TIMEOUT_S), MAX_SESSION_TIMEOUT_S)
        sid = message.get("session")
        if sid is not None:
            session = self.store.sessions.get(sid)
            if session is None or session.secret != message.get("secret") or session.identity != identity:
                raise SessionExpired(f"session {sid} has expired")
            old = self.by_session.get(sid)
            if old is not None and old is not connection:
                old.close()
        else:
            sid = self.store.last_sid + 1
            self.commit({"t": OPEN, "sid": sid, "secret": secrets.token_hex(16), "identity": identity,
                         "timeout_s": timeout_s})
        session = self.store.sessions[sid]
        connection.sid, connection.identity = sid, identity
        self.by_session[sid] = connection
        self.last_seen[sid] = time.monotonic()
        return {"session": sid, "secret": session.secret, "identity": identity, "timeout_s": session.timeout_s}

    def end_session(self, sid: int, *, disconnect: bool = True) -> None:
        """End a session: its ephemeral keys are deleted and its locks pass to their next waiters."""
        held = [key for key, holder in self.store.locks.items() if holder.sid == sid]
        self.commit({"t": END, "sid": sid})
        self.last_seen.pop(sid, None)
        connection = self.by_session.pop(sid, None)
        if connection is not None and disconnect:
            connection.close()
        for key in held:
            self._grant_next(key)

    async def _expire_sessions(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_CHECK_INTERVAL_S)
            now = time.monotonic()
            for sid, session in list(self.store.sessions.items()):
                if now - self.last_seen.get(sid, now) > session.timeout_s:
                    log.info("session %d (%s) expired", sid, session.identity)
                    self.end_session(sid)

    # -- connections ---------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(self, reader, writer)
        self.connections.add(connection)
        self._serving.add(asyncio.current_task())
        try:
            while not connection.closed:
                header = await reader.readexactly(wire.LENGTH.size)
                (length,) = wire.LENGTH.unpack(header)
                if length > wire.MAX_FRAME_BYTES:
                    connection.send(wire.encode_error(None, BadRequest(
                        f"message of {length} bytes is larger than the {wire.MAX_FRAME_BYTES}-byte limit")))
                    log.warning("%s: refused a %d-byte message, disconnecting", connection.peer, length)
                    break
                self._handle(connection, await reader.readexactly(length))
        except (asyncio.IncompleteReadError, OSError):
            pass  # the client hung up, or its connection broke
        except Exception as e:  # noqa: BLE001 - a bug: the state may be half changed
            _exit_after_bug(f"serving {connection.peer}", e)
        finally:
            self._serving.discard(asyncio.current_task())
            self.connections.discard(connection)
            if connection.sid is not None and self.by_session.get(connection.sid) is connection:
                del self.by_session[connection.sid]
            connection.close()

    def _handle(self, connection: Connection, body: bytes) -> None:
        request_id = None
        try:
            message = wire.decode(body)
            request_id = message.get("id")
            if request_id is not None and type(request_id) is not int:
                request_id = None
                raise BadRequest("malformed request: its id must be an integer")
            op = message.get("op")
            if connection.sid is None and op not in SESSIONLESS_OPS:
                if op != "hello":
                    raise BadRequest("the first message must be hello")
                self.reply(connection, request_id, self.open_session(connection, message))
                return
            if connection.sid is not None:
                if connection.sid not in self.store.sessions:
                    raise SessionExpired(f"session {connection.sid} has expired")
                self.last_seen[connection.sid] = time.monotonic()
            handler = self.HANDLERS.get(op)
            if handler is None:
                raise BadRequest(f"unknown operation {op!r}")
            result = handler(self, connection, message)
            if result is DEFERRED:
                return
            self.reply(connection, request_id, result)
        except ConfError as e:
            self.reply_error(connection, request_id, e)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            self.reply_error(connection, request_id, BadRequest(f"malformed request: {e!r}"))

    # -- permissions ---------------------------------------------------------------------------

    def _readable(self, connection: Connection, key: str) -> bool:
        return self.auth.rule_for(key).allows(connection.identity, authn.READ)

    def _check(self, connection: Connection, operation: str, key: str) -> None:
        self.auth.check(connection.identity, operation, key)

    # -- operations ----------------------------------------------------------------------------

    def op_ping(self, connection, message):
        return None

    def op_probe(self, connection, message):
        """Liveness: answered by the committer once it has written what came before, so a dead or
        stuck committer (or event loop) leaves the probe unanswered."""
        self._outbox.append((connection, wire.encode_reply(message.get("id"), None)))
        self._wake_committer.set()
        return DEFERRED

    def op_get(self, connection, message):
        key = check_key(message["key"])
        self._check(connection, authn.READ, key)
        entry = self.store.get(key)
        if entry is None:
            raise NoSuchKey(f"no such key: {key}")
        return entry.to_json()

    def op_children(self, connection, message):
        key = message["key"]
        if key:
            check_key(key)
            self._check(connection, authn.READ, key)
        return self.store.children(key)

    def op_glob(self, connection, message):
        pattern = check_pattern(message["pattern"])
        return [e.to_json() for e in self.store.glob(pattern) if self._readable(connection, e.key)]

    def _put(self, connection, key, value, ephemeral=False):
        encode_value(value)
        record = {"t": PUT, "key": key, "value": value, "owner": connection.identity, "mtime": time.time()}
        if ephemeral:
            record["eph"] = connection.sid
        self.commit(record)
        return self.store.get(key).to_json()

    def op_create(self, connection, message):
        key = check_key(message["key"])
        self._check(connection, authn.WRITE, key)
        if self.store.get(key) is not None:
            raise KeyExists(f"key exists: {key}")
        return self._put(connection, key, message["value"], bool(message.get("ephemeral")))

    def op_set(self, connection, message):
        key = check_key(message["key"])
        self._check(connection, authn.WRITE, key)
        return self._put(connection, key, message["value"], bool(message.get("ephemeral")))

    def _existing(self, key: str, version) -> None:
        entry = self.store.get(key)
        if entry is None:
            raise NoSuchKey(f"no such key: {key}")
        if version is not None and entry.version != version:
            raise VersionMismatch(f"{key} is at version {entry.version}, not {version}")

    def op_update(self, connection, message):
        key = check_key(message["key"])
        self._check(connection, authn.WRITE, key)
        self._existing(key, message.get("version"))
        return self._put(connection, key, message["value"])

    def op_delete(self, connection, message):
        key = check_key(message["key"])
        self._check(connection, authn.DELETE, key)
        self._existing(key, message.get("version"))
        self.commit({"t": DELETE, "keys": [key]})
        return None

    def op_delete_tree(self, connection, message):
        key = check_key(message["key"])
        keys = [e.key for e in self.store.glob(key)]
        for k in keys:
            self._check(connection, authn.DELETE, k)
        if keys:
            self.commit({"t": DELETE, "keys": keys})
        return len(keys)

    def op_next_sequence(self, connection, message):
        key = check_key(message["key"])
        self._check(connection, authn.WRITE, key)
        entry = self.store.get(key)
        current = entry.value if entry is not None else 0
        if not isinstance(current, int) or isinstance(current, bool) or current < 0:
            raise BadRequest(f"{key} holds {current!r}, not a sequence")
        return self._put(connection, key, current + 1)["value"]

    def op_watch(self, connection, message):
        wid, pattern = int(message["watch"]), check_pattern(message["pattern"])
        connection.watches[wid] = pattern
        return [e.to_json() for e in self.store.glob(pattern) if self._readable(connection, e.key)]

    def op_unwatch(self, connection, message):
        connection.watches.pop(int(message["watch"]), None)
        return None

    def op_lock(self, connection, message):
        key = check_key(message["key"])
        self._check(connection, authn.WRITE, key)
        timeout_s = float(message["timeout_s"])
        holder = self.store.locks.get(key)
        if holder is None or holder.sid == connection.sid:
            self.commit({"t": LOCK, "key": key, "sid": connection.sid})
            return None
        future = asyncio.get_running_loop().create_future()
        self.waiters[key].append((connection.sid, future))
        connection.waiting.add(future)
        request_id = message.get("id")
        asyncio.create_task(self._wait_for_lock(connection, request_id, key, future, timeout_s),
                            name=f"lock wait {key}").add_done_callback(_exit_if_failed)
        return DEFERRED

    async def _wait_for_lock(self, connection, request_id, key, future, timeout_s) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
            self.reply(connection, request_id, None)
        except asyncio.TimeoutError:
            if future.done() and not future.cancelled():  # granted just as the time ran out
                self.reply(connection, request_id, None)
                return
            future.cancel()
            holder = self.store.locks.get(key)
            self.reply_error(connection, request_id, LockTimeout(
                f"lock {key}: still held by session {holder.sid if holder else '?'} after {timeout_s:g} s"))
        except asyncio.CancelledError:
            pass
        finally:
            connection.waiting.discard(future)

    def _grant_next(self, key: str) -> None:
        queue = self.waiters.get(key)
        while queue:
            sid, future = queue.popleft()
            if future.done() or sid not in self.store.sessions:
                continue
            self.commit({"t": LOCK, "key": key, "sid": sid})
            future.set_result(None)
            break
        if queue is not None and not queue:
            del self.waiters[key]

    def op_unlock(self, connection, message):
        key = check_key(message["key"])
        holder = self.store.locks.get(key)
        if holder is None or holder.sid != connection.sid:
            raise BadRequest(f"lock {key} is not held by this session")
        self.commit({"t": UNLOCK, "key": key, "sid": connection.sid})
        if key not in self.store.locks:
            self._grant_next(key)
        return None

    def op_close(self, connection, message):
        self.end_session(connection.sid, disconnect=False)  # the client hangs up once answered
        return None

    HANDLERS = {name[3:]: fn for name, fn in list(locals().items()) if name.startswith("op_")}


def _exit_if_failed(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        _exit_after_bug(task.get_name(), task.exception())


def _exit_after_bug(what: str, error: BaseException) -> None:
    """A bug in a server task. Going on could mean going on frozen (a dead committer never
    acknowledges anything again), so exit at once, to be restarted from the journal, which holds
    every acknowledged write (what was not acknowledged may be lost, as in any crash)."""
    log.critical("confserver: %s failed; exiting (status %d) to be restarted", what, EXIT_BUG, exc_info=error)
    logging.shutdown()
    os._exit(EXIT_BUG)


# -- command line ----------------------------------------------------------------------------------

def parse_listen(text: str) -> tuple[str, int]:
    try:
        return listen.parse_listen(text)
    except ValueError as e:
        raise BadRequest(str(e)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from confserver import default_data_dir
    from confserver.url import DEFAULT_HOST, DEFAULT_PORT
    parser.add_argument("--listen", default=f"{DEFAULT_HOST}:{DEFAULT_PORT}", metavar="HOST:PORT",
                        help="address to serve (default %(default)s; port 0 picks a free one)")
    parser.add_argument("--data-dir", default=str(default_data_dir()), metavar="DIR",
                        help="journal, snapshots and auth.json (default %(default)s)")
    parser.add_argument("--auth", metavar="FILE",
                        help="tokens and rules (JSON); required to listen beyond loopback. "
                             "Default: DIR/auth.json, created with fresh tokens")
    parser.add_argument("--no-fsync", action="store_true",
                        help="acknowledge writes before they reach the disk (tests and benchmarks only)")
    parser.add_argument("--snapshot-every", type=int, default=SNAPSHOT_EVERY_RECORDS, metavar="N",
                        help="write a snapshot and start a new log every N records (default %(default)s)")
    parser.add_argument("--ready-file", metavar="FILE", help="write HOST:PORT here once listening")


async def serve(args: argparse.Namespace) -> None:
    host, port = parse_listen(args.listen)
    if not listen.is_loopback(host) and not args.auth:
        raise BadRequest(f"refusing to listen on {host}, beyond loopback, without --auth")
    data_dir = Path(args.data_dir)
    config = authn.load(args.auth) if args.auth else authn.load_or_create(data_dir / authn.AUTH_FILE_NAME)
    server = ConfServer(data_dir, config, fsync=not args.no_fsync, snapshot_every_records=args.snapshot_every)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await server.start(host, port)
    listening = "%s:%d\n" % server.address
    # Only now, once listening, and whole (renamed into place): commands of this directory's
    # instance find us through it, whatever port we were given (ramen.paths.local_confserver_url).
    address_file = data_dir / CONFSERVER_ADDRESS_FILE_NAME
    write_atomically(address_file, listening)
    if args.ready_file:  # only now: who reads it may stop us at once, and must get a clean stop
        write_atomically(Path(args.ready_file), listening)
    try:
        await stop.wait()
        log.info("stopping")
        await server.stop()
    finally:
        address_file.unlink(missing_ok=True)  # nobody listens there any more


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ramen confserver", description="Run the built-in confserver.")
    add_arguments(parser)
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    service_log.configure(logging.DEBUG if args.debug else logging.INFO)  # also under `ramen`
    try:
        asyncio.run(serve(args))
    except ConfError as e:
        print(f"ramen: confserver: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the address is taken or cannot be had: a user's matter, one line
        reason = os.strerror(e.errno) if e.errno else str(e)
        hint = " (is another ramen running?)" if e.errno == errno.EADDRINUSE else ""
        print(f"ramen: confserver: cannot listen on {args.listen}: {reason}{hint}", file=sys.stderr)
        return 1
    return 0

if __name__ == "__main__":
    sys.exit(main())

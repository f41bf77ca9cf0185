"""What only the built-in server has: its wire protocol's defences, its journal, its command line."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time

import pytest

import confserver
from confserver import wire
from confserver.model import MAX_VALUE_BYTES, MAX_VALUE_DEPTH, EventKind
from confserver.probe import probe
from confserver.remote import RECONNECT_WAIT_S
from confserver.server import EXIT_BUG
from tests.confserver.builtin import BuiltinServer


@pytest.fixture
def server(tmp_path):
    s = BuiltinServer(tmp_path / "data").start()
    yield s
    s.stop()


def admin(server, **kwargs):
    return confserver.connect(server.url, identity="admin", auth_file=server.auth_file, **kwargs)


def raw_connection(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def send_raw(sock: socket.socket, body: bytes) -> None:
    sock.sendall(wire.LENGTH.pack(len(body)) + body)


def read_reply(sock: socket.socket) -> dict:
    from confserver.remote import _read_message
    return _read_message(sock)


def hello(sock, server) -> None:
    token = json.loads(server.auth_file.read_text())["tokens"]["admin"]
    send_raw(sock, json.dumps({"id": 0, "op": "hello", "token": token}).encode())
    assert "ok" in read_reply(sock)


@pytest.mark.parametrize("body, expected", [
    (b"{not json", "malformed"),
    (b"[1, 2]", "not a JSON object"),
    (b"\xff\xfe", "malformed"),
    (json.dumps({"id": 1, "op": "launch_missiles"}).encode(), "unknown operation"),
    (json.dumps({"id": 1, "op": "set"}).encode(), "malformed request"),
    (json.dumps({"id": 1, "op": "set", "key": "a/../b", "value": 1}).encode(), "bad key"),
])
def test_malformed_messages_get_an_error_and_the_connection_goes_on(server, body, expected):
    with raw_connection(server) as sock:
        hello(sock, server)
        send_raw(sock, body)
        reply = read_reply(sock)
        assert reply["error"] == "bad_request" and expected in reply["message"]
        send_raw(sock, json.dumps({"id": 2, "op": "set", "key": "still/alive", "value": 1}).encode())
        assert read_reply(sock)["ok"]["key"] == "still/alive"


def test_the_first_message_must_be_hello(server):
    with raw_connection(server) as sock:
        send_raw(sock, json.dumps({"id": 1, "op": "get", "key": "a"}).encode())
        assert "hello" in read_reply(sock)["message"]


def test_an_oversized_message_is_refused_unread_and_the_server_stays_up(server):
    with raw_connection(server) as sock:
        hello(sock, server)
        sock.sendall(wire.LENGTH.pack(wire.MAX_FRAME_BYTES + 1) + b"x" * 1024)
        reply = read_reply(sock)
        assert reply["error"] == "bad_request" and "limit" in reply["message"]
        assert sock.recv(1) == b""  # and it hung up
    with admin(server) as c:
        assert c.set("after/oversized", 1).version == 0


def test_a_value_over_the_limit_inside_a_legal_frame_is_refused(server):
    with raw_connection(server) as sock:
        hello(sock, server)
        big = "x" * (MAX_VALUE_BYTES + 10)
        send_raw(sock, json.dumps({"id": 1, "op": "set", "key": "big", "value": big}).encode())
        reply = read_reply(sock)
        assert reply["error"] == "bad_request" and "limit" in reply["message"]
    with admin(server) as c:
        assert c.get_or_none("big") is None


def test_hundreds_of_clients_and_thousands_of_keys(server):
    clients = [admin(server) for _ in range(200)]
    try:
        watcher = clients[0].watch("many")
        threads = [threading.Thread(target=lambda c=c, i=i: [c.set(f"many/c{i}/k{j}", j) for j in range(10)])
                   for i, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(clients[-1].glob("many")) == 2000
        seen = set()
        while len(seen) < 2000:
            event = watcher.next(10)
            assert event is not None, len(seen)
            seen.add(event.key)
    finally:
        for c in clients:
            c.close()


def test_snapshots_and_log_rebuild_the_state_after_kill_9(tmp_path):
    server = BuiltinServer(tmp_path / "data", "--snapshot-every", "50").start()
    try:
        with admin(server) as c:
            for i in range(300):
                c.set(f"k/{i % 120}", i)
            c.delete("k/0")
        server.restart(hard=True)
        assert (server.data_dir / "snapshot.json").exists()
        assert len(list(server.data_dir.glob("wal.*"))) == 1
        with admin(server) as c:
            values = {e.key: e.value for e in c.glob("k")}
        assert values == {f"k/{i}": (i + 240 if i < 60 else i + 120) for i in range(1, 120)}
    finally:
        server.stop()


def test_a_torn_log_tail_is_cut_and_the_rest_loads(server):
    with admin(server) as c:
        c.set("kept", 1)
    server.stop()
    wal = sorted(server.data_dir.glob("wal.*"))[-1]
    with open(wal, "ab") as f:
        f.write(b"\x40\x00\x00\x00\x00\x00\x00\x00{\"t\":\"put\"")  # a record cut mid-write
    server.start()
    with admin(server) as c:
        assert c.get("kept").value == 1
        c.set("after", 2)
    server.restart(hard=True)
    with admin(server) as c:
        assert c.get("after").value == 2


def test_a_second_server_on_the_same_data_dir_is_refused(server):
    result = subprocess.run([sys.executable, "-m", "confserver.server", "--listen", "127.0.0.1:0",
                             "--data-dir", str(server.data_dir)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "used by another running confserver" in result.stderr
    assert "Traceback" not in result.stderr


def test_listening_beyond_loopback_needs_auth(tmp_path):
    result = subprocess.run([sys.executable, "-m", "confserver.server", "--listen", "0.0.0.0:0",
                             "--data-dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "beyond loopback" in result.stderr


def test_an_unreachable_server_raises_disconnected_quickly(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(confserver.Disconnected, match="cannot reach"):
        confserver.connect(f"ramen://127.0.0.1:{port}", connect_timeout_s=0.5)


def test_a_connection_dropped_during_the_hello_is_tried_again_within_the_connect_timeout(server):
    """A server that dies (or is still starting) as a client says hello: the client tries again,
    as it does for a refused connection, instead of failing at once (seen in the chaos soak: a
    replayer started during a confserver restart died of a reset)."""
    from tests.confserver.zkserver import TcpProxy

    class DropsTheFirst(TcpProxy):
        dropped = 0

        def _accept(self, listener):
            first, _ = listener.accept()
            first.close()
            self.dropped += 1
            super()._accept(listener)

    proxy = DropsTheFirst(server.port).start()
    try:
        with confserver.connect(f"ramen://127.0.0.1:{proxy.port}", identity="admin", auth_file=server.auth_file,
                                connect_timeout_s=5) as client:
            client.set("dropped/once", 1)
            assert client.get("dropped/once").value == 1
        assert proxy.dropped == 1
    finally:
        proxy.cut()


# -- replies of any size, a committer that fails, deep nesting, the probe ---------------------------

BIG_VALUE_BYTES = 400_000


def read_reply_parts(sock: socket.socket) -> tuple[dict, int]:
    """A whole reply and how many frames it came in."""
    items, frames = [], 0
    while True:
        message = read_reply(sock)
        frames += 1
        if "part" in message:
            items.extend(message["part"])
            continue
        if "ok" in message and items:
            message = dict(message, ok=items + message["ok"])
        return message, frames


def test_a_write_in_flight_while_a_huge_glob_is_answered_freezes_nothing(server):
    """The frozen server of issue 19: a glob reply over the frame limit, queued behind a write in
    flight, was encoded by the committer, which died of it; nothing was acknowledged again."""
    with admin(server) as c:
        for i in range(4):
            c.set(f"huge/k{i}", "v" * BIG_VALUE_BYTES)
    with raw_connection(server) as sock:
        hello(sock, server)
        # One send: the glob is read right after the set, while its write is in flight.
        sock.sendall(wire.encode({"id": 1, "op": "set", "key": "huge/extra", "value": 1})
                     + wire.encode({"id": 2, "op": "glob", "pattern": "huge"}))
        assert read_reply(sock)["ok"]["key"] == "huge/extra"
        reply, frames = read_reply_parts(sock)
        assert [e["key"] for e in reply["ok"]] == ["huge/extra"] + [f"huge/k{i}" for i in range(4)]
        assert all(len(e["value"]) == BIG_VALUE_BYTES for e in reply["ok"][1:])
        assert frames >= 3
        send_raw(sock, json.dumps({"id": 3, "op": "set", "key": "huge/after", "value": 2}).encode())
        assert read_reply(sock)["ok"]["version"] == 0
    with admin(server, connect_timeout_s=10) as c:  # new sessions open, writes are acknowledged
        assert c.set("huge/new-session", 3).version == 0
        assert len(c.glob("huge")) == 7


def test_a_failure_in_the_committer_is_logged_and_the_server_exits_to_be_restarted(tmp_path):
    server = BuiltinServer(tmp_path / "data", module="tests.confserver.faulty_server").start()
    try:
        with admin(server) as c:
            c.set("kept", 1)
            with pytest.raises(confserver.Disconnected):
                c.set("boom", 1)
        assert server.process.wait(30) == EXIT_BUG
        log = server.log_path.read_text()
        assert "confserver: committer failed; exiting (status 70) to be restarted" in log
        assert "Traceback" in log and "RuntimeError: injected committer failure" in log
        server.start()
        with admin(server) as c:
            assert c.get("kept").value == 1
            assert c.get_or_none("boom") is None  # never acknowledged
    finally:
        server.stop()


def nested(depth: int):
    value = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("body, expected", [
    (b'{"id":1,"op":"set","key":"deep","value":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (json.dumps({"id": 1, "op": "set", "key": "deep", "value": nested(MAX_VALUE_DEPTH + 1)}).encode(),
     f"nested deeper than the {MAX_VALUE_DEPTH}-level limit"),
    (b'{"id":' + b"[" * 900 + b"]" * 900 + b',"op":"get","key":"deep"}', "id must be an integer"),
    (b'{"id":1,"op":"hello","timeout_s":NaN}', "NaN is not JSON"),
])
def test_deeply_nested_requests_are_refused_in_one_line_and_the_connection_goes_on(server, body, expected):
    with raw_connection(server) as sock:
        hello(sock, server)
        send_raw(sock, body)
        reply = read_reply(sock)
        assert reply["error"] == "bad_request" and expected in reply["message"], reply
        send_raw(sock, json.dumps({"id": 2, "op": "set", "key": "still/alive", "value": 1}).encode())
        assert read_reply(sock)["ok"]["key"] == "still/alive"
    with admin(server) as c:
        assert c.get_or_none("deep") is None
    assert server.alive()
    assert "Traceback" not in server.log_path.read_text()


def test_the_probe_needs_no_session_and_writes_nothing(server):
    for _ in range(3):
        probe("127.0.0.1", server.port)
    with admin(server) as c:
        assert c.glob("") == []
    assert "Traceback" not in server.log_path.read_text()


def test_a_stuck_committer_fails_the_probe(tmp_path):
    server = BuiltinServer(tmp_path / "data", module="tests.confserver.faulty_server").start()
    try:
        probe("127.0.0.1", server.port)
        with raw_connection(server) as sock:
            hello(sock, server)
            send_raw(sock, json.dumps({"id": 1, "op": "set", "key": "stall", "value": 1}).encode())
            with pytest.raises(confserver.Disconnected, match="did not answer a probe"):
                probe("127.0.0.1", server.port, timeout_s=1.0)
        assert server.alive()  # alive but stuck: what `ramen start` must kill
    finally:
        server.kill()


def test_a_client_resumes_its_session_however_long_the_server_was_away(tmp_path):
    """Only the server says a session expired; one restarted gives every session a full timeout
    to come back. A client that gave up by itself after its timeout lost its ephemeral keys to a
    server that `ramen start` restarted after 15 s of being stuck."""
    server = BuiltinServer(tmp_path / "data").start()
    session_timeout_s = 2.0
    try:
        with admin(server, session_timeout_s=session_timeout_s) as c:
            c.create("mine", 1, ephemeral=True)
            server.kill()
            time.sleep(2.5 * session_timeout_s)  # away for longer than the session's timeout
            server.start()
            deadline = time.monotonic() + 30
            while not _set_once(c, "after"):
                assert time.monotonic() < deadline, "the client did not come back"
                time.sleep(0.05)
            assert c.get("mine").ephemeral
    finally:
        server.stop()


def _set_once(client, key: str) -> bool:
    try:
        client.set(key, 1)
        return True
    except confserver.Disconnected:
        return False


def test_a_reply_over_the_unsent_limit_does_not_make_its_client_a_slow_reader(server):
    """A client with more than MAX_UNSENT_BYTES of our output unread is disconnected, but a reply
    it asked for is its own: an event pushed behind a watch reply over that limit still arrives."""
    from confserver.server import MAX_UNSENT_BYTES
    count = MAX_UNSENT_BYTES // BIG_VALUE_BYTES * 3 // 2  # beyond the kernel's socket buffers too
    with admin(server) as c:
        for i in range(count):
            c.set(f"vast/k{i:04d}", "v" * BIG_VALUE_BYTES)
    with raw_connection(server) as sock:
        hello(sock, server)
        send_raw(sock, json.dumps({"id": 1, "op": "watch", "watch": 7, "pattern": "vast"}).encode())
        with admin(server) as writer:  # acknowledged: its event is pushed to us, still unread
            writer.set("vast/new", 1)
        reply, frames = read_reply_parts(sock)
        assert len(reply["ok"]) == count and frames > MAX_UNSENT_BYTES // wire.MAX_FRAME_BYTES
        event = read_reply(sock)
        assert (event["push"], event["watch"], event["event"]["key"]) == ("event", 7, "vast/new")


def test_a_server_stopped_with_clients_connected_logs_no_traceback(tmp_path):
    """A site's confserver stops with other sites' services still connected: each connection's task
    must end before the loop does (one cancelled then was a traceback in the log, for each)."""
    server = BuiltinServer(tmp_path / "data").start()
    connections = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    try:
        probe("127.0.0.1", server.port)  # answered once the loop has taken the connections made before
        server.stop()
    finally:
        for connection in connections:
            connection.close()
    assert server.process.returncode == 0
    log = server.log_path.read_text()
    assert "stopping" in log and "Traceback" not in log, log


def test_a_client_closed_while_its_server_is_gone_returns_and_its_session_ends_at_the_timeout(tmp_path):
    """A service stopping after its confserver went (another site's, stopped first) must stop
    within its grace: its close waits CLOSE_RECONNECT_WAIT_S for the server, not RECONNECT_WAIT_S
    as a call does; the server then ends the session at its timeout."""
    server = BuiltinServer(tmp_path / "data").start()
    try:
        client = admin(server, session_timeout_s=1.0)
        client.create("mine", 1, ephemeral=True)
        server.kill()
        started = time.monotonic()
        client.close()
        assert time.monotonic() - started < RECONNECT_WAIT_S / 2  # a 30 s wait before
        server.start()
        with admin(server) as other:
            deadline = time.monotonic() + 30
            while other.get_or_none("mine") is not None:
                assert time.monotonic() < deadline, "the closed client's session never ended"
                time.sleep(0.05)
    finally:
        server.stop()


def test_a_client_closed_while_its_server_restarts_ends_its_session_itself(tmp_path, caplog):
    """The wait is for a confserver `ramen start` is restarting: the client's ephemeral keys go at
    its close, not a session timeout later."""
    caplog.set_level(logging.WARNING, logger="confserver.remote")  # whatever a CLI run in this process set
    server = BuiltinServer(tmp_path / "data").start()
    try:
        client = admin(server, session_timeout_s=60.0)
        client.create("mine", 1, ephemeral=True)
        server.kill()
        deadline = time.monotonic() + 30
        while "lost; reconnecting" not in caplog.text:  # the client knows: its close waits
            assert time.monotonic() < deadline, "the client never noticed its server died"
            time.sleep(0.01)
        restart = threading.Thread(target=server.start)
        restart.start()
        client.close()
        restart.join()
        with admin(server) as other:
            assert other.get_or_none("mine") is None
    finally:
        server.stop()


def test_a_watch_closed_while_the_server_is_away_does_not_wait_for_it(tmp_path, caplog):
    """The server forgot the watch with the connection, and a reconnect renews only the watches
    still open: closing one has nothing to tell a server that is away (the archiver's stop, after
    another site's confserver went, waited 30 s here and was killed)."""
    caplog.set_level(logging.WARNING, logger="confserver.remote")  # whatever a CLI run in this process set
    server = BuiltinServer(tmp_path / "data").start()
    try:
        with admin(server) as client:
            closed, kept = client.watch("closed/*"), client.watch("kept/*")
            server.kill()
            deadline = time.monotonic() + 30
            while "lost; reconnecting" not in caplog.text:
                assert time.monotonic() < deadline, "the client never noticed its server died"
                time.sleep(0.01)
            started = time.monotonic()
            closed.close()
            assert time.monotonic() - started < RECONNECT_WAIT_S / 2
            server.start()
            client.set("closed/a", 1)
            client.set("kept/a", 1)
            event = kept.next(10)
            while event is not None and event.key != "kept/a":
                event = kept.next(10)
            assert event is not None and event.kind is EventKind.CREATED  # the open watch came back
            assert [e for e in closed.drain() if e.key == "closed/a"] == []
    finally:
        server.stop()

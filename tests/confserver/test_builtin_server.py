"""What only the built-in server has: its wire protocol's defences, its journal, its command line."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import pytest

import confserver
from confserver import wire
from confserver.model import MAX_VALUE_BYTES
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

"""`ramen netd` as a process: it announces its endpoint, shows in `ramen stat`, carries a stream
to another netd as the keys ask, stops cleanly on SIGTERM, and refuses a bad --listen in one line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

import confserver
from ramen import keyspace
from ramen.netd.contract import NetEndpoint, NetReceive, NetSend
from ramen.transport import (ADMIN_ACTION, CountersFile, ExclusivePublication, FragmentAssembler, Image, LogBuffer,
                             LogBufferParams)
from tests.waiting import wait_for

STARTUP_S = 30.0
STREAM = 99


@pytest.fixture
def admin(fresh_confserver):
    with confserver.connect(fresh_confserver.url, identity="admin", auth_file=fresh_confserver.auth_file) as c:
        yield c


def env_of(fresh_confserver, ramen_dir) -> dict:
    return dict(os.environ, RAMEN_CONFSERVER=fresh_confserver.url,
                RAMEN_CONFSERVER_AUTH=str(fresh_confserver.auth_file), RAMEN_DIR=str(ramen_dir))


def start(env: dict, site: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "netd", "--site", site, *args], env=env,
                            stderr=subprocess.PIPE, text=True)


def stop(process: subprocess.Popen) -> str:
    process.send_signal(signal.SIGTERM)
    assert process.wait(STARTUP_S) == 0
    return process.stderr.read()


def endpoint(admin, site: str) -> NetEndpoint | None:
    entry = admin.get_or_none(keyspace.net_endpoint_key(site))
    return None if entry is None else NetEndpoint.from_value(entry.value)


def test_two_netds_carry_a_stream_between_their_sites_and_stop_cleanly(fresh_confserver, admin, tmp_path):
    edge_dir, core_dir = tmp_path / "edge", tmp_path / "core"
    edge = start(env_of(fresh_confserver, edge_dir), "edge")
    core = start(env_of(fresh_confserver, core_dir), "core")
    try:
        announced = wait_for(lambda: endpoint(admin, "core"), "core's endpoint announced", timeout_s=STARTUP_S)
        assert announced.pid == core.pid and announced.channel.startswith("aeron:udp?endpoint=127.0.0.1:")
        wait_for(lambda: endpoint(admin, "edge"), "edge's endpoint announced", timeout_s=STARTUP_S)

        out, received = edge_dir / "out.logbuffer", core_dir / "received" / "out.logbuffer"
        counters = CountersFile.open(edge_dir / "counters.dat")
        publication = ExclusivePublication(LogBuffer.create(out, LogBufferParams(
            term_length=65536, session_id=1, stream_id=STREAM)), counters)
        admin.create(f"{keyspace.net_receives_prefix('core')}/p/f",
                     NetReceive(stream_id=STREAM, log=str(received)).to_value())
        admin.create(f"{keyspace.net_sends_prefix('edge')}/p/f@core",
                     NetSend(log=str(out), channel=announced.channel).to_value())
        wait_for(received.exists, "the image on the core", timeout_s=STARTUP_S)
        core_counters = CountersFile.open(core_dir / "counters.dat")
        image = Image(LogBuffer.open(received), core_counters)
        got: list[bytes] = []
        assembler = FragmentAssembler(lambda b, o, n, h: got.append(bytes(b[o:o + n])))
        messages = [b"n%05d" % i for i in range(5000)]
        pending = list(messages)

        def moved() -> bool:
            while pending:
                result = publication.offer(pending[0])
                if result >= 0:
                    pending.pop(0)
                elif result != ADMIN_ACTION:
                    break  # held by the network: read, then write again
            image.poll(assembler.on_fragment, 1000)
            return len(got) == len(messages)
        wait_for(moved, "every message on the core", timeout_s=STARTUP_S, poll_s=0.001)
        assert got == messages
        stat = subprocess.run([sys.executable, "-m", "ramen.cli.main", "stat"], env=env_of(fresh_confserver, core_dir),
                              capture_output=True, text=True, timeout=STARTUP_S)
        assert stat.returncode == 0 and f"pid {core.pid}: netd core" in stat.stdout, stat.stdout
        assert "netd core receives" in stat.stdout and "rcv-pos" in stat.stdout
        image.close()
        publication.close()
    finally:
        logs = [stop(edge), stop(core)]
    assert endpoint(admin, "core") is None and endpoint(admin, "edge") is None
    assert "netd of site core receiving at aeron:udp?endpoint=127.0.0.1:" in logs[1]
    assert "Traceback" not in "".join(logs)


def test_a_netd_killed_and_started_again_listens_where_it_did_unless_that_port_is_taken(
        fresh_confserver, admin, tmp_path):
    env = env_of(fresh_confserver, tmp_path)
    first = start(env, "core")
    announced = wait_for(lambda: endpoint(admin, "core"), "core's endpoint announced", timeout_s=STARTUP_S)
    first.kill()  # its senders' publications, and the images it left, go on with the next one
    first.wait()
    again = start(env, "core")
    try:
        wait_for(lambda: (e := endpoint(admin, "core")) is not None and e.pid == again.pid or None,
                 "the new netd's endpoint", timeout_s=STARTUP_S)
        assert endpoint(admin, "core").channel == announced.channel
    finally:
        stop(again)
    port = int(announced.channel.rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", port))
        third = start(env, "core")
        try:
            moved = wait_for(lambda: (e := endpoint(admin, "core")) is not None and e.pid == third.pid and e or None,
                             "the third netd's endpoint", timeout_s=STARTUP_S)
            assert moved.channel != announced.channel
        finally:
            stop(third)


def test_a_bad_or_taken_listen_address_is_one_line_and_exit_1(fresh_confserver, tmp_path):
    env = env_of(fresh_confserver, tmp_path)
    bad = start(env, "edge", "--listen", "nowhere")
    assert bad.wait(STARTUP_S) == 1
    assert bad.stderr.read().strip().splitlines() == ["ramen: netd: --listen 'nowhere': expected HOST:PORT"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        busy = start(env, "edge", "--listen", f"127.0.0.1:{port}")
        assert busy.wait(STARTUP_S) == 1
        lines = busy.stderr.read().strip().splitlines()
    assert lines[-1].startswith(f"ramen: netd: cannot listen on 127.0.0.1:{port}: ") and "Traceback" not in lines


def _setup_flood(channel: str, stream_id: int, sessions: range, source: str = "127.0.0.1") -> None:
    from ramen.transport.udp.protocol import SetupFrame
    host, port = channel.rsplit("=", 1)[1].rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as intruder:
        intruder.bind((source, 0))
        for session in sessions:
            intruder.sendto(SetupFrame(0, session, stream_id, 0, 0, 65536, 1408).encode(), (host, int(port)))


def _receiver_counter(counters: CountersFile, name: str) -> int:
    found = [c.value for c in counters.counters() if c.label.startswith(f"{name}: receiver ")]
    return found[0] if found else -1


def test_a_setup_flood_on_a_received_stream_leaves_netd_running_with_its_images_and_counters_bounded(
        fresh_confserver, admin, tmp_path):
    from ramen.transport.udp.defaults import MAX_IMAGES_PER_STREAM
    env = env_of(fresh_confserver, tmp_path)
    netd = start(env, "core")
    try:
        announced = wait_for(lambda: endpoint(admin, "core"), "core's endpoint announced", timeout_s=STARTUP_S)
        admin.create(f"{keyspace.net_receives_prefix('core')}/p/f",
                     NetReceive(stream_id=STREAM, log=str(tmp_path / "received.logbuffer")).to_value())
        counters = CountersFile.open(tmp_path / "counters.dat")
        # The NetReceive applied (netd's `receives`), else the stream's SETUPs are not subscribed to yet.
        wait_for(lambda: any(c.label == "netd core receives" and c.value == 1 for c in counters.counters()),
                 "the stream subscribed to", timeout_s=STARTUP_S)

        _setup_flood(announced.channel, STREAM, range(9000, 9140))  # what took a site down

        wait_for(lambda: _receiver_counter(counters, "setups-received") == 140, "the flood read",
                 timeout_s=STARTUP_S)
        assert netd.poll() is None
        assert _receiver_counter(counters, "images") <= MAX_IMAGES_PER_STREAM
        assert _receiver_counter(counters, "images-evicted") == 140 - MAX_IMAGES_PER_STREAM
        held = sum(c.owner_id == netd.pid for c in counters.counters())
        assert held <= MAX_IMAGES_PER_STREAM * 7 + 30  # its images' counters and its own, whatever came
    finally:
        stderr = stop(netd)
    assert "Traceback" not in stderr


def test_a_netd_with_an_allow_list_drops_what_other_addresses_send(fresh_confserver, admin, tmp_path):
    env = env_of(fresh_confserver, tmp_path)
    netd = start(env, "core", "--allow", "127.0.0.1")
    try:
        announced = wait_for(lambda: endpoint(admin, "core"), "core's endpoint announced", timeout_s=STARTUP_S)
        admin.create(f"{keyspace.net_receives_prefix('core')}/p/f",
                     NetReceive(stream_id=STREAM, log=str(tmp_path / "received.logbuffer")).to_value())
        counters = CountersFile.open(tmp_path / "counters.dat")
        # The NetReceive applied (netd's `receives`), else the stream's SETUPs are not subscribed to yet.
        wait_for(lambda: any(c.label == "netd core receives" and c.value == 1 for c in counters.counters()),
                 "the stream subscribed to", timeout_s=STARTUP_S)

        _setup_flood(announced.channel, STREAM, range(9000, 9010), source="127.0.0.2")

        wait_for(lambda: _receiver_counter(counters, "garbage not-allowed") == 10, "the datagrams refused",
                 timeout_s=STARTUP_S)
        assert _receiver_counter(counters, "setups-received") == 0
    finally:
        stderr = stop(netd)
    assert "Traceback" not in stderr
    bad = start(env, "core", "--allow", "everyone")
    assert bad.wait(STARTUP_S) == 2
    assert "argument --allow: 'everyone' is not an address or a network (such as 10.0.0.0/8)" in bad.stderr.read()

"""What strangers who can reach a receiver's port can make it do (issue 47, section 1): a flood of
SETUPs of made-up sessions, datagrams from addresses the receiver does not take, SETUPs not signed
with the receiver's setup key, and a counters file that has no counter left for this process; over
real sockets, on a ManualClock."""

from __future__ import annotations

import os
import socket
from ipaddress import ip_network

from ramen.transport.counters import CountersFile
from ramen.transport.udp.defaults import IMAGE_READER_GRACE_NS, MAX_IMAGES_PER_STREAM
from ramen.transport.udp.protocol import SetupFrame
from ramen.transport.udp.setup_key import SetupKey
from tests.transport.udp.agent_rig import MTU, STREAM_ID, TERM_LENGTH, Rig

FLOOD_SETUPS = 140
"""As many SETUPs as took a whole site down: 140 datagrams of 40 bytes."""


def _flood(rig: Rig, intruder: socket.socket, sessions: range) -> None:
    endpoint = (rig.endpoint.host, rig.endpoint.port)
    for session in sessions:
        intruder.sendto(SetupFrame(0, session, STREAM_ID, 0, 0, TERM_LENGTH, MTU).encode(), endpoint)


def test_a_setup_flood_makes_no_more_images_than_a_stream_may_have_and_the_stream_goes_on(tmp_path):
    rig = Rig(tmp_path, count=300)
    intruder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) >= 50, 100_000)
        reader = rig.reader  # the real sender's image's; the flood's images get readers too
        _flood(rig, intruder, range(9000, 9000 + FLOOD_SETUPS))
        rig.run_until(lambda: len(reader.got) == 300, 100_000)
        for _ in range(100):  # the flood is read in full
            rig.tick()
        rig.clock.advance(IMAGE_READER_GRACE_NS / 1e9)  # ended images' readers have had their time
        rig.tick()

        assert reader.got == rig.expected
        receiver = f"receiver {rig.endpoint}"
        images = rig.counter("images", receiver)
        assert images <= MAX_IMAGES_PER_STREAM
        assert rig.counter("images-evicted", receiver) == FLOOD_SETUPS - (MAX_IMAGES_PER_STREAM - 1)
        assert rig.counter("setups-refused", receiver) == 0
        logs = list(rig.images_dir.rglob("*.logbuffer"))
        assert len(logs) <= MAX_IMAGES_PER_STREAM  # evicted images' files are removed with them
        image_counters = [c for c in rig.counters.counters() if c.type_name == "rcv-pos"]
        assert len(image_counters) == images
    finally:
        intruder.close()
        rig.close()


def test_datagrams_from_an_address_not_allowed_are_counted_and_dropped_undecoded(tmp_path):
    rig = Rig(tmp_path, count=200, allow=[ip_network("127.0.0.1/32")])
    intruder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    intruder.bind(("127.0.0.2", 0))  # another loopback address: not in the allow-list
    try:
        _flood(rig, intruder, range(9000, 9010))
        rig.run_until(lambda: rig.readers and len(rig.reader.got) == 200, 100_000)

        assert rig.reader.got == rig.expected
        receiver = f"receiver {rig.endpoint}"
        assert rig.counter("garbage", f"garbage not-allowed: {receiver}") == 10
        assert rig.counter("setups-received", receiver) >= 1
        assert [info.session_id for info in rig.receiver.images()] == [rig.pub_log.session_id]
    finally:
        intruder.close()
        rig.close()


def test_with_a_setup_key_a_signed_stream_goes_through_and_unsigned_setups_make_nothing(tmp_path):
    key = SetupKey(b"the sites' shared secret")
    rig = Rig(tmp_path, count=300, sender_key=key, receiver_key=key)
    intruder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) >= 50, 100_000)
        _flood(rig, intruder, range(9000, 9000 + FLOOD_SETUPS))
        session = rig.pub_log.session_id  # and one of the real session, a term past it: it would end the image
        intruder.sendto(SetupFrame(0, session, STREAM_ID, 0, 5, TERM_LENGTH, MTU).encode(),
                        (rig.endpoint.host, rig.endpoint.port))
        rig.run_until(lambda: len(rig.reader.got) == 300, 100_000)

        assert rig.reader.got == rig.expected and len(rig.readers) == 1
        receiver = f"receiver {rig.endpoint}"
        assert rig.counter("images", receiver) == 1
        assert rig.counter("setups-refused", receiver) == FLOOD_SETUPS + 1
        assert len([c for c in rig.counters.counters() if c.type_name == "rcv-pos"]) == 1
    finally:
        intruder.close()
        rig.close()


def test_a_sender_without_the_receivers_setup_key_gets_no_image(tmp_path):
    rig = Rig(tmp_path, count=10, receiver_key=SetupKey(b"the sites' shared secret"))
    try:
        receiver = f"receiver {rig.endpoint}"
        rig.run_until(lambda: rig.counter("setups-refused", receiver) >= 2, 100_000)  # its SETUP, and its retry
        assert rig.readers == [] and rig.counter("images", receiver) == 0
    finally:
        rig.close()


def test_an_image_whose_counters_the_file_refuses_goes_on_with_them_in_memory(tmp_path, caplog):
    path = tmp_path / "counters.dat"
    CountersFile.open(path, capacity=256).close()
    bounded = CountersFile.open(path)  # the receiver agent's mapping: this process's share, 64
    # The rest of the rig (writer, sender, reader) stands for other processes: an unbounded mapping.
    rig = Rig(tmp_path, count=200, process_share=1.0, receiver_counters=bounded)
    filler = []
    try:
        while sum(c.owner_id == os.getpid() for c in rig.counters.counters()) < bounded.process_limit:
            filler.append(rig.counters.allocate(0, "filler"))
        rig.run_until(lambda: rig.readers and len(rig.reader.got) == 200, 100_000)

        assert rig.reader.got == rig.expected
        assert not any(c.type_name == "rcv-pos" for c in rig.counters.counters())
        group = rig.receiver.image_counters(rig.receiver.images()[0])
        assert group.get("rcv-pos") == rig.publication.position  # counted, in memory
        warnings = [r.getMessage() for r in caplog.records if "kept in memory" in r.getMessage()]
        assert len(warnings) == 1 and "its share" in warnings[0]
    finally:
        for counter in filler:
            counter.close()
        rig.close()
        bounded.close()

"""NetworkSender and NetworkReceiver over real UDP sockets on 127.0.0.1 through datagram_io, in one
thread: the sender's views of its log go out by GSO (or one sendto each), the receiver takes GRO
batches whole (on_datagrams) or datagram by datagram, and the reader gets every message once, in
order, with no loss or duplicate on the way."""

from __future__ import annotations

import random

import pytest

from ramen.clocks import ManualClock
from ramen.transport import ExclusivePublication, FragmentAssembler, Image, LogBuffer, LogBufferParams
from ramen.transport.udp import datagram_io
from ramen.transport.udp.protocol import NakFrame, StatusMessage, frames_of
from ramen.transport.udp.receiver import NetworkReceiver
from ramen.transport.udp.sender import NetworkSender

TERM_LENGTH, MTU, SESSION, STREAM = 65536, 1408, 31, 32
MESSAGES = 1500
TICK_S = 0.0001
MAX_CYCLES = 200_000
"""Bound on duty cycles: a stream that never completes fails the test, never hangs it."""


@pytest.mark.parametrize("gso", [True, False], ids=["gso-gro", "plain"])
def test_every_message_crosses_loopback_once_and_in_order(tmp_path, gso):
    clock = ManualClock()
    log = LogBuffer.create(tmp_path / "pub.logbuffer", LogBufferParams(
        term_length=TERM_LENGTH, mtu_length=MTU, session_id=SESSION, stream_id=STREAM))
    publication = ExclusivePublication(log)
    sender = NetworkSender(log, clock=clock, views=True, max_datagrams_per_work=datagram_io.MAX_GSO_SEGMENTS)
    receiver = NetworkReceiver(tmp_path, receiver_id=5, clock=clock)
    receiver.add_subscription(STREAM)
    sender_sock = datagram_io.open_socket(("127.0.0.1", 0), gro=False)
    receiver_sock = datagram_io.open_socket(("127.0.0.1", 0), gro=gso)
    rng = random.Random(3)
    messages = [rng.randbytes(rng.choice([8, 32, 100, 1000, 3000, 8000])) for _ in range(MESSAGES)]
    got: list[bytes] = []
    assembler = FragmentAssembler(
        lambda buffer, offset, length, header: got.append(bytes(buffer[offset:offset + length])))
    buffer = memoryview(bytearray(datagram_io.RECEIVE_SLOT_BYTES))
    control = bytearray(4 * datagram_io.RECEIVE_SLOT_BYTES)
    image = None
    written = batches = 0
    try:
        for _ in range(MAX_CYCLES):
            clock.advance(TICK_S)
            while written < MESSAGES and sender.is_connected \
                    and publication.position + len(messages[written]) < sender.publisher_limit:
                if publication.offer(messages[written]) > 0:
                    written += 1
            out = sender.do_work()
            sent = 0
            while sent < len(out):
                sent += datagram_io.send_datagrams(sender_sock, out[sent:], receiver_sock.getsockname(), gso=gso)
            out = None  # views of the log, let go once sent
            while (received := datagram_io.receive_segments(receiver_sock, buffer)) is not None:
                length, segment_size, _ = received
                batches += segment_size < length
                receiver.on_datagrams(buffer[:length], segment_size)
            ours = receiver.image(SESSION, STREAM)
            if ours is not None:
                if image is None:
                    image = Image(ours.log, join_position=ours.join_position)
                while image.poll(assembler.on_fragment, 64):
                    pass
                receiver.consumed_to(SESSION, STREAM, image.position)
            answers = receiver.do_work()
            if answers:
                datagram_io.send_datagrams(receiver_sock, answers, sender_sock.getsockname(), gso=False)
            for datagram, _ in datagram_io.receive_datagrams(sender_sock, control, 64):
                for item in frames_of(datagram):
                    if isinstance(item, StatusMessage):
                        sender.on_status(item)
                    elif isinstance(item, NakFrame):
                        sender.on_nak(item)
            if len(got) == MESSAGES:
                break
        assert got == messages
        assert ours.frames_duplicate == ours.frames_over_run == 0 and receiver.garbage == {}
        assert receiver.naks_sent == 0 and sender.retransmits == 0
        if gso and datagram_io.gso_supported() and datagram_io.gro_supported():
            assert batches > 0  # some receives were GRO batches of several datagrams
        else:
            assert batches == 0
    finally:
        if image is not None:
            image.close()
        receiver.close()
        sender_sock.close()
        receiver_sock.close()

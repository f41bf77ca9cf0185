"""datagram_io over real sockets on 127.0.0.1: every datagram arrives as it was sent (its bytes and
its boundaries), by GSO/GRO batches where the kernel has them and by the plain path when forced."""

from __future__ import annotations

import select

import pytest

from ramen.transport.udp import datagram_io
from ramen.transport.udp.datagram_io import (MAX_GSO_SEGMENTS, RECEIVE_SLOT_BYTES, open_socket, receive_datagrams,
                                             receive_segments, send_datagrams)

WAIT_S = 5.0
"""Bound on waiting for datagrams already sent on loopback: a lost one fails the test, never hangs it."""

needs_gso = pytest.mark.skipif(not (datagram_io.gso_supported() and datagram_io.gro_supported()),
                               reason="this kernel has no UDP GSO/GRO")


@pytest.fixture
def pair():
    """(sender socket, receiver socket with GRO, receiver socket without GRO)."""
    sockets = [open_socket(("127.0.0.1", 0), gro=False), open_socket(("127.0.0.1", 0), gro=True),
               open_socket(("127.0.0.1", 0), gro=False)]
    yield sockets
    for sock in sockets:
        sock.close()


def datagrams_of(sizes: list[int]) -> list[bytes]:
    """Distinct datagrams of these sizes: each byte says which datagram and where in it."""
    return [bytes((i * 7 + j) & 0xFF for j in range(size)) for i, size in enumerate(sizes)]


def receive_all(sock, count: int) -> list[bytes]:
    buffer = bytearray(4 * RECEIVE_SLOT_BYTES)
    got: list[bytes] = []
    while len(got) < count:
        readable, _, _ = select.select([sock], [], [], WAIT_S)
        assert readable, f"{len(got)} of {count} datagrams arrived"
        got += [bytes(view) for view, _ in receive_datagrams(sock, buffer, count - len(got))]
    return got


@pytest.mark.parametrize("gso", [True, False], ids=["gso", "plain"])
@pytest.mark.parametrize("gro", [True, False], ids=["gro", "no-gro"])
@pytest.mark.parametrize("sizes", [
    [1408] * 10,
    [1408] * 9 + [896],  # a 64 KiB message's last fragment: the last segment shorter
    [1408, 1408, 96, 1408, 64, 64, 64, 65504, 32, 1408],  # unequal sizes: several runs
    [1408] * (MAX_GSO_SEGMENTS + 5),  # more than one GSO send
    [64] * (2 * MAX_GSO_SEGMENTS),
], ids=["equal", "last-shorter", "unequal", "past-max-segments", "small"])
def test_every_datagram_arrives_whole_and_in_order(pair, sizes, gso, gro):
    sender, with_gro, without_gro = pair
    receiver = with_gro if gro else without_gro
    sent = datagrams_of(sizes)
    assert send_datagrams(sender, sent, receiver.getsockname(), gso=gso) == len(sent)
    assert receive_all(receiver, len(sent)) == sent


def test_memoryview_slices_of_one_buffer_are_sent_without_joining(pair):
    sender, receiver, _ = pair
    term = bytearray(range(256)) * 64
    views = [memoryview(term)[at:at + 1024] for at in range(0, 8 * 1024, 1024)] + [memoryview(term)[9000:9100]]
    assert send_datagrams(sender, views, receiver.getsockname()) == len(views)
    assert receive_all(receiver, len(views)) == [bytes(view) for view in views]


@needs_gso
def test_a_gso_send_reaches_a_gro_socket_as_one_batch_of_its_segment_size(pair):
    sender, receiver, _ = pair
    sent = datagrams_of([1408] * 20 + [500])
    assert send_datagrams(sender, sent, receiver.getsockname()) == len(sent)
    select.select([receiver], [], [], WAIT_S)
    length, segment_size, address = receive_segments(receiver, memoryview(bytearray(RECEIVE_SLOT_BYTES)))
    assert (length, segment_size) == (20 * 1408 + 500, 1408)
    assert address == sender.getsockname()


@needs_gso
def test_forced_plain_path_sends_one_datagram_a_call(pair):
    sender, receiver, _ = pair
    sent = datagrams_of([1408] * 5)
    assert send_datagrams(sender, sent, receiver.getsockname(), gso=False) == len(sent)
    buffer = memoryview(bytearray(RECEIVE_SLOT_BYTES))
    for expected in sent:
        select.select([receiver], [], [], WAIT_S)
        length, segment_size, _ = receive_segments(receiver, buffer)
        assert (length, segment_size) == (1408, 1408)
        assert bytes(buffer[:length]) == expected


def test_nothing_waiting_receives_nothing(pair):
    _, receiver, _ = pair
    assert receive_segments(receiver, memoryview(bytearray(RECEIVE_SLOT_BYTES))) is None
    assert receive_datagrams(receiver, bytearray(RECEIVE_SLOT_BYTES), 10) == []


def test_receive_stops_at_max_count_and_leaves_the_rest_waiting(pair):
    sender, _, receiver = pair  # without GRO: one datagram a receive
    sent = datagrams_of([100] * 6)
    send_datagrams(sender, sent, receiver.getsockname())
    select.select([receiver], [], [], WAIT_S)
    first = [bytes(view) for view, _ in receive_datagrams(receiver, bytearray(8 * RECEIVE_SLOT_BYTES), 4)]
    assert first == sent[:4]
    assert receive_all(receiver, 2) == sent[4:]


def test_a_connected_socket_sends_without_an_address(pair):
    sender, receiver, _ = pair
    sender.connect(receiver.getsockname())
    sent = datagrams_of([1408] * 3 + [10])
    assert send_datagrams(sender, sent) == len(sent)
    assert receive_all(receiver, len(sent)) == sent

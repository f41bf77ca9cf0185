"""NetworkSender and NetworkReceiver back to back (no sockets) over a seeded lossy link: DATA
datagrams dropped, every datagram possibly duplicated and delayed (so reordered); the receiver's
NAKs make the sender resend, and the reader gets every message exactly once, in order."""

from __future__ import annotations

import heapq
import random

import pytest

from ramen.clocks import ManualClock
from ramen.transport import ExclusivePublication, FragmentAssembler, Image, LogBuffer, LogBufferParams
from ramen.transport.udp.defaults import NAK_UNICAST_DELAY_NS
from ramen.transport.udp.protocol import DataFrame, NakFrame, RttMeasurement, StatusMessage, frames_of
from ramen.transport.udp.receiver import NetworkReceiver
from ramen.transport.udp.sender import NetworkSender
from tests.vectors import LOGBUFFER_LENS, expected_payload

TERM_LENGTH, MTU, SESSION_ID, STREAM_ID = 65536, 1408, 888, 1003
MESSAGES = 400
"""545216 bytes of frames: over eight terms, with 8 PADs."""
TICK_NS = 50_000
MAX_DELAY_NS = 300_000
"""A datagram takes 0..this on the link: those sent within it of each other may arrive swapped."""
DUPLICATE_RATE = 0.05
RECEIVER_ID = 77


class Link:
    """One direction of the lossy link: datagrams due at a time, in order of that time."""

    def __init__(self, rng: random.Random, loss: float, max_delay_ns: int) -> None:
        self.rng, self.loss, self.max_delay_ns = rng, loss, max_delay_ns
        self.queue: list[tuple[int, int, bytes]] = []
        self.count = 0
        self.dropped = 0

    def send(self, now: int, datagram: bytes) -> None:
        if self.loss and isinstance(frames_of(datagram)[0], DataFrame) and self.rng.random() < self.loss:
            self.dropped += 1
            return
        for _ in range(2 if self.max_delay_ns and self.rng.random() < DUPLICATE_RATE else 1):
            self.count += 1
            delay = self.rng.randrange(self.max_delay_ns) if self.max_delay_ns else 0
            heapq.heappush(self.queue, (now + delay, self.count, datagram))

    def due(self, now: int) -> list[bytes]:
        out = []
        while self.queue and self.queue[0][0] <= now:
            out.append(heapq.heappop(self.queue)[2])
        return out


def run(tmp_path, loss: float, seed: int, max_delay_ns: int = MAX_DELAY_NS):
    clock = ManualClock()
    pub_log = LogBuffer.create(tmp_path / "pub.logbuffer", LogBufferParams(
        term_length=TERM_LENGTH, mtu_length=MTU, session_id=SESSION_ID, stream_id=STREAM_ID))
    publication = ExclusivePublication(pub_log)
    sender = NetworkSender(pub_log, clock=clock)
    receiver = NetworkReceiver(tmp_path, receiver_id=RECEIVER_ID, clock=clock)
    receiver.add_subscription(STREAM_ID)
    rng = random.Random(seed)
    forward, back = Link(rng, loss, max_delay_ns), Link(rng, 0.0, max_delay_ns)
    expected = [expected_payload(i, LOGBUFFER_LENS) for i in range(MESSAGES)]
    got: list[bytes] = []
    assembler = FragmentAssembler(lambda buffer, offset, length, header: got.append(bytes(buffer[offset:offset + length])))
    image = None
    first_seen: dict[tuple[int, int], int] = {}
    nak_delays: list[int] = []
    written = 0
    for _ in range(400_000):  # bounded: a stream that never completes fails, not hangs
        clock.advance(TICK_NS / 1e9)
        now = clock.nanos()
        while written < MESSAGES and sender.is_connected and publication.position < sender.publisher_limit:
            if publication.offer(expected[written]) <= 0:
                break
            written += 1
        for datagram in sender.do_work(now):
            forward.send(now, datagram)
        for datagram in forward.due(now):
            receiver.on_datagram(datagram, now)
        ours = receiver.image(SESSION_ID, STREAM_ID)
        if ours is not None:
            if image is None:
                image = Image(ours.log, join_position=ours.join_position)
            for gap in ours.rebuilder.gaps():
                first_seen.setdefault((gap.term_id, gap.term_offset), now)
        for datagram in receiver.do_work(now):
            for item in frames_of(datagram):
                if isinstance(item, NakFrame):
                    nak_delays.append(now - first_seen[(item.term_id, item.term_offset)])
            back.send(now, datagram)
        for datagram in back.due(now):
            for item in frames_of(datagram):
                if isinstance(item, StatusMessage):
                    sender.on_status(item)
                elif isinstance(item, NakFrame):
                    sender.on_nak(item)
                elif isinstance(item, RttMeasurement):
                    sender.on_rttm(item)
        if image is not None:
            while image.poll(assembler.on_fragment, 16):
                pass
            receiver.consumed_to(SESSION_ID, STREAM_ID, image.position)
        if len(got) == MESSAGES:
            break
    return got, expected, receiver, sender, forward, nak_delays


@pytest.mark.parametrize("loss,seed", [(0.0, 1), (0.05, 2), (0.05, 3), (0.20, 4), (0.20, 5)])
def test_every_message_arrives_exactly_once_and_in_order_through_loss_duplicates_and_reordering(
        tmp_path, loss, seed):
    got, expected, receiver, sender, forward, nak_delays = run(tmp_path, loss, seed)
    assert len(got) == MESSAGES
    assert got == expected
    assert receiver.garbage == {}
    if loss:
        assert forward.dropped > 0
        assert receiver.loss_gaps > 0 and receiver.naks_sent >= receiver.loss_gaps // 2
        assert sender.retransmits > 0
        # Every NAK went out at least the unicast delay after its gap was first seen.
        assert nak_delays and min(nak_delays) >= NAK_UNICAST_DELAY_NS
    else:
        # Reordered past the NAK delay, a late datagram looks lost for a while: NAKs may go, and the
        # resends they cause arrive as duplicates, which change nothing.
        assert forward.dropped == 0


def test_an_ordered_lossless_link_sends_no_nak(tmp_path):
    got, expected, receiver, sender, forward, nak_delays = run(tmp_path, 0.0, 6, max_delay_ns=0)
    assert got == expected
    assert receiver.naks_sent == receiver.loss_gaps == sender.retransmits == 0
    assert receiver.status_messages_sent >= 545216 // (32768 // 4) // 2

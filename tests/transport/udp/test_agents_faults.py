"""The agents' faults over real sockets (issue 23, section 3): flow control by a slow reader seen on
the wire, a receiver that restarts and rejoins, a sender that dies, garbage to both sockets; and
the sender's connection, linger and unreachable rules, on a ManualClock."""

from __future__ import annotations

import random
import socket
import struct
from pathlib import Path

from ramen.transport import BACK_PRESSURED, NOT_CONNECTED, Image, LogBuffer
from ramen.transport import counters as ctr
from ramen.transport.frame import EOS_FLAG, HDR_TYPE_DATA
from ramen.transport.udp import protocol
from ramen.transport.udp.channel import Address, UdpChannel
from ramen.transport.udp.defaults import (IMAGE_LIVENESS_TIMEOUT_NS, PUBLICATION_CONNECTION_TIMEOUT_NS,
                                          PUBLICATION_LINGER_NS, RECEIVER_WINDOW_MAX_BYTES, SETUP_RETRY_NS,
                                          UNREAD_IMAGE_HOLD_NS)
from ramen.transport.udp.receiver_agent import ReceiverAgent
from ramen.transport.udp.protocol import (DataFrame, SetupFrame, StatusMessage, WireError, data_frame, frames_of)
from ramen.transport.udp.sender_agent import SenderAgent
from tests.transport.udp.agent_rig import MTU, SESSION_ID, STREAM_ID, TERM_LENGTH, TICK_S, Faults, Reader, Rig, sm_limit

WINDOW = min(RECEIVER_WINDOW_MAX_BYTES, TERM_LENGTH // 2)


def frames(datagram: bytes) -> list:
    try:
        return frames_of(datagram)
    except WireError:
        return []


def test_publication_is_not_connected_before_the_first_sm_and_back_pressured_at_snd_pos_plus_half_a_term(tmp_path):
    rig = Rig(tmp_path, count=400, backward=Faults(loss=1.0))  # every SM lost: the sender hears nothing
    try:
        for _ in range(3):
            rig.clock.advance(SETUP_RETRY_NS / 1e9)
            rig.tick(read=False)
        assert rig.publication.offer(b"x") == NOT_CONNECTED
        assert rig.written == 0 and set(rig.offer_results) == {NOT_CONNECTED}
        assert rig.counter("setups-sent") >= 3
        assert not rig.has_counter("sub-pos", "->")  # the sender takes no part before an SM
        rig.proxy.backward.faults.loss = 0.0
        # The reader never reads: the receiver's window (32 KiB) stops the sender, the sender's
        # position stops the writer half a term past it.
        rig.run_until(lambda: rig.offer_results[-1] == BACK_PRESSURED, 20_000, read=False)
        for _ in range(100):
            rig.tick(read=False)
        snd_pos = rig.counter("snd-pos")
        assert WINDOW - 8192 - 32 < snd_pos <= WINDOW == rig.counter("snd-lmt")
        assert rig.counter("sub-pos", "->") == snd_pos
        assert rig.counter("pub-lmt") == snd_pos + TERM_LENGTH // 2
        assert snd_pos + TERM_LENGTH // 2 <= rig.publication.position < snd_pos + TERM_LENGTH // 2 + 8192 + 32 * 8
        assert rig.publication.offer(b"x") == BACK_PRESSURED
    finally:
        rig.close()


def test_a_slow_reader_holds_the_sender_within_a_window_of_the_last_sm_and_back_pressures_the_writer(tmp_path):
    rig = Rig(tmp_path, seed=4, count=300, forward=Faults(duplicate=0.05, max_delay_cycles=2))
    rig.reader_fragments = 1  # one fragment a duty cycle: far slower than the writer
    sm_limits = [0]
    over = []
    ends = []

    def on_sm(datagram: bytes) -> None:
        limit = sm_limit(rig, datagram)
        if limit is not None:
            sm_limits.append(max(sm_limits[-1], limit))

    def on_data(datagram: bytes) -> None:
        for item in frames(datagram):
            if isinstance(item, DataFrame) and not item.is_heartbeat:
                end = rig.position(item.term_id, item.term_offset) + (32 if item.is_pad else item.wire_length)
                ends.append(end - sm_limits[-1])
                if end > sm_limits[-1]:
                    over.append((end, sm_limits[-1]))

    # Backward datagrams are delivered as they come (no delay): what the proxy saw is what the
    # sender was told, so a DATA frame past the last SM's limit would be the sender's fault.
    rig.proxy.backward.observers.append(on_sm)
    rig.proxy.forward.observers.append(on_data)
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) == 300, 200_000)
        assert rig.reader.got == rig.expected
        assert over == []
        assert max(ends) > -MTU  # the sender did go up to its limit: the check above had teeth
        assert rig.offer_results.count(BACK_PRESSURED) > 0
        assert rig.counter("snd-bpe") > 0
    finally:
        rig.close()


class UnreadRig(Rig):
    """Images nobody reads: their worker is not started, or died."""

    def new_receiver(self) -> ReceiverAgent:
        self.images_seen = []
        return ReceiverAgent(self.images_dir, self.counters, clock=self.clock, receiver_id=77,
                             on_image=self.images_seen.append)


def test_an_image_nobody_reads_holds_its_sender_for_a_while_then_never_holds_it(tmp_path):
    rig = UnreadRig(tmp_path, seed=6, count=600)  # 600 messages: more than a window and half a term
    try:
        rig.run_until(lambda: rig.offer_results and rig.offer_results[-1] == BACK_PRESSURED, 100_000)
        for _ in range(2000):  # 0.1 s: the sender fills the window nobody reads, the writer its term window
            rig.tick()
        held_at = rig.written
        step_s = 0.5
        for _ in range(int(UNREAD_IMAGE_HOLD_NS / 1e9 / step_s) - 1):  # just short of the hold
            rig.clock.advance(step_s)
            for _ in range(20):
                rig.tick()
        assert rig.written == held_at and rig.publication.offer(b"x") == BACK_PRESSURED
        rig.clock.advance(step_s)
        rig.run_until(lambda: rig.written == len(rig.expected), 100_000)
        rig.run_until(lambda: rig.counter("snd-pos") == rig.publication.position, 100_000)
    finally:
        rig.close()


def test_an_image_held_for_its_readers_waits_for_them_all_however_long_and_each_reads_it_whole(tmp_path):
    """A replayer's stream (NetReceive.readers): a window of it may come before its readers, the
    rest waits for them all, past the hold of an image nobody reads; each reads from the image's start."""
    rig = UnreadRig(tmp_path, seed=7, count=600, hold_for_readers=2)
    try:
        rig.run_until(lambda: rig.offer_results and rig.offer_results[-1] == BACK_PRESSURED, 100_000)
        for _ in range(2000):
            rig.tick()
        held_at = rig.written
        assert held_at < len(rig.expected)
        for _ in range(3):  # three times the hold of an image nobody reads
            rig.clock.advance(UNREAD_IMAGE_HOLD_NS / 1e9)
            for _ in range(20):
                rig.tick()
        assert rig.written == held_at and rig.counter("snd-pos") <= WINDOW
        (info,) = rig.images_seen
        rig.readers.append(Reader(info, rig.counters, rig.clock))
        for _ in range(200):  # one reader of the two: still held
            rig.tick()
        assert rig.written == held_at and rig.counter("snd-pos") <= WINDOW
        rig.readers.append(Reader(info, rig.counters, rig.clock))
        rig.run_until(lambda: all(len(r.got) == len(rig.expected) for r in rig.readers), 200_000)
        assert [r.got for r in rig.readers] == [rig.expected, rig.expected]
    finally:
        rig.close()


IMAGE_LOG = Path("in") / "stream.logbuffer"
"""Where the tests of receivers that come after others put the stream's images (add_subscription's image_log)."""


def read_a_hundred(rig: Rig) -> Reader:
    """The reader of the rig's image, once it read a hundred messages."""
    rig.run_until(lambda: rig.readers and len(rig.reader.got) >= 100, 100_000)
    return rig.reader


def test_a_receiver_that_restarts_rejoins_at_the_senders_position_and_the_stream_goes_on(tmp_path):
    rig = Rig(tmp_path, seed=5, count=400)
    setups = []
    setup_requests = []
    rig.proxy.forward.observers.append(
        lambda d: setups.extend(rig.position(i.active_term_id, i.term_offset) for i in frames(d)
                                if isinstance(i, SetupFrame)))
    rig.proxy.backward.observers.append(
        lambda d: setup_requests.extend(i for i in frames(d) if isinstance(i, StatusMessage) and i.is_setup_request))
    try:
        first = read_a_hundred(rig)
        old_log = first.info.log_path
        rig.receiver.close()
        rig.receiver = None
        assert not old_log.exists()  # the agent's files go with it; the reader keeps its mapping
        rig.run_until(lambda: first.image.is_end_of_stream, 10_000)  # what was rebuilt, then the end
        assert first.got == rig.expected[:len(first.got)]
        for _ in range(100):  # the sender goes on alone for a while, its datagrams lost
            rig.tick()
        assert setups == [0] and setup_requests == []
        rig.receiver = rig.new_receiver()
        rig.receiver.add_subscription(UdpChannel(endpoint=rig.endpoint), STREAM_ID)
        rig.run_until(lambda: len(rig.readers) == 2 and rig.written == 400 and rig.reader.got
                      and rig.reader.got[-1] == rig.expected[-1], 200_000)
        second = rig.reader
        # SEND_SETUP -> SETUP at the sender's position -> a new image there.
        assert setup_requests and len(setups) == 2 and second.info.join_position == setups[1]
        assert second.info.join_position >= first.image.position
        start = rig.expected.index(second.got[0])
        assert start >= len(first.got)
        assert second.got == rig.expected[start:]
    finally:
        rig.close()


def kill_receiver(rig: Rig) -> None:
    """The receiver's process dies while datagrams are on their way to it: the kernel closes its
    socket, and what it had not read yet is lost; its counters are reclaimed, as a dead process's
    are; nothing of it ends its images."""
    def in_flight() -> bool:
        return rig.network_publication.sender.sender_position > rig.reader.log.producer_position()
    for _ in range(10_000):
        rig.clock.advance(TICK_S)
        rig.write()
        rig.sender.do_work()
        rig.proxy.do_work()  # into the receiver's socket
        if in_flight():
            break
        rig.tick(write=False)
    assert in_flight()
    for endpoint in rig.receiver._endpoints.values():
        endpoint.sock.close()
        for image in endpoint.images.values():
            image.counters.close()
        endpoint.counters.close()
    rig.receiver = None


def restart_receiver(rig: Rig) -> None:
    rig.receiver = rig.new_receiver()
    rig.receiver.add_subscription(UdpChannel(endpoint=rig.endpoint), STREAM_ID, image_log=rig.image_log)


def test_a_receiver_that_dies_is_followed_by_one_that_goes_on_in_its_log_and_its_reader_loses_nothing(tmp_path):
    rig = Rig(tmp_path, seed=6, count=400, image_log=tmp_path / IMAGE_LOG)
    try:
        first = read_a_hundred(rig)
        inode = rig.image_log.stat().st_ino
        kill_receiver(rig)
        published = first.log.producer_position()
        for _ in range(100):  # the sender goes on alone up to its limit, those datagrams lost
            rig.tick()
        assert rig.written > len(first.got) and not first.image.is_end_of_stream
        sent = rig.counter("snd-pos")

        restart_receiver(rig)
        rig.run_until(lambda: rig.written == 400 and len(first.got) == 400, 200_000)

        assert first.got == rig.expected  # every message once, in order, through the same mapping
        assert rig.image_log.stat().st_ino == inode
        resumed = rig.reader
        assert resumed is not first and resumed.info.log_path == rig.image_log
        assert published <= resumed.info.join_position < sent  # from where the dead one rebuilt to
        assert rig.counter("images-resumed") == 1 and rig.counter("retransmits") > 0
    finally:
        rig.close()


class LocalReader:
    """A reader of the writer's own log (an archiver, a local child): the writer stays connected
    without the sender, and goes on when the sender no longer holds it."""

    def __init__(self, rig: Rig) -> None:
        self.log = LogBuffer.open(rig.pub_log.path)
        self.image = Image(self.log, rig.counters, clock=rig.clock)

    def poll(self, fragments: int = 64) -> int:
        return self.image.poll(lambda *fragment: None, fragments)

    def close(self) -> None:
        self.image.close()
        self.log.close()


class PacedRig(Rig):
    """A writer of a message a duty cycle, as a live function writes: never a term within the
    10 ms (200 duty cycles) its publication takes to see a new subscriber's position."""

    def write(self) -> None:
        if self.written < len(self.expected) and self.publication.offer(self.expected[self.written]) > 0:
            self.written += 1


def test_a_receiver_gone_while_its_writer_ran_a_term_past_the_sender_gets_a_new_image_there_and_goes_on(tmp_path):
    rig = PacedRig(tmp_path, seed=8, count=3000, term_length=1 << 20, image_log=tmp_path / IMAGE_LOG)
    rig.readers.append(LocalReader(rig))
    try:
        rig.run_until(lambda: len(rig.readers) == 2 and len(rig.reader.got) >= 100, 100_000)
        first = rig.reader
        kill_receiver(rig)
        sender = rig.network_publication.sender
        for _ in range(2000):  # 10 s: past the connection timeout, the writer held by its local reader only
            rig.clock.advance(0.005)
            rig.tick()
        assert rig.written < len(rig.expected)

        restart_receiver(rig)
        # Without the skip, the new image went on from the dead one's log, and the sender's log no
        # longer held the gap: the stream stood still for ever.
        rig.run_until(lambda: rig.written == len(rig.expected) and len(rig.readers) == 3 and rig.reader.got
                      and rig.reader.got[-1] == rig.expected[-1], 100_000)

        assert sender.skips >= 1
        second = rig.reader
        assert second.info.join_position == sender.skipped_to
        start = rig.expected.index(second.got[0])
        assert first.got == rig.expected[:len(first.got)] and start > len(first.got)
        assert second.got == rig.expected[start:]  # the stream goes on, whole from where it skipped to
        assert rig.counter("skipped-bytes") == sender.skipped_bytes > 0
        assert rig.counter("images-resumed") == 0
    finally:
        rig.close()


def test_a_receiver_that_stopped_cleanly_ended_its_log_and_the_next_makes_a_new_image(tmp_path):
    rig = Rig(tmp_path, seed=7, count=400, image_log=tmp_path / IMAGE_LOG)
    try:
        first = read_a_hundred(rig)
        rig.receiver.close()
        rig.run_until(lambda: first.image.is_end_of_stream, 10_000)
        restart_receiver(rig)
        rig.run_until(lambda: len(rig.readers) == 2 and rig.written == 400 and rig.reader.got
                      and rig.reader.got[-1] == rig.expected[-1], 200_000)
        assert rig.counter("images-resumed") == 0
        second = rig.reader
        start = rig.expected.index(second.got[0])
        assert start >= len(first.got) and second.got == rig.expected[start:]
    finally:
        rig.close()


def test_a_sender_that_dies_leaves_an_image_that_ends_cleanly_after_the_liveness_timeout(tmp_path):
    rig = Rig(tmp_path, seed=6, count=150)
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) == 150, 100_000)
        reader = rig.reader
        log_path = reader.info.log_path
        rig.sender.close()  # no EOS, nothing more on the wire
        step_s = 0.5
        for _ in range(int(IMAGE_LIVENESS_TIMEOUT_NS / 1e9 / step_s) - 1):
            rig.clock.advance(step_s)
            rig.tick(write=False)
        assert rig.ended == [] and not reader.image.is_end_of_stream  # 9.5 s: not yet
        for _ in range(3):
            rig.clock.advance(step_s)
            rig.tick(write=False)
        assert rig.ended == [reader.info]
        assert reader.image.is_end_of_stream and reader.got == rig.expected
        assert rig.receiver.images() == [] and not rig.has_counter("rcv-pos")
        assert log_path.exists()  # its reader is still there
        reader.close()
        rig.tick(write=False)
        assert not log_path.exists()
    finally:
        rig.close()


def test_a_sender_back_after_its_image_timed_out_gets_a_new_image_where_the_old_one_stopped(tmp_path):
    # As ramen start restarts a netd killed again and again: 10 s later, past the liveness timeout.
    rig = Rig(tmp_path, seed=9, count=400, image_log=tmp_path / IMAGE_LOG)
    try:
        first = read_a_hundred(rig)
        rig.write()  # in the log, never sent: the sender dies
        rig.sender.close()
        assert rig.written > len(first.got)
        for _ in range(25):
            rig.clock.advance(0.5)
            rig.tick(write=False)
        assert rig.ended == [first.info] and first.image.is_end_of_stream
        stopped = first.image.position

        rig.sender = SenderAgent(rig.counters, clock=rig.clock)  # the netd restarted
        rig.network_publication = rig.sender.add_publication(rig.pub_log.path,
                                                             UdpChannel(endpoint=rig.proxy.address, mtu=MTU))
        assert rig.network_publication.sender.sender_position > stopped
        rig.run_until(lambda: rig.written == 400 and len(rig.readers) == 2 and rig.reader.got
                      and rig.reader.got[-1] == rig.expected[-1], 200_000)

        second = rig.reader
        assert second.info.join_position == stopped and second.info.log_path == rig.image_log
        assert first.got + second.got == rig.expected  # every message once, in order
        assert rig.counter("images-rejoined") == 1
    finally:
        rig.close()


def _receiver_garbage(rig: Rig) -> list[bytes]:
    setup = SetupFrame(0, SESSION_ID, STREAM_ID, 0, 0, TERM_LENGTH, MTU).encode()
    rng = random.Random(7)
    return [
        b"\x01\x02\x03",  # shorter than a header
        setup[:20],  # a SETUP cut short
        struct.pack("<iBBH", 8, 0, 0, 0x77),  # an unknown type
        struct.pack("<iBBH", 40, 9, 0, protocol.HDR_TYPE_SETUP) + bytes(32),  # a wrong version
        data_frame(0, 0, SESSION_ID + 1, STREAM_ID, b"wrong session").encode(),
        StatusMessage(SESSION_ID, STREAM_ID, 0, 0, WINDOW, 1).encode(),  # a sender's frame
        bytes(rng.getrandbits(8) for _ in range(333)),
        struct.pack("<iBBH", 9999, 0, 0, HDR_TYPE_DATA) + bytes(24),  # a length past the datagram
    ]


def test_garbage_to_both_agents_is_counted_by_kind_and_dropped_and_the_stream_goes_on(tmp_path):
    rig = Rig(tmp_path, seed=8, count=300)
    intruder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) >= 50, 100_000)
        endpoint = (rig.endpoint.host, rig.endpoint.port)
        for datagram in _receiver_garbage(rig):
            intruder.sendto(datagram, endpoint)
        for datagram in (b"\x00" * 5, random.Random(11).randbytes(100), struct.pack("<iBBH", 8, 0, 0, 0x55),
                         StatusMessage(SESSION_ID + 1, STREAM_ID, 0, 0, WINDOW, 1).encode(),
                         data_frame(0, 0, SESSION_ID, STREAM_ID, b"not for a sender").encode()):
            rig.proxy.inject_to_sender(datagram)
        rig.run_until(lambda: len(rig.reader.got) == 300, 100_000)
        assert rig.reader.got == rig.expected
        receiver = f"receiver {rig.endpoint}"
        # Each kind at least once (the random bytes are one more of some kind), nothing else.
        assert rig.counter("garbage", f"garbage short: {receiver}") >= 1
        assert rig.counter("garbage", f"garbage unknown-type: {receiver}") >= 1
        assert rig.counter("garbage", f"garbage version: {receiver}") >= 1
        assert rig.counter("garbage", f"garbage unknown-session: {receiver}") == 1
        assert rig.counter("garbage", f"garbage not-for-receiver: {receiver}") == 1
        assert rig.counter("garbage", f"garbage malformed: {receiver}") >= 2  # the cut SETUP, the long DATA
        assert sum(c.value for c in rig.counters.counters() if c.type_name == "garbage" and receiver in c.label) == 8
        sender = "sender 127.0.0.1"
        assert rig.counter("garbage", f"garbage short: {sender}") >= 1
        assert rig.counter("garbage", f"garbage unknown-type: {sender}") >= 1
        assert rig.counter("garbage", f"garbage unknown-session: {sender}") == 1
        assert rig.counter("garbage", f"garbage not-for-sender: {sender}") == 1
        assert sum(c.value for c in rig.counters.counters() if c.type_name == "garbage" and sender in c.label) == 5
    finally:
        intruder.close()
        rig.close()


def test_a_closed_publication_lingers_with_eos_heartbeats_then_goes_when_no_receiver_says_eos(tmp_path):
    rig = Rig(tmp_path, seed=9, count=50)
    eos_heartbeats = []
    rig.proxy.forward.observers.append(lambda d: eos_heartbeats.extend(
        i for i in frames(d) if isinstance(i, DataFrame) and i.is_heartbeat and i.flags & EOS_FLAG))
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) == 50, 100_000)
        rig.receiver.close()  # nobody will send the EOS SM
        rig.receiver = None
        rig.publication.close()
        step_s = 0.05
        for _ in range(int(PUBLICATION_LINGER_NS / 1e9 / step_s)):
            rig.clock.advance(step_s)
            rig.tick(write=False)
        assert rig.sender.publications and rig.has_counter("snd-pos")  # 5 s: still lingering
        assert len(eos_heartbeats) >= PUBLICATION_LINGER_NS // 100_000_000 - 2
        rig.clock.advance(step_s)
        rig.tick(write=False)
        assert rig.sender.publications == [] and not rig.has_counter("snd-pos")
        assert not rig.has_counter("sub-pos", "->")
    finally:
        rig.close()


def test_a_sender_without_sms_for_the_connection_timeout_leaves_its_publication_not_connected(tmp_path):
    rig = Rig(tmp_path, seed=10, count=100)
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) == 100, 100_000)
        rig.receiver.close()
        rig.receiver = None
        for _ in range(3):  # SMs on their way when it closed reach the sender
            rig.tick(write=False)
        rig.clock.advance(PUBLICATION_CONNECTION_TIMEOUT_NS / 1e9 - 0.01)
        rig.tick(write=False)
        assert rig.has_counter("sub-pos", "->") and rig.publication.offer(b"x") > 0
        rig.clock.advance(0.02)
        rig.tick(write=False)
        assert not rig.has_counter("sub-pos", "->")
        rig.clock.advance(0.02)  # the publication re-reads its subscribers
        assert rig.publication.offer(b"x") == NOT_CONNECTED
    finally:
        rig.close()


TETHER_HOLD_MS = 10_000


def test_a_tethered_sender_without_sms_holds_its_writer_for_its_hold_then_leaves_it_not_connected(tmp_path):
    """A live stream's sender (NetSend.tether_hold_s): its receiver's netd restarting for longer than
    the connection timeout must not make the writer drop what it writes meanwhile."""
    rig = Rig(tmp_path, seed=13, count=100, tether_hold_ms=TETHER_HOLD_MS)
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) == 100, 100_000)
        rig.receiver.close()
        rig.receiver = None
        for _ in range(3):  # SMs on their way when it closed reach the sender
            rig.tick(write=False)
        rig.clock.advance(PUBLICATION_CONNECTION_TIMEOUT_NS / 1e9 + 0.1)
        rig.tick(write=False)
        assert rig.network_publication.silent and rig.publication.offer(b"x") > 0
        # Its position's silence counts from its last heartbeat, with the last SM.
        rig.clock.advance(TETHER_HOLD_MS / 1000 - PUBLICATION_CONNECTION_TIMEOUT_NS / 1e9 - 0.2)
        rig.tick(write=False)
        assert rig.publication.offer(b"x") > 0  # silent for less than its hold: still waited for
        rig.clock.advance(0.2)
        assert rig.publication.offer(b"x") == NOT_CONNECTED
        rig.tick(write=False)  # the agent sees its position dropped, and lets it go
        assert not rig.has_counter("sub-pos", "->")
    finally:
        rig.close()


def test_a_tethered_senders_receiver_dead_past_the_connection_timeout_is_followed_by_one_that_gets_it_all(tmp_path):
    rig = Rig(tmp_path, seed=14, count=400, image_log=tmp_path / IMAGE_LOG, tether_hold_ms=TETHER_HOLD_MS)
    try:
        first = read_a_hundred(rig)
        rig.offer_results.clear()
        kill_receiver(rig)
        rig.clock.advance(PUBLICATION_CONNECTION_TIMEOUT_NS / 1e9)
        for _ in range(100):  # the writer goes on while the sender's position lets it, then waits
            rig.tick()
        assert rig.network_publication.silent and NOT_CONNECTED not in rig.offer_results

        restart_receiver(rig)
        rig.run_until(lambda: rig.written == 400 and len(first.got) == 400, 200_000)

        assert first.got == rig.expected and NOT_CONNECTED not in rig.offer_results
        assert not rig.network_publication.silent
    finally:
        rig.close()


def test_a_tethered_publication_removed_keeping_its_position_holds_its_writer_for_the_one_that_succeeds_it(tmp_path):
    """netd's follower stops and starts a live stream's send when its key is rewritten (the
    receiving netd restarted): the writer never sees NOT_CONNECTED in between."""
    rig = Rig(tmp_path, seed=15, count=400, tether_hold_ms=TETHER_HOLD_MS)
    try:
        read_a_hundred(rig)
        rig.offer_results.clear()
        first = rig.network_publication
        assert rig.sender.remove_publication(first, keep_position=True) is first
        for _ in range(100):
            rig.tick()
        assert rig.sender_position_statuses() == [ctr.COUNTER_ACTIVE] and NOT_CONNECTED not in rig.offer_results

        channel = UdpChannel(endpoint=rig.proxy.address, mtu=MTU)
        second = rig.network_publication = rig.sender.add_publication(rig.pub_log.path, channel,
                                                                      tether_hold_ms=TETHER_HOLD_MS, succeeding=first)
        rig.run_until(lambda: rig.written == 400 and len(rig.reader.got) == 400, 200_000)

        assert rig.reader.got == rig.expected and NOT_CONNECTED not in rig.offer_results
        assert second.subscriber_position is not None and first.subscriber_position is None
        assert rig.sender_position_statuses() == [ctr.COUNTER_ACTIVE]  # the successor's alone
    finally:
        rig.close()


def test_a_publication_removed_keeping_its_position_holds_its_writer_for_its_hold_at_most(tmp_path):
    rig = Rig(tmp_path, seed=16, count=100, tether_hold_ms=TETHER_HOLD_MS)
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) == 100, 100_000)
        rig.sender.remove_publication(rig.network_publication, keep_position=True)
        rig.clock.advance(TETHER_HOLD_MS / 1000 - 0.1)
        assert rig.publication.offer(b"x") > 0
        rig.clock.advance(0.2)
        assert rig.publication.offer(b"x") == NOT_CONNECTED
        rig.tick(write=False)
        assert rig.sender_position_statuses() == []  # the agent let the dropped position go
    finally:
        rig.close()


def test_an_untethered_publication_removed_keeps_no_position(tmp_path):
    rig = Rig(tmp_path, seed=17, count=100)
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) == 100, 100_000)
        assert rig.sender.remove_publication(rig.network_publication, keep_position=True) is None
        assert rig.sender_position_statuses() == []
    finally:
        rig.close()


def test_a_sender_to_a_port_nobody_listens_on_counts_it_unreachable_and_goes_on(tmp_path):
    from ramen.clocks import ManualClock
    from ramen.transport import CountersFile, ExclusivePublication, LogBuffer, LogBufferParams
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    clock = ManualClock()
    counters = CountersFile.open(tmp_path / "counters.dat")
    pub_log = LogBuffer.create(tmp_path / "pub.logbuffer", LogBufferParams(term_length=TERM_LENGTH, session_id=1,
                                                                           stream_id=2))
    publication = ExclusivePublication(pub_log, counters, clock=clock)
    agent = SenderAgent(counters, clock=clock)
    network = agent.add_publication(pub_log.path, UdpChannel(endpoint=Address("127.0.0.1", port)))
    try:
        for _ in range(50):  # bounded: the kernel's ICMP answer comes with the next send or receive
            clock.advance(SETUP_RETRY_NS / 1e9 * 1.01)
            agent.do_work()
            if agent.endpoint_counters(network).get("unreachable"):
                break
        assert agent.endpoint_counters(network).get("unreachable") > 0
        assert network.counters.get("setups-sent") >= 2
    finally:
        agent.close()
        publication.close()
        pub_log.close()
        counters.close()


def test_removing_the_last_subscription_ends_its_images_with_an_eos_sm_and_closes_the_socket(tmp_path):
    rig = Rig(tmp_path, seed=13, count=100)
    eos_sms = []
    rig.proxy.backward.observers.append(lambda d: eos_sms.extend(
        i for i in frames(d) if isinstance(i, StatusMessage) and i.is_eos))
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) == 100, 100_000)
        reader = rig.reader
        rig.receiver.remove_subscription(UdpChannel(endpoint=rig.endpoint), STREAM_ID)
        assert rig.ended == [reader.info] and rig.receiver.images() == []
        rig.tick(write=False)  # the proxy passes the EOS SM on
        rig.tick(write=False)  # the sender reads it
        assert len(eos_sms) == 1 and rig.network_publication.eos_sm_received
        assert reader.image.is_end_of_stream and reader.got == rig.expected
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.bind((rig.endpoint.host, rig.endpoint.port))  # the port is free again
        finally:
            probe.close()
        reader.close()
        rig.tick(write=False)
        assert not reader.info.log_path.exists() and not rig.has_counter("rcv-pos")
    finally:
        rig.close()


def test_a_reader_joining_an_image_late_joins_where_it_was_rebuilt_to_as_on_a_local_log(tmp_path):
    rig = Rig(tmp_path, seed=14, count=400)
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) >= 200, 100_000)
        first = rig.reader
        late = Reader(first.info, rig.counters, rig.clock, late=True)
        rebuilt = rig.counter("rcv-pos")
        assert late.image.position == rebuilt > first.info.join_position + 2 * TERM_LENGTH
        rig.readers.append(late)
        rig.run_until(lambda: len(first.got) == 400 and late.got and late.got[-1] == rig.expected[-1], 100_000)
        start = rig.expected.index(late.got[0])
        assert late.got == rig.expected[start:] and first.got == rig.expected
        # Nothing below the tail was a hole for either reader to pad over.
        assert [c.value for c in rig.counters.counters() if c.type_name == "unblocked"] == [0, 0]
    finally:
        rig.close()

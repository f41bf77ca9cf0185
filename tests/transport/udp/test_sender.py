"""The sender's rules, one by one, on a ManualClock: time moves only when a test moves it, so a
test can also prove that something was not sent yet."""

from __future__ import annotations

import pytest

from ramen.clocks import NANOS_PER_SECOND, ManualClock
from ramen.transport import ExclusivePublication, LogBuffer, LogBufferParams
from ramen.transport.frame import HEADER_LENGTH, align
from ramen.transport.udp.defaults import HEARTBEAT_IDLE_NS, RETRANSMIT_UNICAST_LINGER_NS, SETUP_RETRY_NS
from ramen.transport.udp.protocol import (SM_SEND_SETUP_FLAG, RTTM_REPLY_FLAG, DataFrame, NakFrame, RttMeasurement,
                                          SetupFrame, StatusMessage, frames_of)
from ramen.transport.udp.sender import NetworkSender

TERM_LENGTH = 65536
MTU = 1408
SESSION, STREAM = 7, 42
RECEIVER_ID = 1234


class Rig:
    """A publication's log, its sender, and a ManualClock."""

    def __init__(self, tmp_path, **options) -> None:
        self.log = LogBuffer.create(tmp_path / "pub.logbuffer", LogBufferParams(
            term_length=TERM_LENGTH, mtu_length=MTU, session_id=SESSION, stream_id=STREAM))
        self.publication = ExclusivePublication(self.log)
        self.clock = ManualClock()
        self.sender = NetworkSender(self.log, clock=self.clock, **options)

    def advance_ns(self, nanos: int) -> None:
        self.clock.advance(nanos / NANOS_PER_SECOND)

    def offer(self, length: int, count: int = 1) -> None:
        for _ in range(count):
            while self.publication.offer(bytes(length)) < 0:
                pass

    def sm(self, position: int, window: int, flags: int = 0, session: int = SESSION) -> None:
        self.sender.on_status(StatusMessage(session, STREAM, position // TERM_LENGTH, position % TERM_LENGTH, window,
                                            RECEIVER_ID, flags=flags))

    def work(self) -> list[list]:
        """Every datagram the sender has now, decoded."""
        out = []
        for _ in range(1000):  # bounded: a sender that never runs out of work fails, not hangs
            batch = self.sender.do_work()
            if not batch:
                return out
            out += [frames_of(d) for d in batch]
        raise AssertionError("the sender still had datagrams after 1000 duty cycles")


def data_of(datagrams) -> list[DataFrame]:
    return [f for frames in datagrams for f in frames if isinstance(f, DataFrame) and not f.is_heartbeat]


def heartbeats_of(datagrams) -> list[DataFrame]:
    return [f for frames in datagrams for f in frames if isinstance(f, DataFrame) and f.is_heartbeat]


def setups_of(datagrams) -> list[SetupFrame]:
    return [f for frames in datagrams for f in frames if isinstance(f, SetupFrame)]


@pytest.fixture
def rig(tmp_path):
    return Rig(tmp_path)


def test_setup_goes_at_once_then_every_100_ms_until_the_first_sm_and_nothing_else_before(rig):
    rig.offer(100, 5)
    assert setups_of(rig.work()) == [SetupFrame(0, SESSION, STREAM, 0, 0, TERM_LENGTH, MTU)]
    rig.advance_ns(SETUP_RETRY_NS)
    assert rig.work() == []  # exactly the timeout is not yet due (Aeron: now > last + timeout)
    rig.advance_ns(1)
    sent = rig.work()
    assert len(setups_of(sent)) == 1 and data_of(sent) == [] and heartbeats_of(sent) == []
    assert rig.sender.setups_sent == 2
    assert not rig.sender.is_connected and rig.sender.publisher_limit == rig.sender.sender_position == 0
    rig.sm(0, 32768)
    assert rig.sender.is_connected
    assert len(data_of(rig.work())) == 5
    rig.advance_ns(10 * SETUP_RETRY_NS)
    assert setups_of(rig.work()) == [] and rig.sender.setups_sent == 2


def test_an_sm_with_send_setup_makes_a_setup_at_once_at_the_current_position(rig):
    rig.work()
    rig.sm(0, 32768)
    rig.offer(1000, 3)  # three frames of 1056 bytes
    rig.work()
    limit = rig.sender.sender_limit
    rig.advance_ns(1)
    rig.sm(0, 0, flags=SM_SEND_SETUP_FLAG)  # a late joiner: all fields 0 but the ids
    assert setups_of(rig.work()) == [SetupFrame(3 * 1056, SESSION, STREAM, 0, 0, TERM_LENGTH, MTU)]
    assert rig.sender.sender_limit == limit  # its zeros move no limit
    rig.advance_ns(SETUP_RETRY_NS + 1)
    assert len(setups_of(rig.work())) == 1  # and again 100 ms on, until an ordinary SM
    rig.sm(3 * 1056, 32768)
    rig.advance_ns(SETUP_RETRY_NS + 1)
    assert setups_of(rig.work()) == []


def test_data_goes_up_to_the_sm_limit_never_past_and_frames_are_never_split(rig):
    rig.work()
    rig.offer(1000, 5)  # frames of 1032 bytes, 1056 aligned
    rig.sm(0, 3000)
    sent = rig.work()
    assert [(f.term_offset, f.frame_length) for f in data_of(sent)] == [(0, 1032), (1056, 1032)]
    assert all(len(frames) == 1 for frames in sent if data_of([frames]))  # two frames > MTU: one each
    assert rig.sender.sender_position == 2112 and rig.sender.sender_limit == 3000
    assert rig.sender.back_pressure_events == 1
    rig.advance_ns(1)
    assert data_of(rig.work()) == [] and rig.sender.back_pressure_events == 1  # one event per stall
    rig.sm(2112, 3000)  # the limit moves to 5112: one more frame fits (ends 4224), not two (5280)
    assert [f.term_offset for f in data_of(rig.work())] == [2112, 3168]
    rig.sm(0, 100)  # an SM behind the last never takes the limit back
    assert rig.sender.sender_limit == 5112


def test_small_frames_are_packed_several_per_datagram_up_to_the_mtu(rig):
    rig.work()
    rig.offer(100, 10)  # frames of 132 bytes, 160 aligned: 8 fit 1408 bytes
    rig.sm(0, 32768)
    datagrams = rig.sender.do_work()
    data = [d for d in datagrams if isinstance(frames_of(d)[0], DataFrame) and frames_of(d)[0].frame_length]
    assert [len(d) for d in data] == [8 * 160, 2 * 160]
    assert [len(frames_of(d)) for d in data] == [8, 2]
    assert data[0] == bytes(rig.log.terms[0][:8 * 160])  # the log's bytes as they are


def test_a_sender_overtaken_by_its_writer_by_more_than_a_term_skips_to_its_tail_and_sets_up_there(rig):
    rig.work()
    rig.sm(0, 32768)
    rig.offer(100, 400)  # 400 frames of 160 bytes, 64000: within a term of snd-pos, all sent
    sent = []
    for _ in range(3):
        rig.sm(rig.sender.sender_position, 32768)
        sent += data_of(rig.work())
    assert len(sent) == 400 and rig.sender.skips == 0
    # Nobody holds the writer (the receiver went away for the connection timeout): it runs on.
    rig.offer(100, 1000)
    tail = rig.log.producer_position()
    assert tail - rig.sender.sender_position > TERM_LENGTH
    datagrams = rig.work()
    assert rig.sender.sender_position == tail and rig.sender.skips == 1
    assert rig.sender.skipped_bytes == tail - 64000
    assert [(s.active_term_id, s.term_offset) for s in setups_of(datagrams)] == [divmod(tail, TERM_LENGTH)]
    assert data_of(datagrams) == []  # nothing past the tail yet, and nothing before it
    rig.sm(64000, 32768)  # the old image's SMs: its receiver has not taken the SETUP yet
    rig.advance_ns(SETUP_RETRY_NS + 1)
    assert len(setups_of(rig.work())) == 1
    rig.sm(tail, 32768)  # the new image's
    rig.advance_ns(SETUP_RETRY_NS + 1)
    assert setups_of(rig.work()) == []


def test_a_pad_is_sent_header_only_last_in_its_datagram_and_moves_to_the_next_term(rig):
    rig.work()
    datagrams = []
    rig.offer(100, 304)  # frames of 160 bytes: 409 fill term 0 to 65440; sent as they come (a writer
    for _ in range(10):  # more than a term ahead is skipped to: test_a_sender_overtaken_by_its_writer...)
        rig.sm(rig.sender.sender_position, 32768)
        datagrams += rig.sender.do_work()
    rig.offer(100, 105)
    # Old bytes behind where the PAD's header goes (a frame of an earlier lap): a PAD's body is
    # never looked at, only its header is sent.
    rig.log.terms[0][65440 + HEADER_LENGTH:65440 + 2 * HEADER_LENGTH] = bytes(rig.log.terms[0][:HEADER_LENGTH])
    rig.offer(100)  # a PAD of 96, then this 410th message in term 1
    for _ in range(TERM_LENGTH // 1408 + 10):  # bounded: a sender that got stuck fails, not hangs
        rig.sm(rig.sender.sender_position, 32768)
        datagrams += rig.sender.do_work()
    [with_pad] = [d for d in datagrams if any(f.is_pad for f in frames_of(d))]
    frames = frames_of(with_pad)
    assert [f.term_offset for f in frames] == [65280, 65440]  # the last data frame (409 = 51 * 8 + 1), the PAD
    assert frames[-1].is_pad and frames[-1].frame_length == TERM_LENGTH - 65440
    assert len(with_pad) == 160 + HEADER_LENGTH  # the PAD's header only
    after = frames_of(datagrams[datagrams.index(with_pad) + 1])[0]
    assert (after.term_id, after.term_offset) == (1, 0)
    assert rig.sender.sender_position == TERM_LENGTH + 160
    # A NAK of the term's end sends it again the same way.
    rig.sender.on_nak(NakFrame(SESSION, STREAM, 0, 65280, TERM_LENGTH - 65280))
    assert rig.sender.do_work() == [with_pad]


def test_a_nak_more_than_a_term_behind_the_sender_position_sends_nothing(rig):
    rig.work()
    rig.offer(100, 410)
    for _ in range(10):
        rig.sm(rig.sender.sender_position, 32768)
        rig.work()
    assert rig.sender.sender_position == TERM_LENGTH + 160
    rig.sender.on_nak(NakFrame(SESSION, STREAM, 0, 0, 160))  # position 0 < snd-pos - term = 160
    assert data_of(rig.work()) == []
    rig.sender.on_nak(NakFrame(SESSION, STREAM, 0, 160, 160))  # a term behind exactly: still in the log
    assert [f.term_offset for f in data_of(rig.work())] == [160]


def test_publisher_limit_is_sender_position_plus_the_term_window_once_connected(rig):
    rig.work()
    assert rig.sender.publisher_limit == 0  # NOT_CONNECTED: nothing may be written
    rig.sm(0, 32768)
    rig.offer(1000, 4)
    rig.work()
    assert rig.sender.sender_position == 4 * 1056
    assert rig.sender.publisher_limit == 4 * 1056 + TERM_LENGTH // 2


@pytest.mark.parametrize("linger_ns", [RETRANSMIT_UNICAST_LINGER_NS, 1_000_000], ids=["aeron", "agents"])
def test_a_naked_range_goes_again_once_within_the_linger(tmp_path, linger_ns):
    rig = Rig(tmp_path, retransmit_linger_ns=linger_ns)
    rig.work()
    rig.sm(0, 32768)
    rig.offer(100, 10)
    first = rig.work()
    nak = NakFrame(SESSION, STREAM, 0, 320, 480)  # frames 2, 3 and 4
    rig.sender.on_nak(nak)
    again = data_of(rig.work())
    assert [(f.term_offset, bytes(f.payload)) for f in again] == \
        [(f.term_offset, bytes(f.payload)) for f in data_of(first)[2:5]]
    rig.advance_ns(linger_ns - 1)
    rig.sender.on_nak(nak)
    assert data_of(rig.work()) == []  # within the linger: ignored
    rig.advance_ns(1)
    rig.sender.on_nak(nak)
    assert [f.term_offset for f in data_of(rig.work())] == [320, 480, 640]
    assert rig.sender.naks_received == 3 and rig.sender.retransmits == 2
    assert rig.sender.retransmitted_bytes == 2 * 480


def test_a_nak_beyond_the_sender_position_or_of_another_stream_sends_nothing(rig):
    rig.work()
    rig.sm(0, 32768)
    rig.offer(100, 4)
    rig.work()
    rig.sender.on_nak(NakFrame(SESSION, STREAM, 0, 640, 160))  # at snd-pos: never sent
    rig.sender.on_nak(NakFrame(SESSION + 1, STREAM, 0, 0, 160))
    assert data_of(rig.work()) == [] and rig.sender.retransmits == 0


def test_a_heartbeat_goes_when_nothing_was_sent_for_100_ms_with_eos_once_closed(rig):
    rig.work()
    rig.sm(0, 32768)
    assert [(f.term_offset, f.flags) for f in heartbeats_of(rig.work())] == [(0, 0xC0)]  # at once, as Aeron
    rig.offer(100, 2)
    assert heartbeats_of(rig.work()) == []
    rig.advance_ns(HEARTBEAT_IDLE_NS)
    assert rig.work() == []  # exactly 100 ms is not yet due
    rig.advance_ns(1)
    assert [(f.term_offset, f.flags) for f in heartbeats_of(rig.work())] == [(320, 0xC0)]
    rig.publication.close()
    rig.advance_ns(HEARTBEAT_IDLE_NS + 1)
    [hb] = heartbeats_of(rig.work())
    assert (hb.term_offset, hb.flags, hb.frame_length) == (320, 0xE0, 0)
    assert rig.sender.heartbeats_sent == 3


def test_no_heartbeat_before_the_first_sm(rig):
    rig.work()
    rig.advance_ns(5 * HEARTBEAT_IDLE_NS)
    assert heartbeats_of(rig.work()) == [] and rig.sender.heartbeats_sent == 0


def test_an_rttm_request_is_echoed_at_once_with_flags_0(rig):
    rig.sender.on_rttm(RttMeasurement(SESSION, STREAM, 123_456_789, 0, RECEIVER_ID, flags=RTTM_REPLY_FLAG))
    rig.sender.on_rttm(RttMeasurement(SESSION, STREAM, 5, 0, RECEIVER_ID))  # a reply: not echoed
    echoes = [f for frames in rig.work() for f in frames if isinstance(f, RttMeasurement)]
    assert echoes == [RttMeasurement(SESSION, STREAM, 123_456_789, 0, RECEIVER_ID, flags=0)]


def test_control_frames_of_another_session_are_ignored(rig):
    rig.work()
    rig.sm(0, 32768, session=SESSION + 1)
    assert not rig.sender.is_connected and rig.sender.sender_limit == 0
    assert rig.sender.status_messages_received == 0


def test_a_writer_held_to_pub_lmt_by_a_slow_receiver_loses_nothing(tmp_path):
    """Sender and receiver cores back to back (no socket): our ExclusivePublication writes only
    below the sender's pub-lmt, the sender's datagrams go to an ImageRebuilder read by a slow
    Image (one fragment per 0.1 ms), whose SMs go back to the sender. Twelve terms go round the
    three partitions: the writer is back pressured, never overwrites what was not sent, the sender
    never over-runs the receiver's window, and every message arrives once, in order."""
    from ramen.transport import FragmentAssembler, Image
    from ramen.transport.udp import rebuild
    from ramen.transport.udp.rebuild import ImageRebuilder, StatusMessagePolicy
    from tests.vectors import LOGBUFFER_LENS, expected_payload

    params = LogBufferParams(term_length=TERM_LENGTH, mtu_length=MTU, session_id=SESSION, stream_id=STREAM)
    pub_log = LogBuffer.create(tmp_path / "pub.logbuffer", params)
    publication = ExclusivePublication(pub_log)
    clock = ManualClock()
    sender = NetworkSender(pub_log, clock=clock)
    image_log = LogBuffer.create(tmp_path / "image.logbuffer", params)
    rebuilder = ImageRebuilder(image_log, 0)
    policy = StatusMessagePolicy(rebuilder.window_length, clock=clock)
    image = Image(image_log, join_position=0)
    received: list[bytes] = []
    assembler = FragmentAssembler(lambda buffer, offset, length, header: received.append(
        bytes(buffer[offset:offset + length])))
    messages = [expected_payload(i, LOGBUFFER_LENS) for i in range(600)]
    written = held = 0
    statuses: list[int] = []
    max_ahead = 0
    for _ in range(200_000):
        clock.advance(0.0001)
        while written < len(messages):
            if publication.position >= sender.publisher_limit:
                held += 1
                break
            if publication.offer(messages[written]) > 0:
                written += 1
        max_ahead = max(max_ahead, publication.position - sender.sender_position)
        for datagram in sender.do_work():
            statuses += rebuilder.on_datagram(datagram)
        image.poll(assembler.on_fragment, 1)
        rebuilder.consumed_to(image.position)
        if policy.due(image.position):
            sender.on_status(rebuilder.status_message(image.position, RECEIVER_ID))
            policy.sent(image.position)
        if len(received) == len(messages):
            break
    assert received == messages
    assert publication.position > 12 * TERM_LENGTH
    assert held > 0 and sender.back_pressure_events > 0
    # Aeron's rule lets the last message start just below the limit: at most one message beyond it.
    assert max_ahead <= TERM_LENGTH // 2 + 8192 + 6 * HEADER_LENGTH < TERM_LENGTH
    assert rebuild.OVER_RUN not in statuses and statuses.count(rebuild.DUPLICATE) == 0


def test_a_sender_started_mid_stream_goes_back_to_where_its_first_sms_receiver_is_within_a_term(tmp_path):
    """netd restarted: its send starts at the log's tail, the receiver kept the image the previous
    sender built and says (its first SM) where it is: the stream goes on from there, nothing lost."""
    behind = Rig(tmp_path)
    behind.offer(1000, 40)  # written and (by the previous sender) partly sent
    behind.sender = NetworkSender(behind.log, clock=behind.clock)
    tail = behind.log.producer_position()
    assert behind.sender.sender_position == tail
    receiver_at = 10 * align(1000 + HEADER_LENGTH)
    behind.sm(receiver_at, window=TERM_LENGTH // 2)
    assert behind.sender.resumed_from == receiver_at and behind.sender.sender_position == receiver_at
    sent = data_of(behind.work())
    assert (sent[0].term_offset, len(sent)) == (receiver_at, 30)
    assert behind.sender.sender_position == tail

    # Later SMs behind snd-pos are ordinary (data in flight), and a first SM more than a term
    # behind is beyond what the log can send again: the sender stays where it is.
    behind.sm(receiver_at, window=TERM_LENGTH // 2)
    assert behind.sender.sender_position == tail
    (tmp_path / "far").mkdir()
    far = Rig(tmp_path / "far")
    far.offer(1000, 100)  # more than a term (65536)
    far.sender = NetworkSender(far.log, clock=far.clock)
    far.sm(0, window=TERM_LENGTH // 2)
    assert far.sender.resumed_from is None and far.sender.sender_position == far.log.producer_position()


def test_a_pad_in_mid_term_ends_its_datagram_header_only_and_every_datagram_is_frames(tmp_path):
    """A replayer's log pads the messages out of its range where they lie (workers/replayer.py), not
    only at a term's end as Aeron's: the run of frames before it stops there (a clean-clone CI run
    caught a cross-site replay whose every datagram over such a PAD the receiver took for garbage)."""
    from ramen.archive.reader import pad
    rig = Rig(tmp_path)
    rig.offer(1000, 30)  # unfragmented frames at MTU 1408, within a window
    aligned = align(1000 + HEADER_LENGTH)
    start, end = 10 * aligned, 13 * aligned
    rig.log.terms[0][start:start + 4] = pad(rig.log.terms[0], start, end).to_bytes(4, "little")
    rig.sm(0, window=TERM_LENGTH // 2)
    sent = rig.work()  # frames_of raises WireError for a datagram that is not frames
    pads = [f for frames in sent for f in frames if isinstance(f, DataFrame) and f.is_pad]
    assert [(p.term_offset, p.frame_length) for p in pads] == [(start, end - start)]
    assert all(not (isinstance(f, DataFrame) and f.is_pad) or f is frames[-1] for frames in sent for f in frames)
    assert sum(f.frame_length for f in data_of(sent) if not f.is_pad) == 27 * (1000 + HEADER_LENGTH)
    assert rig.sender.sender_position == rig.log.producer_position()

"""The receiver's core rebuilds the sender's stream from the captured frames, in any order."""

from __future__ import annotations

import random

import pytest


from ramen.clocks import NANOS_PER_SECOND, ManualClock
from ramen.transport import FragmentAssembler, Image, LogBuffer, LogBufferParams
from ramen.transport.position import term_id_of
from ramen.transport.udp import rebuild
from ramen.transport.udp.protocol import DataFrame, NakFrame, SetupFrame, StatusMessage, WireError, frames_of
from ramen.transport.udp.rebuild import Gap, ImageRebuilder, StatusMessagePolicy, receiver_window
from tests.transport.udp.conftest import MESSAGES, RECEIVER_DIR, SENDER_DIR, STREAM_END_POSITION
from tests.vectors import LOGBUFFER_LENS, expected_payload

EXPECTED = [expected_payload(i, LOGBUFFER_LENS) for i in range(MESSAGES)]


def setup_of(datagrams) -> SetupFrame:
    return next(f for d in datagrams if d.direction == SENDER_DIR for f in frames_of(d.data)
                if isinstance(f, SetupFrame))


def sender_frames(datagrams, *, heartbeats: bool = False) -> list[DataFrame]:
    """The sender's DATA and PAD frames (and heartbeats if asked), in capture order."""
    return [f for d in datagrams if d.direction == SENDER_DIR for f in frames_of(d.data)
            if isinstance(f, DataFrame) and (heartbeats or not f.is_heartbeat)]


class Reader:
    """The image's reader: our own Image and FragmentAssembler, telling the rebuilder how far it got."""

    def __init__(self, log: LogBuffer, rebuilder: ImageRebuilder) -> None:
        self.image = Image(log, join_position=rebuilder.join_position)
        self.rebuilder = rebuilder
        self.messages: list[bytes] = []
        self.assembler = FragmentAssembler(
            lambda buffer, offset, length, header: self.messages.append(bytes(buffer[offset:offset + length])))

    def poll(self) -> None:
        while self.image.poll(self.assembler.on_fragment, 64):
            pass
        if self.image.position > self.rebuilder.consumer_position:  # a resumed rebuilder starts where it read to
            self.rebuilder.consumed_to(self.image.position)


def new_image(tmp_path, setup: SetupFrame) -> tuple[LogBuffer, ImageRebuilder]:
    log = LogBuffer.create(tmp_path / "image.logbuffer", LogBufferParams(
        term_length=setup.term_length, mtu_length=setup.mtu, initial_term_id=setup.initial_term_id,
        session_id=setup.session_id, stream_id=setup.stream_id, term_id=setup.active_term_id,
        term_offset=setup.term_offset))
    join = (setup.active_term_id - setup.initial_term_id) * setup.term_length + setup.term_offset
    return log, ImageRebuilder(log, join)


def test_captured_datagrams_in_capture_order_rebuild_the_generators_messages(tmp_path, capture):
    name, datagrams = capture
    log, rebuilder = new_image(tmp_path, setup_of(datagrams))
    reader = Reader(log, rebuilder)
    statuses = []
    for datagram in datagrams:
        if datagram.direction == SENDER_DIR:
            statuses += rebuilder.on_datagram(datagram.data)
            reader.poll()
    assert reader.messages == EXPECTED
    # 332 DATA + 3 PAD frames, each inserted once; the stream spans four terms, so the first
    # partition was cleaned and filled again.
    assert statuses.count(rebuild.INSERTED) == 335
    assert set(statuses) == {rebuild.INSERTED, rebuild.HEARTBEAT}
    assert rebuilder.rebuilt_position == rebuilder.hwm_position == STREAM_END_POSITION
    assert rebuilder.gaps() == []
    # The EOS heartbeats mark the stream's end, and the reader is there.
    assert log.end_of_stream_position == STREAM_END_POSITION
    assert reader.image.is_end_of_stream


def test_a_late_joiner_rebuilds_from_its_join_position_on(tmp_path, capture):
    """As subscriber 2 of the rejoin scenario: SETUP at term 1, offset 64224 (position 129760),
    then messages 100..199; what was sent before the join is not this image's."""
    name, datagrams = capture
    setup = setup_of(datagrams)
    late = SetupFrame(64224, setup.session_id, setup.stream_id, 0, 1, setup.term_length, setup.mtu)
    log, rebuilder = new_image(tmp_path, late)
    assert rebuilder.join_position == 129760
    reader = Reader(log, rebuilder)
    statuses = []
    for item in sender_frames(datagrams):
        statuses.append(rebuilder.insert(item))
        reader.poll()
    assert reader.messages == EXPECTED[100:]
    before = sum(1 for item in sender_frames(datagrams) if rebuilder.position_of(item.term_id, item.term_offset) < 129760)
    assert statuses.count(rebuild.DUPLICATE) == before > 0
    assert rebuilder.rebuilt_position == STREAM_END_POSITION


def test_shuffled_frames_with_duplicates_rebuild_the_same_messages(tmp_path, capture):
    """Seeded shuffle, a third of the frames twice; a frame past the window is dropped (OVER_RUN)
    and sent again later, as a sender would after the next SM or a NAK."""
    name, datagrams = capture
    frames = sender_frames(datagrams)
    rng = random.Random(2323)
    queue = frames + rng.sample(frames, len(frames) // 3)
    rng.shuffle(queue)
    log, rebuilder = new_image(tmp_path, setup_of(datagrams))
    reader = Reader(log, rebuilder)
    counts = {rebuild.INSERTED: 0, rebuild.DUPLICATE: 0, rebuild.OVER_RUN: 0}
    saw_gaps = False
    steps = 0
    while queue:
        steps += 1
        assert steps < 100 * len(frames), "the rebuild made no progress"
        item = queue.pop(0)
        limit = rebuilder.consumer_position + rebuilder.window_length
        status = rebuilder.insert(item)
        counts[status] += 1
        sent_end = rebuilder.position_of(item.term_id, item.term_offset) + len(item.encode())
        assert (status == rebuild.OVER_RUN) == (sent_end > limit and status != rebuild.DUPLICATE), status
        if status == rebuild.OVER_RUN:
            queue.append(item)
        saw_gaps = saw_gaps or bool(rebuilder.gaps())
        reader.poll()
    assert reader.messages == EXPECTED
    assert counts[rebuild.INSERTED] == len(frames)
    assert counts[rebuild.DUPLICATE] > 0 and counts[rebuild.OVER_RUN] > 0 and saw_gaps
    assert rebuilder.rebuilt_position == STREAM_END_POSITION and rebuilder.gaps() == []


def test_gaps_below_the_hwm_are_what_was_not_received(tmp_path, capture):
    name, datagrams = capture
    frames = sender_frames(datagrams)
    log, rebuilder = new_image(tmp_path, setup_of(datagrams))
    first_term = [f for f in frames if f.term_id == 0]
    lost = {3, 4, 10, 11, 12, 40}
    for i, item in enumerate(first_term[:41]):
        if i not in lost:
            assert rebuilder.insert(item) == rebuild.INSERTED
    def span(i, j):  # frames i..j-1 as one gap
        start = first_term[i].term_offset
        return Gap(0, start, first_term[j].term_offset - start if j < len(first_term) else 65536 - start)
    assert rebuilder.rebuilt_position == first_term[3].term_offset
    assert rebuilder.gaps() == [span(3, 5), span(10, 13)]  # frame 40 was the last sent: nothing says it is missing
    assert rebuilder.gaps(limit=1) == [span(3, 5)]
    first = first_term[0]
    assert rebuilder.nak(span(3, 5)) == NakFrame(first.session_id, first.stream_id, 0, first_term[3].term_offset,
                                                 first_term[5].term_offset - first_term[3].term_offset)
    # A heartbeat at the sender's position raises the hwm: the loss before an idle spell shows.
    beyond = first_term[41]
    rebuilder.insert(DataFrame(0, 0xC0, 1, beyond.term_offset, beyond.session_id, beyond.stream_id, 0))
    assert rebuilder.gaps() == [span(3, 5), span(10, 13), span(40, 41)]
    for i in sorted(lost):
        rebuilder.insert(first_term[i])
    assert rebuilder.gaps() == [] and rebuilder.rebuilt_position == beyond.term_offset


def rebuilt_to_a_term_and_a_half(tmp_path, datagrams) -> tuple[LogBuffer, ImageRebuilder, Reader, list, int]:
    """A receiver that rebuilt the stream to 1.5 terms, its reader with it, and published its tail
    three frames short of that; the frames, and the index of the first it did not get."""
    frames = sender_frames(datagrams)
    log, rebuilder = new_image(tmp_path, setup_of(datagrams))
    reader = Reader(log, rebuilder)
    k = next(i for i, f in enumerate(frames)
             if rebuilder.position_of(f.term_id, f.term_offset) >= log.term_length * 3 // 2)
    for item in frames[:k]:
        assert rebuilder.insert(item) == rebuild.INSERTED
        reader.poll()
    log.set_tail_position(rebuilder.position_of(frames[k - 3].term_id, frames[k - 3].term_offset))  # as the agent
    return log, rebuilder, reader, frames, k


def test_a_rebuild_resumed_in_a_dead_receivers_log_goes_on_from_its_end_and_its_reader_gets_every_message(
        tmp_path, capture):
    name, datagrams = capture
    log, dead, reader, frames, k = rebuilt_to_a_term_and_a_half(tmp_path, datagrams)
    end = dead.rebuilt_position
    sender_at = dead.position_of(frames[k + 5].term_id, frames[k + 5].term_offset)  # k..k+4 lost with it

    resumed = ImageRebuilder.resuming(log, sender_at)

    assert resumed.join_position == resumed.rebuilt_position == resumed.consumer_position == end
    assert resumed.gaps() == [Gap(term_id_of(end, resumed.bits, resumed.initial_term_id), end & resumed.mask,
                                  sender_at - end)]
    reader.rebuilder = resumed
    statuses = []
    for item in frames:  # the sender sends the gap again, then goes on; what came before is a duplicate
        statuses.append(resumed.insert(item))
        reader.poll()
    # The stream's last half term lands where the dead receiver's first half term lay: cleaned on
    # from a term behind where it stopped, as the dead one would have.
    assert reader.messages == EXPECTED
    assert statuses.count(rebuild.DUPLICATE) == k and statuses.count(rebuild.INSERTED) == len(frames) - k


def test_a_rebuild_is_not_resumed_for_a_sender_out_of_its_reach(tmp_path, capture):
    name, datagrams = capture
    log, dead, reader, frames, k = rebuilt_to_a_term_and_a_half(tmp_path, datagrams)
    end, window = dead.rebuilt_position, dead.window_length
    for sender_at in (end + window + 32, end - log.term_length - 32):
        with pytest.raises(ValueError, match=f"the sender is at {sender_at}, out of reach of {end}"):
            ImageRebuilder.resuming(log, sender_at)
    for sender_at in (end + window, end, end - log.term_length):
        ImageRebuilder.resuming(log, sender_at).close()


def test_frames_of_another_stream_or_out_of_the_term_are_rejected(tmp_path, capture):
    name, datagrams = capture
    first = sender_frames(datagrams)[0]
    log, rebuilder = new_image(tmp_path, setup_of(datagrams))
    fields = dict(first.__dict__)
    for change in ({"session_id": 1}, {"stream_id": 1}, {"term_id": -1}, {"term_offset": 16},
                   {"term_offset": 65536 - 32, "frame_length": 64}):
        assert rebuilder.insert(DataFrame(**fields | change)) == rebuild.REJECTED
    with pytest.raises(WireError):
        rebuilder.on_datagram(first.encode() + b"\x01\x02")
    assert rebuilder.rebuilt_position == 0  # nothing of a malformed datagram goes in
    assert rebuilder.insert(first) == rebuild.INSERTED
    assert rebuilder.insert(first) == rebuild.DUPLICATE


def test_receiver_window_is_the_initial_window_at_most_half_a_term(capture):
    name, datagrams = capture
    windows = {f.receiver_window for d in datagrams if d.direction == RECEIVER_DIR for f in frames_of(d.data)}
    assert windows == {receiver_window(65536)} == {32768}
    assert receiver_window(16 * 1024 * 1024) == 128 * 1024


def test_status_message_policy_sends_past_a_quarter_window_or_after_200_ms():
    clock = ManualClock()
    policy = StatusMessagePolicy(32768, clock=clock)
    assert policy.due(0)  # the first SM goes at once
    policy.sent(0)
    assert not policy.due(8192)
    assert policy.due(8193)
    clock.advance(0.2)
    assert not policy.due(0)  # exactly 200 ms: Aeron's (last + timeout) - now < 0 is not yet true
    clock.advance(1e-9)
    assert policy.due(0)
    policy.sent(0)
    assert not policy.due(100)


def test_status_message_policy_reproduces_the_captured_receivers_sms(tmp_path, capture):
    """Each captured SM after the first is due by our rule at the time it was sent, for the reason
    it was sent: progress past window/4 within 200 ms, or 200 ms without it. And ours encode to its bytes."""
    name, datagrams = capture
    sms = [(d.t, f, d.data) for d in datagrams if d.direction == RECEIVER_DIR
           for f in frames_of(d.data) if isinstance(f, StatusMessage)]
    log, rebuilder = new_image(tmp_path, setup_of(datagrams))
    clock = ManualClock()
    start_ns = clock.nanos()
    def at(t):  # the clock at capture time t
        clock.advance((start_ns + round(t * NANOS_PER_SECOND) - clock.nanos()) / NANOS_PER_SECOND)
    policy = StatusMessagePolicy(rebuilder.window_length, clock=clock)
    def position(sm):
        return rebuilder.position_of(sm.consumption_term_id, sm.consumption_term_offset)
    reasons = set()
    for (t0, previous, _), (t1, sm, data) in zip(sms, sms[1:]):
        at(t0)
        policy.sent(position(previous))
        at(t1)
        assert policy.due(position(sm))
        if position(sm) > position(previous) + rebuilder.window_length // 4:
            reasons.add("progress")
            assert not policy.due(position(previous) + rebuilder.window_length // 4) or t1 - t0 > 0.2
        else:
            reasons.add("timeout")
            assert t1 - t0 > 0.2
        assert rebuilder.status_message(position(sm), sm.receiver_id, flags=sm.flags).encode() == data
    assert reasons == {"progress", "timeout"}

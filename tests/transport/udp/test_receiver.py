"""NetworkReceiver's rules, one at a time, on a ManualClock (no sockets)."""

from __future__ import annotations

import pytest

from ramen.clocks import ManualClock
from ramen.transport.udp import receiver as rcv
from ramen.transport.udp.defaults import (IMAGE_LIVENESS_TIMEOUT_NS, NAK_RETRY_NS, NAK_UNICAST_DELAY_NS,
                                          SEND_SETUP_RETRY_NS, SM_TIMEOUT_NS)
from ramen.transport.udp.protocol import (EOS_FLAG, SM_EOS_FLAG, SM_SEND_SETUP_FLAG, UNFRAGMENTED, NakFrame,
                                          SetupFrame, StatusMessage, data_frame, frames_of, heartbeat)
from ramen.transport.udp.receiver import NetworkReceiver
from workers.inputs import first_frame_position

SESSION, STREAM, TERM_LENGTH, MTU = 888, 1005, 65536, 1408
RECEIVER_ID = 0x1234_5678_9ABC
WINDOW = 32768
PAYLOAD = bytes(range(64))
FRAME = 96
"""A 64-byte message's aligned frame length."""


class Rig:
    def __init__(self, tmp_path, **options) -> None:
        self.clock = ManualClock()
        self.receiver = NetworkReceiver(tmp_path, receiver_id=RECEIVER_ID, clock=self.clock, **options)
        self.receiver.add_subscription(STREAM)

    def advance_ns(self, nanos: int) -> None:
        self.clock.advance(nanos / 1e9)

    def setup(self, term_id: int = 0, term_offset: int = 0, session: int = SESSION, stream: int = STREAM) -> None:
        self.receiver.on_datagram(SetupFrame(term_offset, session, stream, 0, term_id, TERM_LENGTH, MTU).encode())

    def data(self, index: int, term_id: int = 0, flags: int = UNFRAGMENTED, session: int = SESSION) -> None:
        self.receiver.on_datagram(data_frame(term_id, index * FRAME, session, STREAM, PAYLOAD, flags).encode())

    def heartbeat(self, position: int, eos: bool = False, session: int = SESSION) -> None:
        self.receiver.on_datagram(heartbeat(position // TERM_LENGTH, position % TERM_LENGTH, session, STREAM,
                                            eos=eos).encode())

    def work(self) -> list:
        return [f for d in self.receiver.do_work() for f in frames_of(d)]

    def sms(self) -> list[StatusMessage]:
        return [f for f in self.work() if isinstance(f, StatusMessage)]

    def consume(self, position: int) -> None:
        self.receiver.consumed_to(SESSION, STREAM, position)

    @property
    def image(self):
        return self.receiver.image(SESSION, STREAM)


@pytest.fixture
def rig(tmp_path):
    return Rig(tmp_path)


def sm_position(sm: StatusMessage) -> int:
    return sm.consumption_term_id * TERM_LENGTH + sm.consumption_term_offset


def test_a_setup_makes_an_image_at_its_position_answered_by_an_sm_at_once(rig):
    rig.setup(term_id=1, term_offset=64224)  # the rejoin scenario's SETUP
    image = rig.image
    assert image.join_position == image.rebuilt_position == image.hwm_position == 129760
    data = rig.receiver.do_work()
    assert data == [StatusMessage(SESSION, STREAM, 1, 64224, WINDOW, RECEIVER_ID).encode()]
    assert len(data[0]) == 36
    assert rig.receiver.status_messages_sent == image.status_messages_sent == 1
    rig.setup(term_id=1, term_offset=64224)  # a SETUP retry changes nothing
    assert rig.image is image and rig.work() == []


def test_a_setup_more_than_a_term_past_an_image_ends_it_and_a_new_one_begins_there(rig):
    rig.setup()
    for index in range(3):
        rig.data(index)
    old = rig.image
    rig.setup(term_id=1, term_offset=3 * FRAME)  # a sender a term past: one that went back to us
    assert rig.image is old and rig.receiver.images_overtaken == 0
    rig.setup(term_id=1, term_offset=3 * FRAME + 32)  # past: it skipped what its writer overtook
    new = rig.image
    assert new is not old and new.join_position == TERM_LENGTH + 3 * FRAME + 32
    assert rig.receiver.ended_images == [old] and old.is_ended and old.rebuilt_position == 3 * FRAME
    assert rig.receiver.images_overtaken == 1 and new.log.path != old.log.path
    # The same stream going on, as a reader of the new log tells it (workers/inputs.py: a GAP for what lies between)
    assert (new.log.session_id, new.log.stream_id, new.log.initial_term_id) == \
        (old.log.session_id, old.log.stream_id, old.log.initial_term_id)
    assert first_frame_position(new.log) == new.join_position  # nothing came yet: where a reader joins


def test_setups_of_a_stream_nobody_subscribed_to_make_no_image(rig):
    rig.setup(stream=STREAM + 1)
    assert rig.receiver.images == {} and rig.work() == []
    assert rig.receiver.frames_unsubscribed == 1 and rig.receiver.garbage == {}


def test_data_of_an_unknown_session_gets_one_send_setup_sm_with_all_other_fields_zero(rig):
    rig.heartbeat(0, session=SESSION + 1)
    rig.data(0, session=SESSION + 1)
    data = rig.receiver.do_work()
    assert data == [StatusMessage(SESSION + 1, STREAM, 0, 0, 0, 0, flags=SM_SEND_SETUP_FLAG).encode()]
    rig.advance_ns(SEND_SETUP_RETRY_NS)
    rig.heartbeat(0, session=SESSION + 1)
    assert rig.work() == []  # at most one per 100 ms
    rig.advance_ns(1)
    rig.heartbeat(0, session=SESSION + 1)
    assert [sm.flags for sm in rig.sms()] == [SM_SEND_SETUP_FLAG]
    assert rig.receiver.garbage == {rcv.GARBAGE_UNKNOWN_SESSION: 4}
    rig.setup(session=SESSION + 1)  # the sender answers: an image, an ordinary SM
    assert [sm.flags for sm in rig.sms()] == [0]


def test_an_sm_goes_when_consumption_passes_a_quarter_window_else_every_200_ms_repeating_its_position(rig):
    rig.setup()
    rig.sms()
    for i in range(200):
        rig.data(i)
    rig.consume(FRAME * 85)  # 8160 <= 8192: not yet
    assert rig.sms() == []
    rig.consume(FRAME * 86)  # 8256 > 8192: at once
    assert [sm_position(sm) for sm in rig.sms()] == [FRAME * 86]
    rig.consume(FRAME * 100)
    rig.advance_ns(SM_TIMEOUT_NS)
    assert rig.sms() == []  # exactly 200 ms is not yet due
    rig.advance_ns(1)
    # Due on the timeout: it repeats the last SM's position (Aeron's next_sm_position), not 9600.
    assert [sm_position(sm) for sm in rig.sms()] == [FRAME * 86]
    assert rig.sms() == []


def test_a_gap_is_naked_after_the_unicast_delay_and_again_after_each_retry_delay_until_filled(rig):
    rig.setup()
    rig.sms()
    rig.data(0)
    rig.data(2)
    rig.data(3)
    assert rig.image.rebuilt_position == FRAME and rig.image.hwm_position == 4 * FRAME
    assert rig.work() == []  # the gap is seen now
    rig.advance_ns(NAK_UNICAST_DELAY_NS - 1)
    assert rig.work() == []
    rig.advance_ns(1)
    assert rig.work() == [NakFrame(SESSION, STREAM, 0, FRAME, FRAME)]
    rig.advance_ns(NAK_RETRY_NS - 1)
    assert rig.work() == []
    rig.advance_ns(1)
    assert rig.work() == [NakFrame(SESSION, STREAM, 0, FRAME, FRAME)]
    assert rig.receiver.naks_sent == 2 and rig.receiver.loss_gaps == 1
    rig.data(1)
    rig.data(1)  # the NAK's retransmit and the retry's
    assert rig.image.rebuilt_position == 4 * FRAME and rig.image.frames_duplicate == 1
    rig.advance_ns(NAK_RETRY_NS * 3)
    assert [f for f in rig.work() if isinstance(f, NakFrame)] == []
    assert rig.receiver.naks_sent == 2


def test_every_gap_below_the_hwm_is_naked_on_its_own_timers(rig):
    rig.setup()
    rig.sms()
    for index in (0, 2, 4):
        rig.data(index)  # gaps at 1 and 3
    rig.work()
    rig.advance_ns(NAK_UNICAST_DELAY_NS)
    assert [f for f in rig.work() if isinstance(f, NakFrame)] == [NakFrame(SESSION, STREAM, 0, FRAME, FRAME),
                                                                 NakFrame(SESSION, STREAM, 0, 3 * FRAME, FRAME)]
    rig.data(1)  # the first repaired: the second's timer goes on
    rig.advance_ns(NAK_RETRY_NS)
    assert [f for f in rig.work() if isinstance(f, NakFrame)] == [NakFrame(SESSION, STREAM, 0, 3 * FRAME, FRAME)]
    assert rig.receiver.loss_gaps == 2 and rig.receiver.naks_sent == 3


def test_an_image_that_read_all_and_hears_nothing_repeats_its_sm_once_when_asked_to(tmp_path):
    """A sender held at its limit by a lost SM would wait for the 200 ms timeout; with
    stalled_sm_ns the drained image sends one more SM, then none until a frame comes."""
    rig = Rig(tmp_path, stalled_sm_ns=1_000_000)
    rig.setup()
    rig.sms()
    rig.data(0)
    rig.consume(FRAME)
    rig.advance_ns(1_000_000)
    assert rig.sms() == []  # exactly the delay: not yet
    rig.advance_ns(1)
    assert [sm_position(sm) for sm in rig.sms()] == [FRAME]
    rig.advance_ns(10_000_000)
    assert rig.sms() == []  # once per stall
    rig.data(1)  # a frame came, not yet read: no stall
    rig.advance_ns(10_000_000)
    assert rig.sms() == []
    rig.consume(2 * FRAME)
    rig.advance_ns(1_000_001)
    assert [sm_position(sm) for sm in rig.sms()] == [2 * FRAME]


def test_without_stalled_sm_ns_a_drained_image_waits_for_the_sm_timeout_as_aerons(rig):
    rig.setup()
    rig.sms()
    rig.data(0)
    rig.consume(FRAME)
    rig.advance_ns(SM_TIMEOUT_NS)
    assert rig.sms() == []
    rig.advance_ns(1)
    assert len(rig.sms()) == 1


def test_a_gap_shown_only_by_a_heartbeat_is_naked(rig):
    """A loss just before the sender went idle: the next heartbeat moves the hwm."""
    rig.setup()
    rig.sms()
    rig.data(0)
    rig.heartbeat(2 * FRAME)
    rig.work()
    rig.advance_ns(NAK_UNICAST_DELAY_NS)
    assert [f for f in rig.work() if isinstance(f, NakFrame)] == [NakFrame(SESSION, STREAM, 0, FRAME, FRAME)]


def test_sms_carry_eos_once_the_eos_heartbeats_position_is_rebuilt_and_consumed(rig):
    rig.setup()
    rig.sms()
    rig.data(0)
    rig.data(1)
    rig.heartbeat(2 * FRAME, eos=True)
    assert rig.image.end_of_stream_position == 2 * FRAME
    rig.advance_ns(SM_TIMEOUT_NS + 1)
    assert [sm.flags for sm in rig.sms()] == [0]  # not consumed yet
    rig.consume(2 * FRAME)
    rig.advance_ns(SM_TIMEOUT_NS + 1)
    sms = rig.sms()
    assert [sm.flags for sm in sms] == [SM_EOS_FLAG] and rig.image.is_sending_eos


def test_a_data_frame_with_the_eos_flag_ends_the_stream_at_its_end(rig):
    rig.setup()
    rig.sms()
    rig.data(0)
    rig.data(1, flags=UNFRAGMENTED | EOS_FLAG)
    assert rig.image.end_of_stream_position == 2 * FRAME
    rig.consume(2 * FRAME)
    rig.advance_ns(SM_TIMEOUT_NS + 1)
    assert [sm.flags for sm in rig.sms()] == [SM_EOS_FLAG]


def test_an_image_without_frames_for_the_liveness_timeout_ends(rig):
    rig.setup()
    rig.sms()
    image = rig.image
    rig.advance_ns(IMAGE_LIVENESS_TIMEOUT_NS // 2)
    rig.heartbeat(0)  # a frame: alive again
    rig.advance_ns(IMAGE_LIVENESS_TIMEOUT_NS)
    rig.work()
    assert rig.image is image and not image.is_ended
    rig.advance_ns(1)
    rig.work()
    assert rig.image is None and image.is_ended
    assert rig.receiver.ended_images == [image] and rig.receiver.images_ended == 1
    rig.heartbeat(0)  # the session is unknown again: ask for a SETUP
    assert [sm.flags for sm in rig.sms()] == [SM_SEND_SETUP_FLAG]


@pytest.mark.parametrize("ahead,rejoined", [(TERM_LENGTH, True), (TERM_LENGTH + 32, False)])
def test_after_an_image_timed_out_a_new_one_begins_where_it_stopped_if_its_sender_is_within_a_term(
        rig, ahead, rejoined):
    rig.setup()
    for index in range(3):
        rig.data(index)
    stopped = 3 * FRAME
    rig.advance_ns(IMAGE_LIVENESS_TIMEOUT_NS + 1)
    rig.work()
    assert rig.image is None
    sender_at = stopped + ahead
    rig.setup(term_id=sender_at // TERM_LENGTH, term_offset=sender_at % TERM_LENGTH)
    image = rig.image
    if rejoined:
        assert image.join_position == image.rebuilt_position == stopped
        assert image.hwm_position == stopped + WINDOW  # the gap NAKed as far as the window takes frames
        assert [sm_position(sm) for sm in rig.sms()] == [stopped]  # a restarted sender goes back there
        assert rig.receiver.images_rejoined == 1
    else:
        assert image.join_position == sender_at and rig.receiver.images_rejoined == 0


@pytest.mark.parametrize("datagram,kind", [
    (b"\x20\x00\x00", rcv.GARBAGE_SHORT),
    (data_frame(0, 0, SESSION, STREAM, PAYLOAD).encode()[:40], rcv.GARBAGE_MALFORMED),
    (b"\x20\x00\x00\x00\x01\xc0\x01\x00" + bytes(24), rcv.GARBAGE_VERSION),
    (b"\x20\x00\x00\x00\x00\x00\x33\x00" + bytes(24), rcv.GARBAGE_UNKNOWN_TYPE),
    (heartbeat(0, 0, SESSION, STREAM).encode() + b"\x20\x00\x00\x00\x00\x00\x33\x00" + bytes(24),
     rcv.GARBAGE_UNKNOWN_TYPE),
    (StatusMessage(SESSION, STREAM, 0, 0, WINDOW, 1).encode(), rcv.GARBAGE_NOT_FOR_RECEIVER),
    (NakFrame(SESSION, STREAM, 0, 0, 64).encode(), rcv.GARBAGE_NOT_FOR_RECEIVER),
    (data_frame(0, 40, SESSION, STREAM, PAYLOAD).encode(), rcv.GARBAGE_REJECTED),  # misaligned offset
    (data_frame(-5, 0, SESSION, STREAM, PAYLOAD).encode(), rcv.GARBAGE_REJECTED),  # before the initial term
    (SetupFrame(0, SESSION + 2, STREAM, 0, 0, 65535, MTU).encode(), rcv.GARBAGE_BAD_SETUP),
    (SetupFrame(40, SESSION + 2, STREAM, 0, 0, TERM_LENGTH, MTU).encode(), rcv.GARBAGE_BAD_SETUP),
    (SetupFrame(0, SESSION + 2, STREAM, 0, 0, TERM_LENGTH, 100).encode(), rcv.GARBAGE_BAD_SETUP),
])
def test_garbage_is_counted_by_kind_and_dropped(rig, datagram, kind):
    rig.setup()
    rig.sms()
    rig.data(0)
    rig.receiver.on_datagram(datagram)  # never raises
    assert rig.receiver.garbage == {kind: 1}
    assert rig.image.rebuilt_position == rig.image.hwm_position == FRAME
    assert list(rig.receiver.images) == [(SESSION, STREAM)]
    assert rig.work() == []
    assert sorted(p.name for p in rig.receiver.directory.iterdir()) == [f"{SESSION}-{STREAM}-0.logbuffer"]


def test_a_removed_subscription_ends_its_images_with_one_eos_sm_and_a_new_subscriber_rejoins(rig):
    """The rejoin scenario in words (README): subscriber 1 closes, one SM with EOS; the next
    subscriber's receiver asks the unknown session for a SETUP and joins at its position."""
    rig.setup()
    rig.sms()
    for i in range(100):
        rig.data(i)
    rig.consume(100 * FRAME)
    rig.sms()
    first = rig.image
    rig.receiver.remove_subscription(STREAM)
    assert rig.image is None and first.is_ended and rig.receiver.ended_images == [first]
    assert rig.receiver.do_work() == [StatusMessage(SESSION, STREAM, 0, 100 * FRAME, WINDOW, RECEIVER_ID,
                                                    flags=SM_EOS_FLAG).encode()]
    rig.heartbeat(100 * FRAME)
    rig.advance_ns(SM_TIMEOUT_NS * 5)
    assert rig.work() == []  # nobody subscribed: ignored, not garbage
    assert rig.receiver.frames_unsubscribed == 1 and rig.receiver.garbage == {}
    rig.receiver.add_subscription(STREAM)
    rig.heartbeat(100 * FRAME)
    assert rig.receiver.do_work() == [StatusMessage(SESSION, STREAM, 0, 0, 0, 0, flags=SM_SEND_SETUP_FLAG).encode()]
    rig.setup(term_id=0, term_offset=100 * FRAME)
    assert rig.image is not first and rig.image.join_position == 100 * FRAME
    assert [(sm_position(sm), sm.flags) for sm in rig.sms()] == [(100 * FRAME, 0)]


def test_a_frame_past_the_consumer_position_plus_the_window_is_counted_and_dropped(rig):
    rig.setup()
    rig.sms()
    rig.data(341)  # ends at 32832 > 0 + 32768
    assert rig.image.frames_over_run == 1 and rig.image.hwm_position == 0
    rig.data(340)  # ends at 32736: within
    assert rig.image.frames_over_run == 1 and rig.image.hwm_position == 341 * FRAME
    assert rig.receiver.garbage == {}


def test_a_stream_subscribed_with_its_own_window_grants_it_capped_at_half_a_term(rig):
    """A replayer's stream across sites (NetReceive.window) gets a window of its own (a bulk transfer:
    more than Aeron's 128 KiB a round trip); the other streams keep the default."""
    bulk, capped = STREAM + 1, STREAM + 2
    rig.receiver.add_subscription(bulk, window=TERM_LENGTH // 8)
    rig.receiver.add_subscription(capped, window=8 * TERM_LENGTH)
    for stream in (STREAM, bulk, capped):
        rig.setup(stream=stream)
    windows = {sm.stream_id: sm.receiver_window for sm in rig.sms()}
    assert windows == {STREAM: WINDOW, bulk: TERM_LENGTH // 8, capped: TERM_LENGTH // 2}
    with pytest.raises(ValueError, match="less than a frame"):
        rig.receiver.add_subscription(STREAM + 3, window=16)


# -- what strangers can make it allocate ------------------------------------------------------------

def _setup_from(rig, session: int, source: str, stream: int = STREAM) -> None:
    rig.receiver.on_datagram(SetupFrame(0, session, stream, 0, 0, TERM_LENGTH, MTU).encode(), source=source)


def test_a_setup_flood_makes_at_most_the_streams_images_each_taking_the_place_of_one_that_carried_nothing(
        tmp_path):
    rig = Rig(tmp_path, max_images_per_stream=4)
    rig.receiver.on_datagram(SetupFrame(0, SESSION, STREAM, 0, 0, TERM_LENGTH, MTU).encode(), source="10.0.0.1")
    rig.data(0)  # the real sender's image carries data
    for session in range(9000, 9140):  # the flood: 140 SETUPs of made-up sessions
        _setup_from(rig, session, "10.6.6.6")

    receiver = rig.receiver
    assert len(receiver.images) == 4
    assert rig.image is not None and rig.image.rebuilt_position == FRAME  # the one with data stays
    assert sorted(session for session, _ in receiver.images) == [SESSION, 9137, 9138, 9139]
    assert receiver.images_evicted == 137 and receiver.setups_refused == 0
    assert len(receiver.ended_images) == 137  # for the owner to close and remove


def test_a_stream_whose_images_all_carry_data_refuses_a_new_setup_and_counts_it(tmp_path, caplog):
    rig = Rig(tmp_path, max_images_per_stream=2)
    for session in (1, 2):
        _setup_from(rig, session, "10.0.0.1")
        rig.data(0, session=session)

    for session in range(3, 103):
        _setup_from(rig, session, "10.0.0.2")

    assert sorted(rig.receiver.images) == [(1, STREAM), (2, STREAM)]
    assert rig.receiver.setups_refused == 100 and rig.receiver.images_evicted == 0
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1  # a flood is one line per SETUP_REFUSED_LOG_INTERVAL_NS
    assert "stream 1005 has 2 images carrying data, its most" in refusals[0] and "10.0.0.2" in refusals[0]


def test_one_source_gets_at_most_its_images_over_all_streams_and_others_still_theirs(tmp_path):
    rig = Rig(tmp_path, max_images_per_source=3)
    for stream in range(STREAM + 1, STREAM + 6):
        rig.receiver.add_subscription(stream)
    for stream in range(STREAM, STREAM + 6):
        _setup_from(rig, 7, "10.6.6.6", stream=stream)

    _setup_from(rig, 8, "10.0.0.1")

    by_source = sorted((image.source, key[1]) for key, image in rig.receiver.images.items())
    assert by_source == [("10.0.0.1", STREAM), ("10.6.6.6", STREAM), ("10.6.6.6", STREAM + 1),
                         ("10.6.6.6", STREAM + 2)]
    assert rig.receiver.setups_refused == 3
    rig.advance_ns(IMAGE_LIVENESS_TIMEOUT_NS + 1)  # the stranger's images end: its room comes back
    rig.work()
    _setup_from(rig, 9, "10.6.6.6", stream=STREAM + 5)
    assert rig.receiver.image(9, STREAM + 5).source == "10.6.6.6"

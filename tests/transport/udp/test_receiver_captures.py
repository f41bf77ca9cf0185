"""Our receiver, fed what the captured Aeron sender sent, answers as the captured receiver did.

The sender's datagrams go to a NetworkReceiver at their capture times on a ManualClock that also
ticks every 0.1 ms between them (the duty cycle); the image's reader is our own Image, consuming as
the capture's subscriber did: at each moment, up to the last position its log (NAME.sub.csv) shows
by then (its unix times put on the capture's clock by the pcap's first time stamp)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import pytest

from ramen.clocks import NANOS_PER_SECOND, ManualClock
from ramen.transport import FragmentAssembler, Image
from ramen.transport.udp.protocol import DataFrame, StatusMessage, frames_of
from ramen.transport.udp.receiver import NetworkReceiver
from ramen.transport.udp.rebuild import StatusMessagePolicy
from tests.transport.udp.conftest import MESSAGES, RECEIVER_DIR, SENDER_DIR, STREAM_END_POSITION, read_capture
from tests.vectors import LOGBUFFER_LENS, expected_payload

EXPECTED = [expected_payload(i, LOGBUFFER_LENS) for i in range(MESSAGES)]
TICK_NS = 100_000
"""The duty cycle's period in the simulation."""
RECEIVER_ID = 0x5EED_0F_2A3B4C5D
SESSION_ID, TERM_LENGTH = 888, 65536
STREAM_IDS = {"normal": 1001, "slow": 1002}
PCAP_GLOBAL_HEADER = struct.Struct("<IHHiIII")
PCAP_RECORD_TIME = struct.Struct("<II")


def capture_epoch_s(path) -> float:
    """The unix time of the capture's first datagram (its t = 0), from the pcap's first record."""
    data = path.read_bytes()
    seconds, micros = PCAP_RECORD_TIME.unpack_from(data, PCAP_GLOBAL_HEADER.size)
    return seconds + micros / 1e6


def subscriber_log(path, epoch_s: float) -> tuple[int, list[tuple[int, int]]]:
    """When the captured subscriber subscribed, and (time, position) after each message it took
    (times in ns on the capture's clock)."""
    subscribed, out = None, []
    for line in path.read_text().splitlines():
        if line.startswith("rx,"):
            fields = line.split(",")
            out.append((round((float(fields[7]) - epoch_s) * NANOS_PER_SECOND), int(fields[3])))
        elif line.endswith(" subscription added"):
            subscribed = round((float(line.split()[1]) - epoch_s) * NANOS_PER_SECOND)
    assert subscribed is not None
    return subscribed, out


def consumption_of(datagrams, subscriber: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(time, position) the subscriber is known to have consumed by then, in time order: from its
    log, and from each captured SM (the position the captured receiver read from it at that time;
    the log's time stamps are taken after the fact, so they lag the SMs by a few microseconds)."""
    known = list(subscriber)
    for datagram in datagrams:
        if datagram.direction == RECEIVER_DIR:
            for item in frames_of(datagram.data):
                if isinstance(item, StatusMessage) and not item.is_setup_request:
                    known.append((round(datagram.t * NANOS_PER_SECOND),
                                  item.consumption_term_id * TERM_LENGTH + item.consumption_term_offset))
    known.sort()
    return known


class Reader:
    """The image's subscriber: polls one fragment at a time up to where the captured one was."""

    def __init__(self, receiver: NetworkReceiver, image) -> None:
        self.receiver = receiver
        self.ours = image
        self.image = Image(image.log, join_position=image.join_position)
        self.messages: list[bytes] = []
        self.assembler = FragmentAssembler(
            lambda buffer, offset, length, header: self.messages.append(bytes(buffer[offset:offset + length])))

    def consume_to(self, target: int) -> None:
        while self.image.position < target and self.image.poll(self.assembler.on_fragment, 1):
            pass
        self.receiver.consumed_to(self.ours.session_id, self.ours.stream_id, self.image.position)


@dataclass
class Run:
    sms: list[tuple[int, StatusMessage, bytes]] = field(default_factory=list)
    """Every SM of ours: (capture time in ns, frame, bytes)."""
    out: list[tuple[int, bytes]] = field(default_factory=list)
    reader: Reader | None = None
    receiver: NetworkReceiver | None = None


def drive(tmp_path, udp_vectors, name: str) -> tuple[list, Run]:
    datagrams = read_capture(udp_vectors, name)
    epoch = capture_epoch_s(udp_vectors / f"{name}.pcap")
    subscribed_ns, subscriber = subscriber_log(udp_vectors / f"{name}.sub.csv", epoch)
    consumed = consumption_of(datagrams, subscriber)
    clock = ManualClock()
    start = clock.nanos()
    receiver = NetworkReceiver(tmp_path, receiver_id=RECEIVER_ID, clock=clock)
    run = Run(receiver=receiver)
    state = {"next": 0, "target": 0}

    def now() -> int:
        return clock.nanos() - start

    def advance_to(t_ns: int) -> None:
        clock.advance((start + t_ns - clock.nanos()) / NANOS_PER_SECOND)

    def work() -> None:
        while state["next"] < len(consumed) and consumed[state["next"]][0] <= now():
            state["target"] = max(state["target"], consumed[state["next"]][1])
            state["next"] += 1
        if run.reader is None and receiver.images:
            run.reader = Reader(receiver, next(iter(receiver.images.values())))
        if run.reader is not None and not run.reader.ours.is_ended:
            run.reader.consume_to(state["target"])
        for data in receiver.do_work():
            run.out.append((now(), data))
            for item in frames_of(data):
                if isinstance(item, StatusMessage):
                    run.sms.append((now(), item, data))

    for datagram in datagrams:
        t_ns = round(datagram.t * NANOS_PER_SECOND)
        while now() + TICK_NS < t_ns:
            advance_to(now() + TICK_NS)
            work()
        advance_to(t_ns)
        if not receiver.stream_ids and now() >= subscribed_ns:
            receiver.add_subscription(STREAM_IDS[name])
        if datagram.direction == SENDER_DIR:
            receiver.on_datagram(datagram.data)
        work()
    return datagrams, run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, udp_vectors):
    return {name: drive(tmp_path_factory.mktemp(name), udp_vectors, name) for name in ("normal", "slow")}


@pytest.fixture(params=("normal", "slow"))
def run_of(request, runs):
    return request.param, *runs[request.param]


def captured_sms(datagrams) -> list[tuple[int, StatusMessage, bytes]]:
    return [(round(d.t * NANOS_PER_SECOND), f, d.data) for d in datagrams if d.direction == RECEIVER_DIR
            for f in frames_of(d.data) if isinstance(f, StatusMessage)]


def position(sm: StatusMessage) -> int:
    return sm.consumption_term_id * TERM_LENGTH + sm.consumption_term_offset


def first_eos_heartbeat_ns(datagrams) -> int:
    return min(round(d.t * NANOS_PER_SECOND) for d in datagrams if d.direction == SENDER_DIR
               for f in frames_of(d.data) if isinstance(f, DataFrame) and f.is_heartbeat and f.is_eos)


def test_the_stream_rebuilt_is_the_generators_200_messages(run_of):
    name, datagrams, run = run_of
    assert run.reader.messages == EXPECTED
    image = run.reader.ours
    assert image.rebuilt_position == image.hwm_position == image.end_of_stream_position == STREAM_END_POSITION
    assert run.receiver.garbage == {}
    assert run.receiver.naks_sent == run.receiver.loss_gaps == 0
    assert all(isinstance(frames_of(data)[0], StatusMessage) for _, data in run.out)


def test_our_sms_come_when_the_captured_receivers_did_with_its_layout_and_bytes(run_of):
    """One SM of ours per captured SM: due by its time (never later than one duty cycle), not early
    by more than the captured driver's accumulated 200 ms lag, with the same session, stream,
    window, 36-byte layout; its position is the captured one, or (normal, where the subscriber's log
    shows it a little earlier) one it passed within window/4 before; the same bytes but the
    receiverId where position and flags agree."""
    name, datagrams, run = run_of
    captured = captured_sms(datagrams)
    assert len(run.sms) == len(captured) == (18 if name == "normal" else 37)
    same_bytes = 0
    for (t, ours, data), (t_c, theirs, data_c) in zip(run.sms, captured):
        assert t <= t_c + TICK_NS and t_c - t < 10_000_000, (t, t_c)
        assert len(data) == len(data_c) == 36
        assert (ours.session_id, ours.stream_id, ours.receiver_window, ours.receiver_id) == \
            (SESSION_ID, STREAM_IDS[name], 32768, RECEIVER_ID)
        assert ours.group_tag is None
        assert position(theirs) - 32768 // 4 <= position(ours) <= position(theirs)
        if name == "slow":
            assert position(ours) == position(theirs)
        # The layout is the same whatever the position and flags: with theirs, ours are their bytes.
        assert StatusMessage(**{**vars(ours), "receiver_id": theirs.receiver_id, "flags": theirs.flags,
                                "consumption_term_id": theirs.consumption_term_id,
                                "consumption_term_offset": theirs.consumption_term_offset}).encode() == data_c
        if position(ours) == position(theirs) and ours.flags == theirs.flags:
            assert StatusMessage(**{**vars(ours), "receiver_id": theirs.receiver_id}).encode() == data_c
            same_bytes += 1
    # Only the EOS flag (ours one SM sooner in slow, two in normal) and 10 of normal's positions differ.
    assert same_bytes == (36 if name == "slow" else 7)


def test_no_sm_of_ours_that_the_policy_would_not_send(run_of):
    """Replayed through a StatusMessagePolicy at their times, each of our SMs was due; one sent on
    the 200 ms timeout repeats the last SM's position (Aeron's next_sm_position)."""
    name, datagrams, run = run_of
    clock = ManualClock()
    start = clock.nanos()
    policy = StatusMessagePolicy(32768, clock=clock)
    previous = None
    timeouts = 0
    for t, sm, _ in run.sms:
        clock.advance((start + t - clock.nanos()) / NANOS_PER_SECOND)
        assert policy.due(position(sm))
        if previous is not None and position(sm) <= previous + 32768 // 4:
            assert position(sm) == previous
            timeouts += 1
        policy.sent(position(sm))
        previous = position(sm)
    assert timeouts >= 6


def test_sms_carry_eos_once_the_end_of_stream_was_consumed_never_later_than_the_captured_receivers(run_of):
    name, datagrams, run = run_of
    eos_ns = first_eos_heartbeat_ns(datagrams)
    for t, sm, _ in run.sms:
        assert sm.is_eos == (t >= eos_ns), (t, eos_ns)
    first_theirs = min(t for t, sm, _ in captured_sms(datagrams) if sm.is_eos)
    first_ours = min(t for t, sm, _ in run.sms if sm.is_eos)
    assert eos_ns < first_ours <= first_theirs
    assert not any(sm.is_eos for t, sm, _ in captured_sms(datagrams) if t < eos_ns)


def test_setups_before_the_subscription_make_no_image(run_of):
    """slow: the 7 SETUPs before the subscriber subscribed are ignored, as the captured receiver did
    (its first SM answers the first SETUP after)."""
    name, datagrams, run = run_of
    assert run.receiver.setups_received == (7 if name == "slow" else 1)
    assert run.receiver.frames_unsubscribed == (6 if name == "slow" else 0)
    assert len(run.receiver.images) == 1

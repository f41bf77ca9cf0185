"""Our sender, driven as the captured Aeron sender was, emits what it emitted.

The log holds the generator's 200 messages, offered through our own ExclusivePublication (session
888, the capture's stream id, term length 65536, initial term id 0, MTU 1408), each as soon as the
captured sender first sent its first frame (so data becomes available when it did); the captured
receiver's datagrams (SMs) are given to the sender at their capture times, on a ManualClock that
also ticks every 0.1 ms between them (the duty cycle)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from ramen.clocks import NANOS_PER_SECOND, ManualClock
from ramen.transport import ExclusivePublication, LogBuffer, LogBufferParams
from ramen.transport.frame import HEADER_LENGTH, align
from ramen.transport.status import ADMIN_ACTION
from ramen.transport.udp.defaults import HEARTBEAT_IDLE_NS, SETUP_RETRY_NS
from ramen.transport.udp.protocol import (DataFrame, NakFrame, RttMeasurement, SetupFrame, StatusMessage,
                                          frames_of)
from ramen.transport.udp.sender import NetworkSender
from tests.transport.udp.conftest import MESSAGES, RECEIVER_DIR, SENDER_DIR, STREAM_END_POSITION
from tests.vectors import LOGBUFFER_LENS, expected_payload

TERM_LENGTH = 65536
SESSION_ID = 888
MTU = 1408
TICK_NS = 100_000
"""The duty cycle's period in the simulation: the captured driver's timings are this fine."""
STREAM_IDS = {"normal": 1001, "slow": 1002}
SENDER_ADDRESS, RECEIVER_ADDRESS = "127.0.0.1:24326", "127.0.0.1:24325"


def position_of(item: DataFrame) -> int:
    return item.term_id * TERM_LENGTH + item.term_offset


def wire_end(item: DataFrame) -> int:
    """Where a frame's sent bytes end in the stream (a PAD's header only, as the check counts)."""
    return position_of(item) + (HEADER_LENGTH if item.is_pad else align(item.frame_length))


def layout(item: DataFrame, datagram: bytes, offset: int) -> tuple:
    """What must match per position: termId, termOffset, frame length, flags, type and the bytes sent."""
    return (item.term_id, item.term_offset, item.frame_length, item.flags, item.frame_type,
            datagram[offset:offset + item.wire_length])


def data_frames_with_offsets(datagram: bytes):
    offset = 0
    for item in frames_of(datagram):
        if isinstance(item, DataFrame):
            yield item, offset
        offset = align(offset + item.wire_length)


@dataclass
class Run:
    """What our sender sent, and when (ns since the capture's first datagram)."""
    sent: list[tuple[int, bytes]] = field(default_factory=list)
    timeline: list[tuple[int, str, bytes]] = field(default_factory=list)
    """Every datagram, ours and the captured receiver's, in the order they happened: (t, dir, bytes)."""
    over_limit: list[tuple[int, int]] = field(default_factory=list)
    """First transmissions that ended past the last SM's position + window: (end, limit)."""
    first_sent: dict[int, tuple] = field(default_factory=dict)
    bursts: list[int | None] = field(default_factory=list)
    """After each captured receiver datagram: the highest end of a first transmission before the next one."""
    close_ns: int = 0
    sender: NetworkSender | None = None


def captured_first_sent(datagrams) -> dict[int, tuple[float, tuple]]:
    """Position -> (time, layout) of each DATA/PAD frame's first transmission in the capture."""
    first = {}
    for datagram in datagrams:
        if datagram.direction != SENDER_DIR:
            continue
        for item, offset in data_frames_with_offsets(datagram.data):
            if not item.is_heartbeat and position_of(item) not in first:
                first[position_of(item)] = (datagram.t, layout(item, datagram.data, offset))
    return first


def captured_bursts(datagrams) -> list[int | None]:
    bursts: list[int | None] = []
    for datagram in datagrams:
        if datagram.direction == RECEIVER_DIR:
            bursts.append(None)
            continue
        for item, _ in data_frames_with_offsets(datagram.data):
            if not item.is_heartbeat and bursts:
                bursts[-1] = max(bursts[-1] or 0, wire_end(item))
    return bursts


def drive(tmp_path, name: str, datagrams) -> Run:
    """Run our sender through the capture's time line."""
    stream_id = STREAM_IDS[name]
    log = LogBuffer.create(tmp_path / f"{name}.logbuffer", LogBufferParams(
        term_length=TERM_LENGTH, mtu_length=MTU, initial_term_id=0, session_id=SESSION_ID, stream_id=stream_id))
    publication = ExclusivePublication(log)
    clock = ManualClock()
    start_ns = clock.nanos()
    sender = NetworkSender(log, clock=clock)
    first_times = {position: t for position, (t, _) in captured_first_sent(datagrams).items()}
    heartbeats = [d for d in datagrams if d.direction == SENDER_DIR
                  for f in frames_of(d.data) if isinstance(f, DataFrame) and f.is_heartbeat]
    # The publisher closed between the captured sender's last heartbeat without EOS and its first with.
    last_plain = max(d.t for d in heartbeats if not frames_of(d.data)[0].is_eos)
    first_eos = min(d.t for d in heartbeats if frames_of(d.data)[0].is_eos)
    run = Run(close_ns=round((last_plain + first_eos) / 2 * NANOS_PER_SECOND), sender=sender)
    state = {"next_message": 0, "limit": None, "closed": False}

    def now() -> int:
        return clock.nanos() - start_ns

    def advance_to(t_ns: int) -> None:
        clock.advance((start_ns + t_ns - clock.nanos()) / NANOS_PER_SECOND)

    def offer_due() -> None:
        while state["next_message"] < MESSAGES and first_times.get(publication.position, 1e9) * NANOS_PER_SECOND \
                <= now() + 1:
            i = state["next_message"]
            result = publication.offer(expected_payload(i, LOGBUFFER_LENS))
            if result != ADMIN_ACTION:
                assert result > 0, result
                state["next_message"] += 1
        if not state["closed"] and now() >= run.close_ns:
            publication.close()
            state["closed"] = True

    def work() -> None:
        offer_due()
        for _ in range(1000):  # bounded: a sender that never runs out of work fails, not hangs
            out = sender.do_work()
            if not out:
                return
            for datagram in out:
                run.sent.append((now(), datagram))
                run.timeline.append((now(), SENDER_DIR, datagram))
                for item, offset in data_frames_with_offsets(datagram):
                    position = position_of(item)
                    if item.is_heartbeat or position in run.first_sent:
                        continue
                    run.first_sent[position] = layout(item, datagram, offset)
                    if state["limit"] is None or wire_end(item) > state["limit"]:
                        run.over_limit.append((wire_end(item), state["limit"]))
                    if run.bursts:
                        run.bursts[-1] = max(run.bursts[-1] or 0, wire_end(item))
        raise AssertionError(f"the sender still had datagrams after 1000 duty cycles at {now()} ns")

    for datagram in datagrams:
        t_ns = round(datagram.t * NANOS_PER_SECOND)
        while now() + TICK_NS < t_ns:
            advance_to(now() + TICK_NS)
            work()
        advance_to(t_ns)
        if datagram.direction == RECEIVER_DIR:
            run.timeline.append((now(), RECEIVER_DIR, datagram.data))
            run.bursts.append(None)
            for item in frames_of(datagram.data):
                if isinstance(item, StatusMessage):
                    if not item.is_setup_request:
                        position = item.consumption_term_id * TERM_LENGTH + item.consumption_term_offset
                        state["limit"] = max(state["limit"] or 0, position + item.receiver_window)
                    sender.on_status(item)
                elif isinstance(item, NakFrame):
                    sender.on_nak(item)
                elif isinstance(item, RttMeasurement):
                    sender.on_rttm(item)
        work()
    assert state["next_message"] == MESSAGES and state["closed"]
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, udp_vectors):
    from tests.transport.udp.conftest import read_capture
    out = {}
    for name in STREAM_IDS:
        datagrams = read_capture(udp_vectors, name)
        out[name] = (datagrams, drive(tmp_path_factory.mktemp(name), name, datagrams))
    return out


@pytest.fixture(params=tuple(STREAM_IDS))
def run_of(request, runs):
    return request.param, *runs[request.param]


def test_every_data_and_pad_frame_has_the_captured_layout_and_bytes(run_of):
    name, datagrams, run = run_of
    captured = {position: frame_layout for position, (_, frame_layout) in captured_first_sent(datagrams).items()}
    assert len(captured) == 335  # 332 DATA + 3 PAD
    assert run.first_sent.keys() == captured.keys()
    for position, frame_layout in captured.items():
        assert run.first_sent[position] == frame_layout, f"{name}: frame at position {position}"
    assert run.sender.sender_position == STREAM_END_POSITION


def test_no_first_transmission_ends_past_the_last_sm_position_plus_window(run_of):
    name, datagrams, run = run_of
    assert run.over_limit == []


def test_each_sm_releases_the_same_burst_as_the_captured_senders(run_of):
    """After each captured SM, our first transmissions end where the captured sender's did; in the
    slow capture (the sender held by flow control) each burst ends within one MTU below the SM's
    position + 32768, the next frame not fitting, and at least one ends exactly there."""
    name, datagrams, run = run_of
    assert run.bursts == captured_bursts(datagrams)
    if name == "slow":
        limits = []
        for _, direction, data in run.timeline:
            if direction == RECEIVER_DIR:
                sm = frames_of(data)[0]
                limits.append(sm.consumption_term_id * TERM_LENGTH + sm.consumption_term_offset + sm.receiver_window)
        held = [(limit, end) for limit, end in zip(limits, run.bursts) if end is not None and end < STREAM_END_POSITION]
        assert len(held) >= 20
        assert all(limit - MTU < end <= limit for limit, end in held), held
        assert any(end == limit for limit, end in held)


def test_setups_repeat_every_100_ms_until_the_first_sm(run_of):
    name, datagrams, run = run_of
    first_sm_ns = next(t for t, direction, _ in run.timeline if direction == RECEIVER_DIR)
    setups = [t for t, data in run.sent if isinstance(frames_of(data)[0], SetupFrame)]
    captured = [d for d in datagrams if d.direction == SENDER_DIR and isinstance(frames_of(d.data)[0], SetupFrame)]
    assert len(setups) == len(captured) == (7 if name == "slow" else 1)
    assert all(t < first_sm_ns for t in setups)
    assert all(SETUP_RETRY_NS < b - a <= SETUP_RETRY_NS + TICK_NS for a, b in zip(setups, setups[1:]))
    for t, data in run.sent:
        if isinstance(frames_of(data)[0], SetupFrame):
            assert frames_of(data)[0] == frames_of(captured[0].data)[0]  # the same SETUP, byte for byte


def test_heartbeats_go_every_100_ms_when_idle_with_eos_after_close(run_of):
    name, datagrams, run = run_of
    last_data_ns = max(t for t, data in run.sent for item, _ in data_frames_with_offsets(data)
                       if not item.is_heartbeat)
    heartbeats = [(t, item) for t, data in run.sent for item, _ in data_frames_with_offsets(data)
                  if item.is_heartbeat and t > last_data_ns]
    captured_last_data = max(d.t for d in datagrams if d.direction == SENDER_DIR
                             for item, _ in data_frames_with_offsets(d.data) if not item.is_heartbeat)
    captured = [d for d in datagrams if d.direction == SENDER_DIR and d.t > captured_last_data
                for item, _ in data_frames_with_offsets(d.data) if item.is_heartbeat]
    # Ours are due at 100 ms + one tick, the captured driver's at a median 100.4 ms.
    assert len(heartbeats) >= len(captured) >= 13
    times = [last_data_ns] + [t for t, _ in heartbeats]
    assert all(HEARTBEAT_IDLE_NS < b - a <= HEARTBEAT_IDLE_NS + TICK_NS for a, b in zip(times, times[1:]))
    for t, item in heartbeats:
        assert position_of(item) == STREAM_END_POSITION
        assert item.flags == (0xE0 if t >= run.close_ns else 0xC0)
    assert {item.flags for _, item in heartbeats} == {0xC0, 0xE0}
    assert run.sender.heartbeats_sent == sum(1 for t, data in run.sent for item, _ in data_frames_with_offsets(data)
                                             if item.is_heartbeat)


DECODE_AND_CHECK = """
import json, sys
sys.path.insert(0, sys.argv[1])
import aeron_udp_decode as decoder
setups, dgs = {}, []
for line in open(sys.argv[2]):
    record = json.loads(line)
    payload = bytes.fromhex(record["hex"])
    record["len"] = len(payload)
    record["frames"] = decoder.decode_frames(payload, setups)
    dgs.append(record)
sys.exit(0 if decoder.check(dgs, int(sys.argv[3])) else 1)
"""


def test_our_datagrams_with_the_captured_sms_pass_the_decoders_check(tmp_path, udp_vectors, run_of):
    name, datagrams, run = run_of
    path = tmp_path / f"ours-{name}.jsonl"
    with path.open("w") as out:
        for n, (t_ns, direction, data) in enumerate(run.timeline):
            src, dst = (SENDER_ADDRESS, RECEIVER_ADDRESS) if direction == SENDER_DIR else \
                (RECEIVER_ADDRESS, SENDER_ADDRESS)
            out.write(json.dumps({"n": n, "t": round(t_ns / NANOS_PER_SECOND, 6), "src": src, "dst": dst,
                                  "dir": direction, "hex": data.hex()}) + "\n")
    result = subprocess.run([sys.executable, "-c", DECODE_AND_CHECK, str(udp_vectors), str(path), str(MESSAGES)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "generator check: OK" in result.stdout
    flow = next(line for line in result.stdout.splitlines() if line.startswith("flow control:"))
    overshoot = int(flow.split("= ")[1].split(" bytes")[0])
    assert overshoot <= 0, flow

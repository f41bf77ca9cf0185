"""Aeron's UDP frames decode to the fields real Aeron put in them, and encode back to its bytes."""

from __future__ import annotations

import random
import struct

import pytest

from ramen.transport.udp import protocol
from ramen.transport.udp.protocol import (DataFrame, DatagramBuilder, NakFrame, RttMeasurement, SetupFrame,
                                          StatusMessage, WireError, datagram_of, frames_of)

MTU = 1408


def expected_fields(record: dict) -> dict:
    """The jsonl's decoded frame, in our dataclass's terms."""
    kind = record["type"]
    flags = int(record["flags"], 16)
    if kind in ("DATA", "PAD"):
        fields = {"frame_length": record["frame_length"], "flags": flags, "frame_type": record["type_id"],
                  "term_offset": record["term_offset"], "session_id": record["session_id"],
                  "stream_id": record["stream_id"], "term_id": record["term_id"],
                  "reserved_value": record["reserved_value"]}
        return fields
    if kind == "SETUP":
        return {key: record[key] for key in ("term_offset", "session_id", "stream_id", "initial_term_id",
                                             "active_term_id", "term_length", "mtu", "ttl")} | {"flags": flags}
    if kind == "SM":
        return {key: record[key] for key in ("session_id", "stream_id", "consumption_term_id",
                                             "consumption_term_offset", "receiver_window", "receiver_id")} \
            | {"group_tag": record.get("group_tag"), "flags": flags}
    raise AssertionError(f"no frame of type {kind} in the captures we test")


def test_every_captured_frame_decodes_to_the_fields_of_the_capture(capture):
    name, datagrams = capture
    kinds = set()
    for datagram in datagrams:
        frames = frames_of(datagram.data)
        assert len(frames) == len(datagram.frames), f"{name} #{datagram.n}"
        for decoded, record in zip(frames, datagram.frames):
            kinds.add(record["type"])
            expected = expected_fields(record)
            assert {key: getattr(decoded, key) for key in expected} == expected, f"{name} #{datagram.n}"
            if isinstance(decoded, DataFrame):
                assert decoded.is_heartbeat == record.get("heartbeat", False)
                assert decoded.is_eos == record.get("eos", False)
                assert decoded.is_pad == (record["type"] == "PAD")
                if "payload_length" in record:
                    payload = datagram.data[record["off"] + 32:record["off"] + record["frame_length"]]
                    assert len(decoded.payload) == record["payload_length"]
                    assert bytes(decoded.payload) == payload
    assert kinds == {"SETUP", "SM", "DATA", "PAD"}


def test_every_captured_frame_and_datagram_encodes_to_the_captured_bytes(capture):
    name, datagrams = capture
    for datagram in datagrams:
        frames = frames_of(datagram.data)
        for decoded, record in zip(frames, datagram.frames):
            encoded = decoded.encode()
            assert encoded == datagram.data[record["off"]:record["off"] + len(encoded)], f"{name} #{datagram.n}"
        assert datagram_of(frames, MTU) == datagram.data, f"{name} #{datagram.n}"


def test_heartbeat_and_pad_are_sent_header_only_and_pad_ends_the_datagram():
    beat = protocol.heartbeat(3, 64608, 888, 1001, eos=True)
    assert beat.encode() == bytes.fromhex("0000000000e0010060fc000078030000e9030000030000000000000000000000")
    assert beat.is_heartbeat and beat.is_eos
    pad = protocol.pad_frame(0, 65248, 888, 1001, 65536)
    assert pad.frame_length == 288 and len(pad.encode()) == 32
    builder = DatagramBuilder(MTU)
    assert builder.add(protocol.data_frame(0, 64992, 888, 1001, b"x" * 200))
    assert builder.add(pad)
    assert not builder.add(protocol.data_frame(1, 0, 888, 1001, b"y"))
    datagram = builder.build()
    assert len(datagram) == 256 + 32 and [f.is_pad for f in frames_of(datagram)] == [False, True]


def test_the_builder_packs_frames_up_to_the_mtu_and_no_further():
    frames = [protocol.data_frame(0, i * 96, 888, 1001, bytes(64)) for i in range(20)]
    builder = DatagramBuilder(MTU)
    added = 0
    while builder.add(frames[added]):
        added += 1
    assert added == MTU // 96  # 14 frames of 96 aligned bytes; the 15th would make 1440
    datagram = builder.build()
    assert len(datagram) == 14 * 96
    assert [f.term_offset for f in frames_of(datagram)] == [i * 96 for i in range(14)]
    assert builder.build() == b""


def test_control_frames_round_trip_including_a_group_tag_nak_and_rttm():
    for item in (StatusMessage(888, 1004, 2, 4096, 14080, 77, group_tag=77, flags=protocol.SM_SEND_SETUP_FLAG),
                 NakFrame(888, 1003, 1, 4544, 1408),
                 RttMeasurement(888, 1004, 123456789, 0, -5, flags=protocol.RTTM_REPLY_FLAG),
                 SetupFrame(64224, 888, 1005, 0, 1, 65536, 1408)):
        encoded = item.encode()
        assert len(encoded) == {StatusMessage: 44, NakFrame: 28, RttMeasurement: 40, SetupFrame: 40}[type(item)]
        assert frames_of(encoded) == [item]
    assert struct.unpack_from("<q", StatusMessage(1, 2, 3, 4, 5, 6, group_tag=77).encode(), 36) == (77,)


def _header(length: int, frame_type: int, version: int = 0, flags: int = 0xC0) -> bytes:
    return struct.pack("<iBBH", length, version, flags, frame_type)


@pytest.mark.parametrize("datagram, problem", [
    (b"", "shorter than a frame header"),
    (b"\x20\x00\x00", "shorter than a frame header"),
    (_header(40, 1) + bytes(8), "DATA header needs 32 bytes"),
    (_header(20, 1) + bytes(24), "DATA frame length 20"),
    (_header(100, 1) + bytes(56), "DATA frame length 100"),
    (_header(-64, 1) + bytes(56), "DATA frame length -64"),
    (_header(32, 0x0F) + bytes(24), "unknown frame type 0x000f"),
    (_header(40, 4) + bytes(32), "unsupported frame type ERR"),
    (_header(32, 1, version=1) + bytes(24), "version 1"),
    (_header(40, 3) + bytes(32), "SM frame length 40, expected 36 or 44"),
    (_header(28, 2) + bytes(16), "NAK frame length 28, expected 28 within the 24 bytes left"),
    (_header(320, 0) + bytes(24) + _header(32, 1) + bytes(24), "PAD frame is not the last"),
    (_header(33, 0) + bytes(24), "PAD frame length 33"),
    (_header(32, 1) + bytes(24) + b"\x01\x02\x03", "3 trailing bytes"),
])
def test_malformed_datagrams_raise_one_typed_error_naming_the_problem(datagram, problem):
    with pytest.raises(WireError) as raised:
        frames_of(datagram)
    message = str(raised.value)
    assert problem in message and "\n" not in message
    assert message.startswith(f"datagram of {len(datagram)} bytes")


def test_damaged_captured_datagrams_never_fail_but_with_the_typed_error(capture):
    """Truncations and flipped bytes of real datagrams (seeded): each decodes or raises WireError,
    never IndexError or struct.error."""
    name, datagrams = capture
    rng = random.Random(23)
    raised = 0
    for _ in range(3000):
        data = bytearray(rng.choice(datagrams).data)
        if rng.random() < 0.5:
            data = data[:rng.randrange(len(data))]
        for _ in range(rng.randrange(1, 4)):
            if data:
                data[rng.randrange(min(len(data), 48))] = rng.randrange(256)
        try:
            frames_of(bytes(data))
        except WireError:
            raised += 1
    assert raised > 500

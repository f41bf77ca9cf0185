"""Aeron 1.48's UDP frames, byte for byte: what a sender and a receiver put in datagrams.

Every frame starts with Aeron's common header (frameLength i32 @0, version u8 @4, flags u8 @5, type
u16 @6). DATA and PAD frames are the log's own 32-byte frame header (ramen.transport.frame, declared
there once and reused here), so a DATA frame goes from a term to a datagram and back unchanged. The
control frames (SETUP, SM, NAK, RTTM) are declared below, each once: its struct, its named offsets,
its type id and flags. Layouts are Aeron's C structs (aeron_udp_protocol.h) and Java flyweights,
which agree; docs/network.md has them as tables.

Frames in a datagram chain: each next frame starts at align(frameLength, 32). Two exceptions, as
Aeron sends them: a heartbeat (a DATA frame of length 0) is its 32-byte header alone, and a PAD frame
is sent header-only although its frameLength covers the rest of the term, so it is always the last
frame of its datagram.

Decoding is per datagram with struct (a datagram is at most an MTU, 64 KiB). A DATA frame's payload
is a view into the datagram, not a copy: the receiver copies it once, into its log.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ramen.transport import frame
from ramen.transport.defaults import MAX_UDP_PAYLOAD_LENGTH
from ramen.transport.errors import TransportError
from ramen.transport.frame import (BEGIN_FLAG, CURRENT_VERSION, END_FLAG, EOS_FLAG, FRAME_ALIGNMENT,
                                   HDR_TYPE_DATA, HDR_TYPE_PAD, HEADER_LENGTH, UNFRAGMENTED, align)

# -- type ids (Aeron's HeaderFlyweight.HDR_TYPE_*) -------------------------------------------------

HDR_TYPE_NAK = 0x02
HDR_TYPE_SM = 0x03
HDR_TYPE_ERR = 0x04
HDR_TYPE_SETUP = 0x05
HDR_TYPE_RTTM = 0x06
HDR_TYPE_RES = 0x07
HDR_TYPE_ATS_DATA = 0x08
HDR_TYPE_RSP_SETUP = 0x0B

TYPE_NAMES = {HDR_TYPE_PAD: "PAD", HDR_TYPE_DATA: "DATA", HDR_TYPE_NAK: "NAK", HDR_TYPE_SM: "SM",
              HDR_TYPE_ERR: "ERR", HDR_TYPE_SETUP: "SETUP", HDR_TYPE_RTTM: "RTTM", HDR_TYPE_RES: "RES",
              HDR_TYPE_ATS_DATA: "ATS_DATA", HDR_TYPE_RSP_SETUP: "RSP_SETUP"}

# -- the common header, first 8 bytes of every frame -----------------------------------------------

COMMON = frame.LENGTH_FLAGS_TYPE
"""@0: frameLength i32, version u8, flags u8, type u16 (Aeron's HeaderFlyweight)."""
COMMON_LENGTH = COMMON.size

# -- DATA / PAD / heartbeat: the log's frame header (ramen.transport.frame) ------------------------

DATA_HEADER = frame.HEADER
DATA_HEADER_LENGTH = HEADER_LENGTH
HEARTBEAT_FRAME_LENGTH = 0
"""A heartbeat is a DATA header with frameLength 0, sent alone (32 bytes) at the sender's position."""

# -- SETUP (SetupFlyweight), 40 bytes -------------------------------------------------------------

SETUP = struct.Struct("<iBBHiiiiiiii")
"""The common header, then termOffset, sessionId, streamId, initialTermId, activeTermId, termLength,
mtu, ttl (i32 each, from @8): SetupFrame's fields, in order."""
SETUP_LENGTH = SETUP.size
SETUP_SEND_RESPONSE_FLAG = 0x80
SETUP_GROUP_FLAG = 0x40

# -- SM, status message (StatusMessageFlyweight), 36 bytes, 44 with a group tag --------------------

SM = struct.Struct("<iBBHiiiiiq")
"""The common header, then sessionId, streamId, consumptionTermId, consumptionTermOffset,
receiverWindow (i32 each, from @8) and receiverId (i64 @28): StatusMessage's fields, in order."""
SM_LENGTH = SM.size
SM_GROUP_TAG_OFFSET = SM_LENGTH  # right after the fixed part
SM_GROUP_TAG = struct.Struct("<q")
SM_WITH_GROUP_TAG_LENGTH = SM_GROUP_TAG_OFFSET + SM_GROUP_TAG.size
SM_SEND_SETUP_FLAG = 0x80
SM_EOS_FLAG = 0x40

# -- NAK (NakFlyweight), 28 bytes -----------------------------------------------------------------

NAK = struct.Struct("<iBBHiiiii")
"""The common header, then sessionId, streamId, termId, termOffset, length (i32 each, from @8)."""
NAK_LENGTH = NAK.size

# -- RTTM, round-trip time measurement (RttMeasurementFlyweight), 40 bytes ------------------------

RTTM = struct.Struct("<iBBHiiqqq")
"""The common header, then sessionId, streamId (i32 @8, @12), echoTimestampNs, receptionDelta,
receiverId (i64 @16, @24, @32)."""
RTTM_LENGTH = RTTM.size
RTTM_REPLY_FLAG = 0x80
"""Set on a receiver's request: the sender echoes it at once, without the flag."""


class WireError(TransportError):
    """A datagram that is not Aeron frames (short, bad frame length, unknown type, wrong version).

    The message is one line naming the datagram's length, the frame's offset and the problem; a
    receiver counts and drops such datagrams."""


# -- frames -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataFrame:
    """A DATA or PAD frame, or a heartbeat (DATA with frame_length 0).

    `payload` is a view into the datagram it was decoded from (no copy); empty for PAD and
    heartbeats. A PAD's frame_length covers the rest of its term; only its header is sent."""
    frame_length: int
    flags: int
    frame_type: int
    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    reserved_value: int = 0
    payload: bytes | memoryview = b""

    @property
    def is_pad(self) -> bool:
        return self.frame_type == HDR_TYPE_PAD

    @property
    def is_heartbeat(self) -> bool:
        return self.frame_type == HDR_TYPE_DATA and self.frame_length == HEARTBEAT_FRAME_LENGTH

    @property
    def is_eos(self) -> bool:
        return bool(self.flags & EOS_FLAG)

    @property
    def wire_length(self) -> int:
        """Bytes this frame takes in a datagram."""
        if self.frame_type == HDR_TYPE_PAD or self.frame_length == HEARTBEAT_FRAME_LENGTH:
            return DATA_HEADER_LENGTH
        return align(self.frame_length)

    def encode_into(self, buf, offset: int) -> int:
        """Write the frame at offset (payload and its alignment zeros); returns the bytes written."""
        DATA_HEADER.pack_into(buf, offset, self.frame_length, CURRENT_VERSION, self.flags, self.frame_type,
                              self.term_offset, self.session_id, self.stream_id, self.term_id, self.reserved_value)
        end = offset + self.wire_length
        if self.frame_type == HDR_TYPE_DATA and self.frame_length:
            body = offset + DATA_HEADER_LENGTH
            buf[body:body + len(self.payload)] = self.payload
            buf[body + len(self.payload):end] = bytes(end - body - len(self.payload))
        return end - offset

    def encode(self) -> bytes:
        buf = bytearray(self.wire_length)
        self.encode_into(buf, 0)
        return bytes(buf)


def data_frame(term_id: int, term_offset: int, session_id: int, stream_id: int, payload: bytes,
               flags: int = UNFRAGMENTED, reserved_value: int = 0) -> DataFrame:
    """A DATA frame carrying payload (frame_length = header + payload, unaligned)."""
    return DataFrame(DATA_HEADER_LENGTH + len(payload), flags, HDR_TYPE_DATA, term_offset, session_id, stream_id,
                     term_id, reserved_value, payload)


def heartbeat(term_id: int, term_offset: int, session_id: int, stream_id: int, *, eos: bool = False) -> DataFrame:
    """A heartbeat at the sender's position (flags 0xC0, 0xE0 once the publication closed)."""
    return DataFrame(HEARTBEAT_FRAME_LENGTH, UNFRAGMENTED | (EOS_FLAG if eos else 0), HDR_TYPE_DATA, term_offset,
                     session_id, stream_id, term_id)


def pad_frame(term_id: int, term_offset: int, session_id: int, stream_id: int, term_length: int) -> DataFrame:
    """The PAD frame from term_offset to the end of the term."""
    return DataFrame(term_length - term_offset, UNFRAGMENTED, HDR_TYPE_PAD, term_offset, session_id, stream_id,
                     term_id)


@dataclass(frozen=True)
class SetupFrame:
    """SETUP: the sender announces a stream (its ids, term length, MTU and current position)."""
    term_offset: int
    session_id: int
    stream_id: int
    initial_term_id: int
    active_term_id: int
    term_length: int
    mtu: int
    ttl: int = 0
    flags: int = 0

    wire_length = SETUP_LENGTH

    def encode(self) -> bytes:
        return SETUP.pack(SETUP_LENGTH, CURRENT_VERSION, self.flags, HDR_TYPE_SETUP, self.term_offset,
                          self.session_id, self.stream_id, self.initial_term_id, self.active_term_id,
                          self.term_length, self.mtu, self.ttl)


@dataclass(frozen=True)
class StatusMessage:
    """SM: the receiver's consumption position and window (the sender's flow-control input)."""
    session_id: int
    stream_id: int
    consumption_term_id: int
    consumption_term_offset: int
    receiver_window: int
    receiver_id: int
    group_tag: int | None = None
    """Sent only when the subscription's channel has gtag= (then the frame is 44 bytes)."""
    flags: int = 0

    @property
    def wire_length(self) -> int:
        return SM_LENGTH if self.group_tag is None else SM_WITH_GROUP_TAG_LENGTH

    @property
    def is_eos(self) -> bool:
        return bool(self.flags & SM_EOS_FLAG)

    @property
    def is_setup_request(self) -> bool:
        return bool(self.flags & SM_SEND_SETUP_FLAG)

    def encode(self) -> bytes:
        fixed = SM.pack(self.wire_length, CURRENT_VERSION, self.flags, HDR_TYPE_SM, self.session_id, self.stream_id,
                        self.consumption_term_id, self.consumption_term_offset, self.receiver_window,
                        self.receiver_id)
        return fixed if self.group_tag is None else fixed + SM_GROUP_TAG.pack(self.group_tag)


@dataclass(frozen=True)
class NakFrame:
    """NAK: the receiver asks for term bytes [term_offset, term_offset + length) of term_id again."""
    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    length: int
    flags: int = 0

    wire_length = NAK_LENGTH

    def encode(self) -> bytes:
        return NAK.pack(NAK_LENGTH, CURRENT_VERSION, self.flags, HDR_TYPE_NAK, self.session_id, self.stream_id,
                        self.term_id, self.term_offset, self.length)


@dataclass(frozen=True)
class RttMeasurement:
    """RTTM: a receiver's request (REPLY flag) and the sender's echo of it (same timestamp, no flag)."""
    session_id: int
    stream_id: int
    echo_timestamp_ns: int
    reception_delta_ns: int
    receiver_id: int
    flags: int = 0

    wire_length = RTTM_LENGTH

    @property
    def is_reply_requested(self) -> bool:
        return bool(self.flags & RTTM_REPLY_FLAG)

    def encode(self) -> bytes:
        return RTTM.pack(RTTM_LENGTH, CURRENT_VERSION, self.flags, HDR_TYPE_RTTM, self.session_id, self.stream_id,
                         self.echo_timestamp_ns, self.reception_delta_ns, self.receiver_id)


Frame = DataFrame | SetupFrame | StatusMessage | NakFrame | RttMeasurement

_FIXED_LENGTHS = {HDR_TYPE_SETUP: (SETUP_LENGTH,), HDR_TYPE_SM: (SM_LENGTH, SM_WITH_GROUP_TAG_LENGTH),
                  HDR_TYPE_NAK: (NAK_LENGTH,), HDR_TYPE_RTTM: (RTTM_LENGTH,)}


# -- decoding -----------------------------------------------------------------------------------


def frames_of(datagram: bytes | bytearray | memoryview) -> list[Frame]:
    """Every frame of a datagram, in order; raises WireError if any part of it is not a frame."""
    view = _bytes_view(datagram)
    size = len(view)
    if size < COMMON_LENGTH:
        raise WireError(f"datagram of {size} bytes is shorter than a frame header ({COMMON_LENGTH})")
    frames: list[Frame] = []
    offset = 0
    while offset < size:
        decoded, step = _decode_at(view, offset, size)
        frames.append(decoded)
        offset += step
    return frames


def decode_frame(datagram: bytes | bytearray | memoryview, offset: int = 0) -> Frame:
    """The one frame at offset (the others of the datagram are not looked at)."""
    view = _bytes_view(datagram)
    return _decode_at(view, offset, len(view))[0]


def _bytes_view(datagram) -> memoryview:
    view = memoryview(datagram)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _problem(size: int, offset: int, what: str) -> WireError:
    return WireError(f"datagram of {size} bytes: frame at offset {offset}: {what}")


def _decode_at(view: memoryview, offset: int, size: int) -> tuple[Frame, int]:
    """The frame at offset and how far the next one is (to the datagram's end if it is the last)."""
    if size - offset < COMMON_LENGTH:
        raise _problem(size, offset, f"{size - offset} trailing bytes, shorter than a frame header")
    frame_length, version, flags, frame_type = COMMON.unpack_from(view, offset)
    if version != CURRENT_VERSION:
        raise _problem(size, offset, f"version {version}, expected {CURRENT_VERSION}")
    if frame_type == HDR_TYPE_DATA or frame_type == HDR_TYPE_PAD:
        if size - offset < DATA_HEADER_LENGTH:
            raise _problem(size, offset, f"{TYPE_NAMES[frame_type]} header needs {DATA_HEADER_LENGTH} bytes, "
                                         f"{size - offset} left")
        fields = DATA_HEADER.unpack_from(view, offset)
        if frame_type == HDR_TYPE_PAD:
            if frame_length < DATA_HEADER_LENGTH or frame_length % FRAME_ALIGNMENT:
                raise _problem(size, offset, f"PAD frame length {frame_length} is not an aligned length of at "
                                             f"least {DATA_HEADER_LENGTH}")
            if offset + DATA_HEADER_LENGTH != size:
                raise _problem(size, offset, "PAD frame is not the last of its datagram")
            return DataFrame(fields[0], fields[2], fields[3], *fields[4:]), size
        if frame_length == HEARTBEAT_FRAME_LENGTH:
            return DataFrame(fields[0], fields[2], fields[3], *fields[4:]), _next(offset, DATA_HEADER_LENGTH, size)
        if frame_length < DATA_HEADER_LENGTH or offset + frame_length > size:
            raise _problem(size, offset, f"DATA frame length {frame_length} does not fit "
                                         f"{DATA_HEADER_LENGTH}..{size - offset}")
        payload = view[offset + DATA_HEADER_LENGTH:offset + frame_length]
        return (DataFrame(fields[0], fields[2], fields[3], *fields[4:], payload),
                _next(offset, align(frame_length), size))
    lengths = _FIXED_LENGTHS.get(frame_type)
    if lengths is None:
        name = TYPE_NAMES.get(frame_type)
        raise _problem(size, offset, f"unsupported frame type {name} ({frame_type:#04x})" if name
                       else f"unknown frame type {frame_type:#06x}")
    if frame_length not in lengths or offset + frame_length > size:
        raise _problem(size, offset, f"{TYPE_NAMES[frame_type]} frame length {frame_length}, expected "
                                     f"{' or '.join(map(str, lengths))} within the {size - offset} bytes left")
    if frame_type == HDR_TYPE_SM:
        fields = SM.unpack_from(view, offset)
        group_tag = SM_GROUP_TAG.unpack_from(view, offset + SM_GROUP_TAG_OFFSET)[0] \
            if frame_length == SM_WITH_GROUP_TAG_LENGTH else None
        decoded: Frame = StatusMessage(*fields[4:], group_tag=group_tag, flags=flags)
    elif frame_type == HDR_TYPE_SETUP:
        decoded = SetupFrame(*SETUP.unpack_from(view, offset)[4:], flags=flags)
    elif frame_type == HDR_TYPE_NAK:
        decoded = NakFrame(*NAK.unpack_from(view, offset)[4:], flags=flags)
    else:
        decoded = RttMeasurement(*RTTM.unpack_from(view, offset)[4:], flags=flags)
    return decoded, _next(offset, align(frame_length), size)


def _next(offset: int, step: int, size: int) -> int:
    """The step to the next frame; a frame's alignment may run past the datagram's end when it is the last."""
    return min(step, size - offset)


# -- building datagrams -------------------------------------------------------------------------


class DatagramBuilder:
    """Packs frames into one datagram of at most `mtu` bytes, as a sender fills one send.

    A frame that does not fit is refused (add returns False) and the caller sends what is there
    and starts anew; a PAD frame closes the datagram (it is sent header-only, last)."""

    def __init__(self, mtu: int) -> None:
        if mtu <= DATA_HEADER_LENGTH or mtu > MAX_UDP_PAYLOAD_LENGTH or mtu % FRAME_ALIGNMENT:
            raise ValueError(f"MTU {mtu} is not a multiple of {FRAME_ALIGNMENT} in "
                             f"{DATA_HEADER_LENGTH + FRAME_ALIGNMENT}..{MAX_UDP_PAYLOAD_LENGTH}")
        self.mtu = mtu
        self._buf = bytearray(mtu)
        self._length = 0
        """The end of the last frame's bytes; the next frame starts at align(_length)."""
        self._closed = False

    def __len__(self) -> int:
        return self._length

    def add(self, item: Frame) -> bool:
        """Append a frame if it fits; False if it does not (or a PAD already ended the datagram)."""
        start = align(self._length)
        end = start + item.wire_length
        if self._closed or end > self.mtu:
            return False
        if isinstance(item, DataFrame):
            item.encode_into(self._buf, start)
            self._closed = item.is_pad
        else:
            self._buf[start:end] = item.encode()
        if start > self._length:  # the alignment gap after a control frame of 28 or 36 bytes
            self._buf[self._length:start] = bytes(start - self._length)
        self._length = end
        return True

    def build(self) -> bytes:
        """The datagram, and a fresh start for the next."""
        datagram = bytes(self._buf[:self._length])
        self._length = 0
        self._closed = False
        return datagram


def datagram_of(frames: list[Frame], mtu: int = MAX_UDP_PAYLOAD_LENGTH) -> bytes:
    """One datagram holding these frames; ValueError if they do not fit the MTU."""
    builder = DatagramBuilder(mtu)
    for item in frames:
        if not builder.add(item):
            raise ValueError(f"{len(frames)} frames do not fit one datagram of MTU {mtu}")
    return builder.build()


__all__ = [
    "BEGIN_FLAG", "END_FLAG", "EOS_FLAG", "UNFRAGMENTED", "HDR_TYPE_DATA", "HDR_TYPE_PAD", "DataFrame", "SetupFrame",
    "StatusMessage", "NakFrame", "RttMeasurement", "Frame", "WireError", "DatagramBuilder", "frames_of",
    "decode_frame", "datagram_of", "data_frame", "heartbeat", "pad_frame",
]

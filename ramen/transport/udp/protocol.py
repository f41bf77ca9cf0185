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

The receiver's hot path decodes no frame object at all: data_run checks that a datagram (or a GRO
batch of datagrams back to back) is nothing but plain DATA frames of one session, stream and term,
each where the one before ends, so the whole of it can go into the log as one block; the header
checks are one struct unpack for a single frame, numpy over the headers for many. Anything else (a
SETUP, a PAD, a heartbeat, EOS, mixed sessions, damage) is left to frames_of.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

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
SETUP_TAG_LENGTH = 16
"""Beyond Aeron: a SETUP signed with the sites' setup key (setup_key.py) carries, after its 40
bytes, the first 16 bytes of an HMAC-SHA-256 of them; its frameLength says 56."""
SETUP_SIGNED_LENGTH = SETUP_LENGTH + SETUP_TAG_LENGTH
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
    tag: bytes | None = None
    """Its signature (SETUP_TAG_LENGTH bytes) when signed with a setup key, else None (Aeron's)."""

    @property
    def wire_length(self) -> int:
        return SETUP_LENGTH if self.tag is None else SETUP_SIGNED_LENGTH

    def fields(self) -> bytes:
        """Its 40 bytes as sent (frameLength included): what a tag signs."""
        return SETUP.pack(self.wire_length, CURRENT_VERSION, self.flags, HDR_TYPE_SETUP, self.term_offset,
                          self.session_id, self.stream_id, self.initial_term_id, self.active_term_id,
                          self.term_length, self.mtu, self.ttl)

    def encode(self) -> bytes:
        return self.fields() if self.tag is None else self.fields() + self.tag


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

_FIXED_LENGTHS = {HDR_TYPE_SETUP: (SETUP_LENGTH, SETUP_SIGNED_LENGTH),
                  HDR_TYPE_SM: (SM_LENGTH, SM_WITH_GROUP_TAG_LENGTH),
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
        tag = bytes(view[offset + SETUP_LENGTH:offset + SETUP_SIGNED_LENGTH]) \
            if frame_length == SETUP_SIGNED_LENGTH else None
        decoded = SetupFrame(*SETUP.unpack_from(view, offset)[4:], flags=flags, tag=tag)
    elif frame_type == HDR_TYPE_NAK:
        decoded = NakFrame(*NAK.unpack_from(view, offset)[4:], flags=flags)
    else:
        decoded = RttMeasurement(*RTTM.unpack_from(view, offset)[4:], flags=flags)
    return decoded, _next(offset, align(frame_length), size)


def _next(offset: int, step: int, size: int) -> int:
    """The step to the next frame; a frame's alignment may run past the datagram's end when it is the last."""
    return min(step, size - offset)


# -- runs of DATA frames: the receiver's fast path -------------------------------------------------

DATA_KIND_MASK = (0xFFFF00FF | (EOS_FLAG << 8)) - (1 << 32)
"""Of a header's version/flags/type word (frame.HEADER_BY_WORD's second field, a signed int32, so the
mask is too): the version, the type and the EOS flag; BEGIN and END may be anything."""
DATA_KIND = CURRENT_VERSION | (HDR_TYPE_DATA << 16)
"""What DATA_KIND_MASK leaves of a plain DATA frame's word: version 0, type DATA, no EOS."""
RUN_SCALAR_MAX_FRAMES = 8
"""Up to this many frames (judging by the first one's length) a run is checked frame by frame with
struct; past it with numpy, whose fixed cost (~10 us) is that of about as many struct steps."""

_SLOT_WORDS = FRAME_ALIGNMENT // 4
_HEADER_BY_WORD = frame.HEADER_BY_WORD
_slot_offsets = np.zeros(0, dtype=np.int32)


def _offsets_of_slots(slots: int) -> np.ndarray:
    """0, 32, 64, ... for `slots` slots, kept from call to call (grown when a longer run comes)."""
    global _slot_offsets
    if len(_slot_offsets) < slots:
        _slot_offsets = np.arange(max(slots, 2048), dtype=np.int32) * FRAME_ALIGNMENT
    return _slot_offsets[:slots]


def data_run(view: memoryview, segment_size: int | None = None) -> tuple[int, int, int, int, int, int] | None:
    """If `view` (bytes, format "B") is a run of plain DATA frames (no heartbeat, PAD or EOS) of one
    session, stream and term, each starting where the one before ends (aligned) and the last ending at
    the view's end, with a frame starting at every `segment_size` bytes (the datagrams of a GRO batch:
    no frame crosses from one datagram to the next): (first frame's length, term offset, session id,
    stream id, term id, number of frames). Else None: the caller decodes the datagrams one by one.

    A payload that happens to look like a header where no frame starts makes a valid run look broken
    (None): only the fast path is lost, never a frame."""
    size = len(view)
    if size < DATA_HEADER_LENGTH or size % FRAME_ALIGNMENT:
        return None
    length, kind, term_offset, session_id, stream_id, term_id, _ = _HEADER_BY_WORD.unpack_from(view, 0)
    if kind & DATA_KIND_MASK != DATA_KIND or length < DATA_HEADER_LENGTH:
        return None
    aligned = (length + frame.ALIGN_UP) & frame.ALIGN_MASK
    if aligned >= size:
        if aligned > size or (segment_size and segment_size < size):
            return None
        return length, term_offset, session_id, stream_id, term_id, 1
    count = _run_strided(view, size, length, aligned, kind, term_offset, session_id, stream_id, term_id, segment_size)
    if count is None:  # frames of several lengths: the general checks
        if size <= RUN_SCALAR_MAX_FRAMES * aligned:
            count = _run_scalar(view, size, aligned, term_offset, session_id, stream_id, term_id, segment_size)
        else:
            count = _run_numpy(view, size, term_offset, session_id, stream_id, term_id, segment_size)
    return None if count is None else (length, term_offset, session_id, stream_id, term_id, count)


_DATA_KINDS = frozenset(DATA_KIND | (flags << 8) for flags in (0, BEGIN_FLAG, END_FLAG, UNFRAGMENTED))
"""The version/flags/type words a plain DATA frame may have: a fragment's B and E flags, nothing else."""
STRIDED_MAX_FRAMES = 256
"""The longest run checked by one struct unpack; numpy's fixed cost is less than the tuple's past it
(measured: 1024 frames of 64 bytes take 94 us by struct, 38 us by numpy; 22 frames 3.4 us by struct)."""

_strided_structs: dict[tuple[int, int], struct.Struct] = {}


def _strided(aligned: int, count: int) -> struct.Struct:
    """The headers of `count` frames `aligned` bytes apart, in one struct (their payloads skipped)."""
    found = _strided_structs.get((aligned, count))
    if found is None:
        if len(_strided_structs) > 256:  # a few shapes recur (a batch's frames, MTU-sized fragments)
            _strided_structs.clear()
        skip = f"{aligned - DATA_HEADER_LENGTH}x" if aligned > DATA_HEADER_LENGTH else ""
        found = _strided_structs[(aligned, count)] = struct.Struct("<" + ("iiiiiiq" + skip) * count)
    return found


def _run_strided(view, size: int, length: int, aligned: int, kind: int, term_offset: int, session_id: int,
                 stream_id: int, term_id: int, segment_size: int | None) -> int | None:
    """data_run's check when frames repeat the first one's length (a batch of equal messages, a
    message's MTU-sized fragments), maybe but for one shorter last frame: all their headers in one
    struct unpack, each field checked by C-level tuple operations. None when the frames are not so
    (the general checks then decide)."""
    count, rest = divmod(size, aligned)
    if segment_size and segment_size < size and segment_size % aligned:
        return None
    if count <= STRIDED_MAX_FRAMES:
        fields = _strided(aligned, count).unpack_from(view)
        if fields[0::7].count(length) != count or fields[3::7].count(session_id) != count \
                or fields[4::7].count(stream_id) != count or fields[5::7].count(term_id) != count \
                or fields[2::7] != tuple(range(term_offset, term_offset + size - rest, aligned)):
            return None
        kinds = fields[1::7]
        if kinds.count(kind) != count and not _DATA_KINDS.issuperset(kinds):
            return None
    else:
        # Many small frames: the same checks over a strided numpy view of the headers (no copy).
        stride = aligned // 4
        headers = np.frombuffer(view, dtype=np.int32, count=count * stride).reshape(count, stride)
        if not ((headers[:, 0] == length).all() and (headers[:, 3] == session_id).all()
                and (headers[:, 4] == stream_id).all() and (headers[:, 5] == term_id).all()
                and np.array_equal(headers[:, 2], np.arange(term_offset, term_offset + size - rest, aligned))):
            return None
        kinds = headers[:, 1]
        if not (kinds == kind).all() and not ((kinds & DATA_KIND_MASK) == DATA_KIND).all():
            return None
    if rest:
        # One last frame, shorter: it must fill the rest exactly and not cross a datagram's start.
        at = size - rest
        last = _HEADER_BY_WORD.unpack_from(view, at)
        if (last[0] + frame.ALIGN_UP) & frame.ALIGN_MASK != rest or last[0] < DATA_HEADER_LENGTH \
                or last[1] not in _DATA_KINDS or last[2] != term_offset + at or last[3] != session_id \
                or last[4] != stream_id or last[5] != term_id:
            return None
        if segment_size and segment_size < size and at % segment_size \
                and at // segment_size != (size - 1) // segment_size:
            return None
        count += 1
    return count


def _run_scalar(view, size: int, at: int, term_offset: int, session_id: int, stream_id: int, term_id: int,
                segment_size: int | None) -> int | None:
    """data_run's check a frame at a time, from the second frame (at `at`)."""
    count = 1
    boundary = segment_size if segment_size else size
    while at < size:
        if at > boundary:  # the frame before ran across a datagram's end
            return None
        if at == boundary:
            boundary += segment_size
        fields = _HEADER_BY_WORD.unpack_from(view, at)
        length = fields[0]
        if length < DATA_HEADER_LENGTH or fields[1] & DATA_KIND_MASK != DATA_KIND or fields[2] != term_offset + at \
                or fields[3] != session_id or fields[4] != stream_id or fields[5] != term_id:
            return None
        at += (length + frame.ALIGN_UP) & frame.ALIGN_MASK
        count += 1
    # A boundary not yet reached lies at or past the end; one skipped over was crossed by a frame.
    return count if at == size and boundary >= size else None


def _run_numpy(view, size: int, term_offset: int, session_id: int, stream_id: int, term_id: int,
               segment_size: int | None) -> int | None:
    """data_run's check over all headers at once: the slots whose termOffset field holds their own
    offset are the frame starts, which must chain from 0 to the end, cover every datagram's start,
    and each be a plain DATA header of this image."""
    slots = size // FRAME_ALIGNMENT
    words = np.frombuffer(view, dtype=np.int32, count=slots * _SLOT_WORDS).reshape(slots, _SLOT_WORDS)
    starts = np.flatnonzero(words[:, 2] - _offsets_of_slots(slots) == term_offset)
    headers = words[starts]
    lengths = headers[:, 0]
    starts <<= 5
    ends = starts + ((lengths + frame.ALIGN_UP) & frame.ALIGN_MASK)
    if ends[-1] != size or not np.array_equal(ends[:-1], starts[1:]):
        return None
    if not ((lengths >= DATA_HEADER_LENGTH).all() and ((headers[:, 1] & DATA_KIND_MASK) == DATA_KIND).all()
            and (headers[:, 3] == session_id).all() and (headers[:, 4] == stream_id).all()
            and (headers[:, 5] == term_id).all()):
        return None
    if segment_size and segment_size < size:
        if segment_size % FRAME_ALIGNMENT:
            return None
        boundaries = np.arange(0, size, segment_size)
        found = np.searchsorted(starts, boundaries)
        if (found >= len(starts)).any() or not np.array_equal(starts[found], boundaries):
            return None
    return len(starts)


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
    "decode_frame", "datagram_of", "data_frame", "heartbeat", "pad_frame", "data_run",
]

"""Aeron's data frame header: the 32 bytes in front of every fragment in a term.

Offsets are Aeron's (io.aeron.protocol.DataHeaderFlyweight), little endian. Code reads and writes
frames through these names; it never copies a term into objects on a hot path.
"""

import struct

from ramen.transport.position import compute_position

FRAME_LENGTH_OFFSET = 0
VERSION_OFFSET = 4
FLAGS_OFFSET = 5
TYPE_OFFSET = 6
TERM_OFFSET_OFFSET = 8
SESSION_ID_OFFSET = 12
STREAM_ID_OFFSET = 16
TERM_ID_OFFSET = 20
RESERVED_VALUE_OFFSET = 24
HEADER_LENGTH = 32
FRAME_ALIGNMENT = 32

CURRENT_VERSION = 0
BEGIN_FLAG = 0x80
END_FLAG = 0x40
EOS_FLAG = 0x20
UNFRAGMENTED = BEGIN_FLAG | END_FLAG
HDR_TYPE_PAD = 0
HDR_TYPE_DATA = 1

ALIGN_UP = FRAME_ALIGNMENT - 1
ALIGN_MASK = -FRAME_ALIGNMENT
"""align(n) is (n + ALIGN_UP) & ALIGN_MASK: inlined on per-frame paths, where a call costs more than the sum."""

HEADER = struct.Struct("<iBBHiiiiq")
"""The whole header in one unpack: length, version, flags, type, term offset, session, stream, term id, reserved."""

HEADER_BY_WORD = struct.Struct("<iiiiiiq")
"""The same 32 bytes with version, flags and type as one word (see frame_word): length, that word, term
offset, session, stream, term id, reserved. The writer's hot path packs a header with one precomputed
word instead of three small fields."""

# Parts of the header, each read or written where the comment says (one unpack instead of several on
# per-frame paths). Every module reads frames through these: none declares a header layout of its own.
INT32 = struct.Struct("<i")
"""Any one int32 field: the frame length @FRAME_LENGTH_OFFSET, the term id @TERM_ID_OFFSET, the session
id (a recorded frame's checksum) @SESSION_ID_OFFSET."""
LENGTH_FLAGS_TYPE = struct.Struct("<iBBH")
"""@0: length, version, flags, type."""
LENGTH_TO_TERM_OFFSET = struct.Struct("<iBBHi")
"""@0: length, version, flags, type, term offset: what a checked walk reads of a header."""
LENGTH_AND_TYPE = struct.Struct("<i2xH")
"""@0: length and type."""
FLAGS_AND_TYPE = struct.Struct("<BH")
"""@FLAGS_OFFSET: flags and type."""
KIND_WORD = struct.Struct("<I")
"""@VERSION_OFFSET: version, flags and type as one word (see frame_word)."""
STREAM_IDS = struct.Struct("<ii")
"""@SESSION_ID_OFFSET: session id, stream id."""
PLACE = struct.Struct("<iiii")
"""@TERM_OFFSET_OFFSET: term offset, session id, stream id, term id: where a frame lies in which log."""

# The header's fields as indexes of its int32 words, for numpy over many headers at once.
LENGTH_WORD = FRAME_LENGTH_OFFSET // 4
KIND_WORD_INDEX = VERSION_OFFSET // 4
TERM_OFFSET_WORD = TERM_OFFSET_OFFSET // 4
SESSION_ID_WORD = SESSION_ID_OFFSET // 4
STREAM_ID_WORD = STREAM_ID_OFFSET // 4
TERM_ID_WORD = TERM_ID_OFFSET // 4
RESERVED_WORD = RESERVED_VALUE_OFFSET // 4
"""The first of two."""
HEADER_WORDS = HEADER_LENGTH // 4
SLOT_WORDS = FRAME_ALIGNMENT // 4
"""int32 words per frame-alignment slot."""
END_FLAG_IN_KIND = END_FLAG << 8 * (FLAGS_OFFSET - VERSION_OFFSET)
"""The END flag within the kind word."""
TYPE_SHIFT_IN_KIND = 8 * (TYPE_OFFSET - VERSION_OFFSET)
"""The type's shift within the kind word."""

# The second 32-bit word of a header (version | flags | type), as written for the common frame kinds.
DATA_WORD_UNFRAGMENTED = CURRENT_VERSION | (UNFRAGMENTED << 8) | (HDR_TYPE_DATA << 16)
PAD_WORD = CURRENT_VERSION | (UNFRAGMENTED << 8) | (HDR_TYPE_PAD << 16)


def align(value: int, alignment: int = FRAME_ALIGNMENT) -> int:
    """Round up to a power-of-two alignment."""
    return (value + alignment - 1) & -alignment


def frame_word(flags: int, frame_type: int = HDR_TYPE_DATA) -> int:
    """The version/flags/type word for a frame with the given flags."""
    return CURRENT_VERSION | (flags << 8) | (frame_type << 16)


def write_header(buf, offset: int, length: int, flags: int, frame_type: int, term_offset: int,
                 session_id: int, stream_id: int, term_id: int, reserved_value: int = 0) -> None:
    """Write a whole header, length included (callers that commit later pass a negative length)."""
    HEADER.pack_into(buf, offset, length, CURRENT_VERSION, flags, frame_type, term_offset,
                     session_id, stream_id, term_id, reserved_value)


class Header:
    """A flyweight over one frame header, handed to fragment handlers.

    It is reused from fragment to fragment: a handler that keeps values must copy them.
    """

    __slots__ = ("buffer", "offset", "initial_term_id", "position_bits_to_shift")

    def __init__(self, initial_term_id: int = 0, position_bits_to_shift: int = 16) -> None:
        self.buffer = None
        self.offset = 0
        self.initial_term_id = initial_term_id
        self.position_bits_to_shift = position_bits_to_shift

    def _fields(self):
        return HEADER.unpack_from(self.buffer, self.offset)

    @property
    def frame_length(self) -> int:
        return self._fields()[0]

    @property
    def flags(self) -> int:
        return self._fields()[2]

    @property
    def type(self) -> int:
        return self._fields()[3]

    @property
    def term_offset(self) -> int:
        return self._fields()[4]

    @property
    def session_id(self) -> int:
        return self._fields()[5]

    @property
    def stream_id(self) -> int:
        return self._fields()[6]

    @property
    def term_id(self) -> int:
        return self._fields()[7]

    @property
    def reserved_value(self) -> int:
        return self._fields()[8]

    @property
    def position(self) -> int:
        """The stream position just after this frame (Aeron's Header.position())."""
        fields = self._fields()
        return compute_position(fields[7], align(fields[4] + fields[0]),
                                self.position_bits_to_shift, self.initial_term_id)

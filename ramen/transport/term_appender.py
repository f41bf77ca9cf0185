"""Writing frames into a term: headers, payloads and the commit, for the space a publication claimed.

Functions (and the BufferClaim a caller fills itself): the publication owns the term views and the
tail, claims the space (moving the tail first), and calls these to fill it. Every writer keeps Aeron's order: the frame (or a
block's first frame) holds a negative length until the rest is written, and the positive length is
stored last, which is the commit. A block's other frames carry their positive lengths at once and
stay invisible behind its first.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ramen.transport import frame
from ramen.transport.frame import (ALIGN_MASK, ALIGN_UP, HEADER_LENGTH, HEADER_WORDS, KIND_WORD_INDEX, LENGTH_WORD,
                                   RESERVED_WORD, SESSION_ID_WORD, STREAM_ID_WORD, TERM_ID_WORD, TERM_OFFSET_WORD)

COPY_EACH_MIN_LENGTH = 4096
"""Batched payloads of at least this many bytes are copied into the term one by one; shorter ones are
joined and copied in one numpy assignment. Above it the join's second copy of every byte costs more
than a Python step per message (measured: the two are even at 4 KiB)."""

_DATA_WORD = frame.DATA_WORD_UNFRAGMENTED


def begin_block_of_one_length(words: np.ndarray, term_offset: int, n: int, stride: int, frame_length: int,
                              session_id: int, stream_id: int, term_id: int) -> np.ndarray:
    """Write the headers of n frames of `stride` bytes from term_offset of a term (as int32 words), a
    field at a time through an (n, words a frame) view. Returns the block as an (n, stride) uint8 array.

    The first frame holds minus the whole block's length until the commit (see begin_block)."""
    block_length = n * stride
    first_word = term_offset >> 2
    frames = words[first_word:first_word + (block_length >> 2)].reshape(n, stride >> 2)
    frames[0, LENGTH_WORD] = -block_length
    frames[1:, LENGTH_WORD] = frame_length
    frames[:, KIND_WORD_INDEX] = _DATA_WORD
    frames[:, TERM_OFFSET_WORD] = np.arange(term_offset, term_offset + block_length, stride, dtype=np.int32)
    frames[:, SESSION_ID_WORD] = session_id
    frames[:, STREAM_ID_WORD] = stream_id
    frames[:, TERM_ID_WORD] = term_id
    frames[:, RESERVED_WORD:HEADER_WORDS] = 0
    return frames.view(np.uint8)


def begin_block(words: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, block_length: int,
                session_id: int, stream_id: int, term_id: int) -> None:
    """Write the headers of frames at term `offsets` with payloads of `lengths`, a field at a time.

    Frame 1 holds minus the whole block's length until the commit: a reader waits at it, and a
    writer dying meanwhile leaves one gap that unblocking pads in one go. It goes first, so the
    other frames, written with their positive lengths, stay invisible until it commits."""
    idx = offsets >> 2
    words[idx[0] + LENGTH_WORD] = -block_length
    words[idx[1:] + LENGTH_WORD] = lengths[1:] + HEADER_LENGTH
    words[idx + KIND_WORD_INDEX] = _DATA_WORD
    words[idx + TERM_OFFSET_WORD] = offsets
    words[idx + SESSION_ID_WORD] = session_id
    words[idx + STREAM_ID_WORD] = stream_id
    words[idx + TERM_ID_WORD] = term_id
    words[idx + RESERVED_WORD] = 0
    words[idx + RESERVED_WORD + 1] = 0


def copy_messages(messages: Sequence, first: int, block: np.ndarray, payload_length: int) -> None:
    """Copy messages[first:first + n], all of payload_length bytes, into the payloads of block, n
    frames as an (n, stride) uint8 array."""
    n, stride = block.shape
    batch = messages[first:first + n]
    if payload_length >= COPY_EACH_MIN_LENGTH:
        flat = memoryview(block).cast("B")
        start = HEADER_LENGTH
        for message in batch:
            flat[start:start + payload_length] = message
            start += stride
        flat.release()
    else:
        block[:, HEADER_LENGTH:HEADER_LENGTH + payload_length] = \
            np.frombuffer(b"".join(batch), dtype=np.uint8).reshape(n, payload_length)


def copy_each(term, offsets: np.ndarray, messages: Sequence) -> None:
    """Copy each message to the payload of its frame at its term offset."""
    for start, message in zip((offsets + HEADER_LENGTH).tolist(), messages):
        term[start:start + len(message)] = message


def write_fragments(term, term_i32, term_offset: int, source: memoryview, max_payload: int, session_id: int,
                    stream_id: int, term_id: int, reserved_value: int) -> None:
    """Write one message as fragments of at most max_payload bytes (B on the first, E on the last),
    each committed as it is written, into space already claimed from term_offset."""
    length = len(source)
    flags = frame.BEGIN_FLAG
    remaining = length
    frame_offset = term_offset
    while remaining > 0:
        chunk = min(remaining, max_payload)
        frame_length = chunk + HEADER_LENGTH
        if remaining == chunk:
            flags |= frame.END_FLAG
        frame.HEADER.pack_into(term, frame_offset, -frame_length, 0, flags, frame.HDR_TYPE_DATA, frame_offset,
                               session_id, stream_id, term_id, reserved_value)
        consumed = length - remaining
        term[frame_offset + HEADER_LENGTH:frame_offset + frame_length] = source[consumed:consumed + chunk]
        term_i32[frame_offset >> 2] = frame_length
        remaining -= chunk
        frame_offset += (frame_length + ALIGN_UP) & ALIGN_MASK
        flags = 0


def copy_frames(term, term_offset: int, source: memoryview, session_id: int, stream_id: int, term_id: int) -> int:
    """Copy whole frames framed elsewhere to term_offset, each made this log's (term offset and ids);
    lengths, flags and reserved values are kept. Everything but the first length word, which is
    returned for the caller to store last: until then a reader sees no frame."""
    length = len(source)
    term[term_offset + 4:term_offset + length] = source[4:]
    unpack, place = frame.INT32.unpack_from, frame.PLACE.pack_into
    at = 0
    while at < length:
        frame_length = unpack(source, at)[0]
        aligned = (frame_length + ALIGN_UP) & ALIGN_MASK
        if frame_length < HEADER_LENGTH or at + aligned > length:
            raise ValueError(f"frame of length {frame_length} at {at} of a {length}-byte block")
        place(term, term_offset + at + frame.TERM_OFFSET_OFFSET, term_offset + at, session_id, stream_id, term_id)
        at += aligned
    return unpack(source, 0)[0]


def write_pad(term, term_i32, term_offset: int, length: int, session_id: int, stream_id: int, term_id: int) -> None:
    """A PAD frame of `length` bytes (header included) that readers skip, committed."""
    frame.HEADER.pack_into(term, term_offset, -length, 0, frame.UNFRAGMENTED, frame.HDR_TYPE_PAD, term_offset,
                           session_id, stream_id, term_id, 0)
    term_i32[term_offset >> 2] = length


class BufferClaim:
    """Space claimed in a term for a zero-copy write: fill `buffer`, then commit() or abort()."""

    __slots__ = ("buffer", "_term_i32", "_frame_index", "_frame_length", "_term")

    def __init__(self) -> None:
        self.buffer: memoryview | None = None
        self._term = None
        self._term_i32 = None
        self._frame_index = 0
        self._frame_length = 0

    def _wrap(self, term: memoryview, term_i32: memoryview, frame_offset: int, frame_length: int) -> None:
        self._term = term
        self._term_i32 = term_i32
        self._frame_index = frame_offset >> 2
        self._frame_length = frame_length
        self.buffer = term[frame_offset + frame.HEADER_LENGTH:frame_offset + frame_length]

    def commit(self) -> None:
        """Make the message visible to readers."""
        self.buffer.release()
        self.buffer = None
        self._term_i32[self._frame_index] = self._frame_length

    def abort(self) -> None:
        """Give the space up: it becomes padding that readers skip."""
        self.buffer.release()
        self.buffer = None
        frame_offset = self._frame_index << 2
        frame.FLAGS_AND_TYPE.pack_into(self._term, frame_offset + frame.FLAGS_OFFSET, frame.UNFRAGMENTED,
                                       frame.HDR_TYPE_PAD)
        self._term_i32[self._frame_index] = self._frame_length

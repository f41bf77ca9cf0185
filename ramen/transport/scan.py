"""Offline reading of a whole log buffer, for tools: every frame still present, and the messages.

A live reader follows one position; a tool looking at a file does not know where readers were.
Aeron zeroes the space behind its consumers (sometimes mid-frame), and an image log keeps its tail
counters at 0, so the scan trusts neither the tails nor term starts: it walks each term (the one
frame walker, frame_walk.walk) and accepts a frame only where its header says it is (its termOffset
field equals its offset, its version and type are valid, it fits the term, and its session and
stream are the log's). Zeroed or torn space is skipped to the next non-zero slot. Messages are then rebuilt from fragments in position order;
a message whose first fragment was cleaned away is left out.

A header that claims its place and is the log's (its version, termOffset, session and stream) but
whose length or type cannot be (it runs past its term, or is shorter than a header) is no torn
space but damage: the scan skips it too, and names it in `damaged`, for the tool to report.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ramen.transport import frame
from ramen.transport.frame_walk import frame_problem, headers_fit, walk
from ramen.transport.logbuffer import LogBuffer
from ramen.transport.position import PARTITION_COUNT, compute_position


@dataclass(frozen=True)
class Frame:
    position: int
    """Stream position of the frame's start."""
    partition: int
    term_id: int
    term_offset: int
    length: int
    flags: int
    type: int
    session_id: int
    stream_id: int
    reserved_value: int

    @property
    def end_position(self) -> int:
        return self.position + frame.align(self.length)


@dataclass(frozen=True)
class Message:
    position: int
    """Stream position after the message's last fragment (Aeron's header position)."""
    term_id: int
    term_offset: int
    """Of the first fragment."""
    session_id: int
    stream_id: int
    reserved_value: int
    payload: bytes
    fragments: int


def scan_frames(log: LogBuffer, damaged: list[str] | None = None) -> list[Frame]:
    """Every plausible committed frame in the three terms, sorted by position; `damaged`, if given,
    gets a line for each frame of the log found damaged (and skipped)."""
    frames = []
    for partition in range(PARTITION_COUNT):
        frames.extend(_scan_term(log, partition, damaged))
    frames.sort(key=lambda f: f.position)
    return frames


def _damage_at(log: LogBuffer, partition: int, offset: int) -> str | None:
    """What is wrong with a header at `offset` that claims its place and is the log's, or None
    when it is not such a header (torn or zeroed space, another stream's bytes) or is whole."""
    term = log.terms[partition]
    if offset + frame.HEADER_LENGTH > log.term_length:
        return None
    length, version, _, frame_type, term_offset, session_id, stream_id, term_id, _ = frame.HEADER.unpack_from(
        term, offset)
    if (version, term_offset, session_id, stream_id) != (frame.CURRENT_VERSION, offset, log.session_id,
                                                         log.stream_id) or length == 0:
        return None
    position = compute_position(term_id, offset, log.position_bits_to_shift, log.initial_term_id)
    problem = frame_problem(position, length, frame_type, offset, term_id, term_length=log.term_length)
    return None if problem is None else f"term {partition} offset {offset} (term id {term_id}): {problem}"


def _scan_term(log: LogBuffer, partition: int, damaged: list[str] | None = None) -> Iterator[Frame]:
    term = log.terms[partition]
    term_length = log.term_length
    # Slots whose length word is non-zero: the only places a frame can start. Jumping between them
    # keeps a mostly zeroed 1 GiB term from costing millions of Python steps.
    words = np.frombuffer(term, dtype=np.int32)
    candidates = (np.flatnonzero(words[::frame.FRAME_ALIGNMENT // 4]) * frame.FRAME_ALIGNMENT).tolist()
    offset = candidates[0] if candidates else term_length
    reported = -1
    while offset < term_length:
        # The frames chained from here (the walker checks each one's place), as far as they are the log's.
        frames = walk(term, offset, term_length)
        headers = frames.headers
        plausible = ((headers[:, frame.KIND_WORD_INDEX] & 0xFF) == frame.CURRENT_VERSION) & \
            headers_fit(headers, term_id=headers[:, frame.TERM_ID_WORD]) & \
            ((frames.types == frame.HDR_TYPE_PAD) | ((headers[:, frame.SESSION_ID_WORD] == log.session_id) &
                                                     (headers[:, frame.STREAM_ID_WORD] == log.stream_id)))
        count = len(frames) if plausible.all() else int(plausible.argmin())
        for at, fields in zip(frames.starts[:count].tolist(), headers[:count].tolist()):
            length, kind, _, session_id, stream_id, term_id, reserved_low, reserved_high = fields
            position = compute_position(term_id, at, log.position_bits_to_shift, log.initial_term_id)
            yield Frame(position, partition, term_id, at, length, (kind >> 8) & 0xFF, kind >> 16, session_id,
                        stream_id, (reserved_high << 32) | (reserved_low & 0xFFFFFFFF))
        # Then the next place a frame can start, zeroed or torn space skipped: from where the chain
        # stopped, or past it if it stopped where it began (nothing there is a frame of this log).
        stop = int(frames.starts[count]) if count < len(frames) else frames.end
        if damaged is not None and stop != reported and (problem := _damage_at(log, partition, stop)) is not None:
            damaged.append(problem)
            reported = stop  # the walk from there stops there again: named once
        at = bisect.bisect_left(candidates, stop) if stop > offset else bisect.bisect_right(candidates, stop)
        offset = candidates[at] if at < len(candidates) else term_length


def assemble(log: LogBuffer, frames: list[Frame]) -> list[Message]:
    """Whole messages from frames in position order; fragments must follow each other exactly."""
    messages = []
    first: Frame | None = None
    parts: list[bytes] = []
    expected = None
    for f in frames:
        if f.type != frame.HDR_TYPE_DATA:
            expected = f.end_position
            continue
        payload = bytes(log.terms[f.partition][f.term_offset + frame.HEADER_LENGTH:f.term_offset + f.length])
        if f.flags & frame.UNFRAGMENTED == frame.UNFRAGMENTED:
            messages.append(Message(f.end_position, f.term_id, f.term_offset, f.session_id, f.stream_id,
                                    f.reserved_value, payload, 1))
            first = None
        elif f.flags & frame.BEGIN_FLAG:
            first, parts = f, [payload]
        elif first is not None and f.position == expected:
            parts.append(payload)
            if f.flags & frame.END_FLAG:
                messages.append(Message(f.end_position, first.term_id, first.term_offset, first.session_id,
                                        first.stream_id, first.reserved_value, b"".join(parts), len(parts)))
                first = None
        else:
            first = None  # a fragment whose predecessors were cleaned away
        expected = f.end_position
    return messages


def scan_messages(log: LogBuffer, damaged: list[str] | None = None) -> list[Message]:
    """The whole messages still in the log; `damaged`: as scan_frames'."""
    return assemble(log, scan_frames(log, damaged))

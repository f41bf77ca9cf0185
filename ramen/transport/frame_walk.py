"""The one frame walker: the frames of a stretch of term bytes (a log's term, a segment file's chunk,
a replay's window), found with numpy rather than a Python step a frame.

Frames chain: each begins where the one before ends, aligned. A header's termOffset field holds
the frame's own term offset, so every 32-byte slot whose field holds the slot's own offset is a
candidate start, and the candidates must chain exactly from the first frame. A payload that happens
to look like a header breaks the chain; so does damage. Then (and for stretches of few frames,
where numpy's fixed cost is more than the steps it saves: walk_budget) the frames are walked one by
one, which gives the same answer: the walk stops at the first length <= 0 (nothing committed there
yet), at a header that does not fit its place, or at a frame that does not fit the stretch.

What a frame is checked against before its length is trusted (`frame_problem`, `headers_fit`) lives
here too, so that every reader of recorded or logged frames judges them alike.

The live edge of a log is the one place walked otherwise: Image's polls read each length word first
(the writer stores it last, as its commit) and stop at the first not yet stored; what they hand on
(block_poll's block) is walked here.
"""

from __future__ import annotations

import numpy as np

from ramen import message
from ramen.transport import frame
from ramen.transport.frame import (ALIGN_MASK, ALIGN_UP, END_FLAG_IN_KIND, FRAME_ALIGNMENT, HDR_TYPE_DATA, HDR_TYPE_PAD,
                                   HEADER_LENGTH, HEADER_WORDS, KIND_WORD_INDEX, LENGTH_WORD, SLOT_WORDS,
                                   TERM_ID_WORD, TERM_OFFSET_WORD, TYPE_SHIFT_IN_KIND, align)
from ramen.transport.position import int32, position_bits_to_shift

SCAN_FIXED_STEPS = 30
"""The numpy scan's fixed cost per stretch (about 30 µs), in steps of the Python walk (about 1 µs a frame)."""

SCAN_SLOTS_PER_STEP = 400
"""32-byte slots the scan covers in the time of one walk step (about 2.5 ns a slot)."""

_EMPTY_STARTS = np.zeros(0, dtype=np.int64)
_EMPTY_HEADERS = np.zeros((0, HEADER_WORDS), dtype=np.int32)


class Frames:
    """Frames found in a stretch: their offsets in it and their headers as int32 words (copies).

    A stretch walked one frame at a time (few frames) keeps the header tuples the walk read, and
    makes the numpy arrays only when asked for them: for thirty frames (a 1 MiB replay block of 64
    KiB messages), making them costs more than the walk, and `first_misfit` and `message_frames`
    answer from the tuples."""

    def __init__(self, end: int, starts: np.ndarray | None = None, headers: np.ndarray | None = None, *,
                 walked: tuple[list[int], list[tuple]] | None = None) -> None:
        self.end = end
        """Where the walk stopped: the end of the last frame found (the stretch's start if none)."""
        self._starts = starts
        self._headers = headers
        self._walked = walked

    def __len__(self) -> int:
        return len(self._walked[0]) if self._walked is not None else len(self._starts)

    @property
    def starts(self) -> np.ndarray:
        """int64 offsets from the stretch's start."""
        if self._starts is None:
            self._starts = np.array(self._walked[0], dtype=np.int64)
        return self._starts

    @property
    def headers(self) -> np.ndarray:
        """(n, 8) int32: each frame's header, a column a field (frame.LENGTH_WORD, frame.KIND_WORD_INDEX, …)."""
        if self._headers is None:
            self._headers = _headers_of(self._walked[1])
        return self._headers

    @property
    def lengths(self) -> np.ndarray:
        return self.headers[:, LENGTH_WORD]

    @property
    def types(self) -> np.ndarray:
        return self.headers[:, KIND_WORD_INDEX] >> TYPE_SHIFT_IN_KIND

    @property
    def flags(self) -> np.ndarray:
        return (self.headers[:, KIND_WORD_INDEX] >> 8) & 0xFF

    @property
    def ends(self) -> np.ndarray:
        return self.starts + ((self.lengths.astype(np.int64) + ALIGN_UP) & ALIGN_MASK)

    def columns(self) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
        """Starts, ends, lengths, types and flags as lists of ints, for code that goes frame by frame."""
        if self._walked is None:
            return (self.starts.tolist(), self.ends.tolist(), self.lengths.tolist(), self.types.tolist(),
                    self.flags.tolist())
        starts, rows = self._walked
        lengths = [row[0] for row in rows]
        kinds = [row[1] for row in rows]
        return (list(starts), [at + ((length + ALIGN_UP) & ALIGN_MASK) for at, length in zip(starts, lengths)], lengths,
                [kind >> TYPE_SHIFT_IN_KIND for kind in kinds], [(kind >> 8) & 0xFF for kind in kinds])

    def first_misfit(self, *, term_id: int, mtu_length: int | None = None) -> int | None:
        """The index of the first frame whose type, term id or length is not that of its place (as
        headers_fit judges), or None."""
        if self._walked is None:
            fit = headers_fit(self._headers, term_id=term_id, mtu_length=mtu_length)
            return None if fit.all() else int(np.argmin(fit))
        for i, (length, kind, _, _, _, frame_term_id, _) in enumerate(self._walked[1]):
            frame_type = kind >> TYPE_SHIFT_IN_KIND
            if frame_term_id != term_id or (frame_type != HDR_TYPE_PAD and (
                    frame_type != HDR_TYPE_DATA or (mtu_length is not None and length > mtu_length))):
                return i
        return None

    def message_frames(self) -> int:
        """How many frames lead up to the end of the last whole message (0 if none ends here): a
        message ends at an END fragment; padding (a term's end) stands alone."""
        if self._walked is None:
            kinds = self._headers[:, KIND_WORD_INDEX]
            ends = np.flatnonzero((kinds & END_FLAG_IN_KIND) | ((kinds >> TYPE_SHIFT_IN_KIND) == HDR_TYPE_PAD))
            return int(ends[-1]) + 1 if len(ends) else 0
        rows = self._walked[1]
        for i in range(len(rows) - 1, -1, -1):
            kind = rows[i][1]
            if kind & END_FLAG_IN_KIND or kind >> TYPE_SHIFT_IN_KIND == HDR_TYPE_PAD:
                return i + 1
        return 0

    def start_of(self, i: int) -> int:
        return self._walked[0][i] if self._walked is not None else int(self._starts[i])

    def length_of(self, i: int) -> int:
        return self._walked[1][i][0] if self._walked is not None else int(self._headers[i, LENGTH_WORD])

    def end_of(self, i: int) -> int:
        return self.start_of(i) + ((self.length_of(i) + ALIGN_UP) & ALIGN_MASK)


def _headers_of(rows: list[tuple]) -> np.ndarray:
    """The (n, 8) int32 headers of the walk's tuples (the last field is one int64 of two words)."""
    headers = np.empty((len(rows), HEADER_WORDS), dtype=np.int32)
    if rows:
        fields = np.array(rows, dtype=np.int64)
        headers[:, :HEADER_WORDS - 2] = fields[:, :HEADER_WORDS - 2]
        headers[:, HEADER_WORDS - 2:] = fields[:, HEADER_WORDS - 2:].view(np.int32)
    return headers


_SLOT_OFFSETS = np.zeros(0, dtype=np.int32)


def _slot_offsets(slots: int) -> np.ndarray:
    """0, 32, 64, … for `slots` slots: kept from stretch to stretch (grown when a longer one comes)."""
    global _SLOT_OFFSETS
    if len(_SLOT_OFFSETS) < slots:
        _SLOT_OFFSETS = np.arange(slots, dtype=np.int32) * FRAME_ALIGNMENT
    return _SLOT_OFFSETS[:slots]


def walk_budget(length: int) -> int:
    """Walk steps that cost what the numpy scan of a `length`-byte stretch costs: a 1 MiB stretch may
    be walked if it holds fewer than about 110 frames, a 64 KiB one fewer than about 35."""
    return SCAN_FIXED_STEPS + (length >> 5) // SCAN_SLOTS_PER_STEP


def walk(buffer, start: int = 0, end: int | None = None, *, term_offset: int | None = None,
         term_id: int | None = None, first_length: int | None = None, max_frames: int | None = None) -> Frames:
    """The frames of buffer[start:end] chained from a frame at `start`, up to the first length <= 0,
    header that does not claim its own place, or frame that does not fit before `end`.

    `term_offset`: the term offset of buffer[start] (default `start`: the buffer is a whole term).
    `term_id`: frames of another term id end the walk too (a lap of the stream before this one).
    `first_length`: the first frame's length, when its length word is not in the buffer yet (a
    replay's window, whose first length word is kept aside until the commit).
    `max_frames`: walk one by one (no numpy) when the stretch holds fewer frames, as its first
    frame's length suggests and the walk finds; the default is what the numpy scan of the stretch
    costs in walk steps (walk_budget)."""
    if end is None:
        end = len(buffer)
    if term_offset is None:
        term_offset = start
    length = (end - start) & ALIGN_MASK
    if max_frames is None:
        max_frames = walk_budget(length)
    first = first_length if first_length is not None or length == 0 else frame.INT32.unpack_from(buffer, start)[0]
    if length < max_frames * align(max(first or 0, HEADER_LENGTH)):  # few frames, judging by the first
        found = _walk_each(buffer, start, length, term_offset, term_id, first_length, max_frames)
        if found is not None:
            return found
    found = _scan(buffer, start, length, term_offset, term_id, first_length)
    if found is not None:
        return found
    return _walk_each(buffer, start, length, term_offset, term_id, first_length, None)


def _scan(buffer, start: int, length: int, term_offset: int, term_id: int | None,
          first_length: int | None) -> Frames | None:
    """The vectorised walk; None when it cannot vouch for its answer (the walk one by one then gives it)."""
    slots = length >> 5
    if slots == 0:
        return Frames(start, _EMPTY_STARTS, _EMPTY_HEADERS)
    words = np.frombuffer(buffer, dtype=np.int32, count=slots * SLOT_WORDS, offset=start).reshape(slots, SLOT_WORDS)
    relative = words[:, TERM_OFFSET_WORD] - _slot_offsets(slots)  # each slot's claimed offset, from the slot's
    starts = np.flatnonzero(relative == term_offset).astype(np.int64) << 5
    if len(starts) == 0 or starts[0] != 0:
        return None
    headers = words[starts >> 5]  # a gather: a copy
    if first_length is not None:
        headers[0, LENGTH_WORD] = first_length
    lengths = headers[:, LENGTH_WORD]
    stop = lengths < HEADER_LENGTH
    if term_id is not None:
        stop |= headers[:, TERM_ID_WORD] != term_id
    if stop.any():
        last = int(np.argmax(stop))  # the first that ends the walk: it must lie where the chain leads
        ends = starts[:last] + ((lengths[:last].astype(np.int64) + ALIGN_UP) & ALIGN_MASK)
        if not np.array_equal(ends, starts[1:last + 1]):
            return None
        return Frames(start + (int(ends[-1]) if last else 0), starts[:last] + start, headers[:last])
    ends = starts + ((lengths.astype(np.int64) + ALIGN_UP) & ALIGN_MASK)
    if not np.array_equal(ends[:-1], starts[1:]):
        return None
    count = int(np.searchsorted(ends, length, side="right"))  # all, or all but a last cut by the end
    return Frames(start + (int(ends[count - 1]) if count else 0), starts[:count] + start, headers[:count])


def _walk_each(buffer, start: int, length: int, term_offset: int, term_id: int | None, first_length: int | None,
               max_frames: int | None) -> Frames | None:
    """The walk one frame at a time; None once more than `max_frames` frames are found."""
    header_at = frame.HEADER_BY_WORD.unpack_from
    starts: list[int] = []  # from the buffer's start
    rows: list[tuple] = []
    at, end = start, start + length
    last_header = end - HEADER_LENGTH
    shift = term_offset - start  # a frame's term offset less its place in the buffer
    left = -1 if max_frames is None else max_frames
    while at <= last_header:
        if left == 0:
            return None
        left -= 1
        fields = header_at(buffer, at)
        if at == start and first_length is not None:
            fields = (first_length, *fields[1:])
        frame_length = fields[0]
        if frame_length < HEADER_LENGTH or fields[2] != at + shift or (term_id is not None and fields[5] != term_id):
            break
        next_at = at + ((frame_length + ALIGN_UP) & ALIGN_MASK)
        if next_at > end:
            break
        starts.append(at)
        rows.append(fields)
        at = next_at
    return Frames(at, walked=(starts, rows))


def headers_fit(headers: np.ndarray, *, term_id: int, mtu_length: int | None = None) -> np.ndarray:
    """Whether each of the chained frames' types, term ids and lengths are those of their place (a
    stretch lies in one term): a boolean a frame; `frame_problem` names what is wrong with one."""
    types = headers[:, KIND_WORD_INDEX] >> TYPE_SHIFT_IN_KIND
    fit = ((types == HDR_TYPE_DATA) | (types == HDR_TYPE_PAD)) & (headers[:, TERM_ID_WORD] == term_id)
    if mtu_length is not None:
        fit &= (headers[:, LENGTH_WORD] <= mtu_length) | (types == HDR_TYPE_PAD)
    return fit


def frame_problem(position: int, length: int, frame_type: int, term_offset: int, term_id: int, *,
                  term_length: int, initial_term_id: int | None = None,
                  mtu_length: int | None = None) -> str | None:
    """What is wrong with a frame header found at stream `position`, or None. Its length is checked
    before anyone uses it to find the next frame (a length <= 0 is the end of the data, for the
    caller to judge). Without initial_term_id or mtu_length, those checks are left out."""
    mask = term_length - 1
    if length < HEADER_LENGTH:
        return f"frame length {length} is shorter than a frame header ({HEADER_LENGTH})"
    term_end = (position | mask) + 1
    if position + align(length) > term_end:
        return f"frame length {length} runs past the end of its term (position {term_end})"
    if frame_type != HDR_TYPE_DATA and frame_type != HDR_TYPE_PAD:
        return f"frame type {frame_type} is neither DATA ({HDR_TYPE_DATA}) nor PAD ({HDR_TYPE_PAD})"
    if frame_type == HDR_TYPE_DATA and mtu_length is not None and length > mtu_length:
        return f"DATA frame length {length} exceeds the recording's MTU ({mtu_length})"
    wrong = []
    if term_offset != position & mask:
        wrong.append(f"termOffset {term_offset} (expected {position & mask})")
    if initial_term_id is not None:
        expected = int32(initial_term_id + (position >> position_bits_to_shift(term_length)))
        if term_id != expected:
            wrong.append(f"termId {term_id} (expected {expected})")
    if wrong:
        return f"frame header does not fit its position: {', '.join(wrong)}"
    return None


def _held_tuples(log_buffer):
    """(position, max event time) of each TUPLES message with event times that a log's active term
    and the one before hold, in the log's order: what a restarted writer or reader can still read
    there (the cleaning behind the readers keeps those two terms as written: flow_control.py).
    Frames of an older lap of the stream (a stale term id) are left out."""
    term_count = log_buffer.active_term_count
    for count in range(max(0, term_count - 1), term_count + 1):
        term = log_buffer.terms[count % 3]
        frames = walk(term, term_id=int32(log_buffer.initial_term_id + count))
        first = (frames.types == HDR_TYPE_DATA) & ((frames.flags & frame.BEGIN_FLAG) != 0) & \
            (frames.lengths >= HEADER_LENGTH + message.HEADER_LENGTH)
        for offset in frames.starts[first].tolist():
            header = message.decode_header(term, offset + HEADER_LENGTH)
            if header is not None and header.kind == message.KIND_TUPLES and \
                    header.max_event_time_us != message.NO_EVENT_TIME:
                yield (count << log_buffer.position_bits_to_shift) + offset, header.max_event_time_us


def last_event_time_us(log_buffer, before: int | None = None) -> int | None:
    """The largest event time in the TUPLES messages a log still holds (_held_tuples): where a
    restarted writer's stream was; `before`: of those that begin before that position (a reader
    that joined there reads the rest)."""
    return max((high for position, high in _held_tuples(log_buffer) if before is None or position < before),
               default=None)


def resume_position(log_buffer, since_us: int) -> int | None:
    """Where a reader that wants every row from event time `since_us` on can join the log: at the
    first message it still holds whose rows reach `since_us`, or at its tail when none does. None
    when the oldest message it holds already reaches it: the rows before may have been overwritten.
    (Rows come in the order of their event times within a window's lateness, which the caller takes
    off `since_us`.)"""
    held = iter(_held_tuples(log_buffer))
    oldest = next(held, None)
    if oldest is None or oldest[1] >= since_us:
        return None
    return next((position for position, high in held if high >= since_us), log_buffer.producer_position())

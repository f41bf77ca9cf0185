"""The replay publication: an ExclusivePublication that cleans nothing behind its readers.

A reader only ever looks at the length word at its position, which is at most the tail; so what a
writer must keep is that the word at the tail reads zero. Here every claim (offer's, try_claim's,
offer_batch's, offer_frames', commit_window's, the padding at a term's end) zeroes the word just
past it before the tail moves there (at a term's end, the first word of the next term), and a
claim's frames stay invisible until their first length word is stored last; at open, the word at
the tail is zeroed (a reopened log may hold a frame there). Everything else in the ring keeps
whatever an earlier lap left.

ExclusivePublication zeroes the space two terms behind its slowest reader instead (flow_control.py
TermCleaner), as Aeron does, so that a restarted writer finds its last rows (frame_walk.last_message)
and a frame a dead writer claimed and never wrote reads as a clean zero gap that readers pad. A
replay's log is never resumed by a restarted writer, so for it that cleaning buys nothing, and it
costs a third of an in-place replay's time (workers/replayer_process.py open_output).
"""

from __future__ import annotations

from ramen.transport.frame import ALIGN_MASK, ALIGN_UP, HEADER_LENGTH
from ramen.transport.position import index_by_term_count
from ramen.transport.publication import ExclusivePublication

_offer = ExclusivePublication.offer
_FRAME_UP = HEADER_LENGTH + ALIGN_UP


class NoCleaner:
    """A TermCleaner that leaves every term as written."""

    def __init__(self, *args) -> None:
        pass

    def clean_entered_term(self, index: int) -> None:
        pass

    def clean_to(self, position: int) -> None:
        pass


class ReplayPublication(ExclusivePublication):
    """A publication that does not clean behind its readers: a replay's (see the module's docstring).
    Written through every entry point of ExclusivePublication, and opened the same way."""

    _cleaner_type = NoCleaner

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._zero_length_word(self._term_offset)  # a reopened log may hold a frame at its tail

    def offer(self, buffer, offset: int = 0, length: int | None = None, reserved_value: int = 0) -> int:
        # ExclusivePublication.offer inlines its claim: zero the word just past the frame first.
        # When nothing is written there after all (back pressure, padding, fragments), the word
        # zeroed lies past the tail, where no reader looks.
        if self._closed:
            return _offer(self, buffer, offset, length, reserved_value)
        new_offset = self._term_offset + \
            (((len(buffer) - offset if length is None else length) + _FRAME_UP) & ALIGN_MASK)
        if new_offset < self.term_length:
            self._terms_i32[self._index][new_offset >> 2] = 0
        elif new_offset == self.term_length:
            self._zero_length_word(new_offset)
        return _offer(self, buffer, offset, length, reserved_value)

    def _offer_fragmented(self, buffer, offset: int, length: int, reserved_value: int) -> int:
        # Each fragment is committed as it is written, so a reader reaches the next one's length
        # word before it is written: zero every fragment's first, past the tail, before the claim.
        if length <= self.max_message_length and not self._closed:
            stride = self.max_payload_length + HEADER_LENGTH
            first = self._term_offset
            end = min(self.term_length, first + -(-length // self.max_payload_length) * stride)
            words = self._terms_i32[self._index]
            for at in range(first + stride, end, stride):
                words[at >> 2] = 0
        return super()._offer_fragmented(buffer, offset, length, reserved_value)

    def _claim(self, new_term_offset: int) -> None:
        self._zero_length_word(new_term_offset)
        self._tails[self._index] = self._tail_base + new_term_offset
        self._term_offset = new_term_offset

    def _zero_length_word(self, term_offset: int) -> None:
        """Zero the length word a reader finds at `term_offset` of the active term: at the term's
        end, that is the next term's first."""
        if term_offset < self.term_length:
            self._terms_i32[self._index][term_offset >> 2] = 0
        else:
            self._terms_i32[index_by_term_count(self._term_count + 1)][0] = 0

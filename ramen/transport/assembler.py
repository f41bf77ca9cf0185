"""Fragment assembly: hand over only whole messages (Aeron's FragmentAssembler).

A message larger than the MTU arrives as fragments flagged BEGIN ... END. Unfragmented messages
pass straight through with no copy; fragments are gathered per image (keyed by the image's header
flyweight) and the whole message is handed over with a header describing it: the first
fragment's term id and offset, and the position after the last fragment.
"""

from __future__ import annotations

from dataclasses import dataclass

from ramen.transport import frame
from ramen.transport.logbuffer import LogBufferError
from ramen.transport.frame_walk import walk
from ramen.transport.status import ABORT, CONTINUE


@dataclass
class MessageHeader:
    """Header of a reassembled message (a snapshot, unlike the reused frame Header)."""
    term_id: int
    term_offset: int
    session_id: int
    stream_id: int
    reserved_value: int
    position: int
    flags: int = frame.UNFRAGMENTED


class _Builder:
    __slots__ = ("data", "term_id", "term_offset", "reserved_value", "in_progress", "joined")

    def __init__(self) -> None:
        self.data = bytearray()
        self.in_progress = False
        self.joined = False
        """`data` is already the whole message (joined at its BEGIN): the other fragments are skipped."""


def _join_committed(buffer, frame_offset: int) -> bytes | None:
    """The message whose BEGIN frame is at frame_offset, in one exact-size copy, when every fragment
    of it is committed already (a reader catching up finds them so); None otherwise. A message's
    fragments never cross a term's end."""
    pieces = []
    offset = frame_offset
    while offset + frame.HEADER_LENGTH <= len(buffer):
        length = frame.INT32.unpack_from(buffer, offset)[0]
        if length <= 0:
            return None
        pieces.append(buffer[offset + frame.HEADER_LENGTH:offset + length])
        if buffer[offset + frame.FLAGS_OFFSET] & frame.END_FLAG:
            return b"".join(pieces)
        offset += frame.align(length)
    return None


class FragmentAssembler:
    """Wraps a handler(buffer, offset, length, header) so that it sees whole messages only.

    Use `on_fragment` with poll and `on_controlled_fragment` with controlled_poll.

    With `hand_over` (on_fragment only), the handler may keep the buffer it gets: every message
    comes whole in a buffer of its own at offset 0, an unfragmented one copied out of the log, a
    reassembled one in the bytearray it was built in, which the assembler then forgets. A handler
    that keeps messages (a worker's windows) then copies each once, not twice.
    """

    def __init__(self, delegate, *, hand_over: bool = False) -> None:
        self.delegate = delegate
        self.hand_over = hand_over
        self._builders: dict[int, _Builder] = {}

    def on_fragment(self, buffer, offset: int, length: int, header) -> None:
        flags = buffer[header.offset + frame.FLAGS_OFFSET]
        if flags & frame.UNFRAGMENTED == frame.UNFRAGMENTED:
            if self.hand_over:
                self.delegate(bytes(buffer[offset:offset + length]), 0, length, header)
            else:
                self.delegate(buffer, offset, length, header)
            return
        if self.hand_over:
            builder = self._join_or_append(buffer, offset, length, header, flags)
        else:
            builder = self._append(buffer, offset, length, header, flags)
        if builder is not None and flags & frame.END_FLAG:
            builder.in_progress = builder.joined = False
            data = builder.data
            if self.hand_over:
                builder.data = bytearray()
            self.delegate(data, 0, len(data), self._message_header(builder, header))

    __call__ = on_fragment

    def on_controlled_fragment(self, buffer, offset: int, length: int, header) -> int:
        """As on_fragment; an ABORT of a whole message rolls its last fragment back for redelivery."""
        flags = buffer[header.offset + frame.FLAGS_OFFSET]
        if flags & frame.UNFRAGMENTED == frame.UNFRAGMENTED:
            return self.delegate(buffer, offset, length, header)
        mark = len(self._builders[id(header)].data) if id(header) in self._builders else 0
        builder = self._append(buffer, offset, length, header, flags)
        if builder is None or not flags & frame.END_FLAG:
            return CONTINUE
        action = self.delegate(builder.data, 0, len(builder.data), self._message_header(builder, header))
        if action == ABORT:
            del builder.data[mark:]
        else:
            builder.in_progress = False
        return action

    def _append(self, buffer, offset: int, length: int, header, flags: int) -> _Builder | None:
        """Add a fragment to its image's message; None when it has no beginning (joined mid-message)."""
        builder = self._builders.get(id(header))
        if builder is None:
            builder = self._builders[id(header)] = _Builder()
        if flags & frame.BEGIN_FLAG:
            builder.data[:] = buffer[offset:offset + length]
            self._begin(builder, buffer, header)
            return builder
        if not builder.in_progress:
            return None
        builder.data += buffer[offset:offset + length]
        return builder

    def _join_or_append(self, buffer, offset: int, length: int, header, flags: int) -> _Builder | None:
        """As _append, but a message whose fragments are all there at its BEGIN is copied at once
        into a buffer of its size, not grown a fragment at a time (each growth may move it)."""
        builder = self._builders.get(id(header))
        if flags & frame.BEGIN_FLAG:
            whole = _join_committed(buffer, header.offset)
            if whole is not None:
                if builder is None:
                    builder = self._builders[id(header)] = _Builder()
                self._begin(builder, buffer, header)
                builder.data, builder.joined = whole, True
                return builder
            if builder is not None and builder.joined:  # the previous message never ended
                builder.data, builder.joined = bytearray(), False
        elif builder is not None and builder.joined:
            return builder  # a later fragment of a message joined at its BEGIN
        return self._append(buffer, offset, length, header, flags)

    @staticmethod
    def _begin(builder: _Builder, buffer, header) -> None:
        fields = frame.HEADER.unpack_from(buffer, header.offset)
        builder.term_offset, builder.term_id, builder.reserved_value = fields[4], fields[7], fields[8]
        builder.in_progress = True

    @staticmethod
    def _message_header(builder: _Builder, header) -> MessageHeader:
        fields = frame.HEADER.unpack_from(header.buffer, header.offset)
        return MessageHeader(builder.term_id, builder.term_offset, fields[5], fields[6], builder.reserved_value,
                             header.position)


_HDR = frame.HEADER_LENGTH


class BlockAssembler:
    """Whole messages out of the blocks `Image.block_poll` hands over, each in a buffer of its own.

    For a reader that keeps every message (a worker's windows), the fast path: one walk over the
    frame headers of a block, where `poll` with a FragmentAssembler costs several Python calls per
    fragment (a third of a lazy replay's reading, measured). A message whose END is not in the
    block yet is copied and carried over to the next one. Fragments without a beginning (a reader
    joined mid-message) are skipped, and so is a message whose END never came (its writer died and
    the reader unblocked the rest as padding), as FragmentAssembler does.

    Use `on_block` as the block handler of one image, then `take()` the messages."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self._carried: list | None = None
        """The fragments so far of a message cut by a block's end, copied."""

    def take(self) -> list[bytes]:
        """The whole messages assembled since the last take, in stream order."""
        messages, self.messages = self.messages, []
        return messages

    def on_block(self, term, offset: int, length: int, session_id: int, term_id: int) -> None:
        end = offset + length
        frames = walk(term, offset, end)
        if frames.end != end:  # block_poll hands over committed frames only, each where its header says
            raise LogBufferError(f"term {term_id}: the frame at term offset {frames.end} does not chain with "
                                 f"the ones before it in a committed block (damaged log)")
        messages = self.messages
        pieces = self._carried
        for at, _, frame_length, frame_type, flags in zip(*frames.columns()):
            if frame_type == frame.HDR_TYPE_DATA:
                body = term[at + _HDR:at + frame_length]
                if flags & frame.BEGIN_FLAG:
                    if flags & frame.END_FLAG:
                        messages.append(bytes(body))
                        pieces = None
                    else:
                        pieces = [body]
                elif pieces is not None:
                    pieces.append(body)
                    if flags & frame.END_FLAG:
                        messages.append(b"".join(pieces))
                        pieces = None
            else:  # padding: at a term's end, where no message is in progress, or an unblocked frame
                pieces = None
        self._carried = None if pieces is None else [b"".join(pieces)]

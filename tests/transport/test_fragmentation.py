"""Messages larger than a frame: fragments, reassembly, the largest message, and controlled polls."""

import random
import struct

import pytest

from ramen.transport import (ABORT, ADMIN_ACTION, BREAK, COMMIT, CONTINUE, BlockAssembler, CountersFile,
                             ExclusivePublication, FragmentAssembler, Image, LogBuffer, LogBufferError,
                             LogBufferParams, frame)
from ramen.transport.counters import SUBSCRIBER_POSITION_TYPE_ID
from ramen.transport.image import unblock

TERM = 64 * 1024
MTU = 1408
MAX_PAYLOAD = MTU - 32
SESSION_ID = 888
STREAM_ID = 1003
BEGIN, END = 0x80, 0x40


def align32(value: int) -> int:
    return (value + 31) // 32 * 32


def payload(length: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(length)


def frames(term, start: int, end: int) -> list[dict]:
    """Every frame header from start to end, decoded at Aeron's offsets."""
    out = []
    offset = start
    while offset < end:
        length, version, flags, frame_type, term_offset, session_id, stream_id, term_id, reserved = \
            struct.unpack_from("<iBBHiiiiq", term, offset)
        out.append({"offset": offset, "length": length, "flags": flags, "type": frame_type,
                    "term_offset": term_offset, "session_id": session_id, "stream_id": stream_id,
                    "term_id": term_id, "reserved_value": reserved,
                    "payload": bytes(term[offset + 32:offset + length])})
        offset += align32(length)
    return out


def make_log(tmp_path, term_length: int = TERM, **params) -> LogBuffer:
    return LogBuffer.create(tmp_path / "frag.logbuffer",
                            LogBufferParams(term_length=term_length, mtu_length=MTU, session_id=SESSION_ID,
                                            stream_id=STREAM_ID, **params))


def collect(image: Image, fragment_limit: int = 1 << 20) -> list[tuple[bytes, object]]:
    """Poll through a FragmentAssembler until nothing is left: (message, header snapshot) pairs."""
    out = []

    def on_message(buf, offset, length, header):
        out.append((bytes(buf[offset:offset + length]), (header.term_id, header.term_offset, header.position,
                                                         header.reserved_value)))

    assembler = FragmentAssembler(on_message)
    while image.poll(assembler.on_fragment, fragment_limit):
        pass
    return out


# -- fragmentation -------------------------------------------------------------------------------

def test_message_larger_than_the_mtu_payload_is_split_into_begin_middle_end_fragments(tmp_path):
    log = make_log(tmp_path)
    publication = ExclusivePublication(log)
    message = payload(3000, 1)

    position = publication.offer(message, reserved_value=99)

    written = frames(log.terms[0], 0, position)
    assert [f["length"] for f in written] == [MAX_PAYLOAD + 32, MAX_PAYLOAD + 32, 3000 - 2 * MAX_PAYLOAD + 32]
    assert [f["flags"] for f in written] == [BEGIN, 0x00, END]
    assert [f["offset"] for f in written] == [f["term_offset"] for f in written] == [0, MTU, 2 * MTU]
    assert all(f["type"] == 1 and f["session_id"] == SESSION_ID and f["stream_id"] == STREAM_ID and
               f["term_id"] == 0 and f["reserved_value"] == 99 for f in written)
    assert b"".join(f["payload"] for f in written) == message
    assert position == 2 * MTU + align32(3000 - 2 * MAX_PAYLOAD + 32)


def test_message_of_exactly_the_mtu_payload_is_one_unfragmented_frame(tmp_path):
    log = make_log(tmp_path)

    position = ExclusivePublication(log).offer(payload(MAX_PAYLOAD, 2))

    assert position == MTU
    assert [(f["length"], f["flags"]) for f in frames(log.terms[0], 0, position)] == [(MTU, BEGIN | END)]


def test_message_one_byte_over_the_mtu_payload_is_two_fragments(tmp_path):
    log = make_log(tmp_path)

    position = ExclusivePublication(log).offer(payload(MAX_PAYLOAD + 1, 3))

    assert [(f["length"], f["flags"]) for f in frames(log.terms[0], 0, position)] == [(MTU, BEGIN), (33, END)]
    assert position == MTU + 64


def test_fragment_assembler_hands_over_whole_messages_only(tmp_path):
    log = make_log(tmp_path)
    publication = ExclusivePublication(log)
    image = Image(log, join_position=0)
    lengths = [0, 1, 7, 1376, 1377, 3000, 64, 8192, 5000, 200, 2753]
    sent = []
    for i, length in enumerate(lengths):
        start = publication.position
        message = payload(length, i)
        end = publication.offer(message, reserved_value=i)
        sent.append((message, (0, start, end, i)))

    # One fragment per poll, so every fragmented message spans several polls.
    received = collect(image, fragment_limit=1)

    assert received == sent


def test_a_handing_over_assembler_gives_each_message_a_buffer_of_its_own(tmp_path):
    """hand_over: a handler may keep what it gets. Every buffer is whole at offset 0, no two are
    the same object, and none changes when the log goes on (terms rotate, are cleaned, reused)."""
    log = make_log(tmp_path)
    publication = ExclusivePublication(log)
    image = Image(log, join_position=0)
    kept = []
    assembler = FragmentAssembler(lambda buf, offset, length, header: kept.append((buf, offset, length)),
                                  hand_over=True)
    sent = []
    for round_ in range(12):  # 12 x ~14 KB: more than the three 64 KiB terms hold
        for i, length in enumerate([10, 5000, 1376, 3000, 4100]):
            message = payload(length, round_ * 10 + i)
            while publication.offer(message) == ADMIN_ACTION:
                pass
            sent.append(message)
        while image.poll(assembler.on_fragment, 3):  # fragmented messages span polls
            pass
    assert all(offset == 0 and length == len(buf) for buf, offset, length in kept)
    assert len({id(buf) for buf, _, _ in kept}) == len(kept)
    assert [bytes(buf) for buf, _, _ in kept] == sent


def test_max_message_length_is_an_eighth_of_the_term(tmp_path):
    log = make_log(tmp_path)
    assert log.max_message_length == TERM // 8 == 8192


def test_max_message_length_is_capped_at_16_mib(tmp_path):
    log = make_log(tmp_path, term_length=256 * 1024 * 1024)  # a sparse file: only written pages cost
    publication = ExclusivePublication(log)
    assert log.max_message_length == 16 * 1024 * 1024

    with pytest.raises(ValueError, match="16777217 bytes exceeds the max message length 16777216"):
        publication.offer(bytes(16 * 1024 * 1024 + 1))
    assert publication.position == 0

    full, remainder = divmod(16 * 1024 * 1024, MAX_PAYLOAD)
    assert publication.offer(bytes(16 * 1024 * 1024)) == full * MTU + align32(remainder + 32)


def test_message_of_the_max_length_is_written_and_reassembled(tmp_path):
    log = make_log(tmp_path)
    message = payload(8192, 4)

    ExclusivePublication(log).offer(message)

    assert [m for m, _ in collect(Image(log, join_position=0))] == [message]


def test_offer_above_the_max_message_length_raises_and_writes_nothing(tmp_path):
    log = make_log(tmp_path)
    publication = ExclusivePublication(log)

    with pytest.raises(ValueError, match="8193 bytes exceeds the max message length 8192"):
        publication.offer(bytes(8193))

    assert publication.position == 0 and log.producer_position() == 0
    assert bytes(log.terms[0][:64]) == bytes(64)


def test_fragmented_message_that_would_straddle_the_term_end_is_padded_and_rotates(tmp_path):
    log = make_log(tmp_path)
    publication = ExclusivePublication(log)
    image = Image(log, join_position=0)
    filler = payload(1000, 5)
    while publication.position + 3104 <= TERM:  # 3104: the aligned frames of a 3000-byte message
        assert publication.offer(filler) > 0
    pad_offset = publication.position
    message = payload(3000, 6)

    assert publication.offer(message) == ADMIN_ACTION

    pad = frames(log.terms[0], pad_offset, TERM)
    assert [(f["type"], f["length"], f["term_offset"], f["flags"]) for f in pad] == \
        [(0, TERM - pad_offset, pad_offset, BEGIN | END)]
    assert log.active_term_count == 1
    assert publication.position == TERM

    position = publication.offer(message)

    assert position == TERM + 3104
    written = frames(log.terms[1], 0, 3104)
    assert [(f["flags"], f["term_id"]) for f in written] == [(BEGIN, 1), (0, 1), (END, 1)]
    received = collect(image)
    assert received[-1] == (message, (1, 0, position, 0))
    assert [m for m, _ in received[:-1]] == [filler] * (len(received) - 1)


def test_message_that_exactly_fills_the_rest_of_the_term_is_not_padded(tmp_path):
    log = make_log(tmp_path)
    publication = ExclusivePublication(log)
    while publication.position + 2 * MTU < TERM:
        publication.offer(payload(MAX_PAYLOAD, 7))
    rest = TERM - publication.position
    assert MTU < rest <= 2 * MTU

    position = publication.offer(payload(MAX_PAYLOAD + rest - MTU - 32, 8))  # two frames, to the last byte

    assert position == TERM
    assert log.active_term_count == 0


# -- controlled polls ----------------------------------------------------------------------------

def three_messages(tmp_path, counters=None):
    log = make_log(tmp_path)
    image = Image(log, counters, join_position=0)
    publication = ExclusivePublication(log)
    ends = [publication.offer(m) for m in (b"m0", b"m1", b"m2")]
    return image, ends


def test_controlled_poll_abort_leaves_the_fragment_for_the_next_poll(tmp_path):
    image, ends = three_messages(tmp_path)
    seen = []

    def abort_m1(buf, offset, length, header):
        seen.append(bytes(buf[offset:offset + length]))
        return ABORT if seen[-1] == b"m1" and seen.count(b"m1") == 1 else CONTINUE

    assert image.controlled_poll(abort_m1, 10) == 1
    assert image.position == ends[0]
    assert image.controlled_poll(abort_m1, 10) == 2
    assert seen == [b"m0", b"m1", b"m1", b"m2"]
    assert image.position == ends[2]


def test_controlled_poll_break_consumes_the_fragment_and_stops(tmp_path):
    image, ends = three_messages(tmp_path)
    seen = []

    def break_each(buf, offset, length, header):
        seen.append(bytes(buf[offset:offset + length]))
        return BREAK

    assert image.controlled_poll(break_each, 10) == 1
    assert image.position == ends[0]
    assert image.controlled_poll(break_each, 10) == 1
    assert seen == [b"m0", b"m1"]
    assert image.position == ends[1]


def test_controlled_poll_continue_consumes_and_goes_on(tmp_path):
    image, ends = three_messages(tmp_path)
    seen = []

    def keep_going(buf, offset, length, header):
        seen.append(bytes(buf[offset:offset + length]))
        return CONTINUE

    assert image.controlled_poll(keep_going, 10) == 3
    assert seen == [b"m0", b"m1", b"m2"]
    assert image.position == ends[2]


@pytest.mark.parametrize("action, published_during_m1", [(COMMIT, "end of m0"), (CONTINUE, "start")])
def test_controlled_poll_commit_publishes_the_position_before_the_next_fragment(tmp_path, action,
                                                                                published_during_m1):
    counters = CountersFile.open(tmp_path / "cnc.dat")
    image, ends = three_messages(tmp_path, counters)
    observer = CountersFile.open(tmp_path / "cnc.dat")  # another mapping, as another process would read it
    sub_pos_id, = observer.find(SUBSCRIBER_POSITION_TYPE_ID, image.log.correlation_id)
    published = {}

    def handler(buf, offset, length, header):
        name = bytes(buf[offset:offset + length])
        published[name] = observer.get(sub_pos_id)
        return action if name == b"m0" else CONTINUE

    assert image.controlled_poll(handler, 10) == 3
    assert published[b"m1"] == {"end of m0": ends[0], "start": 0}[published_during_m1]
    assert observer.get(sub_pos_id) == ends[2]


def test_assembler_redelivers_an_aborted_fragmented_message_whole(tmp_path):
    log = make_log(tmp_path)
    image = Image(log, join_position=0)
    publication = ExclusivePublication(log)
    message = payload(3000, 9)
    end = publication.offer(message)
    deliveries = []

    def abort_first_time(buf, offset, length, header):
        deliveries.append((bytes(buf[offset:offset + length]), header.position))
        return ABORT if len(deliveries) == 1 else CONTINUE

    assembler = FragmentAssembler(abort_first_time)
    assert image.controlled_poll(assembler.on_controlled_fragment, 10) == 2  # B and middle consumed
    assert image.position == 2 * MTU
    image.controlled_poll(assembler.on_controlled_fragment, 10)

    assert deliveries == [(message, end), (message, end)]
    assert image.position == end


def test_poll_hands_over_at_most_the_fragment_limit(tmp_path):
    log = make_log(tmp_path)
    publication = ExclusivePublication(log)
    for i in range(5):
        publication.offer(bytes([i]) * 10)
    image = Image(log, join_position=0)
    seen = []

    counts = [image.poll(lambda buf, offset, length, header: seen.append(buf[offset]), 2) for _ in range(4)]

    assert counts == [2, 2, 1, 0]
    assert seen == [0, 1, 2, 3, 4]


def test_a_handing_over_assembler_waits_for_fragments_not_yet_committed(tmp_path):
    """A message whose END is not committed when its BEGIN is polled is grown as its fragments
    come, and handed over whole once the END is there."""
    log = make_log(tmp_path)
    publication = ExclusivePublication(log)
    image = Image(log, join_position=0)
    kept = []
    assembler = FragmentAssembler(lambda buf, offset, length, header: kept.append(bytes(buf[offset:offset + length])),
                                  hand_over=True)
    message = payload(3 * MAX_PAYLOAD + 10, 1)
    publication.offer(message)
    last = 3 * MTU  # the last fragment's frame: not yet committed, as if its writer were still at it
    length_word = log.terms[0][last:last + 4].tobytes()
    log.terms[0][last:last + 4] = bytes(4)

    assert image.poll(assembler.on_fragment, 10) == 3 and kept == []
    log.terms[0][last:last + 4] = length_word
    assert image.poll(assembler.on_fragment, 10) == 1
    assert kept == [message]


# -- whole messages a block at a time (BlockAssembler) -------------------------------------------

def test_a_block_assembler_gives_whole_messages_each_in_a_buffer_of_its_own_across_blocks_and_terms(tmp_path):
    """Small blocks cut fragmented messages (carried over), terms rotate and are reused, and what was
    taken never changes: each message is its own bytes, equal to what was offered."""
    log = make_log(tmp_path)
    publication = ExclusivePublication(log)
    image = Image(log, join_position=0)
    assembler = BlockAssembler()
    sent, kept = [], []
    for round_ in range(12):  # 12 x ~14 KB: more than the three 64 KiB terms hold, padding at their ends
        for i, length in enumerate([0, 10, 5000, 1376, 1377, 3000, 4100]):
            message = payload(length, round_ * 10 + i)
            while publication.offer(message) == ADMIN_ACTION:
                pass
            sent.append(message)
        while image.block_poll(assembler.on_block, 2 * MTU):  # a block of two frames at most
            kept += assembler.take()
    non_empty = [m for m in kept if m]  # (b"" is one object in Python)
    assert all(type(m) is bytes for m in kept) and len({id(m) for m in non_empty}) == len(non_empty)
    assert kept == sent


def test_a_block_assembler_carries_a_message_whose_end_is_not_committed_yet(tmp_path):
    log = make_log(tmp_path)
    publication = ExclusivePublication(log)
    image = Image(log, join_position=0)
    assembler = BlockAssembler()
    message = payload(3 * MAX_PAYLOAD + 10, 1)
    publication.offer(message)
    last = 3 * MTU  # the last fragment's frame: not yet committed, as if its writer were still at it
    length_word = log.terms[0][last:last + 4].tobytes()
    log.terms[0][last:last + 4] = bytes(4)

    assert image.block_poll(assembler.on_block, TERM) == 3 * MTU and assembler.take() == []
    log.terms[0][last:last + 4] = length_word
    assert image.block_poll(assembler.on_block, TERM) > 0
    assert assembler.take() == [message]


def test_a_block_assembler_drops_a_message_whose_writer_died_mid_way_and_goes_on(tmp_path):
    """The reader unblocks the frame its dead writer left uncommitted (padding to the next frame):
    the message's fragments so far go, the next message comes whole."""
    log = make_log(tmp_path)
    publication = ExclusivePublication(log)
    image = Image(log, join_position=0)
    assembler = BlockAssembler()
    cut, whole = payload(3 * MAX_PAYLOAD + 10, 1), payload(100, 2)
    publication.offer(cut)
    last = 3 * MTU
    log.terms[0][last:last + 64] = bytes(64)  # its END, claimed and never written
    publication.offer(whole)
    assert image.block_poll(assembler.on_block, TERM) == 3 * MTU
    assert unblock(log, last)
    while image.block_poll(assembler.on_block, TERM):
        pass
    assert assembler.take() == [whole]


def test_a_block_assembler_skips_the_fragments_of_a_message_begun_before_it_joined(tmp_path):
    log = make_log(tmp_path)
    publication = ExclusivePublication(log)
    first, second = payload(3000, 1), payload(50, 2)
    publication.offer(first)
    publication.offer(second)
    image = Image(log, join_position=MTU)  # the first message's middle fragment
    assembler = BlockAssembler()
    while image.block_poll(assembler.on_block, TERM):
        pass
    assert assembler.take() == [second]


def test_a_block_assembler_refuses_a_frame_that_is_not_where_its_header_says(tmp_path):
    """Damage in a committed block (a term offset field that does not name its place) is an error,
    not messages quietly lost."""
    log = make_log(tmp_path)
    publication = ExclusivePublication(log)
    for i in range(3):
        publication.offer(payload(100, i))
    frame.INT32.pack_into(log.terms[0], 160 + frame.TERM_OFFSET_OFFSET, 999 * 32)  # the second frame's
    with pytest.raises(LogBufferError, match="term offset 160 does not chain"):
        Image(log, join_position=0).block_poll(BlockAssembler().on_block, TERM)

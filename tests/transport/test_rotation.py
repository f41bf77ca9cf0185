"""Term rotation: padding at term ends, position arithmetic, term ids that go negative or wrap, batches."""

import random
import struct
import time

import pytest

from ramen.transport import (ADMIN_ACTION, BACK_PRESSURED, MAX_POSITION_EXCEEDED, BufferClaim, CountersFile,
                             ExclusivePublication, FragmentAssembler, Image, LogBuffer, LogBufferParams)
from ramen.transport.position import compute_position, int32, max_possible_position, term_id_of

TERM = 64 * 1024
BITS = 16
INT32_MAX = 2**31 - 1
TIMEOUT_S = 30
"""Safety bound for loops that wait on a reader: a test that needs it has failed."""


def align32(value: int) -> int:
    return (value + 31) // 32 * 32


def header_at(term, offset: int) -> tuple:
    """(frameLength, flags, type, termOffset, termId) at Aeron's offsets."""
    length, flags, frame_type, term_offset, term_id = (struct.unpack_from("<i", term, offset)[0], term[offset + 5],
                                                       struct.unpack_from("<H", term, offset + 6)[0],
                                                       struct.unpack_from("<i", term, offset + 8)[0],
                                                       struct.unpack_from("<i", term, offset + 20)[0])
    return length, flags, frame_type, term_offset, term_id


def tail(log: LogBuffer, partition: int) -> tuple[int, int]:
    """(termId, termOffset) of a partition's raw tail counter."""
    raw = log.raw_tail(partition)
    return int32(raw >> 32), raw & 0xFFFFFFFF


def stream_through_terms(tmp_path, initial_term_id: int, terms: int = 22) -> list[int]:
    """Write until `terms` rotations happened, checking every position, pad and tail on the way,
    with a reader that keeps up (it polls when the writer is back-pressured). Returns the term ids
    of the frames read, in order."""
    log = LogBuffer.create(tmp_path / "rot.logbuffer",
                           LogBufferParams(term_length=TERM, initial_term_id=initial_term_id))
    counters = CountersFile.open(tmp_path / "cnc.dat")
    image = Image(log, counters, join_position=0)
    publication = ExclusivePublication(log, counters)
    received = []

    def on_fragment(buf, offset, length, header):
        received.append((bytes(buf[offset:offset + length]), header.position, header.term_id))

    def image_poll() -> int:
        return image.poll(on_fragment, 64)

    rng = random.Random(initial_term_id)
    sent = []
    term_count = 0
    message = None
    give_up = time.monotonic() + TIMEOUT_S
    while term_count < terms:
        assert time.monotonic() < give_up, f"gave up after {TIMEOUT_S} s at term {term_count}"
        if message is None:
            message = len(sent).to_bytes(4, "little") + rng.randbytes(rng.randrange(0, 1373))
        before = publication.position
        term_id = int32(initial_term_id + term_count)
        partition = term_count % 3
        offset = before - term_count * TERM
        result = publication.offer(message)
        if result == BACK_PRESSURED:
            image_poll()
            continue
        if result == ADMIN_ACTION:
            if offset < TERM:
                assert header_at(log.terms[partition], offset) == (TERM - offset, 0xC0, 0, offset, term_id)
            assert tail(log, partition) == (term_id, TERM)
            term_count += 1
            assert log.active_term_count == term_count
            assert tail(log, term_count % 3) == (int32(term_id + 1), 0)
            assert publication.position == term_count * TERM == log.producer_position()
            continue
        assert result == before + align32(len(message) + 32)
        assert result == compute_position(term_id, offset + align32(len(message) + 32), BITS, initial_term_id)
        assert header_at(log.terms[partition], offset) == (len(message) + 32, 0xC0, 1, offset, term_id)
        assert tail(log, partition) == (term_id, result - term_count * TERM)
        sent.append((message, result))
        message = None
    while image_poll():
        pass
    assert [(m, p) for m, p, _ in received] == sent
    positions = [p for _, p in sent]
    assert positions == sorted(set(positions))
    return [t for _, _, t in received]


def test_message_that_does_not_fit_the_term_is_padded_and_rotates(tmp_path):
    log = LogBuffer.create(tmp_path / "pad.logbuffer", LogBufferParams(term_length=TERM, initial_term_id=100))
    publication = ExclusivePublication(log)
    while publication.position + 1056 <= TERM:
        publication.offer(bytes(1000))
    pad_offset = publication.position

    assert publication.offer(b"m" * 1000) == ADMIN_ACTION

    assert header_at(log.terms[0], pad_offset) == (TERM - pad_offset, 0xC0, 0, pad_offset, 100)
    assert (log.active_term_count, tail(log, 0), tail(log, 1)) == (1, (100, TERM), (101, 0))
    position = publication.offer(b"m" * 1000)
    assert position == TERM + 1056
    assert header_at(log.terms[1], 0) == (1032, 0xC0, 1, 0, 101)
    received = []
    reader = Image(log, join_position=pad_offset)
    handler = lambda buf, offset, length, header: received.append((bytes(buf[offset:offset + length]),  # noqa: E731
                                                                   header.position))
    assert reader.poll(handler, 10) == 0 and reader.position == TERM  # pad skipped, the poll stops at the term end
    assert reader.poll(handler, 10) == 1
    assert received == [(b"m" * 1000, position)]


def test_rotation_through_twenty_terms_keeps_exact_positions_and_pads_each_term_end(tmp_path):
    term_ids = stream_through_terms(tmp_path, initial_term_id=0)
    assert term_ids[0] == 0 and term_ids[-1] == 21
    assert sorted(set(term_ids)) == list(range(22))


def test_negative_initial_term_id_counts_terms_up_through_zero(tmp_path):
    term_ids = stream_through_terms(tmp_path, initial_term_id=-5)
    assert sorted(set(term_ids)) == list(range(-5, 17))


def test_term_ids_that_wrap_past_int32_max_keep_positions_increasing(tmp_path):
    term_ids = stream_through_terms(tmp_path, initial_term_id=INT32_MAX - 2)
    distinct = list(dict.fromkeys(term_ids))
    assert distinct[:5] == [INT32_MAX - 2, INT32_MAX - 1, INT32_MAX, -2**31, -2**31 + 1]
    assert len(distinct) == 22


def test_position_arithmetic_wraps_term_ids_like_java_ints():
    initial = INT32_MAX - 2
    assert compute_position(-2**31, 96, BITS, initial) == 3 * TERM + 96
    assert term_id_of(3 * TERM + 96, BITS, initial) == -2**31
    assert compute_position(-3, 0, BITS, -5) == 2 * TERM
    assert max_possible_position(TERM) == TERM * 2**31


def test_log_started_mid_stream_counts_positions_from_its_term_id_and_offset(tmp_path):
    log = LogBuffer.create(tmp_path / "mid.logbuffer",
                           LogBufferParams(term_length=TERM, initial_term_id=-5, term_id=0, term_offset=1024))
    image = Image(log)
    publication = ExclusivePublication(log)

    assert log.active_term_count == 5 and tail(log, 5 % 3) == (0, 1024)
    assert publication.position == image.position == 5 * TERM + 1024
    position = publication.offer(b"x" * 10)

    assert position == 5 * TERM + 1024 + 64
    assert header_at(log.terms[5 % 3], 1024) == (42, 0xC0, 1, 1024, 0)
    received = []
    image.poll(lambda buf, offset, length, header: received.append(header.position), 10)
    assert received == [position]


# -- batches -------------------------------------------------------------------------------------

def expected_layout(start: int, messages) -> tuple[list[int], list[int]]:
    """Where unfragmented messages offered from start must end, and where the pads must go."""
    ends, pads = [], []
    position = start
    for message in messages:
        aligned = align32(len(message) + 32)
        term_end = (position // TERM + 1) * TERM
        if position + aligned > term_end:
            pads.append(position)
            position = term_end
        position += aligned
        ends.append(position)
    return ends, pads


def read_messages(image: Image) -> list[tuple[bytes, int]]:
    out = []
    assembler = FragmentAssembler(lambda buf, offset, length, header: out.append((bytes(buf[offset:offset + length]),
                                                                                  header.position)))
    while image.poll(assembler.on_fragment, 256):
        pass
    return out


@pytest.mark.parametrize("lengths", ["uniform", "varied"])
def test_offer_batch_writes_many_messages_in_one_call_and_rotates_inside_it(tmp_path, lengths):
    log = LogBuffer.create(tmp_path / "batch.logbuffer", LogBufferParams(term_length=TERM, term_offset=TERM - 4096))
    image = Image(log)
    publication = ExclusivePublication(log)
    rng = random.Random(7)
    messages = [i.to_bytes(4, "little") + rng.randbytes(96 if lengths == "uniform" else rng.randrange(0, 600))
                for i in range(300)]
    ends, pads = expected_layout(TERM - 4096, messages)

    count, end = publication.offer_batch(messages)

    assert (count, end) == (300, ends[-1])
    assert log.active_term_count == len(pads) >= 1
    for pad in pads:
        term_id, offset = pad // TERM, pad % TERM
        assert header_at(log.terms[term_id % 3], offset) == (TERM - offset, 0xC0, 0, offset, term_id)
    assert read_messages(image) == list(zip(messages, ends))


def test_offer_batch_stops_below_the_limit_and_the_rest_goes_after_the_reader_moves(tmp_path):
    log = LogBuffer.create(tmp_path / "limit.logbuffer", LogBufferParams(term_length=TERM))
    counters = CountersFile.open(tmp_path / "cnc.dat")
    image = Image(log, counters, join_position=0)
    publication = ExclusivePublication(log, counters)
    messages = [i.to_bytes(4, "little") + bytes(124) for i in range(1000)]  # 160-byte frames

    count, position = publication.offer_batch(messages)

    # Every message that starts below the limit (half a term ahead of the reader) is written.
    limit = publication.position_limit
    assert limit == TERM // 2
    assert count == -(-limit // 160) and position == count * 160
    assert publication.offer_batch(messages[count:]) == (0, BACK_PRESSURED)
    received = read_messages(image)
    written = count
    give_up = time.monotonic() + TIMEOUT_S
    while written < len(messages):
        assert time.monotonic() < give_up, f"gave up after {TIMEOUT_S} s with {written} messages written"
        count, position = publication.offer_batch(messages[written:])
        if count == 0:
            assert position == BACK_PRESSURED
        written += count
        received += read_messages(image)
    ends, pads = expected_layout(0, messages)
    assert received == list(zip(messages, ends))
    assert len(pads) == log.active_term_count == 2


def test_offer_batch_fragments_a_message_above_the_mtu_payload(tmp_path):
    log = LogBuffer.create(tmp_path / "bigbatch.logbuffer", LogBufferParams(term_length=TERM))
    image = Image(log, join_position=0)
    publication = ExclusivePublication(log)
    messages = [b"a" * 10, random.Random(1).randbytes(3000), b"b" * 20]

    count, position = publication.offer_batch(messages)

    assert count == 3 and position == publication.position
    assert [m for m, _ in read_messages(image)] == messages


def test_offer_batch_of_nothing_writes_nothing(tmp_path):
    log = LogBuffer.create(tmp_path / "empty.logbuffer", LogBufferParams(term_length=TERM))
    publication = ExclusivePublication(log)
    publication.offer(b"x")
    assert publication.offer_batch([]) == (0, 64)


@pytest.mark.parametrize("lengths", [[100] * 10, [100, 60, 100, 30, 100, 100, 100, 100, 100, 100]],
                         ids=["one-length", "varied"])
def test_offer_batch_block_stays_invisible_until_its_first_frame_commits(tmp_path, lengths):
    """While the payloads are copied, the tail already covers the block and its first frame holds
    minus the whole block's length, so a reader waits at it."""
    log = LogBuffer.create(tmp_path / "commit.logbuffer", LogBufferParams(term_length=TERM))
    reader = Image(log)
    publication = ExclusivePublication(log)
    block_length = sum(align32(32 + n) for n in lengths)
    seen = []

    class WatchedMessages(list):
        def __getitem__(self, key):
            seen.append((struct.unpack_from("<i", log.terms[0], 0)[0], log.raw_tail(0),
                         reader.poll(lambda *fragment: None, 100)))
            return list.__getitem__(self, key)

    messages = WatchedMessages(bytes([i]) * n for i, n in enumerate(lengths))
    assert publication.offer_batch(messages) == (10, block_length)
    assert seen == [(-block_length, block_length, 0)]
    assert reader.poll(lambda *fragment: None, 100) == 10


# -- the end of the stream -----------------------------------------------------------------------

@pytest.mark.parametrize("with_counters", [False, True], ids=["no-counters", "counters"])
def test_offers_past_the_largest_position_return_max_position_exceeded(tmp_path, with_counters):
    initial = -5
    last_term_id = int32(initial + INT32_MAX)  # the stream's last term: term count 2**31 - 1
    log = LogBuffer.create(tmp_path / "end.logbuffer", LogBufferParams(
        term_length=TERM, initial_term_id=initial, term_id=last_term_id, term_offset=TERM - 1024))
    counters = CountersFile.open(tmp_path / "cnc.dat") if with_counters else None
    image = Image(log, counters)
    publication = ExclusivePublication(log, counters)
    end = max_possible_position(TERM)
    assert publication.position == end - 1024

    results = [publication.offer(b"x" * 400) for _ in range(4)]

    assert results == [end - 576, end - 128, MAX_POSITION_EXCEEDED, MAX_POSITION_EXCEEDED]
    assert publication.position == end
    assert header_at(log.terms[INT32_MAX % 3], TERM - 128) == (128, 0xC0, 0, TERM - 128, last_term_id)
    assert log.active_term_count == INT32_MAX
    assert publication.try_claim(10, BufferClaim()) == MAX_POSITION_EXCEEDED
    assert publication.offer_batch([b"y"] * 3) == (0, MAX_POSITION_EXCEEDED)
    assert read_messages(image) == [(b"x" * 400, end - 576), (b"x" * 400, end - 128)]
    assert image.position == end


def test_without_counters_the_entered_term_is_cleared_so_old_frames_never_reappear(tmp_path):
    """A publication with no counters file cannot clean behind readers; it clears each term it enters."""
    from ramen.transport.scan import scan_messages

    term_length = 64 * 1024
    log = LogBuffer.create(tmp_path / "nc.logbuffer", LogBufferParams(term_length=term_length))
    publication = ExclusivePublication(log)
    message = b"z" * 1000
    for _ in range(4 * term_length // 1032 + 3):  # past three terms: back into partition 0
        result = publication.offer(message)
        if result == ADMIN_ACTION:
            result = publication.offer(message)
        assert result > 0
    # Partition 0 now holds only the current term: its frames all carry the newest term id.
    term_ids = {m.term_id for m in scan_messages(log) if m.term_id % 3 == 0}
    assert term_ids == {3}
    assert log.producer_position() == publication.position


def test_a_reader_that_reaches_a_term_before_its_writer_does_not_read_the_old_frames_there(tmp_path):
    """Terms filled exactly: the writer rotates only at its next offer, so the reader gets to the
    next partition first, where the frames of three terms ago still lie."""
    term_length = 64 * 1024
    log = LogBuffer.create(tmp_path / "exact.logbuffer", LogBufferParams(term_length=term_length, initial_term_id=9))
    publication = ExclusivePublication(log)
    image = Image(LogBuffer.open(log.path), join_position=0)
    payload = b"q" * (1024 - 32)  # 64 frames fill a term exactly
    for _ in range(3 * 64):
        result = publication.offer(payload)
        if result == ADMIN_ACTION:  # a full term rotates at the next offer
            result = publication.offer(payload)
        assert result > 0
    assert publication.position == 3 * term_length  # not rotated yet: partition 0 still holds term 9
    seen = []
    for _ in range(10):  # bounded: a reader fooled by old frames would go round forever
        image.poll(lambda buf, off, length, hdr: seen.append(hdr.term_id), 1000)
    assert len(seen) == 3 * 64 and set(seen) == {9, 10, 11}
    assert image.position == 3 * term_length
    # Once the writer enters term 12, the reader goes on with the new frames only.
    result = publication.offer(payload)
    if result == ADMIN_ACTION:
        result = publication.offer(payload)
    assert result > 0
    seen.clear()
    for _ in range(10):
        image.poll(lambda buf, off, length, hdr: seen.append(hdr.term_id), 1000)
    assert seen == [12]

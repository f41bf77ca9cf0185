"""ExclusivePublication.offer_rows: a 2-D uint8 array written as one message a row, as offer_batch would."""

import struct
import time

import numpy as np
import pytest

from ramen.transport import (BACK_PRESSURED, MAX_POSITION_EXCEEDED, CountersFile, ExclusivePublication,
                             FragmentAssembler, Image, LogBuffer, LogBufferParams)
from ramen.transport.position import int32, max_possible_position

TERM = 64 * 1024
TIMEOUT_S = 30
"""Safety bound for loops that wait on a reader: a test that needs it has failed."""


def make_rows(count: int, length: int, seed: int = 1) -> np.ndarray:
    """count rows of length bytes, each starting with its index so the order can be checked."""
    rows = np.random.default_rng(seed).integers(0, 256, size=(count, length), dtype=np.uint8)
    if length >= 4:
        rows[:, :4] = np.arange(count, dtype="<u4").view(np.uint8).reshape(count, 4)
    return rows


def read_messages(image: Image) -> list[tuple[bytes, int]]:
    out = []
    assembler = FragmentAssembler(lambda buf, offset, length, header: out.append((bytes(buf[offset:offset + length]),
                                                                                  header.position)))
    while image.poll(assembler.on_fragment, 256):
        pass
    return out


def terms_and_tails(log: LogBuffer) -> tuple[bytes, list[int], int]:
    return bytes(log.buffer[:3 * log.term_length]), [log.raw_tail(i) for i in range(3)], log.active_term_count


@pytest.mark.parametrize("length", [0, 1, 96, 4096])
def test_offer_rows_writes_what_offer_batch_writes_and_rotates_inside_it(tmp_path, length):
    params = LogBufferParams(term_length=TERM, mtu_length=8192, term_offset=TERM - 4096, session_id=3, stream_id=4)
    by_rows = LogBuffer.create(tmp_path / "rows.logbuffer", params)
    by_batch = LogBuffer.create(tmp_path / "batch.logbuffer", params)
    rows = make_rows(3 * TERM // (length + 64), length)

    result = ExclusivePublication(by_rows).offer_rows(rows)

    assert result == ExclusivePublication(by_batch).offer_batch([row.tobytes() for row in rows])
    assert result[0] == len(rows) and by_rows.active_term_count >= 1
    assert terms_and_tails(by_rows) == terms_and_tails(by_batch)


def test_offer_rows_reads_back_row_by_row_from_a_strided_array(tmp_path):
    log = LogBuffer.create(tmp_path / "strided.logbuffer", LogBufferParams(term_length=TERM))
    image = Image(log)
    publication = ExclusivePublication(log)
    rows = make_rows(50, 201)[:, ::2]  # not contiguous: every other byte of each row

    count, position = publication.offer_rows(rows)

    assert (count, position) == (50, 50 * 160)
    assert read_messages(image) == [(row.tobytes(), (i + 1) * 160) for i, row in enumerate(rows)]


def test_offer_rows_stops_below_the_limit_and_the_rest_goes_after_the_reader_moves(tmp_path):
    log = LogBuffer.create(tmp_path / "limit.logbuffer", LogBufferParams(term_length=TERM))
    counters = CountersFile.open(tmp_path / "cnc.dat")
    image = Image(log, counters, join_position=0)
    publication = ExclusivePublication(log, counters)
    rows = make_rows(1000, 128)  # 160-byte frames

    count, position = publication.offer_rows(rows)

    # Every row that starts below the limit (half a term ahead of the reader) is written.
    limit = publication.position_limit
    assert limit == TERM // 2
    assert count == -(-limit // 160) and position == count * 160
    assert publication.offer_rows(rows[count:]) == (0, BACK_PRESSURED)
    received = read_messages(image)
    written = count
    give_up = time.monotonic() + TIMEOUT_S
    while written < len(rows):
        assert time.monotonic() < give_up, f"gave up after {TIMEOUT_S} s with {written} rows written"
        count, position = publication.offer_rows(rows[written:])
        if count == 0:
            assert position == BACK_PRESSURED
        written += count
        received += read_messages(image)
    assert [message for message, _ in received] == [row.tobytes() for row in rows]
    assert log.active_term_count == 2


def test_offer_rows_block_stays_invisible_until_its_first_frame_commits(tmp_path):
    """While the rows are copied, the tail already covers the block and its first frame holds minus
    the whole block's length, so a reader waits at it."""
    log = LogBuffer.create(tmp_path / "commit.logbuffer", LogBufferParams(term_length=TERM))
    reader = Image(log)
    publication = ExclusivePublication(log)
    seen = []

    class WatchedRows(np.ndarray):
        def __getitem__(self, key):
            seen.append((struct.unpack_from("<i", log.terms[0], 0)[0], log.raw_tail(0),
                         reader.poll(lambda *fragment: None, 100)))
            return np.asarray(self)[key]

    assert publication.offer_rows(make_rows(10, 100).view(WatchedRows)) == (10, 10 * 160)
    assert seen == [(-10 * 160, 10 * 160, 0)]
    assert reader.poll(lambda *fragment: None, 100) == 10


def test_offer_rows_fragments_rows_above_the_mtu_payload(tmp_path):
    log = LogBuffer.create(tmp_path / "big.logbuffer", LogBufferParams(term_length=TERM, mtu_length=1408))
    image = Image(log)
    publication = ExclusivePublication(log)
    rows = make_rows(3, 3000)

    count, position = publication.offer_rows(rows)

    assert count == 3 and position == publication.position
    assert [message for message, _ in read_messages(image)] == [row.tobytes() for row in rows]


def test_offer_rows_of_nothing_writes_nothing(tmp_path):
    log = LogBuffer.create(tmp_path / "empty.logbuffer", LogBufferParams(term_length=TERM))
    publication = ExclusivePublication(log)
    publication.offer(b"x")
    assert publication.offer_rows(np.zeros((0, 10), dtype=np.uint8)) == (0, 64)


def test_offer_rows_past_the_largest_position_returns_max_position_exceeded(tmp_path):
    initial = -5
    log = LogBuffer.create(tmp_path / "end.logbuffer", LogBufferParams(
        term_length=TERM, initial_term_id=initial, term_id=int32(initial + 2**31 - 1), term_offset=TERM - 1024))
    publication = ExclusivePublication(log)

    assert publication.offer_rows(make_rows(100, 96)) == (8, max_possible_position(TERM))
    assert publication.offer_rows(make_rows(1, 96)) == (0, MAX_POSITION_EXCEEDED)


@pytest.mark.parametrize("rows", [[b"abc", b"def"], np.zeros(10, dtype=np.uint8), np.zeros((2, 10), dtype=np.int64)],
                         ids=["list", "1-D", "int64"])
def test_offer_rows_takes_only_a_2d_uint8_array(tmp_path, rows):
    publication = ExclusivePublication(LogBuffer.create(tmp_path / "bad.logbuffer", LogBufferParams(term_length=TERM)))
    with pytest.raises(ValueError, match="2-D uint8 array"):
        publication.offer_rows(rows)
    assert publication.position == 0

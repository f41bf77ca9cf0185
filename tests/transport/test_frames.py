"""Frames and log buffer files, byte for byte against Aeron's layout.

The expected offsets are written out here as Aeron documents them (DataHeaderFlyweight,
LogBufferDescriptor), not taken from ramen's constants, so a wrong constant cannot hide itself.
"""

import mmap
import os
import resource
import struct

import numpy as np
import pytest

from ramen.transport import logbuffer
from ramen.transport import (BufferClaim, CountersFile, ExclusivePublication, Image, LogBuffer, LogBufferError,
                             LogBufferParams)

TERM = 64 * 1024
INITIAL_TERM_ID = 7
SESSION_ID = 555
STREAM_ID = 1001
CORRELATION_ID = 4242
PARAMS = LogBufferParams(term_length=TERM, initial_term_id=INITIAL_TERM_ID, session_id=SESSION_ID,
                         stream_id=STREAM_ID, correlation_id=CORRELATION_ID)
LONG_MAX = 2**63 - 1


def align32(value: int) -> int:
    return (value + 31) // 32 * 32


def frame_at(buffer, offset: int) -> dict:
    """Decode a data frame header at Aeron's field offsets."""
    return {
        "frame_length": struct.unpack_from("<i", buffer, offset + 0)[0],
        "version": buffer[offset + 4],
        "flags": buffer[offset + 5],
        "type": struct.unpack_from("<H", buffer, offset + 6)[0],
        "term_offset": struct.unpack_from("<i", buffer, offset + 8)[0],
        "session_id": struct.unpack_from("<i", buffer, offset + 12)[0],
        "stream_id": struct.unpack_from("<i", buffer, offset + 16)[0],
        "term_id": struct.unpack_from("<i", buffer, offset + 20)[0],
        "reserved_value": struct.unpack_from("<q", buffer, offset + 24)[0],
    }


def data_frame(length: int, term_offset: int, term_id: int = INITIAL_TERM_ID, reserved_value: int = 0) -> dict:
    return {"frame_length": length + 32, "version": 0, "flags": 0xC0, "type": 1, "term_offset": term_offset,
            "session_id": SESSION_ID, "stream_id": STREAM_ID, "term_id": term_id, "reserved_value": reserved_value}


def read_all(image: Image) -> list[tuple[bytes, int]]:
    """(payload, position after the frame) of every committed fragment."""
    out = []
    image.poll(lambda buf, offset, length, header: out.append((bytes(buf[offset:offset + length]), header.position)),
               1 << 20)
    return out


def file_metadata(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()[-4096:]


@pytest.fixture
def log(tmp_path):
    return LogBuffer.create(tmp_path / "frames.logbuffer", PARAMS)


# -- data frames ---------------------------------------------------------------------------------

def test_offer_of_n_bytes_writes_a_data_frame_of_n_plus_32_with_aeron_header(log):
    publication = ExclusivePublication(log)
    payload = bytes(range(100))

    position = publication.offer(payload, reserved_value=0x1122334455667788)

    term = log.terms[0]
    assert frame_at(term, 0) == data_frame(100, 0, reserved_value=0x1122334455667788)
    assert bytes(term[32:132]) == payload
    assert position == align32(132) == 160


def test_second_frame_starts_at_the_aligned_end_of_the_first_and_carries_its_term_offset(log):
    publication = ExclusivePublication(log)
    publication.offer(b"x" * 100)

    position = publication.offer(b"y" * 7)

    assert frame_at(log.terms[0], 160) == data_frame(7, 160)
    assert position == 160 + align32(39)


def test_frames_are_32_byte_aligned_and_offer_returns_the_end_of_the_aligned_frame(log):
    publication = ExclusivePublication(log)
    offset = 0
    for length in range(0, 200, 3):
        position = publication.offer(bytes([length % 251]) * length)

        assert offset % 32 == 0
        assert frame_at(log.terms[0], offset) == data_frame(length, offset)
        assert position == offset + align32(length + 32)
        offset = position
    assert [len(payload) for payload, _ in read_all(Image(log, join_position=0))] == list(range(0, 200, 3))


def test_zero_length_message_is_a_32_byte_frame(log):
    publication = ExclusivePublication(log)

    position = publication.offer(b"")

    assert position == 32
    assert frame_at(log.terms[0], 0) == data_frame(0, 0)
    assert read_all(Image(log, join_position=0)) == [(b"", 32)]


def test_offer_of_a_slice_writes_only_the_slice(log):
    publication = ExclusivePublication(log)

    position = publication.offer(b"0123456789", offset=3, length=4)

    assert position == 64
    assert read_all(Image(log, join_position=0)) == [(b"3456", 64)]


def test_fragment_handler_header_reports_every_field_of_the_frame(log):
    publication = ExclusivePublication(log)
    publication.offer(b"a" * 10)
    end = publication.offer(b"b" * 40, reserved_value=-3)
    seen = []

    def on_fragment(buf, offset, length, header):
        seen.append((header.frame_length, header.flags, header.type, header.term_offset, header.session_id,
                     header.stream_id, header.term_id, header.reserved_value, header.position))

    Image(log, join_position=0).poll(on_fragment, 10)

    assert seen == [(42, 0xC0, 1, 0, SESSION_ID, STREAM_ID, INITIAL_TERM_ID, 0, 64),
                    (72, 0xC0, 1, 64, SESSION_ID, STREAM_ID, INITIAL_TERM_ID, -3, end)]


def test_tail_counter_holds_term_id_and_offset_after_each_offer(log):
    publication = ExclusivePublication(log)
    publication.offer(b"z" * 50)

    raw = struct.unpack_from("<q", file_metadata(log.path), 0)[0]

    assert raw == (INITIAL_TERM_ID << 32) | 96
    assert log.producer_position() == publication.position == 96


# -- zero-copy claims ----------------------------------------------------------------------------

def test_try_claim_writes_in_place_and_commit_makes_it_visible(log):
    publication = ExclusivePublication(log)
    claim = BufferClaim()
    image = Image(log, join_position=0)

    position = publication.try_claim(50, claim)

    assert position == align32(82) == 96
    assert frame_at(log.terms[0], 0)["frame_length"] == -82  # claimed, not committed
    claim.buffer[:] = b"c" * 50
    assert read_all(image) == []  # a reader stops at a negative length
    claim.commit()
    assert frame_at(log.terms[0], 0) == data_frame(50, 0)
    assert read_all(image) == [(b"c" * 50, 96)]


def test_aborted_claim_becomes_a_pad_frame_that_readers_skip(log):
    publication = ExclusivePublication(log)
    claim = BufferClaim()
    publication.try_claim(50, claim)

    claim.abort()
    position = publication.offer(b"after")

    pad = frame_at(log.terms[0], 0)
    assert pad["type"] == 0 and pad["frame_length"] == 82 and pad["term_offset"] == 0
    assert position == 96 + 64
    assert read_all(Image(log, join_position=0)) == [(b"after", 160)]


def test_claim_larger_than_the_mtu_payload_is_refused(log):
    publication = ExclusivePublication(log)
    with pytest.raises(ValueError, match="1377.*1376"):
        publication.try_claim(1377, BufferClaim())
    assert publication.position == 0


# -- metadata ------------------------------------------------------------------------------------

def test_new_log_buffer_metadata_fields_sit_at_aeron_offsets(log):
    meta = file_metadata(log.path)

    tails = struct.unpack_from("<qqq", meta, 0)
    # Partition 0 is active at the initial term; the others are one rotation behind (Aeron's
    # initialisePositionCounters), so the first rotations find the term ids they expect.
    assert tails == (INITIAL_TERM_ID << 32, (INITIAL_TERM_ID - 2) << 32, (INITIAL_TERM_ID - 1) << 32)
    assert struct.unpack_from("<i", meta, 24)[0] == 0  # activeTermCount
    assert struct.unpack_from("<q", meta, 128)[0] == LONG_MAX  # endOfStreamPosition
    assert struct.unpack_from("<i", meta, 136)[0] == 0  # isConnected
    assert struct.unpack_from("<q", meta, 256)[0] == CORRELATION_ID
    assert struct.unpack_from("<i", meta, 264)[0] == INITIAL_TERM_ID
    assert struct.unpack_from("<i", meta, 268)[0] == 32  # defaultFrameHeaderLength
    assert struct.unpack_from("<i", meta, 272)[0] == 1408  # mtuLength
    assert struct.unpack_from("<i", meta, 276)[0] == TERM
    assert struct.unpack_from("<i", meta, 280)[0] == 4096  # pageSize
    # Aeron's createDefaultHeader(sessionId, streamId, initialTermId).
    assert frame_at(meta, 320) == {"frame_length": 0, "version": 0, "flags": 0xC0, "type": 1, "term_offset": 0,
                                   "session_id": SESSION_ID, "stream_id": STREAM_ID, "term_id": INITIAL_TERM_ID,
                                   "reserved_value": 0}


def test_publication_with_a_subscriber_sets_is_connected_and_close_sets_end_of_stream(log, tmp_path):
    counters = CountersFile.open(tmp_path / "cnc.dat")
    image = Image(log, counters)
    publication = ExclusivePublication(log, counters)

    assert publication.is_connected
    assert struct.unpack_from("<i", file_metadata(log.path), 136)[0] == 1
    end = publication.offer(b"last")
    publication.close()

    assert struct.unpack_from("<q", file_metadata(log.path), 128)[0] == end
    assert read_all(image) == [(b"last", end)]
    assert image.is_end_of_stream


def test_reopened_log_buffer_reads_back_the_created_fields(log):
    reopened = LogBuffer.open(log.path)

    assert (reopened.term_length, reopened.initial_term_id, reopened.mtu_length, reopened.page_size,
            reopened.correlation_id, reopened.session_id, reopened.stream_id) == \
        (TERM, INITIAL_TERM_ID, 1408, 4096, CORRELATION_ID, SESSION_ID, STREAM_ID)
    reopened.close()


@pytest.mark.parametrize("term_length, page_size", [(64 * 1024, 4096), (128 * 1024, 4096), (64 * 1024, 65536)])
def test_log_file_length_is_three_terms_plus_metadata_aligned_to_the_page(tmp_path, term_length, page_size):
    path = tmp_path / "sized.logbuffer"
    LogBuffer.create(path, LogBufferParams(term_length=term_length, page_size=page_size)).close()

    expected = (3 * term_length + 4096 + page_size - 1) // page_size * page_size
    assert os.path.getsize(path) == expected
    # The metadata is the file's last 4096 bytes, wherever the page alignment leaves it.
    assert struct.unpack_from("<ii", file_metadata(path), 276) == (term_length, page_size)
    reopened = LogBuffer.open(path)
    assert (reopened.term_length, reopened.page_size) == (term_length, page_size)
    reopened.close()


# -- bad files -----------------------------------------------------------------------------------

def test_creating_a_log_whose_term_length_is_not_a_power_of_two_is_refused(tmp_path):
    with pytest.raises(LogBufferError, match="term length 100000 is not a power of two"):
        LogBuffer.create(tmp_path / "bad.logbuffer", LogBufferParams(term_length=100000))


def test_creating_a_log_over_an_existing_file_is_refused(log):
    with pytest.raises(LogBufferError) as error:
        LogBuffer.create(log.path, PARAMS)
    assert str(log.path) in str(error.value) and "already exists" in str(error.value)


def test_a_log_appears_at_its_path_only_once_its_metadata_is_written(tmp_path, monkeypatch):
    # A reader that maps a log while it is being created must never see a zero term length.
    path = tmp_path / "new.logbuffer"
    initialise = logbuffer._initialise_metadata
    seen = []

    def watched(*args):
        seen.append(sorted(tmp_path.iterdir()))
        initialise(*args)
    monkeypatch.setattr(logbuffer, "_initialise_metadata", watched)

    LogBuffer.create(path, PARAMS).close()

    assert seen == [[]]
    assert LogBuffer.open(path, writable=False).term_length == TERM


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed", "hidden name"])
def test_a_log_whose_creation_fails_leaves_no_file(tmp_path, monkeypatch, unnamed):
    if not unnamed:
        open_ = os.open

        def no_tmpfile(path, flags, *args):
            if flags & os.O_TMPFILE == os.O_TMPFILE:
                raise OSError(95, "Operation not supported")
            return open_(path, flags, *args)
        monkeypatch.setattr(os, "open", no_tmpfile)

    def fail(*args):
        raise RuntimeError("killed while creating")
    initialise = logbuffer._initialise_metadata
    monkeypatch.setattr(logbuffer, "_initialise_metadata", fail)
    with pytest.raises(RuntimeError):
        LogBuffer.create(tmp_path / "new.logbuffer", PARAMS)
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setattr(logbuffer, "_initialise_metadata", initialise)
    LogBuffer.create(tmp_path / "new.logbuffer", PARAMS).close()
    assert [p.name for p in tmp_path.iterdir()] == ["new.logbuffer"]


def test_opening_a_truncated_log_names_the_file_and_says_it_is_too_short(log):
    path = log.path
    log.close()
    os.truncate(path, 100_000)

    with pytest.raises(LogBufferError) as error:
        LogBuffer.open(path)

    message = str(error.value)
    assert str(path) in message
    assert "100000 bytes is too short for a log buffer" in message and "truncated" in message


def test_opening_a_log_truncated_past_its_metadata_says_it_is_damaged(tmp_path):
    path = tmp_path / "big.logbuffer"
    LogBuffer.create(path, LogBufferParams(term_length=128 * 1024)).close()
    os.truncate(path, 3 * 64 * 1024 + 4096)  # long enough for some log, but the metadata is gone

    with pytest.raises(LogBufferError) as error:
        LogBuffer.open(path)

    message = str(error.value)
    assert str(path) in message
    assert "term length 0 is outside" in message and "not a log buffer, or damaged" in message


def test_opening_a_log_whose_term_length_is_not_a_power_of_two_names_the_problem(log):
    path = log.path
    log.close()
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 4096 + 276)
        f.write(struct.pack("<i", 100_000))

    with pytest.raises(LogBufferError) as error:
        LogBuffer.open(path)

    message = str(error.value)
    assert str(path) in message and "term length 100000 is not a power of two" in message


def test_opening_a_file_of_the_wrong_length_for_its_term_length_names_both_lengths(tmp_path):
    source = tmp_path / "source.logbuffer"
    LogBuffer.create(source, LogBufferParams(term_length=128 * 1024)).close()
    data = source.read_bytes()
    path = tmp_path / "short.logbuffer"
    path.write_bytes(data[:-8192] + data[-4096:])  # one page of the terms lost, metadata intact

    with pytest.raises(LogBufferError) as error:
        LogBuffer.open(path)

    message = str(error.value)
    assert str(path) in message
    assert "file is 393216 bytes, but a log of term length 131072 and page size 4096 is 397312 bytes" in message


def test_opening_a_missing_log_names_the_file(tmp_path):
    path = tmp_path / "missing.logbuffer"
    with pytest.raises(LogBufferError, match="no such log buffer file") as error:
        LogBuffer.open(path)
    assert str(path) in str(error.value)


def test_offer_frames_forwards_recorded_messages_with_this_logs_ids_and_offsets(tmp_path):
    """A replayer forwards recorded frames as they lie: the payloads, lengths, flags and reserved
    values are kept; term offset, session, stream and term id become the replay log's."""
    from ramen.transport.scan import scan_messages
    from ramen.transport.status import ADMIN_ACTION

    source = LogBuffer.create(tmp_path / "src.logbuffer", LogBufferParams(term_length=TERM, session_id=1,
                                                                          stream_id=2, initial_term_id=3))
    writer = ExclusivePublication(source)
    payloads = [bytes([i]) * (100 + i * 1000) for i in range(8)]  # the later ones fragmented
    starts = []
    for i, payload in enumerate(payloads):
        starts.append(writer.position)
        assert writer.offer(payload, reserved_value=1000 + i) > 0
    end = writer.position
    target = LogBuffer.create(tmp_path / "dst.logbuffer", PARAMS)
    replay = ExclusivePublication(target)
    assert replay.offer(b"x" * 40) > 0  # the replay log's frames start elsewhere than the recording's

    forwarded = payloads[3:]  # a block of several messages, from the middle of the recording
    block_start = starts[3]
    assert replay.offer_frames(source.terms[0], block_start, end - block_start) == 96 + end - block_start

    assert [m.payload for m in scan_messages(target)] == [b"x" * 40, *forwarded]
    at = 96
    while at < 96 + end - block_start:
        got, recorded = frame_at(target.terms[0], at), frame_at(source.terms[0], at - 96 + block_start)
        assert (got["term_offset"], got["session_id"], got["stream_id"], got["term_id"]) == \
            (at, SESSION_ID, STREAM_ID, INITIAL_TERM_ID)
        assert (got["frame_length"], got["flags"], got["type"], got["reserved_value"]) == \
            (recorded["frame_length"], recorded["flags"], recorded["type"], recorded["reserved_value"])
        at += align32(got["frame_length"])

    # A block past the term's end pads the term, and goes into the next one on the retry.
    assert replay.offer_frames(source.terms[0], 0, end) == replay.position < TERM < replay.position + end
    assert replay.offer_frames(source.terms[0], 0, end) == ADMIN_ACTION
    assert replay.offer_frames(source.terms[0], 0, end) == TERM + end
    assert frame_at(target.terms[1], 0)["term_id"] == INITIAL_TERM_ID + 1
    assert [m.payload for m in scan_messages(target)][-2 * len(payloads):] == payloads * 2

    with pytest.raises(ValueError, match="does not fit a term"):
        replay.offer_frames(source.terms[0], 0, TERM * 2)
    with pytest.raises(ValueError, match="frame of length"):
        replay.offer_frames(bytes(64), 0, 64)  # no frame there


# -- pre-touch -----------------------------------------------------------------------------------

def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _faults_writing_every_page(log: LogBuffer) -> int:
    pages = np.frombuffer(log.buffer, dtype=np.uint8)[::mmap.PAGESIZE]
    before = _minor_faults()
    pages[:] = 1
    return _minor_faults() - before


def _faults_reading_every_page(log: LogBuffer) -> int:
    pages = np.frombuffer(log.buffer, dtype=np.uint8)[::mmap.PAGESIZE]
    before = _minor_faults()
    int(pages.sum())
    return _minor_faults() - before


def test_a_pre_touched_log_takes_its_page_faults_at_creation_not_on_its_first_lap(tmp_path):
    params = LogBufferParams(term_length=1024 * 1024)
    pages = os.path.getsize(LogBuffer.create(tmp_path / "probe.logbuffer", params).path) // mmap.PAGESIZE

    sparse = LogBuffer.create(tmp_path / "sparse.logbuffer", params)
    touched = LogBuffer.create(tmp_path / "touched.logbuffer", params, pre_touch=True)

    assert _faults_writing_every_page(sparse) >= pages // 2
    assert _faults_writing_every_page(touched) < pages // 20
    sparse.close()
    touched.close()


def test_a_reader_opening_a_log_pre_touched_maps_every_page_without_changing_it(tmp_path):
    params = LogBufferParams(term_length=1024 * 1024)
    written = LogBuffer.create(tmp_path / "shared.logbuffer", params)
    pages = np.frombuffer(written.buffer, dtype=np.uint8)[::mmap.PAGESIZE]
    pages[:-1] = np.arange(len(pages) - 1) % 251 + 1  # every page but the metadata's holds data
    expected = bytes(written.buffer)
    del pages

    reader = LogBuffer.open(written.path, writable=False, pre_touch=True)

    assert _faults_reading_every_page(reader) < len(expected) // mmap.PAGESIZE // 64  # a read fault maps 16
    assert bytes(reader.buffer) == expected
    reader.close()
    written.close()

"""Segment files: names, Aeron's base-position rule, the writer (as Aeron's RecordingWriter), the reader,
and finding where an unclean recording ends."""

import base64
import struct

import pytest

from ramen.archive import checksum
from ramen.archive.catalog import NULL_POSITION, Catalog
from ramen.archive.segment import (SegmentError, SegmentReader, SegmentWriter, TornFrameError,
                                   check_segment_file_length, find_stop_position, parse_segment_file_name,
                                   segment_file_base_position, segment_file_name)
from ramen.archive.verify import verify_archive
from ramen.transport import LogBufferParams, frame
from tests.archive.helpers import (ARCHIVES, ramen, ramen_json, read_archive_manifest, record, vector_params,
                                   vector_payloads, writable_copy)

TERM = 65536
SESSION, STREAM = 31, 32


def make_term(frames, *, term_id=5, start=0, term_length=TERM, padding_byte=0):
    """A term buffer holding frames [(type, payload length)] from offset `start`; payload bytes are
    non-zero, and the alignment padding after each payload is padding_byte."""
    term = bytearray(term_length)
    offset = start
    for i, (frame_type, payload_length) in enumerate(frames):
        length = frame.HEADER_LENGTH + payload_length
        frame.write_header(term, offset, length, frame.UNFRAGMENTED, frame_type, offset, SESSION, STREAM, term_id)
        body = offset + frame.HEADER_LENGTH
        term[body:body + payload_length] = bytes((i + j) % 255 + 1 for j in range(payload_length))
        term[offset + length:offset + frame.align(length)] = bytes([padding_byte]) * (frame.align(length) - length)
        offset += frame.align(length)
    return term, offset


def test_segment_files_are_named_by_recording_and_base_position():
    assert segment_file_name(1, 196608) == "1-196608.rec"
    assert parse_segment_file_name("1-196608.rec") == (1, 196608)
    for not_a_segment in ("1-196608.rec.del", "x-1.rec", "1-.rec", "archive.catalog", "-1-0.rec"):
        assert parse_segment_file_name(not_a_segment) is None


def test_base_positions_count_from_the_term_a_recording_started_in():
    # The vectors' recording 1 starts at term offset 4096 of term 3: its first file is 1-196608.rec.
    assert segment_file_base_position(200704, 200704, TERM, 262144) == 196608
    assert segment_file_base_position(200704, 196608 + 262143, TERM, 262144) == 196608
    assert segment_file_base_position(200704, 196608 + 262144, TERM, 262144) == 458752
    assert segment_file_base_position(0, 1091008, TERM, 262144) == 1048576
    assert segment_file_base_position(0, 1048576, TERM, 262144) == 1048576


@pytest.mark.parametrize("segment_length, term_length, problem", [
    (100000, TERM, "not a power of two"), (32768, TERM, "not a power of two in 65536"),
    (2 << 30, TERM, "not a power of two in"), (TERM, 2 * TERM, "shorter than the term length"),
])
def test_segment_length_must_be_a_power_of_two_holding_whole_terms(segment_length, term_length, problem):
    with pytest.raises(SegmentError, match=problem):
        check_segment_file_length(segment_length, term_length)
    check_segment_file_length(1 << 30, 1 << 30)


@pytest.mark.parametrize("name", ARCHIVES)
def test_the_writer_reproduces_aerons_segment_files_byte_for_byte(aeron_vectors, tmp_path, name):
    """Same frames in, same files out: rollover across five segments, a recording starting mid-term,
    PAD frames header-only, and (in archive_crc32) CRC-32 checksums in the sessionId fields."""
    vectors = aeron_vectors / "archives" / name
    manifest = read_archive_manifest(aeron_vectors / "archives" / f"{name}.manifest.csv")
    frame_checksum = checksum.get("crc32") if name == "archive_crc32" else None
    with Catalog.create(tmp_path / "archive") as catalog:
        for recording_id in sorted(manifest.recordings):
            recorded = record(tmp_path / "archive", catalog, vector_payloads(manifest, recording_id),
                              params=vector_params(manifest, recording_id), checksum=frame_checksum,
                              work_dir=tmp_path)
            assert recorded.stop_position == int(manifest.recordings[recording_id]["stop"])
    ours = sorted(p.name for p in (tmp_path / "archive").glob("*.rec"))
    assert ours == sorted(p.name for p in vectors.glob("*.rec"))
    for segment in ours:
        assert (tmp_path / "archive" / segment).read_bytes() == (vectors / segment).read_bytes(), segment


def test_the_writer_rolls_over_to_a_new_file_at_each_segment_end(tmp_path):
    writer = SegmentWriter(tmp_path, 3, 0, TERM, TERM)
    for term_id in (5, 6):
        term, end = make_term([(frame.HDR_TYPE_DATA, 32736)] * 2, term_id=term_id)
        assert end == TERM
        writer.on_block(term, 0, TERM, SESSION, term_id)
    writer.close()
    assert writer.position == 2 * TERM
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3-0.rec", "3-131072.rec", "3-65536.rec"]
    # The next file is created as soon as the last one is full, at full (sparse) length.
    assert (tmp_path / "3-131072.rec").read_bytes() == bytes(TERM)
    second = (tmp_path / "3-65536.rec").read_bytes()
    assert struct.unpack_from("<iiiii", second, 8)[::3] == (0, 6)  # termOffset 0 of term 6


def test_pad_frames_are_stored_header_only_and_still_advance_the_position(tmp_path):
    term, end = make_term([(frame.HDR_TYPE_DATA, 100)])
    pad_length = TERM - end
    frame.write_header(term, end, pad_length, frame.UNFRAGMENTED, frame.HDR_TYPE_PAD, end, SESSION, STREAM, 5)
    term[end + 32:] = b"\xee" * (pad_length - 32)  # whatever the term held there: never written out
    before = bytes(term)

    with SegmentWriter(tmp_path, 0, 0, TERM, 2 * TERM) as writer:
        writer.on_block(term, 0, TERM, SESSION, 5)
        assert writer.position == TERM

    data = (tmp_path / "0-0.rec").read_bytes()
    assert bytes(term) == before
    assert data[:end + 32] == before[:end + 32]
    assert data[end + 32:TERM] == bytes(pad_length - 32)


def test_checksums_of_payload_and_padding_go_in_the_session_id_and_the_term_is_untouched(tmp_path):
    crc = checksum.get("crc32c")
    payloads = [0, 1, 33, 100, 1376]
    term, end = make_term([(frame.HDR_TYPE_DATA, n) for n in payloads], start=4096, padding_byte=0x5A)
    before = bytes(term)

    with SegmentWriter(tmp_path, 0, 4096, TERM, TERM * 4, checksum=crc) as writer:
        writer.on_block(memoryview(term), 4096, end - 4096, SESSION, 5)

    assert bytes(term) == before
    data = (tmp_path / "0-0.rec").read_bytes()
    assert data[:4096] == bytes(4096)
    offset = 4096
    for n in payloads:
        aligned = frame.align(32 + n)
        expected = crc.compute(before[offset + 32:offset + aligned])  # the padding (0x5A bytes) included
        assert struct.unpack_from("<i", data, offset + 12)[0] == expected
        assert data[offset:offset + 12] == before[offset:offset + 12]
        assert data[offset + 16:offset + aligned] == before[offset + 16:offset + aligned]
        offset += aligned


def test_the_writer_refuses_a_block_that_does_not_continue_the_recording(tmp_path):
    term, end = make_term([(frame.HDR_TYPE_DATA, 100)] * 3)
    with SegmentWriter(tmp_path, 0, 0, TERM, TERM) as writer:
        writer.on_block(term, 0, 160, SESSION, 5)
        with pytest.raises(ValueError, match="block starts at term offset 320 but the recording is at position 160"):
            writer.on_block(term, 320, 160, SESSION, 5)
        with pytest.raises(ValueError, match="block must hold whole committed frames"):
            writer.on_block(term, 160, 64, SESSION, 5)


def test_a_recording_we_write_reads_back_the_same_and_passes_verify(tmp_path):
    archive = tmp_path / "archive"
    crc = checksum.get("crc32c")
    payloads = [bytes([i % 256]) * (i * 97 % 5000) for i in range(600)]  # up to 5000 bytes: fragmented
    with Catalog.create(archive, checksum=crc) as catalog:
        recorded = record(archive, catalog, payloads, checksum=crc, work_dir=tmp_path, segment_length=131072,
                          params=LogBufferParams(term_length=TERM, initial_term_id=-3, term_id=-2, term_offset=512,
                                                 session_id=77, stream_id=88))
        descriptor = catalog.get(recorded.recording_id)

    assert verify_archive(archive, checksum=crc) == []
    assert ramen("archive", "verify", archive, "--checksum", "crc32c").returncode == 0
    [described] = ramen_json("archive", "describe", archive, "--json")
    assert described == descriptor.to_aeron_dict()
    assert (described["startPosition"], described["stopPosition"]) == (TERM + 512, recorded.stop_position)
    dumped = ramen_json("archive", "dump", archive, recorded.recording_id, "--json")
    assert [(m["position"], m["length"]) for m in dumped] == [(p, len(b)) for b, p in recorded.messages]
    assert [base64.b64decode(m["payload_b64"]) for m in dumped] == payloads
    assert all((m["session_id"], m["stream_id"]) == (77, 88) for m in dumped)
    with SegmentReader.for_recording(archive, descriptor) as reader:
        frames = list(reader.frames())
    assert frames[0].position == TERM + 512 and frames[-1].end_position == recorded.stop_position
    assert all(f.term_offset == f.position % TERM and f.term_id == -3 + f.position // TERM for f in frames)


def test_the_reader_walks_frames_across_segment_files_between_two_positions(aeron_vectors):
    archive = aeron_vectors / "archives" / "archive_plain"
    with Catalog.open(archive) as catalog:
        descriptor = catalog.get(0)
    with SegmentReader.for_recording(archive, descriptor) as reader:
        everything = [(f.position, f.end_position) for f in reader.frames()]
        start, end = everything[300][0], everything[1000][0]
        some = [(f.position, f.end_position) for f in reader.frames(start, end)]
    assert everything[-1][1] == descriptor.stop_position
    assert some == everything[300:1000]
    assert some[0][0] < 262144 < some[-1][1]
    assert all(a[1] == b[0] for a, b in zip(everything, everything[1:]))


def test_the_reader_copies_bytes_but_never_past_the_end_of_a_term(aeron_vectors):
    archive = aeron_vectors / "archives" / "archive_plain"
    with Catalog.open(archive) as catalog:
        descriptor = catalog.get(0)
    buffer = bytearray(1 << 20)
    with SegmentReader.for_recording(archive, descriptor) as reader:
        assert reader.read(TERM - 96, buffer) == 96
        assert reader.read(TERM, buffer, limit_position=TERM + 64) == 64
    segment = (archive / "0-0.rec").read_bytes()
    assert buffer[:64] == segment[TERM:TERM + 64]


def test_the_reader_names_a_missing_segment_file(aeron_vectors, tmp_path):
    archive = writable_copy(aeron_vectors / "archives" / "archive_plain", tmp_path / "archive")
    (archive / "0-262144.rec").unlink()
    with Catalog.open(archive) as catalog:
        descriptor = catalog.get(0)
    with SegmentReader.for_recording(archive, descriptor) as reader:
        with pytest.raises(SegmentError, match=r"0-262144.rec offset 0: missing segment file of recording 0 .*position 262144"):
            list(reader.frames())


def test_the_end_of_a_recording_is_found_by_walking_its_last_segment(aeron_vectors):
    archive = aeron_vectors / "archives" / "archive_plain"
    assert find_stop_position(archive, 0, 0, TERM, 262144) == 1091008
    assert find_stop_position(archive, 1, 200704, TERM, 262144) == 365216
    assert find_stop_position(archive, 9, 4096, TERM, 262144) == 4096  # no files: nothing was recorded


def _write_straddling_recording(tmp_path, *, zero_payload=False, crc=None):
    """Frames up to 4064, then one of 2048 bytes across the page boundary at 4096."""
    term, end = make_term([(frame.HDR_TYPE_DATA, 4032 - 32)] + [(frame.HDR_TYPE_DATA, 2016)])
    assert end == 4032 + 2048
    if zero_payload:
        term[4032 + 32:end] = bytes(end - 4032 - 32)
    with SegmentWriter(tmp_path, 0, 0, TERM, TERM, checksum=crc) as writer:
        writer.on_block(term, 0, end, SESSION, 5)
    return tmp_path / "0-0.rec", 4032, end


def test_a_torn_last_frame_across_a_page_is_refused_or_truncated_on_request(tmp_path):
    path, last, end = _write_straddling_recording(tmp_path)
    assert find_stop_position(tmp_path, 0, 0, TERM, TERM) == end
    with open(path, "r+b") as f:  # the page after the boundary never reached the disk
        f.seek(4096)
        f.write(bytes(end - 4096))

    with pytest.raises(TornFrameError, match="0-0.rec: the last frame, at position 4032, straddles a page"):
        find_stop_position(tmp_path, 0, 0, TERM, TERM)
    assert find_stop_position(tmp_path, 0, 0, TERM, TERM, on_torn=lambda p: False) == end

    asked = []
    assert find_stop_position(tmp_path, 0, 0, TERM, TERM, on_torn=lambda p: asked.append(p) or True) == last
    assert asked == [path]
    data = path.read_bytes()
    assert len(data) == TERM and data[last:] == bytes(TERM - last)


def test_a_straddling_frame_whose_checksum_matches_is_whole_even_if_its_later_page_is_zeros(tmp_path):
    crc = checksum.get("crc32")
    (tmp_path / "with").mkdir()
    (tmp_path / "without").mkdir()
    _, _, end = _write_straddling_recording(tmp_path / "with", zero_payload=True, crc=crc)
    assert find_stop_position(tmp_path / "with", 0, 0, TERM, TERM, checksum=crc) == end
    _write_straddling_recording(tmp_path / "without", zero_payload=True)
    with pytest.raises(TornFrameError):  # Aeron's rule cannot tell zeros written from zeros lost
        find_stop_position(tmp_path / "without", 0, 0, TERM, TERM)


def test_a_pad_frame_at_the_end_is_never_taken_for_a_torn_frame(tmp_path):
    term, end = make_term([(frame.HDR_TYPE_DATA, 4000)])
    frame.write_header(term, end, TERM - end, frame.UNFRAGMENTED, frame.HDR_TYPE_PAD, end, SESSION, STREAM, 5)
    with SegmentWriter(tmp_path, 0, 0, TERM, 2 * TERM) as writer:
        writer.on_block(term, 0, TERM, SESSION, 5)
    assert find_stop_position(tmp_path, 0, 0, TERM, 2 * TERM) == TERM


def test_verify_reports_a_torn_end_of_a_recording_without_stop_position(tmp_path):
    path, _, end = _write_straddling_recording(tmp_path)
    with Catalog.create(tmp_path) as catalog:
        catalog.add_recording(start_position=0, initial_term_id=5, segment_file_length=TERM, term_buffer_length=TERM,
                              mtu_length=8192, session_id=SESSION, stream_id=STREAM, stripped_channel="aeron:ipc",
                              original_channel="aeron:ipc", source_identity="aeron:ipc")
        assert catalog.get(0).stop_position == NULL_POSITION
    assert verify_archive(tmp_path) == []
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(bytes(end - 4096))
    [problem] = verify_archive(tmp_path)
    assert problem.startswith("recording 0: ") and "position 4032, straddles a page boundary" in problem

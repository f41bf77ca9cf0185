"""archive.catalog: Aeron's layout byte for byte, updates in place, growth, checksums, damaged files."""

import random
import struct
import zlib

import crc32c
import pytest

from ramen.archive import checksum
from ramen.archive.catalog import (CATALOG_FILE_NAME, DEFAULT_CAPACITY, NULL_POSITION, NULL_TIMESTAMP, Catalog,
                                   CatalogError, RecordingDescriptor, RecordingState, UnknownRecordingError)
from ramen.archive.errors import ArchiveError
from ramen.transport import LogBufferParams
from tests.archive.helpers import ARCHIVES, record

FIELDS = dict(start_position=4096, initial_term_id=-7, segment_file_length=1 << 20, term_buffer_length=1 << 16,
              mtu_length=1408, session_id=-12345, stream_id=42, stripped_channel="aeron:udp?endpoint=localhost:40123",
              original_channel="aeron:udp?endpoint=localhost:40123|term-length=64k", source_identity="127.0.0.1:5555")


def add(catalog: Catalog, **overrides) -> int:
    return catalog.add_recording(**{**FIELDS, **overrides})


def signed(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


def test_checksums_are_signed_crcs_selected_by_name():
    data = b"123456789"
    assert checksum.get("crc32").compute(data) == signed(zlib.crc32(data)) == signed(0xCBF43926)
    assert checksum.get("crc32c").compute(data) == signed(crc32c.crc32c(data)) == signed(0xE3069283)
    assert checksum.get("CRC-32C") is checksum.get("crc32c")
    assert checksum.optional(None) is None
    with pytest.raises(ValueError, match="unknown checksum 'md5': choose one of crc32, crc32c"):
        checksum.get("md5")


@pytest.mark.parametrize("name", ARCHIVES)
def test_a_catalog_written_like_aerons_is_byte_identical_to_aerons(aeron_vectors, tmp_path, name):
    """Same recordings, same bytes: header, layout, alignment and (CRC-32) descriptor checksums."""
    aerons = aeron_vectors / "archives" / name
    with Catalog.open(aerons) as theirs:
        descriptors = theirs.descriptors()
    ours_checksum = checksum.get("crc32") if name == "archive_crc32" else None
    with Catalog.create(tmp_path, checksum=ours_checksum) as ours:
        for d in descriptors:
            recording_id = ours.add_recording(
                start_position=d.start_position, initial_term_id=d.initial_term_id,
                segment_file_length=d.segment_file_length, term_buffer_length=d.term_buffer_length,
                mtu_length=d.mtu_length, session_id=d.session_id, stream_id=d.stream_id,
                stripped_channel=d.stripped_channel, original_channel=d.original_channel,
                source_identity=d.source_identity, start_timestamp=d.start_timestamp)
            ours.recording_stopped(recording_id, d.stop_position, d.stop_timestamp)
        assert ours.descriptors() == descriptors
        assert [d.checksum for d in ours.descriptors()] == [d.checksum for d in descriptors]
    assert (tmp_path / CATALOG_FILE_NAME).read_bytes() == (aerons / CATALOG_FILE_NAME).read_bytes()


def test_aerons_descriptor_checksum_covers_the_descriptor_and_its_padding(aeron_vectors):
    data = (aeron_vectors / "archives" / "archive_crc32" / CATALOG_FILE_NAME).read_bytes()
    for entry in (32, 224):  # record 0 at 32; record 1 after its 192 aligned bytes
        length, state, stored = struct.unpack_from("<iii", data, entry)
        assert state == RecordingState.VALID
        assert (32 + length) % 64 == 0
        assert stored == signed(zlib.crc32(data[entry + 32:entry + 32 + length]))


def test_every_descriptor_field_round_trips_through_the_file(tmp_path):
    with Catalog.create(tmp_path) as catalog:
        recording_id = add(catalog, start_timestamp=1700000000123, control_session_id=77, correlation_id=-5)
    with Catalog.open(tmp_path) as catalog:
        d = catalog.get(recording_id)
    assert d == RecordingDescriptor(
        recording_id=0, start_timestamp=1700000000123, stop_timestamp=NULL_TIMESTAMP, start_position=4096,
        stop_position=NULL_POSITION, initial_term_id=-7, segment_file_length=1 << 20, term_buffer_length=1 << 16,
        mtu_length=1408, session_id=-12345, stream_id=42, stripped_channel=FIELDS["stripped_channel"],
        original_channel=FIELDS["original_channel"], source_identity="127.0.0.1:5555", control_session_id=77,
        correlation_id=-5, state=RecordingState.VALID)
    assert d.to_aeron_dict() == {
        "controlSessionId": 77, "correlationId": -5, "recordingId": 0, "startTimestamp": 1700000000123,
        "stopTimestamp": -1, "startPosition": 4096, "stopPosition": -1, "initialTermId": -7,
        "segmentFileLength": 1 << 20, "termBufferLength": 1 << 16, "mtuLength": 1408, "sessionId": -12345,
        "streamId": 42, "strippedChannel": FIELDS["stripped_channel"], "originalChannel": FIELDS["original_channel"],
        "sourceIdentity": "127.0.0.1:5555", "state": "VALID"}


def test_new_recordings_get_increasing_ids_and_the_next_id_is_persisted(tmp_path):
    with Catalog.create(tmp_path) as catalog:
        assert [add(catalog) for _ in range(3)] == [0, 1, 2]
    with Catalog.open(tmp_path, writable=True) as catalog:
        assert catalog.header.next_recording_id == 3
        assert add(catalog) == 3
        assert catalog.recording_ids() == [0, 1, 2, 3]


def test_stop_start_and_state_updates_persist(tmp_path):
    with Catalog.create(tmp_path) as catalog:
        recording_id = add(catalog, start_position=0)
        catalog.recording_stopped(recording_id, 1 << 21, 1700000009999)
        catalog.set_start_position(recording_id, 1 << 20)
        catalog.change_state(recording_id, RecordingState.INVALID)
    with Catalog.open(tmp_path) as catalog:
        d = catalog.get(recording_id)
        assert (d.start_position, d.stop_position, d.stop_timestamp) == (1 << 20, 1 << 21, 1700000009999)
        assert d.state == RecordingState.INVALID
        assert catalog.stop_position(recording_id) == 1 << 21


def test_updates_that_make_no_sense_are_refused(tmp_path):
    with Catalog.create(tmp_path) as catalog:
        recording_id = add(catalog, start_position=4096)
        with pytest.raises(CatalogError, match="at or after the start position 4096"):
            catalog.recording_stopped(recording_id, 0)
        with pytest.raises(ValueError, match="not ASCII"):
            add(catalog, original_channel="aeron:ipc?alias=café")
        with pytest.raises(ArchiveError, match="not a power of two"):  # the descriptor's layout
            add(catalog, segment_file_length=100000)
        with pytest.raises(UnknownRecordingError, match="no recording 9"):
            catalog.set_stop_position(9, 0)
    with Catalog.open(tmp_path) as catalog, pytest.raises(CatalogError, match="read-only"):
        add(catalog)


@pytest.mark.parametrize("name", ["crc32", "crc32c"])
def test_every_update_keeps_the_descriptor_checksum_of_its_bytes(tmp_path, name):
    algorithm = checksum.get(name)
    with Catalog.create(tmp_path, checksum=algorithm) as catalog:
        recording_id = add(catalog, start_position=0)
        catalog.recording_stopped(recording_id, 1 << 21)
        catalog.set_start_position(recording_id, 1 << 20)
        catalog.change_state(recording_id, RecordingState.INVALID)  # the checksum does not cover the state
    data = (tmp_path / CATALOG_FILE_NAME).read_bytes()
    length, _, stored = struct.unpack_from("<iii", data, 32)
    crc = zlib.crc32 if name == "crc32" else crc32c.crc32c
    assert stored == signed(crc(data[64:64 + length]))
    with Catalog.open(tmp_path) as catalog:
        assert catalog.compute_descriptor_checksum(recording_id, algorithm) == stored


def test_a_full_catalog_grows_by_half_and_keeps_every_entry(tmp_path):
    with Catalog.create(tmp_path, capacity=4096) as catalog:
        ids = [add(catalog, stream_id=i) for i in range(40)]  # 40 entries of 256 bytes: 10 KiB
        assert catalog.capacity == 4096 * 3 // 2 * 3 // 2 * 3 // 2 == 13824
        assert (tmp_path / CATALOG_FILE_NAME).stat().st_size == 13824
        catalog.recording_stopped(ids[-1], 1 << 20)
    with Catalog.open(tmp_path) as catalog:
        assert [d.stream_id for d in catalog] == list(range(40))
        assert catalog.get(39).stop_position == 1 << 20


def test_a_reader_sees_recordings_added_after_it_opened_even_past_growth(tmp_path):
    with Catalog.create(tmp_path, capacity=1024) as writer, Catalog.open(tmp_path) as reader:
        add(writer)
        assert reader.recording_ids() == [0]
        for _ in range(10):
            add(writer)
        writer.recording_stopped(10, 1 << 20)
        assert reader.get(10).stop_position == 1 << 20
        assert len(reader.descriptors()) == 11


def test_a_next_recording_id_left_behind_by_a_crash_is_moved_past_the_entries(tmp_path):
    with Catalog.create(tmp_path) as catalog:
        add(catalog)
        add(catalog)
    with open(tmp_path / CATALOG_FILE_NAME, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<q", 1))
    with Catalog.open(tmp_path, writable=True) as catalog:
        assert add(catalog) == 2


def test_descriptors_can_be_filtered_by_state(tmp_path):
    with Catalog.create(tmp_path) as catalog:
        for _ in range(3):
            add(catalog)
        catalog.change_state(1, RecordingState.DELETED)
        assert [d.recording_id for d in catalog.descriptors(states=(RecordingState.VALID,))] == [0, 2]
        assert 1 in catalog and 5 not in catalog


def test_a_recording_left_without_stop_position_gets_it_from_its_segments(tmp_path):
    with Catalog.create(tmp_path) as catalog:
        recorded = record(tmp_path, catalog, [bytes([i % 251]) * (i * 37 % 3000) for i in range(400)],
                          params=LogBufferParams(term_length=65536, session_id=5, stream_id=6), stop=False,
                          segment_length=65536)
        assert catalog.get(recorded.recording_id).stop_position == NULL_POSITION
        assert catalog.refresh_stop_positions() == [recorded.recording_id]
        d = catalog.get(recorded.recording_id)
        assert d.stop_position == recorded.stop_position == recorded.messages[-1][1]
        assert d.stop_timestamp >= d.start_timestamp


@pytest.mark.parametrize("content, problem", [
    (b"", "too short for a catalog header"),
    (b"\x00\x01\x03\x00\x20\x00", "too short for a catalog header"),
    (random.Random(7).randbytes(4096), "not an Aeron Archive catalog"),
    (struct.pack("<iiqi", 2 << 16, 32, 0, 64).ljust(4096, b"\0"), "version field 2.0.0"),
    (struct.pack("<iiqi", 3 << 16 | 1 << 8, 32, 0, 48).ljust(4096, b"\0"), "alignment 48"),
])
def test_a_file_that_is_not_a_catalog_is_refused_naming_it(tmp_path, content, problem):
    (tmp_path / CATALOG_FILE_NAME).write_bytes(content)
    with pytest.raises(CatalogError) as error:
        Catalog.open(tmp_path)
    assert str(tmp_path / CATALOG_FILE_NAME) in str(error.value)
    assert problem in str(error.value)


def test_a_catalog_cut_inside_an_entry_is_refused_naming_the_entry(tmp_path):
    with Catalog.create(tmp_path) as catalog:
        add(catalog)
        add(catalog)
    path = tmp_path / CATALOG_FILE_NAME
    path.write_bytes(path.read_bytes()[:32 + 256 + 100])
    with pytest.raises(CatalogError, match=r"entry at offset 288 claims .* past the end of the file .*truncated"):
        Catalog.open(tmp_path)


def test_a_damaged_entry_is_refused_naming_its_offset(tmp_path):
    with Catalog.create(tmp_path) as catalog:
        add(catalog)
        add(catalog)
    path = tmp_path / CATALOG_FILE_NAME
    data = bytearray(path.read_bytes())
    struct.pack_into("<i", data, 288 + 4, 7)  # the state of the second entry
    path.write_bytes(data)
    with pytest.raises(CatalogError, match="entry at offset 288 has state 7"):
        Catalog.open(tmp_path)


def test_a_missing_catalog_or_directory_is_named(tmp_path):
    with pytest.raises(CatalogError, match="no catalog in this directory"):
        Catalog.open(tmp_path)
    with pytest.raises(CatalogError, match="no such archive directory"):
        Catalog.open(tmp_path / "nope")
    Catalog.create(tmp_path).close()
    with pytest.raises(CatalogError, match="already exists"):
        Catalog.create(tmp_path)
    assert (tmp_path / CATALOG_FILE_NAME).stat().st_size == DEFAULT_CAPACITY


@pytest.mark.parametrize("made_with", [None, "crc32"])
def test_an_update_keeps_the_checksum_algorithm_the_descriptor_was_made_with(tmp_path, made_with):
    """Readers find a recording's frame checksum from its descriptor's: an archiver started with
    another default (ramen's is now crc32c) must not make an old recording claim checksums its
    frames do not have, or lose those they do."""
    with Catalog.create(tmp_path, checksum=checksum.optional(made_with)) as catalog:
        rid = add(catalog)
    with Catalog.open(tmp_path, writable=True, checksum=checksum.get("crc32c")) as catalog:
        catalog.recording_stopped(rid, 8192)
        catalog.set_start_position(rid, 4096)
        assert catalog.descriptor_checksum(rid) == checksum.optional(made_with)
        assert catalog.get(rid).checksum == (0 if made_with is None else catalog.compute_descriptor_checksum(
            rid, checksum.get(made_with)))
    with Catalog.open(tmp_path, writable=True) as catalog:  # and without one
        catalog.set_stop_position(rid, 12288)
        assert catalog.descriptor_checksum(rid) == checksum.optional(made_with)


def test_a_descriptor_whose_checksum_matches_no_algorithm_is_named_as_damaged(tmp_path):
    with Catalog.create(tmp_path, checksum=checksum.get("crc32c")) as catalog:
        rid = add(catalog)
        offset = catalog.entry_offset(rid)
    with open(tmp_path / CATALOG_FILE_NAME, "r+b") as f:
        f.seek(offset + 32 + 80 + 6)  # a byte of the strippedChannel
        f.write(b"#")
    with Catalog.open(tmp_path) as catalog:
        with pytest.raises(CatalogError, match=rf"archive.catalog entry at offset {offset}: recording {rid}'s "
                                               r"descriptor checksum -?\d+ matches none of crc32, crc32c .*damaged"):
            catalog.descriptor_checksum(rid)


@pytest.mark.parametrize("field, value, problem", [
    ("term_buffer_length", 12345, "term length 12345 is not a power of two"),
    ("mtu_length", 1 << 17, "MTU 131072 is not a multiple of 32 in 64..65536"),
    ("stop_position", 1 << 62, f"stop position {1 << 62} is past the largest position"),
    ("start_position", 100, "start position 100 is not a non-negative multiple of 32"),
])
def test_a_descriptor_whose_numbers_cannot_be_right_has_a_layout_problem(field, value, problem):
    from dataclasses import replace

    from ramen.archive.catalog import layout_problem
    d = RecordingDescriptor(recording_id=0, start_timestamp=0, stop_timestamp=0, start_position=0, stop_position=4096,
                            initial_term_id=0, segment_file_length=1 << 17, term_buffer_length=1 << 16,
                            mtu_length=1408, session_id=1, stream_id=1, stripped_channel="", original_channel="",
                            source_identity="")
    assert layout_problem(d) is None
    assert problem in layout_problem(replace(d, **{field: value}))

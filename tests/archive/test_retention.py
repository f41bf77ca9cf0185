"""Retention: whole segments before a position go, the start moves to the first kept segment, and the
segment holding a recording's end always stays."""

import pytest

from ramen.archive import checksum
from ramen.archive.catalog import Catalog
from ramen.archive.markfile import ArchiveMarkFile
from ramen.archive.retention import purge_before, purge_before_time, purge_to_size
from ramen.archive.verify import verify_archive
from ramen.transport import LogBufferParams
from tests.archive.helpers import assert_one_line_error, ramen, ramen_json, record, writable_copy

SEGMENT = 262144


@pytest.fixture
def plain(aeron_vectors, tmp_path):
    return writable_copy(aeron_vectors / "archives" / "archive_plain", tmp_path / "archive")


def segments(directory, recording_id):
    return sorted(int(p.name.split("-")[1][:-4]) for p in directory.glob(f"{recording_id}-*.rec"))


def test_segments_wholly_before_the_position_go_and_the_start_moves_to_the_first_kept(plain):
    with Catalog.open(plain, writable=True) as catalog:
        result = purge_before(catalog, 0, 600000)  # inside the third segment, [524288, 786432)
        assert catalog.get(0).start_position == 524288
    assert (result.old_start_position, result.new_start_position) == (0, 524288)
    assert sorted(p.name for p in result.deleted) == ["0-0.rec", "0-262144.rec"]
    assert segments(plain, 0) == [524288, 786432, 1048576]
    assert verify_archive(plain) == []
    messages = ramen_json("archive", "dump", plain, 0, "--json")
    assert messages[0]["position"] > 524288 and messages[-1]["position"] == 1091008


def test_the_segment_holding_the_end_of_a_recording_is_never_deleted(plain):
    with Catalog.open(plain, writable=True) as catalog:
        result = purge_before(catalog, 0, 10**9)
    assert result.new_start_position == 1048576
    assert segments(plain, 0) == [1048576]
    assert verify_archive(plain) == []


def test_less_than_one_whole_segment_before_the_position_purges_nothing(plain):
    with Catalog.open(plain, writable=True) as catalog:
        assert not purge_before(catalog, 0, SEGMENT - 32).purged
        assert not purge_before(catalog, 1, 365216).purged  # one segment, started mid-term: it is the last
        assert catalog.get(1).start_position == 200704
    assert segments(plain, 0) == [0, 262144, 524288, 786432, 1048576]


def test_purging_an_active_recording_keeps_the_file_being_written(tmp_path):
    archive = tmp_path / "archive"
    with Catalog.create(archive) as catalog:
        recorded = record(archive, catalog, [b"x" * 1000] * 300, segment_length=65536, stop=False, work_dir=tmp_path,
                          params=LogBufferParams(term_length=65536, session_id=1, stream_id=2))
        assert segments(archive, 0) == [0, 65536, 131072, 196608, 262144]
        result = purge_before(catalog, recorded.recording_id, 10**9)
    assert result.new_start_position == 262144
    assert segments(archive, 0) == [262144]


def test_a_purge_keeps_a_checksummed_descriptor_valid(aeron_vectors, tmp_path):
    archive = writable_copy(aeron_vectors / "archives" / "archive_crc32", tmp_path / "archive")
    result = ramen("archive", "purge", archive, 0, "--before", 524288)
    assert result.returncode == 0, result.stderr
    assert "start position 0 -> 524288; deleted 2 segment file(s)" in result.stdout
    assert verify_archive(archive, checksum=checksum.get("crc32")) == []


def test_a_purge_by_time_without_an_index_only_drops_recordings_that_stopped_before_it(plain):
    with Catalog.open(plain, writable=True) as catalog:
        d = catalog.get(0)
        assert not purge_before_time(catalog, 0, d.stop_timestamp - 1).purged
        assert purge_before_time(catalog, 0, d.stop_timestamp).new_start_position == 1048576


def test_a_purge_by_time_with_a_time_index_purges_before_the_position_it_gives(plain):
    asked = []
    with Catalog.open(plain, writable=True) as catalog:
        result = purge_before_time(catalog, 0, 1234, time_to_position=lambda t: asked.append(t) or 300000)
    assert asked == [1234]
    assert result.new_start_position == 262144


def test_the_cli_refuses_to_purge_under_a_running_archiver(plain):
    with ArchiveMarkFile.acquire(plain):
        assert_one_line_error(ramen("archive", "purge", plain, 0, "--before", 600000), "an archiver is running here")
    assert segments(plain, 0)[0] == 0


def test_purging_to_a_size_keeps_at_least_that_many_bytes_in_whole_segments(plain):
    # Recording 0 ends at 1091008; keeping 400000 bytes means keeping from 691008, so the
    # segments before the one holding 691008 ([524288, 786432)) go.
    with Catalog.open(plain, writable=True) as catalog:
        result = purge_to_size(catalog, 0, 400_000)
        assert catalog.get(0).start_position == 524288
        assert catalog.get(0).stop_position - catalog.get(0).start_position >= 400_000
    assert sorted(p.name for p in result.deleted) == ["0-0.rec", "0-262144.rec"]
    assert verify_archive(plain) == []
    with Catalog.open(plain, writable=True) as catalog:
        assert not purge_to_size(catalog, 0, 10**9).deleted  # under the limit: nothing goes

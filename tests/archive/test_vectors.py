"""`ramen archive` on archives written by real Aeron Archive: descriptors, messages, verification."""

import base64
import struct

import pytest

from tests.archive.helpers import (ARCHIVES, assert_one_line_error, ramen, ramen_json, read_archive_manifest,
                                   writable_copy)
from tests.vectors import ARCHIVE_LENS, expected_payload


def archive(aeron_vectors, name):
    return aeron_vectors / "archives" / name


def manifest_of(aeron_vectors, name):
    return read_archive_manifest(aeron_vectors / "archives" / f"{name}.manifest.csv")


@pytest.mark.parametrize("name", ARCHIVES)
def test_describe_json_gives_the_descriptors_aeron_recorded(aeron_vectors, name):
    manifest = manifest_of(aeron_vectors, name)
    descriptors = ramen_json("archive", "describe", archive(aeron_vectors, name), "--json")

    assert [d["recordingId"] for d in descriptors] == sorted(manifest.recordings)
    for d in descriptors:
        expected = manifest.recordings[d["recordingId"]]
        assert d["state"] == "VALID"
        assert (d["startPosition"], d["stopPosition"]) == (int(expected["start"]), int(expected["stop"]))
        assert d["initialTermId"] == int(expected["initialTermId"])
        assert d["segmentFileLength"] == int(expected["segmentFileLength"])
        assert d["termBufferLength"] == int(expected["termLength"])
        assert d["mtuLength"] == int(expected["mtu"])
        assert (d["sessionId"], d["streamId"]) == (int(expected["sessionId"]), int(expected["streamId"]))
        assert d["strippedChannel"] == expected["strippedChannel"]
        assert d["originalChannel"] == expected["originalChannel"]
        assert d["sourceIdentity"] == expected["sourceIdentity"]
        assert 0 < d["startTimestamp"] <= d["stopTimestamp"]
        assert (d["controlSessionId"], d["correlationId"]) == (0, 0)


def test_describe_prints_the_catalog_header_and_one_recording(aeron_vectors):
    result = ramen("archive", "describe", archive(aeron_vectors, "archive_crc32"), 1)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for line in ("version              3.1.0", "nextRecordingId      2", "alignment            64",
                 "recording 1", "startPosition        200704", "checksum             1450293156"):
        assert line in text
    assert "recording 0" not in text


@pytest.mark.parametrize("name", ARCHIVES)
def test_dump_returns_every_message_byte_for_byte_at_its_position(aeron_vectors, name):
    manifest = manifest_of(aeron_vectors, name)
    for recording_id, stream_id in sorted(manifest.stream_of.items()):
        messages = ramen_json("archive", "dump", archive(aeron_vectors, name), recording_id, "--json")
        session_id = int(manifest.recordings[recording_id]["sessionId"])
        sent = manifest.tx[stream_id]
        assert len(messages) == len(sent)
        for m, (index, length, position) in zip(messages, sent):
            assert m["position"] == position
            assert m["length"] == length
            assert base64.b64decode(m["payload_b64"]) == expected_payload(index, ARCHIVE_LENS)
            # With checksums the frames' sessionId holds the checksum: the dump reports the recording's.
            assert (m["stream_id"], m["session_id"]) == (stream_id, session_id)


def test_dump_from_and_to_positions_gives_the_messages_between(aeron_vectors):
    manifest = manifest_of(aeron_vectors, "archive_plain")
    sent = manifest.tx[1001]
    # From the end of message 500 (the start of message 501) to the end of message 600.
    start, end = sent[500][2], sent[600][2]
    messages = ramen_json("archive", "dump", archive(aeron_vectors, "archive_plain"), 0, "--from", start,
                          "--to", end, "--json")
    assert [m["position"] for m in messages] == [p for _, _, p in sent[501:601]]


@pytest.mark.parametrize("name, options", [("archive_plain", []), ("archive_crc32", ["--checksum", "crc32"])])
def test_verify_passes_on_what_aeron_wrote(aeron_vectors, name, options):
    result = ramen("archive", "verify", archive(aeron_vectors, name), *options)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")


def test_verify_with_a_checksum_says_that_an_archive_aeron_wrote_without_has_none(aeron_vectors):
    """Aeron's recording without checksums: everything but checksums is verified, and one line says
    that the checksum asked for was not checked there (not every frame reported damaged)."""
    result = ramen("archive", "verify", archive(aeron_vectors, "archive_plain"), "--checksum", "crc32")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "recordings 0, 1 carry no checksums" in result.stdout and "position 32" not in result.stdout


def _first_frame_with_payload_after(data: bytes, first_frame: int, after: int) -> tuple[int, int]:
    """(offset, length) of the first DATA frame with a payload at or after `after`, walking from first_frame."""
    offset = first_frame
    while True:
        length, _, _, frame_type = struct.unpack_from("<iBBH", data, offset)
        assert length > 0
        if offset >= after and frame_type == 1 and length > 32:
            return offset, length
        offset += (length + 31) & -32


def test_a_flipped_payload_byte_fails_crc32_verify_naming_recording_and_position(aeron_vectors, tmp_path):
    copy = writable_copy(archive(aeron_vectors, "archive_crc32"), tmp_path / "archive")
    segment = copy / "0-262144.rec"
    data = bytearray(segment.read_bytes())
    offset, length = _first_frame_with_payload_after(data, 0, 10000)
    data[offset + 32 + length // 2 - 16] ^= 0x01
    segment.write_bytes(data)

    result = ramen("archive", "verify", copy, "--checksum", "crc32")

    assert result.returncode == 1
    problems = result.stdout.strip().splitlines()
    assert len(problems) == 1, result.stdout
    assert problems[0].startswith(f"recording 0: position {262144 + offset} ")
    assert "checksum" in problems[0]


def test_a_damaged_frame_header_fails_verify_without_checksums(aeron_vectors, tmp_path):
    copy = writable_copy(archive(aeron_vectors, "archive_plain"), tmp_path / "archive")
    segment = copy / "1-196608.rec"
    data = bytearray(segment.read_bytes())
    offset, _ = _first_frame_with_payload_after(data, 4096, 8192)
    struct.pack_into("<i", data, offset + 20, 999)  # the termId field
    segment.write_bytes(data)

    result = ramen("archive", "verify", copy)

    assert result.returncode == 1
    assert f"recording 1: position {196608 + offset} " in result.stdout
    assert "termId 999" in result.stdout


def test_verify_names_a_missing_segment_and_an_orphan_file(aeron_vectors, tmp_path):
    copy = writable_copy(archive(aeron_vectors, "archive_plain"), tmp_path / "archive")
    (copy / "0-524288.rec").rename(copy / "7-0.rec")

    result = ramen("archive", "verify", copy)

    assert result.returncode == 1
    assert "0-524288.rec offset 0: missing segment file (positions 524288..786432 are lost)" in result.stdout
    assert "7-0.rec: segment file of recording 7, which is not in the archive.catalog" in result.stdout


def test_bad_input_is_a_one_line_error(aeron_vectors, tmp_path):
    plain = archive(aeron_vectors, "archive_plain")
    assert_one_line_error(ramen("archive", "describe", tmp_path / "nope"), "no such archive directory")
    assert_one_line_error(ramen("archive", "describe", tmp_path), "no catalog")
    assert_one_line_error(ramen("archive", "dump", plain, 5), "no recording 5")
    assert_one_line_error(ramen("archive", "dump", plain, 0, "--from", 100), "--from 100", "frame boundary")
    assert_one_line_error(ramen("archive", "dump", plain, 0, "--to", 10), "--to 10", "frame boundary")
    assert_one_line_error(ramen("archive", "dump", plain, 1, "--from", 0), "--from 0", "outside recording 1")
    assert_one_line_error(ramen("archive", "dump", plain, 0, "--from", 64), "--from 64", "not the start of a frame")
    assert_one_line_error(ramen("archive", "verify", tmp_path / "nope"), "no such archive directory")
    assert_one_line_error(ramen("archive", "purge", plain, 9, "--before", 0), "no recording 9")

"""`ramen archive verify --checksum ALGO` on recordings made with and without frame checksums: a
recording without any says so in one line and is verified in every other respect; one with them is
still checked, whatever its descriptor checksum field says."""

import struct
from pathlib import Path

from ramen.archive import checksum
from ramen.archive.catalog import (CHECKSUM_OFFSET, DESCRIPTOR_HEADER_LENGTH, STOP_POSITION_OFFSET,
                                   STOP_TIMESTAMP_OFFSET, STREAM_ID_OFFSET, Catalog)
from ramen.archive.segment import SegmentReader
from ramen.transport import LogBufferParams
from tests.archive.helpers import ramen, record

TERM = 65536
PAYLOADS = [bytes([i % 251 + 1]) * (i * 61 % 3000 + 1) for i in range(200)]
CRC32C = checksum.get("crc32c")


def record_archive(archive: Path, work_dir: Path, algorithms: list[checksum.Checksum | None]) -> list[int]:
    """One recording per entry of `algorithms`, each with that frame and descriptor checksum."""
    ids = []
    for i, algorithm in enumerate(algorithms):
        with Catalog.open_or_create(archive, checksum=algorithm) as catalog:
            ids.append(record(archive, catalog, PAYLOADS, checksum=algorithm, work_dir=work_dir,
                              params=LogBufferParams(term_length=TERM, session_id=40 + i, stream_id=7)).recording_id)
    return ids


def damage_a_payload(archive: Path, recording_id: int) -> int:
    """Flip one payload byte of the recording's 10th DATA frame; returns the frame's position."""
    with Catalog.open(archive) as catalog:
        d = catalog.get(recording_id)
    with SegmentReader.for_recording(archive, d) as reader:
        f = [f for f in reader.frames() if f.is_data][10]
        path, offset = reader.segment_path(f.position), f.file_offset + 40
        position = f.position
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([byte ^ 0xFF]))
    return position


def test_an_archive_recorded_without_checksums_verifies_with_one_line_saying_so(tmp_path):
    archive = tmp_path / "archive"
    record_archive(archive, tmp_path, [None, None])
    result = ramen("archive", "verify", archive, "--checksum", "crc32c")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    [line] = result.stdout.splitlines()
    assert line.startswith(f"{archive}: ok; recordings 0, 1 carry no checksums"), line
    assert "--checksum crc32c was not checked there" in line
    # Without --checksum, nothing to say about checksums.
    plain = ramen("archive", "verify", archive)
    assert (plain.returncode, plain.stdout) == (0, f"{archive}: ok\n")


def test_a_recording_without_checksums_is_still_checked_for_everything_else(tmp_path):
    archive = tmp_path / "archive"
    [rid] = record_archive(archive, tmp_path, [None])
    with Catalog.open(archive) as catalog:
        d = catalog.get(rid)
    with SegmentReader.for_recording(archive, d) as reader:
        f = [f for f in reader.frames() if f.is_data][5]
        path, offset = reader.segment_path(f.position), f.file_offset + 16  # the streamId field
    with open(path, "r+b") as file:
        file.seek(offset)
        file.write(struct.pack("<i", 99))
    result = ramen("archive", "verify", archive, "--checksum", "crc32c")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    assert "streamId 99 (expected 7)" in lines[0]
    assert lines[1].startswith(f"{archive}: recording 0 carries no checksums")


def test_a_damaged_recording_with_crc32c_is_still_reported_beside_one_without(tmp_path):
    archive = tmp_path / "archive"
    plain, checked = record_archive(archive, tmp_path, [None, CRC32C])
    position = damage_a_payload(archive, checked)
    result = ramen("archive", "verify", archive, "--checksum", "crc32c")
    assert result.returncode == 1, result.stdout
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"recording {checked}: position {position} ") and "damaged data" in lines[0], lines
    assert lines[-1].startswith(f"{archive}: recording {plain} carries no checksums"), lines
    assert not any(line.startswith(f"recording {plain}:") for line in lines), lines


def test_a_crc32c_recording_whose_descriptor_checksum_was_zeroed_is_still_checked(tmp_path):
    """A descriptor checksum of 0 is not enough to skip the frames: they hold checksums, not the
    stream's sessionId, so the damage in them is still found (and the descriptor's too)."""
    archive = tmp_path / "archive"
    [rid] = record_archive(archive, tmp_path, [CRC32C])
    position = damage_a_payload(archive, rid)
    with Catalog.open(archive) as catalog:
        entry = catalog.entry_offset(rid)
    with open(archive / "archive.catalog", "r+b") as file:
        file.seek(entry + CHECKSUM_OFFSET)
        file.write(struct.pack("<i", 0))
    result = ramen("archive", "verify", archive, "--checksum", "crc32c")
    assert result.returncode == 1, result.stdout
    assert "carries no checksums" not in result.stdout
    assert "catalog descriptor checksum 0 does not match" in result.stdout
    assert f"recording {rid}: position {position} " in result.stdout and "damaged data" in result.stdout


def as_aerons_refresh_leaves_it(archive: Path, recording_id: int) -> None:
    """The descriptor as real Aeron 1.48 leaves it after an unclean stop: its checksum made while it
    recorded (stop position and time NULL), then the stop written by the catalog's refresh
    (Catalog.refreshAndFixDescriptor) without updating the checksum."""
    with Catalog.open(archive) as catalog:
        entry = catalog.entry_offset(recording_id)
        body = entry + DESCRIPTOR_HEADER_LENGTH
    with open(archive / "archive.catalog", "r+b") as file:
        file.seek(body)
        descriptor = bytearray(file.read(STREAM_ID_OFFSET + 4))
        stops = bytes(descriptor[STOP_TIMESTAMP_OFFSET:STOP_TIMESTAMP_OFFSET + 8]), \
            bytes(descriptor[STOP_POSITION_OFFSET:STOP_POSITION_OFFSET + 8])
        for offset in (STOP_TIMESTAMP_OFFSET, STOP_POSITION_OFFSET):
            file.seek(body + offset)
            file.write(struct.pack("<q", -1))  # recording
    with Catalog.open(archive) as catalog:
        while_recording = catalog.compute_descriptor_checksum(recording_id, CRC32C)
    with open(archive / "archive.catalog", "r+b") as file:
        file.seek(entry + CHECKSUM_OFFSET)
        file.write(struct.pack("<i", while_recording))
        for offset, value in zip((STOP_TIMESTAMP_OFFSET, STOP_POSITION_OFFSET), stops):
            file.seek(body + offset)
            file.write(value)  # refreshed, the checksum left


def test_a_descriptor_checksum_aerons_catalog_refresh_left_stale_is_read_with_a_warning_and_verify_reports_it(
        tmp_path):
    """Aeron replays such a recording as usual; ramen refused it as a damaged descriptor (0 of its
    messages). It reads it, saying so in one line; verify reports it, as Aeron's CatalogTool does."""
    archive = tmp_path / "archive"
    [rid] = record_archive(archive, tmp_path, [CRC32C])
    as_aerons_refresh_leaves_it(archive, rid)

    dump = ramen("archive", "dump", archive, rid, "--json")
    assert dump.returncode == 0, dump.stderr
    assert len(dump.stdout.splitlines()) == len(PAYLOADS)
    (warning,) = dump.stderr.strip().splitlines()
    assert f"recording {rid}'s descriptor checksum" in warning and "is stale" in warning
    assert "before its stop position and time were written" in warning
    describe = ramen("archive", "describe", archive)
    assert "(crc32c, stale: made before its stop was written)" in describe.stdout
    verify = ramen("archive", "verify", archive)
    assert verify.returncode == 1
    problems = [line for line in verify.stdout.splitlines() if line.startswith(f"recording {rid}:")]
    assert len(problems) == 1 and "is stale: made before its stop position and time were written" in problems[0]

    # Only the stop is left out of a stale checksum: any other field changed is damage.
    with open(archive / "archive.catalog", "r+b") as file:
        with Catalog.open(archive) as catalog:
            file.seek(catalog.entry_offset(rid) + DESCRIPTOR_HEADER_LENGTH + STREAM_ID_OFFSET)
        file.write(struct.pack("<i", 8))
    dump = ramen("archive", "dump", archive, rid)
    assert dump.returncode == 1 and "matches none of crc32, crc32c over its contents (damaged descriptor)" in \
        dump.stderr


def test_dump_headers_shows_ramens_messages_by_kind_channel_and_event_times_not_their_bytes(tmp_path):
    """`archive dump --json` printed ~110 KB of base64 a line for 64 KiB messages."""
    import json

    import pyarrow as pa

    from ramen.tuples import encode_tuples, gap
    rows = pa.record_batch({"ts": pa.array([1_000_000, 3_000_000], pa.timestamp("us")), "bytes": pa.array([5, 6])})
    payloads = [gap(0, 60_000_000, 7), encode_tuples(rows, "ts"), b"not ours"]
    archive = tmp_path / "archive"
    with Catalog.open_or_create(archive, checksum=CRC32C) as catalog:
        rid = record(archive, catalog, payloads, checksum=CRC32C, work_dir=tmp_path,
                     params=LogBufferParams(term_length=TERM, session_id=3, stream_id=7)).recording_id
    dumped = ramen("archive", "dump", archive, rid, "--headers", "--json")
    assert dumped.returncode == 0, dumped.stderr
    lines = [json.loads(line) for line in dumped.stdout.splitlines()]
    assert [{k: v for k, v in line.items() if k not in ("position", "length")} for line in lines] == [
        {"kind": "GAP", "channel": 0, "source": 7, "min_event_time_us": 0, "max_event_time_us": 59_999_999},
        {"kind": "TUPLES", "channel": 0, "source": 0, "min_event_time_us": 1_000_000, "max_event_time_us": 3_000_000},
        {}]
    assert [line["length"] for line in lines] == [len(p) for p in payloads]
    text = ramen("archive", "dump", archive, rid, "--headers").stdout.splitlines()
    assert text[2].endswith("GAP channel 0 source 7 1970-01-01T00:00Z .. 1970-01-01T00:01Z")
    assert text[3].endswith("TUPLES channel 0 source 0 1970-01-01T00:00:01Z .. 1970-01-01T00:00:03Z")
    assert text[4].endswith("(not a ramen message)")

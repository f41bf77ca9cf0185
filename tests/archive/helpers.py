"""Shared by the archive suites: the vectors' manifests, running the CLI, and recording real frames."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ramen.archive.catalog import Catalog
from ramen.archive.checksum import Checksum
from ramen.archive.segment import SegmentWriter
from ramen.transport import ADMIN_ACTION, ExclusivePublication, Image, LogBuffer, LogBufferParams
from tests.vectors import ARCHIVE_LENS, expected_payload

ARCHIVES = ("archive_plain", "archive_crc32")
SEGMENT_LENGTH = 262144
TERM_LENGTH = 65536
MTU = 1408


@dataclass
class ArchiveManifest:
    params: dict[str, str]
    recordings: dict[int, dict[str, str]] = field(default_factory=dict)
    """recording id -> the `# recording id=...` fields"""
    stream_of: dict[int, int] = field(default_factory=dict)
    """recording id -> stream id"""
    tx: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    """stream id -> [(message index, length, position after the offer)]"""


def read_archive_manifest(path: Path) -> ArchiveManifest:
    lines = path.read_text().splitlines()
    manifest = ArchiveManifest(dict(re.findall(r"(\w+)=(\S+)", lines[0])))
    for line in lines:
        if line.startswith("# recording id="):
            fields = dict(re.findall(r"(\w+)=(\S+)", line))
            manifest.recordings[int(fields["id"])] = fields
        elif (m := re.match(r"# recording (\d+) channel=\S+ stream=(\d+)", line)):
            manifest.stream_of[int(m.group(1))] = int(m.group(2))
        elif line.startswith("tx,"):
            _, stream, index, length, position = line.split(",")
            manifest.tx.setdefault(int(stream), []).append((int(index), int(length), int(position)))
    return manifest


def ramen(*args, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ramen.cli.main", *map(str, args)], capture_output=True, text=True,
                          check=check, timeout=120)


def ramen_json(*args) -> list[dict]:
    return [json.loads(line) for line in ramen(*args, check=True).stdout.splitlines()]


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ramen: archive: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def writable_copy(src: Path, dst: Path) -> Path:
    """A copy of a vector directory we may change (the vectors themselves are read-only)."""
    shutil.copytree(src, dst)
    for path in [dst, *dst.iterdir()]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return dst


@dataclass
class Recorded:
    recording_id: int
    start_position: int
    stop_position: int
    messages: list[tuple[bytes, int]]
    """(payload, position after the offer) of every message"""


def record(archive_dir: Path, catalog: Catalog, payloads: list[bytes], *, params: LogBufferParams,
           segment_length: int = SEGMENT_LENGTH, checksum: Checksum | None = None, stop: bool = True,
           work_dir: Path | None = None) -> Recorded:
    """Publish payloads on a real log buffer and record them as the archiver would: block_poll into a
    SegmentWriter, the recording added to the catalog first and stopped at the end (if stop)."""
    log_path = (work_dir or archive_dir) / f"recording-{catalog.next_recording_id}.logbuffer"
    log = LogBuffer.create(log_path, params)
    publication = ExclusivePublication(log)
    image = Image(log)
    start = image.position
    recording_id = catalog.add_recording(
        start_position=start, initial_term_id=log.initial_term_id, segment_file_length=segment_length,
        term_buffer_length=log.term_length, mtu_length=log.mtu_length, session_id=log.session_id,
        stream_id=log.stream_id, stripped_channel="aeron:ipc", original_channel="aeron:ipc?term-length=64k",
        source_identity="aeron:ipc")
    writer = SegmentWriter(archive_dir, recording_id, start, log.term_length, segment_length, checksum=checksum)
    messages = []
    try:
        for payload in payloads:
            while (position := publication.offer(payload)) < 0:
                assert position == ADMIN_ACTION, position
            messages.append((payload, position))
            # Read after every message, so the publication never laps the image (no counters: no back pressure),
            # and never past the publication's position: without counters it cleans a term only on entering
            # it, so the term after a full one may still hold frames of three terms ago.
            while image.position < publication.position:
                image.block_poll(writer.on_block, publication.position - image.position)
        if stop:
            catalog.recording_stopped(recording_id, writer.position)
        return Recorded(recording_id, start, writer.position, messages)
    finally:
        writer.close()
        image.close()
        publication.close()
        del publication
        log.close()
        os.unlink(log_path)


def vector_params(manifest: ArchiveManifest, recording_id: int) -> LogBufferParams:
    """Log buffer parameters that make the same frames as the vector's recording."""
    r = manifest.recordings[recording_id]
    channel = r["originalChannel"]
    term_id = re.search(r"term-id=(\d+)\|term-offset=(\d+)", channel)
    return LogBufferParams(term_length=int(r["termLength"]), mtu_length=int(r["mtu"]),
                           initial_term_id=int(r["initialTermId"]), session_id=int(r["sessionId"]),
                           stream_id=int(r["streamId"]),
                           term_id=int(term_id.group(1)) if term_id else None,
                           term_offset=int(term_id.group(2)) if term_id else 0)


def vector_payloads(manifest: ArchiveManifest, recording_id: int) -> list[bytes]:
    return [expected_payload(index, ARCHIVE_LENS) for index, _, _ in manifest.tx[manifest.stream_of[recording_id]]]

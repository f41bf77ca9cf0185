"""Ways to damage a copy of an archive ramen recorded, for the damage matrix (test_damage.py) and the
end-to-end replay test: each names one kind of damage a disk, a crash or a person can do to a
segment file, the catalog or a time index, and where it lands."""

from __future__ import annotations

import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ramen.archive import checksum as checksums
from ramen.archive.catalog import (ALIGNMENT_OFFSET, CATALOG_FILE_NAME, CHECKSUM_OFFSET, DESCRIPTOR_BLOCK_LENGTH,
                                   DESCRIPTOR_HEADER_LENGTH, STOP_POSITION_OFFSET, VERSION_OFFSET, Catalog,
                                   RecordingDescriptor)
from ramen.archive.segment import SegmentReader, segment_file_name
from ramen.archive.time_index import (ENTRY_LENGTH, INDEX_HEADER_LENGTH, INDEX_MAGIC, LEGACY_HEADER, LEGACY_VERSION,
                                      TimeIndex, index_path)
from ramen.transport import frame

SEGMENT, CATALOG, INDEX = "segment", "catalog", "index"


@dataclass(frozen=True)
class Frame:
    position: int
    file_offset: int
    base: int
    length: int
    flags: int
    type: int


@dataclass
class Victims:
    """Where in a sound archive each damage lands: frames of one fragmented message of recording 0
    in a segment file after its first (so that a range in the first is untouched)."""
    descriptor: RecordingDescriptor
    other: RecordingDescriptor
    begin: Frame
    """the message's first fragment, a full one (length = MTU)"""
    middle: Frame
    end: Frame
    """its last fragment, shorter than the MTU, followed by another frame in the same term"""
    catalog_offset: int
    """where recording 0's entry starts in the catalog"""

    def segment(self, archive_dir: Path, f: Frame) -> Path:
        return archive_dir / segment_file_name(self.descriptor.recording_id, f.base)


def find_victims(archive_dir: Path, channel: str) -> Victims:
    with Catalog.open(archive_dir) as catalog:
        recordings = sorted((d for d in catalog if d.stripped_channel == channel), key=lambda d: d.recording_id)
        d, other = recordings[0], recordings[1]
        catalog_offset = catalog.entry_offset(d.recording_id)
    with SegmentReader.for_recording(archive_dir, d) as reader:
        frames = [Frame(f.position, f.file_offset, f.segment_base, f.length, f.flags, f.type)
                  for f in reader.frames()]
    bases = sorted({f.base for f in frames})
    assert len(bases) >= 3, f"recording {d.recording_id} needs at least 3 segment files, has {len(bases)}"
    for i, f in enumerate(frames):
        if f.base != bases[len(bases) // 2] or f.file_offset < d.term_buffer_length // 2 \
                or f.flags != frame.BEGIN_FLAG or f.length != d.mtu_length:
            continue
        message = [f]
        for g in frames[i + 1:]:
            message.append(g)
            if g.flags & frame.END_FLAG:
                break
        end, after = message[-1], frames[i + len(message)]
        same_term = (end.position // d.term_buffer_length) == (after.position // d.term_buffer_length)
        if len(message) >= 3 and end.length + 32 <= d.mtu_length and same_term and after.type == frame.HDR_TYPE_DATA:
            return Victims(d, other, f, message[1], end, catalog_offset)
    raise AssertionError("no fragmented message of 3 fragments or more in the middle segment")


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _read(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def _header_field(v: Victims, archive_dir: Path, f: Frame, field_offset: int, fmt: str, value) -> None:
    _patch(v.segment(archive_dir, f), f.file_offset + field_offset, struct.pack(fmt, value))


def _set_descriptor_i64(v: Victims, archive_dir: Path, field_offset: int, value: int, *, fix_checksum: bool) -> None:
    """Store a descriptor field; with fix_checksum the descriptor checksum is made to match (a
    consistent but wrong descriptor, as a bug would write it)."""
    path = archive_dir / CATALOG_FILE_NAME
    start = v.catalog_offset + DESCRIPTOR_HEADER_LENGTH
    _patch(path, start + field_offset, struct.pack("<q", value))
    if fix_checksum:
        length = struct.unpack("<i", _read(path, v.catalog_offset, 4))[0]
        crc = checksums.get("crc32c").compute(_read(path, start, length))
        _patch(path, v.catalog_offset + CHECKSUM_OFFSET, struct.pack("<i", crc))


def _truncate(path: Path, length: int) -> None:
    os.truncate(path, length)


def _to_legacy_index(path: Path) -> None:
    """Rewrite a version-2 index as version 1 wrote it (no count, no checksums)."""
    index = TimeIndex.open(path)
    entries, disorder = index.entries.tobytes(), index.disorder_us
    index.close()
    recording_id = int(path.name.split(".")[0])
    header = LEGACY_HEADER.pack(INDEX_MAGIC, LEGACY_VERSION, ENTRY_LENGTH, recording_id, disorder)
    path.write_bytes(header.ljust(INDEX_HEADER_LENGTH, b"\0") + entries)


@dataclass(frozen=True)
class Damage:
    name: str
    where: str  # SEGMENT, CATALOG or INDEX
    apply: Callable[[Victims, Path], None]
    untouched_replays: bool = True
    """whether a replay of a range away from the damage still works (not when the whole catalog is gone)"""


def _original_channel(v: Victims) -> int:
    """Catalog offset of the first byte of recording 0's originalChannel (the strippedChannel, which
    says whose recording it is, left alone)."""
    stripped = v.catalog_offset + DESCRIPTOR_HEADER_LENGTH + DESCRIPTOR_BLOCK_LENGTH
    return stripped + 4 + len(v.descriptor.stripped_channel) + 4


def _tindex(v: Victims, archive_dir: Path) -> Path:
    return index_path(archive_dir, v.descriptor.recording_id)


DAMAGES = [
    # A frame header: its length (read before anything else), type, term offset, term id, flags.
    Damage("frame length huge", SEGMENT, lambda v, a: _header_field(v, a, v.begin, 0, "<i", 0x7FFFFFF0)),
    Damage("frame length negative", SEGMENT, lambda v, a: _header_field(v, a, v.begin, 0, "<i", -64)),
    Damage("frame header zeroed", SEGMENT, lambda v, a: _patch(v.segment(a, v.begin), v.begin.file_offset, bytes(32))),
    Damage("frame length past the MTU", SEGMENT,
           lambda v, a: _header_field(v, a, v.begin, 0, "<i", v.begin.length + 32)),
    Damage("frame length not aligned with the next frame", SEGMENT,
           lambda v, a: _header_field(v, a, v.end, 0, "<i", v.end.length + 32)),
    Damage("frame type unknown", SEGMENT, lambda v, a: _header_field(v, a, v.begin, frame.TYPE_OFFSET, "<H", 7)),
    Damage("term offset wrong", SEGMENT, lambda v, a: _header_field(
        v, a, v.begin, frame.TERM_OFFSET_OFFSET, "<i", (v.begin.position + 32) % v.descriptor.term_buffer_length)),
    Damage("term id wrong", SEGMENT, lambda v, a: _header_field(v, a, v.begin, frame.TERM_ID_OFFSET, "<i", 999)),
    Damage("begin flag cleared", SEGMENT, lambda v, a: _header_field(v, a, v.begin, frame.FLAGS_OFFSET, "<B", 0)),
    Damage("end flag cleared", SEGMENT, lambda v, a: _header_field(v, a, v.end, frame.FLAGS_OFFSET, "<B", 0)),
    Damage("padding inside a message", SEGMENT,
           lambda v, a: _header_field(v, a, v.middle, frame.TYPE_OFFSET, "<H", frame.HDR_TYPE_PAD)),
    Damage("payload byte flipped", SEGMENT, lambda v, a: _patch(
        v.segment(a, v.middle), v.middle.file_offset + 100,
        bytes([_read(v.segment(a, v.middle), v.middle.file_offset + 100, 1)[0] ^ 0x10]))),
    # A segment file.
    Damage("segment truncated mid-frame", SEGMENT, lambda v, a: _truncate(v.segment(a, v.begin),
                                                                          v.begin.file_offset + 500)),
    Damage("segment truncated mid-header", SEGMENT, lambda v, a: _truncate(v.segment(a, v.begin),
                                                                           v.begin.file_offset + 16)),
    Damage("segment missing", SEGMENT, lambda v, a: v.segment(a, v.begin).unlink()),
    Damage("segment path a directory", SEGMENT, lambda v, a: (v.segment(a, v.begin).unlink(),
                                                              v.segment(a, v.begin).mkdir())),
    # The catalog.
    Damage("catalog header version", CATALOG, lambda v, a: _patch(a / CATALOG_FILE_NAME, VERSION_OFFSET, bytes(4)),
           untouched_replays=False),
    Damage("catalog header alignment", CATALOG, lambda v, a: _patch(a / CATALOG_FILE_NAME, ALIGNMENT_OFFSET,
                                                                     struct.pack("<i", 48)), untouched_replays=False),
    Damage("catalog entry length", CATALOG, lambda v, a: _patch(a / CATALOG_FILE_NAME, v.catalog_offset,
                                                                struct.pack("<i", 0x7FFF0000)),
           untouched_replays=False),
    Damage("descriptor byte flipped", CATALOG, lambda v, a: _patch(a / CATALOG_FILE_NAME, _original_channel(v) + 2,
                                                                    b"#")),
    Damage("stop position 2^62", CATALOG,
           lambda v, a: _set_descriptor_i64(v, a, STOP_POSITION_OFFSET, 1 << 62, fix_checksum=True)),
    Damage("stop position past the segments", CATALOG, lambda v, a: _set_descriptor_i64(
        v, a, STOP_POSITION_OFFSET, v.descriptor.stop_position + 16 * v.descriptor.segment_file_length,
        fix_checksum=True)),
    # The time index.
    Damage("tindex zeroed", INDEX, lambda v, a: _tindex(v, a).write_bytes(bytes(_tindex(v, a).stat().st_size))),
    Damage("tindex truncated", INDEX,
           lambda v, a: _truncate(_tindex(v, a), INDEX_HEADER_LENGTH + 5 * ENTRY_LENGTH + 7)),
    Damage("tindex of another recording", INDEX, lambda v, a: shutil.copyfile(
        index_path(a, v.other.recording_id), _tindex(v, a))),
    Damage("tindex entry flipped", INDEX, lambda v, a: _patch(
        _tindex(v, a), INDEX_HEADER_LENGTH + 10 * ENTRY_LENGTH + 9, b"\x55")),
    Damage("tindex header flipped", INDEX, lambda v, a: _patch(_tindex(v, a), 24, b"\x7f")),
]

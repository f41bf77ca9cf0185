"""Reading the manifests of ../shared/aeron-vectors: what real Aeron wrote, message by message."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

LOGBUFFER_LENS = [0, 1, 7, 8, 31, 32, 33, 100, 1000, 1376, 1377, 3000, 64, 8192, 5000, 200]
ARCHIVE_LENS = [0, 1, 7, 8, 31, 32, 33, 100, 1000, 1376, 1377, 3000, 64, 200, 500, 17]


def expected_payload(index: int, lens: list[int]) -> bytes:
    """Message i as the vector writer made it (see the vectors' README)."""
    length = lens[index % len(lens)]
    prefix = ("m%05d:" % (index % 100000)).encode()
    return bytes(prefix[j] if j < 7 else ord("a") + (index + j) % 26 for j in range(length))


@dataclass
class RxRow:
    index: int
    length: int
    position: int
    term_id: int
    term_offset: int
    flags: int
    after_snapshot: bool


@dataclass
class LogBufferManifest:
    params: dict[str, str]
    tx: dict[int, tuple[int, int]] = field(default_factory=dict)
    """position after the offer -> (message index, length)"""
    rx: dict[int, RxRow] = field(default_factory=dict)
    snapshot: dict[str, int] = field(default_factory=dict)


def read_logbuffer_manifest(path: Path) -> LogBufferManifest:
    lines = path.read_text().splitlines()
    params = dict(re.findall(r"(\w+)=(\S+)", lines[0]))
    manifest = LogBufferManifest(params)
    after = False
    for line in lines:
        if line.startswith("# SNAPSHOT"):
            after = True
            numbers = [int(n) for n in re.findall(r"=(\d+)", line)]
            manifest.snapshot = {"subscriber_position": numbers[0], "received": numbers[1],
                                 "publication_position": numbers[2]}
        elif line.startswith("tx,"):
            _, index, length, position = line.split(",")
            manifest.tx[int(position)] = (int(index), int(length))
        elif line.startswith("rx,"):
            _, index, length, position, term_id, term_offset, flags = line.split(",")
            manifest.rx[int(index)] = RxRow(int(index), int(length), int(position), int(term_id), int(term_offset),
                                            int(flags, 16), after)
    return manifest

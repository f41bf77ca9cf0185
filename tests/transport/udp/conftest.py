"""The captures of two real Aeron 1.48 C media drivers on loopback (aeron-vectors/udp/README.txt)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

CAPTURES = ("normal", "slow")
SENDER_DIR = "24326>24325"
"""Sender socket to receiver socket: DATA, PAD, SETUP, heartbeats."""
RECEIVER_DIR = "24325>24326"
"""Receiver socket to sender socket: SM, NAK, RTTM requests."""
MESSAGES = 200
STREAM_END_POSITION = 261216


@dataclass(frozen=True)
class Datagram:
    n: int
    t: float
    direction: str
    data: bytes
    frames: list[dict]


def read_capture(folder: Path, name: str) -> list[Datagram]:
    datagrams = []
    for line in (folder / f"{name}.jsonl").read_text().splitlines():
        record = json.loads(line)
        datagrams.append(Datagram(record["n"], record["t"], record["dir"], bytes.fromhex(record["hex"]),
                                  record["frames"]))
    return datagrams


@pytest.fixture(scope="session")
def udp_vectors(aeron_vectors) -> Path:
    path = aeron_vectors / "udp"
    if not path.is_dir():
        pytest.skip(f"UDP captures not found at {path}")
    return path


@pytest.fixture(scope="session", params=CAPTURES)
def capture(request, udp_vectors) -> tuple[str, list[Datagram]]:
    """(name, datagrams) of each capture in turn."""
    return request.param, read_capture(udp_vectors, request.param)

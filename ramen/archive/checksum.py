"""Checksums of recorded frames and catalog descriptors, as Aeron Archive stores them.

Aeron lets an archive checksum each DATA frame's payload (its sessionId field then holds the value)
and each catalog descriptor. It stores the 32-bit CRC as a Java int, i.e. signed, so compute()
returns the signed value: comparing with what `struct.unpack("<i")` reads needs no conversion.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable

import crc32c as _crc32c

CRC32 = "crc32"
CRC32C = "crc32c"
NAMES = (CRC32, CRC32C)

_UINT32_SIGN = 1 << 31
_UINT32_RANGE = 1 << 32


def to_int32(value: int) -> int:
    """An unsigned 32-bit CRC as the signed int Aeron writes."""
    return value - _UINT32_RANGE if value >= _UINT32_SIGN else value


@dataclass(frozen=True)
class Checksum:
    """One checksum algorithm: `compute(data)` over any bytes-like object (mmap slices included)."""

    name: str
    _crc: Callable[[object], int]

    def compute(self, data) -> int:
        return to_int32(self._crc(data))

    @property
    def unsigned(self) -> Callable[[object], int]:
        """The CRC as an unsigned 32-bit value, without the conversion: for loops over many frames,
        compared with the stored fields read as unsigned."""
        return self._crc

    def __str__(self) -> str:
        return self.name


_ALGORITHMS = {
    CRC32: Checksum(CRC32, zlib.crc32),
    # crc32c.crc32c uses the CPU's CRC32C instruction where there is one.
    CRC32C: Checksum(CRC32C, _crc32c.crc32c),
}


def get(name: str) -> Checksum:
    """The checksum called `name` ("crc32" or "crc32c", case-insensitive; Aeron's "CRC-32" spellings too)."""
    key = name.strip().lower().replace("-", "") if isinstance(name, str) else name
    try:
        return _ALGORITHMS[key]
    except KeyError:
        raise ValueError(f"unknown checksum {name!r}: choose one of {', '.join(NAMES)}") from None


def optional(name: str | None) -> Checksum | None:
    """`get(name)`, or None when no checksum is configured."""
    return None if name is None else get(name)


def crc32c_extend(data, previous: int = 0) -> int:
    """The unsigned CRC-32C of what `previous` was the CRC of, followed by `data`: how ramen's own
    files (the time index) keep a checksum of a file that grows, at the cost of what is added."""
    return _crc32c.crc32c(data, previous)

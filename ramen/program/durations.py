"""Durations as users write them in programs ("1 minute", "10s", "7d", "1h 30m"), held as integer
microseconds so they compare exactly, hash stably and match the event-time unit of ramen messages."""

from __future__ import annotations

import re

MICROS_PER_SECOND = 1_000_000
UNITS = {
    "us": 1, "µs": 1, "microsecond": 1, "microseconds": 1,
    "ms": 1_000, "millisecond": 1_000, "milliseconds": 1_000,
    "s": MICROS_PER_SECOND, "sec": MICROS_PER_SECOND, "secs": MICROS_PER_SECOND,
    "second": MICROS_PER_SECOND, "seconds": MICROS_PER_SECOND,
    "m": 60 * MICROS_PER_SECOND, "min": 60 * MICROS_PER_SECOND, "mins": 60 * MICROS_PER_SECOND,
    "minute": 60 * MICROS_PER_SECOND, "minutes": 60 * MICROS_PER_SECOND,
    "h": 3600 * MICROS_PER_SECOND, "hour": 3600 * MICROS_PER_SECOND, "hours": 3600 * MICROS_PER_SECOND,
    "d": 86400 * MICROS_PER_SECOND, "day": 86400 * MICROS_PER_SECOND, "days": 86400 * MICROS_PER_SECOND,
    "w": 7 * 86400 * MICROS_PER_SECOND, "week": 7 * 86400 * MICROS_PER_SECOND,
    "weeks": 7 * 86400 * MICROS_PER_SECOND,
}
# Largest unit first, so formatting picks "1h" over "60m"; no weeks: "14d" reads better than "2w".
_FORMAT_UNITS = (("d", UNITS["d"]), ("h", UNITS["h"]), ("m", UNITS["m"]),
                 ("s", UNITS["s"]), ("ms", UNITS["ms"]), ("us", 1))
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zµ]+)\s*", re.IGNORECASE)


def parse_duration(text: str, *, allow_zero: bool = False) -> int:
    """Microseconds in `text`: one or more `<number><unit>` parts ("90s", "1 minute", "1h 30m").
    A bare number is refused: "10" could mean seconds or minutes, and guessing wrong is silent.
    Zero ("0s") only with allow_zero: a zero lateness makes sense, a zero window or retention does not."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"bad duration {text!r}: expected e.g. \"10s\", \"1 minute\", \"7d\"")
    total, position = 0.0, 0
    while position < len(text):
        match = _PART.match(text, position)
        if not match or match.group(2).lower() not in UNITS:
            raise ValueError(f"bad duration {text!r}: expected e.g. \"10s\", \"1 minute\", \"7d\"")
        total += float(match.group(1)) * UNITS[match.group(2).lower()]
        position = match.end()
    micros = round(total)
    if micros < 0 or (micros == 0 and not allow_zero):
        raise ValueError(f"bad duration {text!r}: must be positive")
    return micros


def format_duration(micros: int) -> str:
    """The shortest exact spelling of `micros`, e.g. 90_000_000 -> "1m30s"; parse_duration reads it back."""
    if micros == 0:
        return "0s"
    parts = []
    for unit, size in _FORMAT_UNITS:
        count, micros = divmod(micros, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)

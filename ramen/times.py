"""Times as users write and read them: µs since the epoch, UTC (as in ramen messages), parsed from
the CLI's forms and formatted for one-line messages.

Formatting is UTC ISO-8601 to the minute when exact, else to the second, rounded so that the time
shown can be pasted back into --since (for "before") or --until (for "after").
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from ramen.program.durations import MICROS_PER_SECOND, UNITS

__all__ = ["MAX_TIME_US", "MIN_TIME_US", "TimeError", "date_of", "format_range", "format_rfc3339", "format_time",
           "parse_time"]

MICROS_PER_MINUTE = 60 * MICROS_PER_SECOND
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MIN_YEAR, MAX_YEAR = 1970, 9999
MIN_TIME_US = 0
MAX_TIME_US = (datetime.max.replace(tzinfo=timezone.utc) - _EPOCH) // timedelta(microseconds=1) + 1
"""Times a command may name: [MIN_YEAR, MAX_YEAR], what a date shows (µs since the epoch, UTC)."""
_RELATIVE = re.compile(r"^(?:now)?\s*([+-])\s*(\d+(?:\.\d+)?)\s*([a-zµ]+)$", re.IGNORECASE)
_EPOCH_SECONDS = re.compile(r"^\d+(?:\.\d+)?$")


class TimeError(ValueError):
    """A time that cannot be read, or that no date can show. One line."""


def _datetime(micros: int) -> datetime:
    seconds, rest = divmod(micros, MICROS_PER_SECOND)
    return datetime.fromtimestamp(seconds, timezone.utc).replace(microsecond=rest)


def date_of(micros: int) -> str:
    return _datetime(micros).strftime("%Y-%m-%d")


def format_time(micros: int, *, ceil: bool = False, day: str | None = None) -> str:
    """UTC ISO-8601 to the minute when exact (`2026-11-20T10:00Z`), else to the second, rounded
    down (or up with `ceil`). The date is left out when it is `day` (`11:00Z`)."""
    if ceil:
        micros = -(-micros // MICROS_PER_SECOND) * MICROS_PER_SECOND
    else:
        micros = micros // MICROS_PER_SECOND * MICROS_PER_SECOND
    moment = _datetime(micros)
    clock = moment.strftime("%H:%M" if micros % MICROS_PER_MINUTE == 0 else "%H:%M:%S") + "Z"
    date = moment.strftime("%Y-%m-%d")
    return clock if date == day else f"{date}T{clock}"


def format_range(since_us: int, until_us: int) -> str:
    """`2026-11-20T10:00Z..11:00Z`: wide enough to hold [since_us, until_us)."""
    return f"{format_time(since_us)}..{format_time(until_us, ceil=True, day=date_of(since_us))}"


def parse_time(text: str, now_us: int) -> int:
    """µs since the epoch, UTC, of a CLI time: `now`, relative to now (`-1h`, `-15m`, `-10min`,
    `now-2h`, `+5m`), epoch seconds (`1763632800`, `1763632800.5`), or ISO-8601
    (`2026-11-20T10:00Z`, `2026-11-20 10:00`, `2026-11-20T10:00:00+02:00`, `2026-11-20`);
    ISO times without an offset are UTC, never the local zone, so a command means the same
    on every host."""
    spelled = text.strip()
    if spelled.lower() == "now":
        return now_us
    relative = _RELATIVE.match(spelled)
    if relative and relative.group(3).lower() in UNITS:
        sign, number, unit = relative.groups()
        offset = round(float(number) * UNITS[unit.lower()])
        return _within_years(now_us - offset if sign == "-" else now_us + offset, text)
    if _EPOCH_SECONDS.match(spelled):
        return _within_years(round(float(spelled) * MICROS_PER_SECOND), text)
    try:
        moment = datetime.fromisoformat(spelled)
    except ValueError:
        raise TimeError(f"cannot read {text!r} as a time: give ISO-8601 (2026-11-20T10:00Z), "
                        f"epoch seconds, now, or a time relative to now (-1h, -15m)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    delta = moment - _EPOCH
    return _within_years((delta.days * 86400 + delta.seconds) * MICROS_PER_SECOND + delta.microseconds, text)


def _within_years(micros: int, text: str) -> int:
    """A time the calendar can show (every message names times as dates)."""
    if not MIN_TIME_US <= micros < MAX_TIME_US:
        raise TimeError(f"{text!r} is not a time between the years {MIN_YEAR} and {MAX_YEAR}")
    return micros


def format_rfc3339(micros: int) -> str:
    """RFC 3339 in UTC, as output shows times: `2026-11-25T12:15:00Z`, with the fraction of a
    second only when there is one (`…:00.250Z`)."""
    moment = _datetime(micros)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + "Z"

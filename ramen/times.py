"""Times as users write and read them: µs since the epoch, UTC (as in ramen messages), parsed from
the CLI's forms (Graphite's `from`/`until`, Grafana's rounding, ISO-8601, epoch seconds: every
command that takes a time reads it here) and formatted for one-line messages.

Formatting is UTC ISO-8601 to the minute when exact, else to the second, rounded so that the time
shown can be pasted back into --since (for "before") or --until (for "after").
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

from ramen.program.durations import MICROS_PER_SECOND

__all__ = ["MAX_TIME_US", "MIN_TIME_US", "TIME_FORMS", "TimeError", "date_of", "format_range", "format_rfc3339",
           "format_time", "parse_time", "unit_start"]

MICROS_PER_MINUTE = 60 * MICROS_PER_SECOND
MICROS_PER_HOUR = 60 * MICROS_PER_MINUTE
MICROS_PER_DAY = 24 * MICROS_PER_HOUR
MICROS_PER_WEEK = 7 * MICROS_PER_DAY
MICROS_PER_MONTH = 30 * MICROS_PER_DAY
"""Graphite's month in offsets (`-1mon`); rounding (`/mon`) goes by the calendar instead."""
MICROS_PER_YEAR = 365 * MICROS_PER_DAY
"""Graphite's year in offsets (`-1y`); rounding (`/y`) goes by the calendar instead."""
OFFSET_UNITS = (("s", MICROS_PER_SECOND), ("min", MICROS_PER_MINUTE), ("h", MICROS_PER_HOUR),
                ("d", MICROS_PER_DAY), ("w", MICROS_PER_WEEK), ("mon", MICROS_PER_MONTH), ("y", MICROS_PER_YEAR))
"""Graphite's offset units, by prefix and in the order it tries them: `sec`, `seconds`, `hr`,
`hours`, `minutes`, `months` all count; `m` alone is none of them (see _EXACT_UNITS)."""
_EXACT_UNITS = {"m": MICROS_PER_MINUTE, "M": MICROS_PER_MONTH}
"""Units spelled exactly so (case matters): ramen and Grafana read `m` as minutes, Grafana `M` as months."""
NAMED_HOURS = {"midnight": 0, "noon": 12, "teatime": 16}
RELATIVE_DAYS = {"yesterday": -1, "today": 0, "tomorrow": 1}
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
"""In Python's date.weekday() order (Monday 0)."""
TIME_FORMS = ("now, -2h, -1mon, now-1d/d, now/w, noon yesterday, 6pm today, 12:00_20261124, 20261124, "
              "11/24/26, epoch seconds, ISO-8601 (2026-11-24T12:00Z)")
"""The forms a user may write, briefly: for help texts and for the message that refuses a time."""
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MIN_YEAR, MAX_YEAR = 1970, 9999
MIN_TIME_US = 0
MAX_TIME_US = (datetime.max.replace(tzinfo=timezone.utc) - _EPOCH) // timedelta(microseconds=1) + 1
"""Times a command may name: [MIN_YEAR, MAX_YEAR], what a date shows (µs since the epoch, UTC)."""

_ISO_8601 = re.compile(r"\d{4}-\d{2}-\d{2}|\d{8}T", re.IGNORECASE)
_IGNORED = re.compile(r"[\s_,]+")
"""What Graphite drops before reading a time, so `12:00_20261124` and `noon yesterday` read."""
_EPOCH_SECONDS = re.compile(r"\d+(?:\.\d+)?$", re.ASCII)
_READABLE = re.compile(r"""
    (?P<reference>
        (?P<now>now)
      | (?:(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?(?P<meridiem>am|pm) | (?P<hour24>\d{1,2}):(?P<minute24>\d{2})
         | (?P<named>midnight|noon|teatime))?
        (?:(?P<relative_day>yesterday|today|tomorrow)
         | (?P<mdy>\d{1,2}/\d{1,2}/(?:\d{4}|\d{2}))
         | (?P<ymd>\d{8})
         | (?P<month>jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*(?P<day_of_month>\d{1,2})
         | (?P<weekday>mon|tue|wed|thu|fri|sat|sun)[a-z]*)?
    )
    (?P<steps>(?:[+-](?:\d+(?:\.\d+)?[a-z]+)+ | /[a-z]+)*)
""", re.IGNORECASE | re.VERBOSE | re.ASCII)
_STEP = re.compile(r"(?P<sign>[+-])(?:\d+(?:\.\d+)?[a-z]+)+|/(?P<round>[a-z]+)", re.IGNORECASE | re.ASCII)
_PART = re.compile(r"(\d+(?:\.\d+)?)([a-z]+)", re.IGNORECASE | re.ASCII)


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


def parse_time(text: str, now_us: int, *, end: bool = False) -> int:
    """µs since the epoch of a time as `--since`/`--until` (and Graphite's `from`/`until`) spell it.

    All times are UTC: ramen has no per-user time zone, so a command means the same on every host.
    The forms are graphite-web's (its render API's `from`/`until`), Grafana's rounding, ISO-8601
    and epoch seconds:

    - `now`; ISO-8601 (`2026-11-20T10:00Z`, `2026-11-20 10:00`, `2026-11-20T10:00:00+02:00`,
      `2026-11-20`; without an offset it is UTC); epoch seconds (`1763632800`, `1763632800.5`).
      An 8-digit number that reads as a date (year after 1900, month < 13, day < 32) is
      YYYYMMDD, as in Graphite; any other number is epoch seconds.
    - A reference: an optional time of day (`HH:MM`, `6:30pm`, `6pm`, `noon`, `midnight`,
      `teatime` = 16:00) then an optional day (`yesterday`, `today`, `tomorrow`, `YYYYMMDD`,
      `MM/DD/YY` or `MM/DD/YYYY`, a month name and day `nov25`, or a weekday name `monday` = the
      latest one, today included). No time of day means 00:00, no day means today: `noon yesterday`,
      `12:00_20261124`, `6pm today`. Spaces, `_` and `,` are ignored, case too (but see `M`).
      Unlike Graphite, 12am is midnight and 12pm noon.
    - Then offsets: a sign and one or more `<number><unit>` (`-2h`, `now-1d`, `midnight+1d`,
      `-1h30min`; a sign before each also works, as in Grafana: `now-1h-30m`). Units go by
      Graphite's prefixes: s… seconds, min… minutes, h… hours, d… days, w… weeks, mon… months
      of 30 days, y… years of 365 days; ramen and Grafana also read a bare `m` as minutes and a
      bare `M` as months.
    - Grafana's rounding, `/<unit>` after any of it (`now/d`, `now-1d/d`, `now-1h/h`, `now/w`):
      to the start of that second, minute, hour, day, week (weeks begin on Monday, as in
      ISO-8601), month or year; with `end` (the time ends a range: --until, Graphite's `until`)
      to the start of the next one, as Grafana rounds `to` up to the unit's end and ramen's
      ranges exclude their end. Steps apply left to right: `now/d-1h` is 23:00 yesterday.
    """
    spelled = text.strip()
    if _ISO_8601.match(spelled):
        return _within_years(_iso_8601(spelled, text), text)
    compact = _IGNORED.sub("", spelled)
    if _EPOCH_SECONDS.match(compact) and not _is_yyyymmdd(compact):
        return _within_years(round(Decimal(compact) * MICROS_PER_SECOND), text)
    readable = _READABLE.fullmatch(compact)
    if not compact or readable is None:
        raise _unreadable(text)
    micros = _reference(readable, now_us, text)
    for step in _STEP.finditer(readable.group("steps")):
        if step.group("round"):
            micros = _rounded(micros, _unit(step.group("round"), text), end=end, text=text)
        else:
            offset = sum(round(Decimal(number) * _unit(unit, text)) for number, unit in _PART.findall(step.group(0)))
            micros = _within_years(micros - offset if step.group("sign") == "-" else micros + offset, text)
    return _within_years(micros, text)


def _iso_8601(spelled: str, text: str) -> int:
    try:
        moment = datetime.fromisoformat(spelled)
    except ValueError:
        raise _unreadable(text) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return _micros(moment)


def _is_yyyymmdd(digits: str) -> bool:
    """Graphite's test: 8 digits whose parts could be a year after 1900, a month and a day."""
    return len(digits) == 8 and digits.isdigit() and int(digits[:4]) > 1900 and int(digits[4:6]) < 13 \
        and int(digits[6:]) < 32


def _reference(readable: re.Match, now_us: int, text: str) -> int:
    """The instant the offsets start from: now, or a day at a time of day (00:00 unless given)."""
    parts = {name: (value.lower() if value else value) for name, value in readable.groupdict().items()}
    if parts["now"] or not readable.group("reference"):
        return now_us
    hour, minute = 0, 0
    if parts["named"]:
        hour = NAMED_HOURS[parts["named"]]
    elif parts["meridiem"]:
        hour, minute = int(parts["hour"]), int(parts["minute"] or 0)
        if not 1 <= hour <= 12 or minute > 59:
            raise _unreadable(text, f"no time {readable.group('reference')} on a 12-hour clock")
        hour = hour % 12 + (12 if parts["meridiem"] == "pm" else 0)
    elif parts["hour24"]:
        hour, minute = int(parts["hour24"]), int(parts["minute24"])
        if hour > 23 or minute > 59:
            raise _unreadable(text, f"no time {hour:02}:{minute:02}")
    today = _datetime(now_us).date()
    try:
        if parts["relative_day"]:
            day = today + timedelta(days=RELATIVE_DAYS[parts["relative_day"]])
        elif parts["mdy"]:
            month, day_of_month, year = map(int, parts["mdy"].split("/"))
            # Graphite's two-digit years: 70..99 are 1970..1999, 00..69 are 2000..2069.
            year += 1900 if year < 1900 else 0
            year += 100 if year < 1970 else 0
            day = date(year, month, day_of_month)
        elif parts["ymd"]:
            ymd = parts["ymd"]
            day = date(int(ymd[:4]), int(ymd[4:6]), int(ymd[6:]))
        elif parts["month"]:
            day = date(today.year, MONTHS.index(parts["month"]) + 1, int(parts["day_of_month"]))
        elif parts["weekday"]:
            day = today - timedelta(days=(today.weekday() - WEEKDAYS.index(parts["weekday"])) % 7)
        else:
            day = today
    except ValueError:
        raise _unreadable(text, "no such date") from None
    return _micros(datetime(day.year, day.month, day.day, hour, minute, tzinfo=timezone.utc))


def _unit(spelled: str, text: str) -> int:
    """µs in an offset unit, by Graphite's prefix rules ("mon" and "y" are 30 and 365 days)."""
    if spelled in _EXACT_UNITS:
        return _EXACT_UNITS[spelled]
    lowered = spelled.lower()
    for prefix, micros in OFFSET_UNITS:
        if lowered.startswith(prefix):
            return micros
    raise _unreadable(text, f"no unit {spelled!r}")


def unit_start(micros: int, unit: str) -> int:
    """The start of the `unit` (Graphite's spelling: `days`, `h`, `weeks`...; a calendar week from
    Monday, month or year for those) that holds `micros`, as `now/d` rounds."""
    return _rounded(micros, _unit(unit, unit), end=False, text=unit)


def _rounded(micros: int, unit_us: int, *, end: bool, text: str) -> int:
    """The start of the unit holding `micros` (a calendar week, month or year for those units),
    or with `end` the start of the next one."""
    moment = _datetime(micros)
    midnight = datetime(moment.year, moment.month, moment.day, tzinfo=timezone.utc)
    try:
        if unit_us == MICROS_PER_YEAR:
            start = midnight.replace(month=1, day=1)
            following = start.replace(year=start.year + 1)
        elif unit_us == MICROS_PER_MONTH:
            start = midnight.replace(day=1)
            following = (start + timedelta(days=31)).replace(day=1)
        elif unit_us == MICROS_PER_WEEK:
            start = midnight - timedelta(days=moment.weekday())
            following = start + timedelta(weeks=1)
        else:
            start_us = micros // unit_us * unit_us  # the epoch began at midnight, so days align too
            return start_us + unit_us if end else start_us
    except (ValueError, OverflowError):
        raise _out_of_range(text) from None
    return _micros(following if end else start)


def _micros(moment: datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86400 + delta.seconds) * MICROS_PER_SECOND + delta.microseconds


def _unreadable(text: str, why: str = "") -> TimeError:
    reason = f" ({why})" if why else ""
    return TimeError(f"cannot read {text!r} as a time{reason}: give {TIME_FORMS}")


def _out_of_range(text: str) -> TimeError:
    return TimeError(f"{text!r} is not a time between the years {MIN_YEAR} and {MAX_YEAR}")


def _within_years(micros: int, text: str) -> int:
    """A time the calendar can show (every message names times as dates)."""
    if not MIN_TIME_US <= micros < MAX_TIME_US:
        raise _out_of_range(text)
    return micros


def format_rfc3339(micros: int) -> str:
    """RFC 3339 in UTC, as output shows times: `2026-11-25T12:15:00Z`, with the fraction of a
    second only when there is one (`…:00.250Z`)."""
    moment = _datetime(micros)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + "Z"

"""Times as the CLI reads them (now, relative, epoch seconds, ISO-8601, always UTC) and as
one-line messages show them."""

import pytest

from ramen.times import TimeError, format_range, format_time, parse_time

MINUTE = 60_000_000
HOUR = 60 * MINUTE
T10 = parse_time("2026-11-20T10:00Z", 0)
"""10:00 UTC on the day the examples use."""


NOW = parse_time("2026-11-20T12:00Z", 0)


@pytest.mark.parametrize("text, expected", [
    ("now", NOW),
    ("-1h", NOW - HOUR),
    ("-15m", NOW - 15 * MINUTE),
    ("-10min", NOW - 10 * MINUTE),
    ("-2 hours", NOW - 2 * HOUR),
    ("now-30s", NOW - 30_000_000),
    ("+5m", NOW + 5 * MINUTE),
    ("2026-11-20T10:00Z", NOW - 2 * HOUR),
    ("2026-11-20 10:00", NOW - 2 * HOUR),
    ("2026-11-20T10:00:00+02:00", NOW - 4 * HOUR),
    ("2026-11-20T10:00:00.250Z", NOW - 2 * HOUR + 250_000),
    ("2026-11-20", NOW - 12 * HOUR),
    ("1763632800", 1763632800 * 1_000_000),
    ("1763632800.5", 1763632800_500_000),
])
def test_parse_time_reads_the_cli_forms_in_utc(text, expected):
    assert parse_time(text, NOW) == expected


def test_the_reference_day_is_what_the_examples_say():
    assert T10 == 1795168800 * 1_000_000
    assert format_time(T10) == "2026-11-20T10:00Z"
    assert format_time(T10 + 1_500_000) == "2026-11-20T10:00:01Z"
    assert format_time(T10 + 1_500_000, ceil=True) == "2026-11-20T10:00:02Z"


@pytest.mark.parametrize("text", ["yesterday", "-1 fortnight", "2026-13-01", "10:00Z tomorrow", ""])
def test_parse_time_refuses_what_it_cannot_read_in_one_line(text):
    with pytest.raises(TimeError) as caught:
        parse_time(text, NOW)
    assert str(caught.value).startswith(f"cannot read {text!r} as a time")
    assert "\n" not in str(caught.value)


def test_a_range_leaves_out_the_date_it_repeats():
    assert format_range(T10, T10 + HOUR) == "2026-11-20T10:00Z..11:00Z"
    assert format_range(T10, T10 + 24 * HOUR) == "2026-11-20T10:00Z..2026-11-21T10:00Z"


def test_a_time_no_calendar_shows_is_refused_in_one_line():
    with pytest.raises(TimeError, match=r"^'99999999999999' is not a time between the years 1970 and 9999$"):
        parse_time("99999999999999", 0)

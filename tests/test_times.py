"""Times as the CLI reads them (now, relative, epoch seconds, ISO-8601, always UTC) and as
one-line messages show them."""

from datetime import datetime, timedelta, timezone

import pytest

from ramen.times import TIME_FORMS, TimeError, format_range, format_time, parse_time

SECOND = 1_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
T10 = parse_time("2026-11-20T10:00Z", 0)
"""10:00 UTC on the day the examples use."""


def utc(*fields: int) -> int:
    """µs since the epoch of a UTC date and time, computed without parse_time."""
    return (datetime(*fields, tzinfo=timezone.utc) - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(
        microseconds=1)


NOW = utc(2026, 11, 20, 12, 34, 56, 789_000)
"""A Friday, with seconds and µs, so the forms that name a time of day show that they drop them."""
DAY = 24 * HOUR


# (text, µs as a range's start, µs as its end when it differs): every form of Graphite's attime,
# Grafana's rounding, ISO-8601 and epoch seconds, read at NOW, in UTC.
@pytest.mark.parametrize("text, start, end", [
    ("now", NOW, None),
    ("NOW", NOW, None),
    # relative, graphite's units by prefix (mon = 30 days, y = 365 days), ramen's bare m
    ("-2h", NOW - 2 * HOUR, None),
    ("-1hr", NOW - HOUR, None),
    ("-2 hours", NOW - 2 * HOUR, None),
    ("-30minutes", NOW - 30 * MINUTE, None),
    ("-10min", NOW - 10 * MINUTE, None),
    ("-15m", NOW - 15 * MINUTE, None),
    ("-30s", NOW - 30_000_000, None),
    ("-30sec", NOW - 30_000_000, None),
    ("-30seconds", NOW - 30_000_000, None),
    ("-1d", NOW - DAY, None),
    ("-3days", NOW - 3 * DAY, None),
    ("-1w", NOW - 7 * DAY, None),
    ("-2weeks", NOW - 14 * DAY, None),
    ("-1mon", NOW - 30 * DAY, None),
    ("-2months", NOW - 60 * DAY, None),
    ("-1y", NOW - 365 * DAY, None),
    ("-1years", NOW - 365 * DAY, None),
    ("-1h30min", NOW - 90 * MINUTE, None),
    ("-1.5h", NOW - 90 * MINUTE, None),
    ("+1h", NOW + HOUR, None),
    ("+5m", NOW + 5 * MINUTE, None),
    ("now-1d", NOW - DAY, None),
    ("now-30s", NOW - 30_000_000, None),
    ("now-1h-30m", NOW - 90 * MINUTE, None),
    # graphite's references: time of day, then day (00:00 and today unless given)
    ("midnight", utc(2026, 11, 20), None),
    ("noon", utc(2026, 11, 20, 12), None),
    ("teatime", utc(2026, 11, 20, 16), None),
    ("today", utc(2026, 11, 20), None),
    ("yesterday", utc(2026, 11, 19), None),
    ("tomorrow", utc(2026, 11, 21), None),
    ("noon yesterday", utc(2026, 11, 19, 12), None),
    ("noon tomorrow", utc(2026, 11, 21, 12), None),
    ("midnight tomorrow", utc(2026, 11, 21), None),
    ("6pm today", utc(2026, 11, 20, 18), None),
    ("6pm", utc(2026, 11, 20, 18), None),
    ("9am yesterday", utc(2026, 11, 19, 9), None),
    ("6:30pm yesterday", utc(2026, 11, 19, 18, 30), None),
    ("12am", utc(2026, 11, 20), None),
    ("12pm", utc(2026, 11, 20, 12), None),
    ("10:15", utc(2026, 11, 20, 10, 15), None),
    ("midnight+1d", utc(2026, 11, 21), None),
    ("noon yesterday-1h", utc(2026, 11, 19, 11), None),
    ("teatime+30min", utc(2026, 11, 20, 16, 30), None),
    ("12:00_20261124", utc(2026, 11, 24, 12), None),
    ("23:59_20261124", utc(2026, 11, 24, 23, 59), None),
    ("20261124", utc(2026, 11, 24), None),
    ("20261124+1h", utc(2026, 11, 24, 1), None),
    ("11/24/26", utc(2026, 11, 24), None),
    ("11/24/2026", utc(2026, 11, 24), None),
    ("1/2/70", utc(1970, 1, 2), None),
    ("noon 11/24/26", utc(2026, 11, 24, 12), None),
    ("nov24", utc(2026, 11, 24), None),
    ("November 3", utc(2026, 11, 3), None),
    ("monday", utc(2026, 11, 16), None),
    ("friday", utc(2026, 11, 20), None),
    ("sat", utc(2026, 11, 14), None),
    ("noon wednesday", utc(2026, 11, 18, 12), None),
    # Grafana's rounding: to the unit's start for a range's start, to the next one's start for its end
    ("now/d", utc(2026, 11, 20), utc(2026, 11, 21)),
    ("now-1d/d", utc(2026, 11, 19), utc(2026, 11, 20)),
    ("now-1h/h", utc(2026, 11, 20, 11), utc(2026, 11, 20, 12)),
    ("now/m", utc(2026, 11, 20, 12, 34), utc(2026, 11, 20, 12, 35)),
    ("now/s", utc(2026, 11, 20, 12, 34, 56), utc(2026, 11, 20, 12, 34, 57)),
    ("now/w", utc(2026, 11, 16), utc(2026, 11, 23)),
    ("now-1w/w", utc(2026, 11, 9), utc(2026, 11, 16)),
    ("now/M", utc(2026, 11, 1), utc(2026, 12, 1)),
    ("now-1M/M", utc(2026, 10, 1), utc(2026, 11, 1)),
    ("now/mon", utc(2026, 11, 1), utc(2026, 12, 1)),
    ("now/y", utc(2026, 1, 1), utc(2027, 1, 1)),
    ("now/d-1h", utc(2026, 11, 19, 23), utc(2026, 11, 20, 23)),
    ("now/d+8h", utc(2026, 11, 20, 8), utc(2026, 11, 21, 8)),
    ("-1d/d", utc(2026, 11, 19), utc(2026, 11, 20)),
    # ISO-8601 (naive is UTC) and epoch seconds; 8 digits that read as a date are YYYYMMDD
    ("2026-11-20T10:00Z", utc(2026, 11, 20, 10), None),
    ("2026-11-20 10:00", utc(2026, 11, 20, 10), None),
    ("2026-11-20T10:00:00+02:00", utc(2026, 11, 20, 8), None),
    ("2026-11-20T10:00:00.250Z", utc(2026, 11, 20, 10, 0, 0, 250_000), None),
    ("2026-11-20", utc(2026, 11, 20), None),
    ("1795168800", utc(2026, 11, 20, 10), None),
    ("1795168800.5", utc(2026, 11, 20, 10, 0, 0, 500_000), None),
    ("20261125", utc(2026, 11, 25), None),
    ("19991231", utc(1999, 12, 31), None),
    ("123456789", 123456789 * SECOND, None),
    ("18991231", 18991231 * SECOND, None),
    ("20261301", 20261301 * SECOND, None),
])
def test_parse_time_reads_graphite_and_grafana_forms_in_utc(text, start, end):
    assert parse_time(text, NOW) == start
    assert parse_time(text, NOW, end=True) == (start if end is None else end)


def test_the_reference_day_is_what_the_examples_say():
    assert T10 == 1795168800 * 1_000_000
    assert format_time(T10) == "2026-11-20T10:00Z"
    assert format_time(T10 + 1_500_000) == "2026-11-20T10:00:01Z"
    assert format_time(T10 + 1_500_000, ceil=True) == "2026-11-20T10:00:02Z"


@pytest.mark.parametrize("text", ["yesterday-ish", "-1 fortnight", "-15", "-1ms", "2026-13-01", "10:00Z tomorrow", "",
                                  "today noon", "25:00", "13pm", "20260231", "2/30/26", "nov", "noon now", "now/q",
                                  "1795168800-1h"])
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


# The CLI reads its times through parse_time: a command that gets past its times fails later, at the
# confserver nobody listens on (or the directory that is no archive), with that error and no other.
UNREACHABLE = "ramen://127.0.0.1:1"


@pytest.fixture
def ramen_main(tmp_path, monkeypatch, capsys):
    """`ramen ARGS…` in this process; (exit status, stderr lines)."""
    from ramen.cli.main import main
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path / "ramen"))

    def run(*args: str) -> tuple[int, list[str]]:
        status = main(list(args))
        return status, capsys.readouterr().err.strip().splitlines()
    return run


@pytest.mark.parametrize("command", [
    ["replay", "--since", "now-1d/d", "net/traffic"],
    ["replay", "--since", "-1mon", "net/traffic"],
    ["replay", "--since", "20261124", "--until", "12:00_20261124", "net/traffic"],
    ["replay", "--since", "noon yesterday", "--until", "now/d", "net/traffic"],
    ["tail", "--since", "-1mon", "net/traffic"],
    ["tail", "--since", "now-1h/h", "net/traffic"],
])
def test_the_cli_reads_graphite_and_grafana_times_then_goes_on(ramen_main, command):
    status, lines = ramen_main(*command, "--confserver", UNREACHABLE)
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"ramen: {command[0]}: cannot reach the confserver at {UNREACHABLE}"), lines


@pytest.mark.parametrize("command", [["replay", "--since", "now-1d/q", "net/traffic"],
                                     ["replay", "--since", "-1h", "--until", "now-1d/q", "net/traffic"],
                                     ["tail", "--since", "now-1d/q", "net/traffic"]])
def test_the_cli_refuses_an_unreadable_time_in_one_line_before_it_connects(ramen_main, command):
    status, lines = ramen_main(*command, "--confserver", UNREACHABLE)
    assert status == 1
    assert lines == [f"ramen: {command[0]}: cannot read 'now-1d/q' as a time (no unit 'q'): give {TIME_FORMS}"]


def test_archive_purge_reads_before_as_a_time_unless_it_is_a_position(ramen_main, tmp_path):
    from ramen.cli.archive import _parse_before
    assert _parse_before("524288", NOW) == (524288, None)
    assert _parse_before("now-1d/d", NOW) == (None, utc(2026, 11, 19) // 1000)
    assert _parse_before("2026-11-20T10:00Z", NOW) == (None, utc(2026, 11, 20, 10) // 1000)
    status, lines = ramen_main("archive", "purge", str(tmp_path), "0", "--before", "-30d")
    assert status == 1 and lines == [f"ramen: archive: {tmp_path}/archive.catalog: no catalog in this directory "
                                     f"(not an archive?)"]
    status, lines = ramen_main("archive", "purge", str(tmp_path), "0", "--before", "-1 fortnight")
    assert status == 1 and lines == [f"ramen: archive: --before: cannot read '-1 fortnight' as a time "
                                     f"(no unit 'fortnight'): give {TIME_FORMS}"]

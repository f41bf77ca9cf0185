"""Durations and Arrow type names as users write them in program files."""

import pyarrow as pa
import pytest

from ramen.program.durations import format_duration, parse_duration
from ramen.program.schema import parse_type, type_name

SECOND = 1_000_000


@pytest.mark.parametrize("text, micros", [
    ("1 minute", 60 * SECOND), ("10s", 10 * SECOND), ("7d", 7 * 86400 * SECOND), ("1h 30m", 5400 * SECOND),
    ("1m30s", 90 * SECOND), ("500ms", SECOND // 2), ("2 hours", 7200 * SECOND), ("1.5s", 3 * SECOND // 2),
    ("250us", 250), ("1 week", 7 * 86400 * SECOND),
])
def test_durations_users_write_parse_to_microseconds(text, micros):
    assert parse_duration(text) == micros


@pytest.mark.parametrize("text", ["soon", "10", "", "1 fortnight", "s", "-5s", "10s later", "0s"])
def test_durations_that_mean_nothing_or_zero_are_refused(text):
    with pytest.raises(ValueError, match="bad duration"):
        parse_duration(text)


def test_a_zero_lateness_is_allowed_where_asked():
    assert parse_duration("0s", allow_zero=True) == 0


@pytest.mark.parametrize("micros", [1, 999, SECOND, 90 * SECOND, 7 * 86400 * SECOND, 86400 * SECOND + 1])
def test_formatted_durations_read_back_exactly(micros):
    assert parse_duration(format_duration(micros)) == micros


@pytest.mark.parametrize("name, arrow_type", [
    ("int8", pa.int8()), ("uint64", pa.uint64()), ("float32", pa.float32()), ("double", pa.float64()),
    ("bool", pa.bool_()), ("string", pa.string()), ("binary", pa.binary()), ("date32", pa.date32()),
    ("timestamp[ns]", pa.timestamp("ns")), ("timestamp[us, tz=UTC]", pa.timestamp("us", tz="UTC")),
    ("duration[ms]", pa.duration("ms")), ("decimal128(10, 2)", pa.decimal128(10, 2)),
    ("list<string>", pa.list_(pa.string())), ("time64[us]", pa.time64("us")),
])
def test_type_names_map_to_arrow_types_and_back(name, arrow_type):
    assert parse_type(name) == arrow_type
    assert parse_type(type_name(arrow_type)) == arrow_type


@pytest.mark.parametrize("name", ["int46", "timestamp[m]", "text", "list<nope>", "", "decimal128(99, 2)"])
def test_unknown_type_names_are_refused(name):
    with pytest.raises(ValueError, match="unknown type"):
        parse_type(name)


def test_types_a_program_cannot_name_are_refused_when_written_back():
    with pytest.raises(ValueError, match="cannot be named"):
        type_name(pa.struct([("a", pa.int8())]))

"""`--where FIELD OP VALUE` (ramen/cli/rows.py): what it keeps, and a mistake named in one line."""

import pyarrow as pa
import pytest

from ramen.cli.errors import UserError
from ramen.cli.rows import parse_where

SCHEMA = pa.schema([("ts", pa.timestamp("us")), ("host", pa.string()), ("bytes", pa.int64())])
BATCH = pa.record_batch([pa.array([0, 1, 2], pa.timestamp("us")), pa.array(["a", "b", "c"]),
                         pa.array([4, 5, 6], pa.int64())], schema=SCHEMA)


@pytest.mark.parametrize("text, kept", [("bytes > 4", [False, True, True]), ("bytes>=5", [False, True, True]),
                                        ("host = 'b'", [False, True, False]), ("bytes != 5", [True, False, True]),
                                        ("ts < 1970-01-01T00:00:00.000002", [True, True, False])])
def test_a_filter_keeps_the_rows_it_says(text, kept):
    assert parse_where(text, SCHEMA)(BATCH).to_pylist() == kept


@pytest.mark.parametrize("text, problem", [
    ("bytes >> 5", "'>>' is not an operator (one of = != < <= > >=)"),  # it said "'> 5' is not a int64"
    ("bytes =< 5", "'=<' is not an operator"),
    ("bytes >", "expected 'FIELD OP VALUE'"),
    ("bits > 5", "no field 'bits' (fields: ts, host, bytes)"),
    ("bytes > five", "'five' is not a int64"),
])
def test_a_mistake_is_named(text, problem):
    with pytest.raises(UserError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_where(text, SCHEMA)

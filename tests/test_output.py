"""The CLI's row writers (ramen/cli/output.py) and `ramen replay`'s streaming loop: formats read back
by their own readers, RFC 3339 times, the table's pages, --limit, and a reader that goes away.

(Here rather than under tests/cli, whose fixtures start Spark for `ramen run`'s checks.)"""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ramen.cli.errors import OutputError
from ramen.cli.output import TABLE_NULL, open_writer, rfc3339
from ramen.cli.replay import _stream

T0 = 1_795_608_900_000_000  # 2026-11-25T12:15:00Z
SCHEMA = pa.schema([("ts", pa.timestamp("us")), ("host", pa.string()), ("bytes", pa.int64()),
                    ("ratio", pa.float64())])


def batch(first: int, rows: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array([T0 + (first + i) * 250_000 for i in range(rows)], pa.timestamp("us")),
                            pa.array([f"h{(first + i) % 3}" for i in range(rows)]),
                            pa.array(range(first, first + rows), pa.int64()),
                            pa.array([(first + i) / 4 for i in range(rows)], pa.float64())], schema=SCHEMA)


def written(output_format: str, batches: list[pa.RecordBatch], **options) -> bytes:
    sink = io.BytesIO()
    writer = open_writer(output_format, sink, SCHEMA, **options)
    for b in batches:
        writer.write(b)
    writer.close()
    return sink.getvalue()


def test_rfc3339_is_utc_with_z_and_a_fraction_only_when_not_whole():
    times = pa.array([T0, T0 + 250_000, T0 + 1, None, 0], pa.timestamp("us"))
    assert rfc3339(times).to_pylist() == ["2026-11-25T12:15:00Z", "2026-11-25T12:15:00.25Z",
                                          "2026-11-25T12:15:00.000001Z", None, "1970-01-01T00:00:00Z"]


def test_rfc3339_of_other_units_and_zoned_columns_is_the_same_instant():
    assert rfc3339(pa.array([T0 // 1000], pa.timestamp("ms", tz="Europe/Paris"))).to_pylist() == \
        ["2026-11-25T12:15:00Z"]
    assert rfc3339(pa.array([T0 * 1000 + 500_000_000, T0 * 1000 + 1_999], pa.timestamp("ns"))).to_pylist() == \
        ["2026-11-25T12:15:00.5Z", "2026-11-25T12:15:00.000001Z"]  # to the µs, ramen's unit


def test_rfc3339_in_a_local_zone_carries_each_rows_offset_across_daylight_saving():
    july = 1_783_000_000_000_000  # 2026-07-02, summer time in Paris
    got = rfc3339(pa.array([T0, july], pa.timestamp("us")), "Europe/Paris").to_pylist()
    assert got == ["2026-11-25T13:15:00+01:00", "2026-07-02T15:46:40+02:00"]


def test_csv_reads_back_with_its_header_and_rfc3339_times():
    data = written("csv", [batch(0, 5), batch(5, 3)], header=True)
    lines = data.decode().splitlines()
    assert lines[0] == '"ts","host","bytes","ratio"'
    assert lines[1] == '"2026-11-25T12:15:00Z","h0",0,0'
    assert lines[2].startswith('"2026-11-25T12:15:00.25Z"')
    back = pacsv.read_csv(io.BytesIO(data))
    assert back.num_rows == 8 and back["bytes"].to_pylist() == list(range(8))
    assert back["ts"].cast(pa.timestamp("us")).cast(pa.int64()).to_pylist() == [T0 + i * 250_000 for i in range(8)]


def test_csv_without_header_has_rows_only():
    assert written("csv", [batch(0, 2)]).decode().splitlines()[0] == '"2026-11-25T12:15:00Z","h0",0,0'


def test_jsonl_is_one_object_per_row_with_escaped_strings_and_null_for_what_json_cannot_say():
    odd = pa.record_batch([pa.array([T0, None], pa.timestamp("us")), pa.array(['a"b\\c\n\t\x01', None]),
                           pa.array([None, 7], pa.int64()), pa.array([float("nan"), 1.5])], schema=SCHEMA)
    rows = [json.loads(line) for line in written("jsonl", [odd, batch(0, 1)]).decode().splitlines()]
    assert rows == [{"ts": "2026-11-25T12:15:00Z", "host": 'a"b\\c\n\t\x01', "bytes": None, "ratio": None},
                    {"ts": None, "host": None, "bytes": 7, "ratio": 1.5},
                    {"ts": "2026-11-25T12:15:00Z", "host": "h0", "bytes": 0, "ratio": 0.0}]


def test_jsonl_keys_keep_the_schema_order_and_json_dumps_spacing():
    line = written("jsonl", [batch(1, 1)]).decode()
    assert line == '{"ts": "2026-11-25T12:15:00.25Z", "host": "h1", "bytes": 1, "ratio": 0.25}\n'
    assert line == json.dumps(json.loads(line)) + "\n"  # spaced as ramen ps --json (json.dumps) spaces


def test_table_widths_come_from_the_first_page_and_a_wider_value_later_overflows():
    wide = pa.record_batch([pa.array([T0], pa.timestamp("us")), pa.array(["a-much-longer-host"]),
                            pa.array([None], pa.int64()), pa.array([2.0])], schema=SCHEMA)
    sink = io.BytesIO()
    writer = open_writer("table", sink, SCHEMA)
    writer.page_rows = 2
    writer.write(batch(0, 1))
    assert sink.getvalue() == b""  # the first page is not full: its widths are not known yet
    writer.write(batch(1, 1))
    first_page = sink.getvalue().decode().splitlines()
    assert first_page == ["ts                       host  bytes  ratio",
                          "2026-11-25T12:15:00Z     h0    0      0",
                          "2026-11-25T12:15:00.25Z  h1    1      0.25"]
    writer.write(wide)
    writer.close()
    assert sink.getvalue().decode().splitlines()[3] == f"2026-11-25T12:15:00Z     a-much-longer-host  {TABLE_NULL}   2"


def test_table_of_fewer_rows_than_a_page_prints_at_close_and_of_none_prints_its_header():
    assert len(written("table", [batch(0, 3)]).decode().splitlines()) == 4
    assert written("table", []).decode() == "ts  host  bytes  ratio\n"


def test_parquet_reads_back_in_row_groups_of_the_size_asked(tmp_path):
    path = tmp_path / "out.parquet"
    with open(path, "wb") as sink:
        writer = open_writer("parquet", sink, SCHEMA)
        writer.row_group_rows = 10
        for first in range(0, 35, 5):
            writer.write(batch(first, 5))
        writer.close()
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [10, 10, 10, 5]
    assert pq.read_table(path).equals(pa.Table.from_batches([batch(0, 35)]))


def test_arrow_stream_reads_back_with_its_types():
    data = written("arrow", [batch(0, 4), batch(4, 4)])
    table = pa.ipc.open_stream(data).read_all()
    assert table.schema == SCHEMA and table.equals(pa.Table.from_batches([batch(0, 8)]))


@pytest.mark.parametrize("output_format", ["csv", "jsonl", "table", "arrow"])
def test_a_reader_that_went_away_is_a_broken_pipe_error(output_format):
    read_end, write_end = os.pipe()
    os.close(read_end)
    sink = os.fdopen(write_end, "wb", buffering=0)
    try:
        with pytest.raises(BrokenPipeError):
            writer = open_writer(output_format, sink, SCHEMA)
            writer.write(batch(0, 20_000))
            writer.close()
    finally:
        sink.close()  # unbuffered: nothing left to flush into the broken pipe


class FullDisk(io.RawIOBase):
    """A sink that takes `room` bytes, then fails as a full disk does."""

    def __init__(self, room: int) -> None:
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return len(data)


@pytest.mark.parametrize("output_format", ["csv", "jsonl", "table", "parquet", "arrow"])
@pytest.mark.parametrize("fills", ["at once", "halfway", "at the last byte"])
def test_an_output_that_fills_up_is_a_one_line_output_error(output_format, fills):
    """Whether the disk fills at the header, at a batch or only at the end (a table's first page,
    a parquet footer), the command gets an OutputError, which it prints as its one line."""
    batches = [batch(first, 1_000) for first in range(0, 3_000, 1_000)]
    size = len(written(output_format, batches))
    room = {"at once": 0, "halfway": size // 2, "at the last byte": size - 1}[fills]
    with pytest.raises(OutputError, match=r"^cannot write the output: No space left on device$"):
        writer = open_writer(output_format, FullDisk(room), SCHEMA)
        for b in batches:
            writer.write(b)
        writer.close()


# As ramen replay ends (ramen.cli.main.main), stdout buffered (/dev/full's own buffer is a few
# bytes): the flush before the exit writes it.
EXIT_PROBE = ("import io, os, sys; from ramen.cli import main; "
              "sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, 'w'), buffer_size=1 << 16)); "
              "sys.stdout.write('x' * 500); os._exit(main._flushed('replay', 0))")


def test_exiting_at_once_flushes_the_output_first():
    result = subprocess.run([sys.executable, "-c", EXIT_PROBE], capture_output=True, text=True)
    assert (result.returncode, result.stdout, result.stderr) == (0, "x" * 500, "")


def test_exiting_at_once_with_output_that_cannot_be_flushed_is_a_one_line_error():
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-c", EXIT_PROBE], stdout=full, stderr=subprocess.PIPE, text=True)
    assert (result.returncode, result.stderr) == (1, "ramen: replay: cannot write the output: No space left on device\n")


class Source:
    """Batches as a replay gives them, counting how many were taken."""

    def __init__(self, count: int, rows: int) -> None:
        self.taken = 0
        self.count, self.rows = count, rows

    def __iter__(self):
        for i in range(self.count):
            self.taken += 1
            yield batch(i * self.rows, self.rows)


def test_limit_stops_after_n_rows_without_reading_further():
    source, sink = Source(10, 4), io.BytesIO()
    writer = open_writer("jsonl", sink, SCHEMA)
    complete = _stream(iter(source), [], None, [], writer, limit=6)
    assert complete is False and source.taken == 2
    assert [json.loads(line)["bytes"] for line in sink.getvalue().decode().splitlines()] == list(range(6))


def test_stream_filters_and_selects_fields_and_reads_to_the_end_without_limit():
    from ramen.replay.order import ReorderBuffer
    source, sink = Source(3, 4), io.BytesIO()
    out_schema = pa.schema([SCHEMA.field("bytes")])
    writer = open_writer("csv", sink, out_schema)
    keep = lambda b: pc.greater(b.column("bytes"), 4)  # noqa: E731
    complete = _stream(iter(source), [keep], ReorderBuffer(SCHEMA, "ts", 0), ["bytes"], writer, limit=None)
    writer.close()
    assert complete is True and sink.getvalue().decode().split() == [str(i) for i in range(5, 12)]


def test_rfc3339_of_a_column_is_the_text_ramen_times_gives_one_time():
    from ramen.times import format_rfc3339
    micros = [0, T0, T0 + 1, T0 + 10, T0 + 250_000, T0 + 999_999, T0 + 59 * 1_000_000 + 120_000]
    assert rfc3339(pa.array(micros, pa.timestamp("us"))).to_pylist() == [format_rfc3339(m) for m in micros]

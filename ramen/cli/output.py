"""Writers of rows for the CLI (`ramen replay`, later `ramen tail`) and the benches: a batch at a
time, into a binary sink, with no Python step per row or cell where pyarrow can do the work.

Formats:
- `table`: aligned columns for a person; the widths come from the first page (TABLE_PAGE_ROWS rows)
  and stay: a later, wider value overflows its column instead of being cut.
- `csv`: pyarrow's CSVWriter, a batch at a time (strings, timestamps included, are quoted).
- `jsonl`: one JSON object per row, spaced as json.dumps (and `ramen ps --json`) spaces them, built
  column-wise with pyarrow compute.
- `parquet`: a row group every PARQUET_ROW_GROUP_ROWS rows or so.
- `arrow`: an Arrow IPC stream (`pyarrow.ipc.open_stream` reads it back).

In table, csv and jsonl, timestamps are RFC 3339 in UTC, `2026-11-25T12:15:00Z`, with fractional
seconds only when the time has some (`…:00.25Z`); with a local zone, `2026-11-25T13:15:00+01:00`.
Parquet and Arrow keep the typed columns. Timestamps before 1970 are not shown (ramen's times
start at the epoch, ramen.times.MIN_TIME_US).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc

from ramen.arrow_text import text_bytes
from ramen.cli.errors import writing

__all__ = ["FORMATS", "TEXT_FORMATS", "RowWriter", "local_zone", "open_writer", "rfc3339"]

FORMATS = ("table", "csv", "jsonl", "parquet", "arrow")
TEXT_FORMATS = frozenset({"table", "csv", "jsonl"})
TABLE_PAGE_ROWS = 1000
"""Rows the table format looks at for its column widths before it prints anything."""
TABLE_GAP = "  "
TABLE_NULL = "null"
PARQUET_ROW_GROUP_ROWS = 1 << 20
"""Rows held before a parquet row group is written: a few replay batches, a reader's usual group."""
MICROS_PER_SECOND = 1_000_000
_NEEDS_ESCAPE = r'[\\"\x00-\x1f]'  # RE2: a backslash, a quote or a control character
_CONTROL = r"[\x00-\x1f]"


# -- values as text -----------------------------------------------------------------------------

def local_zone() -> str:
    """The IANA name of this host's zone ($TZ, else /etc/localtime's link), for --local; 'UTC' when
    neither names one (pyarrow needs a name, not an offset, to follow daylight saving)."""
    tz = os.environ.get("TZ", "").lstrip(":")
    if tz:
        return tz
    try:
        target = os.readlink("/etc/localtime")
    except OSError:
        return "UTC"
    marker = "zoneinfo/"
    return target.split(marker, 1)[1] if marker in target else "UTC"


def rfc3339(column: pa.Array | pa.ChunkedArray, zone: str | None = None) -> pa.Array | pa.ChunkedArray:
    """A timestamp column as RFC 3339 strings (nulls stay null): UTC with `Z`, or the wall time in
    `zone` with its offset. Fractional seconds only when not whole, without trailing zeros.

    Built from Arrow's own cast to text (`2026-11-25 12:15:00.250000`), edited column-wise:
    pyarrow's strftime costs about 1 µs a value, the cast and edits about a tenth of that."""
    # To µs, ramen's unit (nanoseconds are cut, not refused), UTC wall time.
    utc = column.cast(pa.timestamp("us", tz=column.type.tz), safe=False).cast(pa.timestamp("us"))
    if zone is None:
        wall, suffix = utc, "Z"
    else:
        wall = pc.local_timestamp(utc.cast(pa.timestamp("us", tz=zone)))
        suffix = _offsets(wall, utc)
    text = pc.utf8_replace_slice(wall.cast(pa.string()), start=10, stop=11, replacement="T")
    # Trailing zeros of the fraction go, then its dot if nothing is left of it; seconds keep theirs.
    text = pc.utf8_rtrim(pc.utf8_rtrim(text, characters="0"), characters=".")
    return pc.binary_join_element_wise(text, suffix, "")


def _offsets(wall: pa.Array | pa.ChunkedArray, utc: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Each row's UTC offset as `+01:00`: the few distinct offsets of a batch formatted once each."""
    seconds = pc.divide(pc.subtract(wall.cast(pa.int64()), utc.cast(pa.int64())), MICROS_PER_SECOND)
    encoded = pc.dictionary_encode(seconds)
    chunks = encoded.chunks if isinstance(encoded, pa.ChunkedArray) else [encoded]
    out = []
    for chunk in chunks:
        names = [None if s is None else f"{'-' if s < 0 else '+'}{abs(s) // 3600:02d}:{abs(s) % 3600 // 60:02d}"
                 for s in chunk.dictionary.to_pylist()]
        out.append(pa.array(names, pa.string()).take(chunk.indices))
    return pa.chunked_array(out, pa.string()) if isinstance(encoded, pa.ChunkedArray) else out[0]


def as_text(batch: pa.RecordBatch, zone: str | None = None) -> pa.RecordBatch:
    """The batch with its timestamp columns as RFC 3339 strings (the text formats' view of it)."""
    if not any(pa.types.is_timestamp(f.type) for f in batch.schema):
        return batch
    columns = [rfc3339(c, zone) if pa.types.is_timestamp(c.type) else c for c in batch.columns]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _json_escaped(strings: pa.Array) -> pa.Array:
    """JSON string bodies: backslash and quote escaped, control characters as JSON wants them.
    Most batches have none of these: one look for any costs less than the replacements."""
    if not pc.any(pc.match_substring_regex(strings, _NEEDS_ESCAPE)).as_py():
        return strings
    out = pc.replace_substring(strings, "\\", "\\\\")
    out = pc.replace_substring(out, '"', '\\"')
    for char, escape in (("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")):
        out = pc.replace_substring(out, char, escape)
    if pc.any(pc.match_substring_regex(out, _CONTROL)).as_py():
        for code in (c for c in range(0x20) if chr(c) not in "\n\r\t"):
            out = pc.replace_substring(out, chr(code), f"\\u{code:04x}")
    return out


def _json_values(column: pa.Array, zone: str | None = None) -> pa.Array:
    """Each value's JSON text (null for nulls, NaN and infinities, which JSON has no word for)."""
    kind = column.type
    if pa.types.is_timestamp(kind):  # RFC 3339 has nothing to escape
        text = pc.binary_join_element_wise('"', rfc3339(column, zone), '"', "")
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = pc.binary_join_element_wise('"', _json_escaped(column.cast(pa.string())), '"', "")
    elif pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        text = column.cast(pa.string())
    elif pa.types.is_floating(kind):
        text = pc.if_else(pc.is_finite(column), column.cast(pa.string()), pa.scalar(None, pa.string()))
    else:  # dates, lists, structs, decimals…: rare in ramen's schemas, worth no fast path
        text = pa.array([json.dumps(v, default=str) for v in column.to_pylist()], pa.string())
    return pc.fill_null(text, "null")


# -- writers --------------------------------------------------------------------------------------

class RowWriter:
    """Writes batches of one schema to a binary sink, each as soon as it is given."""

    def __init__(self, sink: BinaryIO, schema: pa.Schema) -> None:
        self.sink = sink
        self.schema = schema
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        with writing():
            self._write(batch)

    def _write(self, batch: pa.RecordBatch) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Write what is held back (a first page, a row group, a stream's end) and flush."""
        with writing():
            self._finish()
            self.sink.flush()

    def _finish(self) -> None:
        """What the format holds back until the end."""

    def abandon(self) -> None:
        """The rows will never be whole (the replay failed): write no end that would make them look so."""


class CsvWriter(RowWriter):
    def __init__(self, sink: BinaryIO, schema: pa.Schema, *, header: bool = False, zone: str | None = None) -> None:
        super().__init__(sink, schema)
        import pyarrow.csv as pacsv
        self.zone = zone
        text_schema = pa.schema([pa.field(f.name, pa.string()) if pa.types.is_timestamp(f.type) else f
                                 for f in schema])
        self._file = pa.PythonFile(sink, mode="w")
        self._csv = pacsv.CSVWriter(self._file, text_schema, write_options=pacsv.WriteOptions(include_header=header))

    def _write(self, batch: pa.RecordBatch) -> None:
        self._csv.write_batch(as_text(batch, self.zone))

    def _finish(self) -> None:
        self._csv.close()


class JsonlWriter(RowWriter):
    """One object per row, keys in schema order: lines built column-wise, written as one buffer."""

    def __init__(self, sink: BinaryIO, schema: pa.Schema, *, zone: str | None = None) -> None:
        super().__init__(sink, schema)
        self.zone = zone
        # json.dumps's separators, as `ramen ps --json` and the replay's jsonl before it spaced them.
        self._keys = [("{" if i == 0 else ", ") + json.dumps(name) + ": " for i, name in enumerate(schema.names)]

    def _write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        parts: list = []
        for key, column in zip(self._keys, batch.columns):
            parts += [key, _json_values(column, self.zone)]
        lines = pc.binary_join_element_wise(*parts, "}\n", "")
        self.sink.write(text_bytes(lines))


class TableWriter(RowWriter):
    """Aligned columns. The first page (TABLE_PAGE_ROWS rows, or fewer at the end) is held to size
    the columns; every later batch is printed at once with those widths, a wider value overflowing."""

    def __init__(self, sink: BinaryIO, schema: pa.Schema, *, zone: str | None = None,
                 page_rows: int = TABLE_PAGE_ROWS) -> None:
        super().__init__(sink, schema)
        self.zone = zone
        self.page_rows = page_rows
        self.widths: list[int] | None = None
        self._page: list[pa.RecordBatch] = []
        self._held = 0

    def _write(self, batch: pa.RecordBatch) -> None:
        if self.widths is None:
            self._page.append(batch)
            self._held += batch.num_rows
            if self._held >= self.page_rows:
                self._first_page()
            return
        self._print(batch)

    def _cells(self, batch: pa.RecordBatch) -> list[pa.Array]:
        batch = as_text(batch, self.zone)
        return [pc.fill_null(c if pa.types.is_string(c.type) else c.cast(pa.string()), TABLE_NULL)
                for c in batch.columns]

    def _first_page(self) -> None:
        page = pa.Table.from_batches(self._page, schema=self.schema).combine_chunks()
        self._page, self._held = [], 0
        batch = page.to_batches()[0] if page.num_rows else None
        cells = self._cells(batch) if batch is not None else []
        self.widths = [max(len(name), pc.max(pc.utf8_length(c)).as_py() or 0 if len(c) else 0)
                       for name, c in zip(self.schema.names, cells or [()] * len(self.schema))]
        header = TABLE_GAP.join(n.ljust(w) for n, w in zip(self.schema.names, self.widths)).rstrip() + "\n"
        self.sink.write(header.encode())
        if batch is not None:
            self._print(batch, cells)

    def _print(self, batch: pa.RecordBatch, cells: list[pa.Array] | None = None) -> None:
        if batch.num_rows == 0:
            return
        cells = cells if cells is not None else self._cells(batch)
        padded = [pc.utf8_rpad(c, width=w, padding=" ") for c, w in zip(cells, self.widths)]
        lines = pc.utf8_rtrim(pc.binary_join_element_wise(*padded, TABLE_GAP), characters=" ")
        self.sink.write(text_bytes(pc.binary_join_element_wise(lines, "\n", "")))

    def _finish(self) -> None:
        if self.widths is None:
            self._first_page()


class ParquetWriter(RowWriter):
    def __init__(self, sink: BinaryIO, schema: pa.Schema, *, row_group_rows: int = PARQUET_ROW_GROUP_ROWS) -> None:
        super().__init__(sink, schema)
        import pyarrow.parquet as pq
        self.row_group_rows = row_group_rows
        self._file = pa.PythonFile(sink, mode="w")
        self._parquet = pq.ParquetWriter(self._file, schema)
        self._held: list[pa.RecordBatch] = []
        self._held_rows = 0

    def _write(self, batch: pa.RecordBatch) -> None:
        self._held.append(batch)
        self._held_rows += batch.num_rows
        if self._held_rows >= self.row_group_rows:
            self._flush_group()

    def _flush_group(self) -> None:
        if self._held_rows:
            self._parquet.write_table(pa.Table.from_batches(self._held, schema=self.schema),
                                      row_group_size=self._held_rows)
        self._held, self._held_rows = [], 0

    def _finish(self) -> None:
        self._flush_group()
        self._parquet.close()

    def abandon(self) -> None:
        self._parquet.is_open = False  # pyarrow's writer would write its footer when collected


class ArrowStreamWriter(RowWriter):
    def __init__(self, sink: BinaryIO, schema: pa.Schema) -> None:
        super().__init__(sink, schema)
        self._file = pa.PythonFile(sink, mode="w")
        self._stream = pa.ipc.new_stream(self._file, schema)

    def _write(self, batch: pa.RecordBatch) -> None:
        self._stream.write_batch(batch)

    def _finish(self) -> None:
        self._stream.close()


def open_writer(output_format: str, sink: BinaryIO, schema: pa.Schema, *, header: bool = False,
                zone: str | None = None) -> RowWriter:
    """The writer of `output_format` (one of FORMATS) over `sink`. `zone`: an IANA zone to show
    times in (None: UTC); `header`: a header line for csv (table always has one)."""
    with writing():  # a header, a stream's schema
        if output_format == "csv":
            return CsvWriter(sink, schema, header=header, zone=zone)
        if output_format == "jsonl":
            return JsonlWriter(sink, schema, zone=zone)
        if output_format == "table":
            return TableWriter(sink, schema, zone=zone)
        if output_format == "parquet":
            return ParquetWriter(sink, schema)
        if output_format == "arrow":
            return ArrowStreamWriter(sink, schema)
    raise ValueError(f"unknown output format {output_format!r} (formats: {', '.join(FORMATS)})")


def open_sink(path: Path | None) -> BinaryIO:
    """`path` opened for writing, or stdout's binary side when None."""
    import sys
    if path is None:
        return sys.stdout.buffer
    with writing(str(path)):
        return open(path, "wb")  # noqa: SIM115 - closed by the caller

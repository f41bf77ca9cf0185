"""Where a source function's rows come from: a deterministic generator, or csv/jsonl/parquet files.

A source is polled from the worker's duty cycle: `poll(now_us)` returns the next batch (at most
BATCH_ROWS rows) or None when nothing is due, and never blocks.

The generator's rows are a pure function of (seed, event time): row n sits at event time
n·step on a grid of step = 1/rate seconds aligned to the epoch, and its values come from a
counter-based RNG (Philox keyed by the seed, counter n). So any range of its output can be
recomputed (`generate_rows`) to check a live run, a restart or a replay, and two runs with the same
seed agree row for row. With `backfill` it first produces [now − backfill, now) as fast as it can,
then follows real time.

File sources read a file or every file of a directory (by extension), in event-time order; with
`follow = true` they keep reading what is appended to files and new files as they appear (each
newly read piece in event-time order).
"""

from __future__ import annotations

import io
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.program.durations import parse_duration
from ramen.program.model import Function
from workers.defaults import (BATCH_ROWS, FOLLOW_INTERVAL_S, GENERATOR_BYTES_MAX, GENERATOR_BYTES_MIN,
                              GENERATOR_DEFAULT_HOSTS, GENERATOR_DEFAULT_RATE, GENERATOR_DEFAULT_SEED,
                              GENERATOR_FLUSH_INTERVAL_S, GENERATOR_INT_RANGE)

log = logging.getLogger(__name__)

WORDS_PER_ROW = 4
"""Philox-4x64 yields four 64-bit words per counter value: one counter value per row."""
FILE_EXTENSIONS = {"csv": (".csv",), "jsonl": (".jsonl", ".json", ".ndjson"), "parquet": (".parquet", ".pq")}


class SourceError(ValueError):
    """A source that cannot run as configured; the message is one line."""


class RowSource(Protocol):
    def poll(self, now_us: int) -> pa.RecordBatch | None: ...

    @property
    def resumes_from_us(self) -> int | None:
        """The event time from which this source, restarted, goes on with no row missing since its
        previous run's last; None when it starts afresh."""


# -- the generator ------------------------------------------------------------------------------

def host_names(hosts: int) -> pa.Array:
    width = max(2, len(str(hosts - 1)))
    return pa.array([f"host{i:0{width}d}" for i in range(hosts)], pa.string())


def _fill(field_: pa.Field, words: np.ndarray, times_us: np.ndarray, hosts: pa.Array) -> pa.Array:
    """A column of generated values for one field, by its type (and name, for a few common ones)."""
    kind = field_.type
    name = field_.name.lower()
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return pa.array(times_us, pa.timestamp("us")).cast(kind)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        if "host" in name or len(hosts) == 0:
            return pc.take(hosts, pa.array(words % np.uint64(len(hosts)))).cast(kind)
        names = pa.array([f"{field_.name}{i}" for i in range(len(hosts))], pa.string())
        return pc.take(names, pa.array(words % np.uint64(len(hosts)))).cast(kind)
    if pa.types.is_boolean(kind):
        return pa.array((words & np.uint64(1)).astype(bool))
    if pa.types.is_integer(kind):
        if "byte" in name or "size" in name or "len" in name:
            values = GENERATOR_BYTES_MIN + (words % np.uint64(GENERATOR_BYTES_MAX - GENERATOR_BYTES_MIN)).astype(np.int64)
        else:
            values = (words % np.uint64(GENERATOR_INT_RANGE)).astype(np.int64)
        return pa.array(values).cast(kind)
    if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return pa.array((words >> np.uint64(11)).astype(np.float64) / float(1 << 53)).cast(kind)
    return pa.nulls(len(words), kind)


def generate_rows(schema: pa.Schema, event_time: str | None, *, seed: int, hosts: int, step_us: int,
                  first_index: int, count: int) -> pa.RecordBatch:
    """Rows first_index .. first_index+count-1 of the generator's grid: the same rows whatever the
    batching, so tests and benchmarks recompute what a worker produced."""
    words = np.random.Philox(counter=first_index, key=seed & ((1 << 128) - 1)).random_raw(
        WORDS_PER_ROW * count).reshape(count, WORDS_PER_ROW) if count else np.zeros((0, WORDS_PER_ROW), np.uint64)
    times_us = (np.arange(first_index, first_index + count, dtype=np.int64) * step_us)
    names = host_names(hosts)
    columns = []
    value_index = 0
    for field_ in schema:
        if field_.name == event_time:
            columns.append(pa.array(times_us, pa.timestamp("us")).cast(field_.type))
            continue
        column_words = words[:, value_index % WORDS_PER_ROW]
        if value_index >= WORDS_PER_ROW:  # more fields than words: remix so columns differ
            column_words = column_words ^ (column_words >> np.uint64(17 + value_index))
        columns.append(_fill(field_, column_words, times_us, names))
        value_index += 1
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def step_of(rate: float) -> int:
    """The grid step in µs of a generator producing `rate` rows per second."""
    return max(1, round(1_000_000 / rate))


def rows_between(since_us: int, until_us: int, step_us: int) -> tuple[int, int]:
    """(first index, count) of the grid rows with event times in [since_us, until_us)."""
    first = -(-since_us // step_us)
    end = -(-until_us // step_us)
    return first, max(0, end - first)


@dataclass
class GeneratorSource:
    schema: pa.Schema
    event_time: str | None
    rate: float = GENERATOR_DEFAULT_RATE
    hosts: int = GENERATOR_DEFAULT_HOSTS
    seed: int = GENERATOR_DEFAULT_SEED
    backfill_us: int = 0
    start_us: int | None = None
    """Event time of the first row; default: now − backfill at the first poll."""
    batch_rows: int = BATCH_ROWS
    flush_interval_s: float = GENERATOR_FLUSH_INTERVAL_S
    next_index: int | None = field(default=None, init=False)

    @property
    def step_us(self) -> int:
        return step_of(self.rate)

    @property
    def resumes_from_us(self) -> int | None:
        return self.start_us

    def poll(self, now_us: int) -> pa.RecordBatch | None:
        step = self.step_us
        if self.next_index is None:
            start = self.start_us if self.start_us is not None else now_us - self.backfill_us
            self.next_index = -(-start // step)
        due = -(-now_us // step) - self.next_index  # rows with event time < now
        if due <= 0:
            return None
        if due < self.batch_rows and now_us - self.next_index * step < self.flush_interval_s * 1e6:
            return None  # following real time: gather a worthwhile batch (a backfill never waits)
        count = min(due, self.batch_rows)
        batch = generate_rows(self.schema, self.event_time, seed=self.seed, hosts=self.hosts, step_us=step,
                              first_index=self.next_index, count=count)
        self.next_index += count
        return batch


# -- files --------------------------------------------------------------------------------------

def _conform(table: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise SourceError(f"{where}: no column {', '.join(map(repr, missing))} "
                          f"(columns: {', '.join(table.column_names) or 'none'})")
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SourceError(f"{where}: cannot read as {schema}: {str(e).splitlines()[0]}".replace("\n", ", ")) from None


@dataclass
class _FileCursor:
    offset: int = 0
    header: bytes | None = None


@dataclass
class FileSource:
    kind: str
    path: Path
    schema: pa.Schema
    event_time: str | None
    follow: bool = False
    batch_rows: int = BATCH_ROWS
    clock: Callable[[], float] = time.monotonic
    _pending: list[pa.Table] = field(default_factory=list, init=False)
    _cursors: dict[Path, _FileCursor] = field(default_factory=dict, init=False)
    _next_look_s: float = field(default=0.0, init=False)
    _done: bool = field(default=False, init=False)
    resumes_from_us = None
    """A file source reads its files from the start again."""

    def poll(self, now_us: int) -> pa.RecordBatch | None:
        if not self._pending and not self._done and self.clock() >= self._next_look_s:
            self._read_new()
            self._next_look_s = self.clock() + FOLLOW_INTERVAL_S
            if not self.follow:
                self._done = True
        while self._pending:
            table = self._pending[0]
            if table.num_rows == 0:
                self._pending.pop(0)
                continue
            head = table.slice(0, self.batch_rows)
            if table.num_rows > self.batch_rows:
                self._pending[0] = table.slice(self.batch_rows)
            else:
                self._pending.pop(0)
            return head.combine_chunks().to_batches()[0] if head.num_rows else None
        return None

    @property
    def exhausted(self) -> bool:
        return self._done and not self._pending

    def files(self) -> list[Path]:
        if self.path.is_dir():
            return sorted(p for p in self.path.iterdir()
                          if p.is_file() and p.name.endswith(FILE_EXTENSIONS[self.kind]))
        if self.path.is_file():
            return [self.path]
        if not self.follow:
            raise SourceError(f"{self.path}: no such file or directory")
        return []

    def _read_new(self) -> None:
        tables = []
        for path in self.files():
            table = self._read_file(path)
            if table is not None and table.num_rows:
                tables.append(table)
        if not tables:
            return
        table = pa.concat_tables(tables)
        if self.event_time is not None:
            table = table.sort_by(self.event_time)
        self._pending.append(table)

    def _read_file(self, path: Path) -> pa.Table | None:
        cursor = self._cursors.setdefault(path, _FileCursor())
        if self.kind == "parquet":
            if cursor.offset:  # a parquet file is whole when it appears: read each once
                return None
            import pyarrow.parquet as pq
            cursor.offset = 1
            return _conform(pq.read_table(path), self.schema, str(path))
        with open(path, "rb") as f:
            f.seek(cursor.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1 if self.follow else len(data)
        if end <= 0:
            return None  # no complete line yet
        chunk = data[:end]
        cursor.offset += end
        if self.kind == "csv":
            return self._read_csv(path, cursor, chunk)
        return self._read_jsonl(path, chunk)

    def _read_csv(self, path: Path, cursor: _FileCursor, chunk: bytes) -> pa.Table | None:
        import pyarrow.csv as pcsv
        if cursor.header is None:
            newline = chunk.find(b"\n")
            cursor.header = chunk[:newline + 1] if newline >= 0 else chunk + b"\n"
            chunk = chunk[len(cursor.header):] if newline >= 0 else b""
        if not chunk.strip():
            return None
        names = cursor.header.decode().strip().split(",")
        types = {f.name: f.type for f in self.schema if f.name in names}
        try:
            table = pcsv.read_csv(io.BytesIO(cursor.header + chunk),
                                  convert_options=pcsv.ConvertOptions(column_types=types))
        except pa.ArrowInvalid as e:
            raise SourceError(f"{path}: {str(e).splitlines()[0]}") from None
        return _conform(table, self.schema, str(path))

    def _read_jsonl(self, path: Path, chunk: bytes) -> pa.Table | None:
        import pyarrow.json as pjson
        if not chunk.strip():
            return None
        try:
            table = pjson.read_json(io.BytesIO(chunk), parse_options=pjson.ParseOptions(
                explicit_schema=self.schema, unexpected_field_behavior="ignore"))
        except pa.ArrowInvalid as e:
            raise SourceError(f"{path}: {str(e).splitlines()[0]}") from None
        return _conform(table, self.schema, str(path))


# -- from a program -----------------------------------------------------------------------------

def resume_start(start_us: int, backfill_us: int, now_us: int) -> int:
    """Where a restarted generator begins: at `start_us`, just after its previous run's last row,
    unless that is longer ago than its backfill. A generator never makes more than `backfill` of
    the past at a start (after days down, it would make days of rows before following real
    time); the rows it skips are missing from its archive, whose coverage shows the gap."""
    return max(start_us, now_us - backfill_us)


def make_source(function: Function, program_path: str | None, *, start_us: int | None = None,
                clock: Clock = SYSTEM_CLOCK) -> RowSource:
    """The row source of a source function. `start_us` (generator only) resumes after what an
    earlier run already wrote, instead of backfilling again (at most `backfill` ago: resume_start)."""
    source = function.source
    if source is None:
        raise SourceError(f"{function.qualified_name} is not a source function")
    if source.kind == "generator":
        backfill = source.option("backfill")
        try:
            backfill_us = parse_duration(backfill) if isinstance(backfill, str) else int((backfill or 0) * 1e6)
        except ValueError as e:
            raise SourceError(f"{function.qualified_name}: source 'backfill': {e}") from None
        if start_us is not None:
            now_us = clock.epoch_us()
            resumed_us = resume_start(start_us, backfill_us, now_us)
            if resumed_us != start_us:
                log.warning("%s: its last row is %.0f s old, more than its backfill: it resumes %g s ago, and "
                            "its archive has a gap before", function.qualified_name, (now_us - start_us) / 1e6,
                            backfill_us / 1e6)
            start_us = resumed_us
        return GeneratorSource(function.schema, function.event_time,
                               rate=source.option("rate", GENERATOR_DEFAULT_RATE),
                               hosts=int(source.option("hosts", GENERATOR_DEFAULT_HOSTS)),
                               seed=int(source.option("seed", GENERATOR_DEFAULT_SEED)),
                               backfill_us=backfill_us, start_us=start_us)
    if source.kind in FILE_EXTENSIONS:
        path = Path(source.option("path"))
        if not path.is_absolute() and program_path:
            path = Path(program_path).parent / path
        return FileSource(source.kind, path, function.schema, function.event_time,
                          follow=bool(source.option("follow", False)), clock=clock.seconds)
    raise SourceError(f"{function.qualified_name}: unknown source kind {source.kind!r}")

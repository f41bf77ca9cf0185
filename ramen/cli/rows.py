"""What `ramen replay` and `ramen tail` share between the rows a replay streams and the writer:
the output options, the fields and `--where` filters checked against the target's schema, and
the event-time order (the reorder buffer as deep as the target's disorder, ramen/replay/order.py).
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ramen.cli.errors import UserError
from ramen.cli.output import FORMATS, TEXT_FORMATS, RowWriter, local_zone, open_writer

log = logging.getLogger(__name__)

Filter = Callable[[pa.RecordBatch], pa.Array]

_WHERE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*([=!<>]+)\s*(.+?)\s*$")
_OPERATORS = {"==": pc.equal, "=": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal,
              ">": pc.greater, ">=": pc.greater_equal}


def add_output_arguments(parser, *, default_format: str) -> None:
    """The options of the rows' selection and form: fields, --where, --format, --json, --output,
    --local, --with-header."""
    parser.add_argument("fields", nargs="*", metavar="FIELD", help="fields to print (default: all)")
    parser.add_argument("--where", action="append", default=[], metavar="'FIELD OP VALUE'",
                        help="keep only rows where this holds (OP: = != < <= > >=); repeatable")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help=f"output format (default {default_format}; parquet and arrow are binary: give --output "
                             f"or redirect)")
    parser.add_argument("--json", action="store_true",
                        help="the same as --format jsonl (one object per row, as ps --json)")
    parser.add_argument("--output", "-o", type=Path, default=None, metavar="FILE", help="write to FILE, not stdout")
    parser.add_argument("--local", action="store_true", help="print times in the local zone, not UTC")
    parser.add_argument("--with-header", action="store_true", help="print a header line with csv")
    parser.set_defaults(default_format=default_format)


def output_format(args) -> str:
    if args.json and args.format not in (None, "jsonl"):
        raise UserError(f"--json is --format jsonl: it cannot go with --format {args.format}")
    chosen = "jsonl" if args.json else (args.format or args.default_format)
    if chosen not in TEXT_FORMATS and args.output is None and sys.stdout.isatty():
        raise UserError(f"--format {chosen} is binary: give --output FILE or redirect stdout")
    return chosen


def open_row_writer(args, chosen_format: str, sink, schema: pa.Schema, fields: list[str]) -> RowWriter:
    """The writer of the rows asked (`fields`, else all of `schema`), in the form the options say."""
    shown = schema if not fields else pa.schema([schema.field(f) for f in fields])
    return open_writer(chosen_format, sink, shown, header=args.with_header, zone=local_zone() if args.local else None)


def schema_of(programs, target: str) -> pa.Schema | None:
    """The target's output schema, to check fields and filters before anything is asked; None for
    an unknown target (the plan says so, with suggestions)."""
    program, _, function = target.partition("/")
    if program in programs and function in programs[program]:
        return programs[program].function(function).schema
    return None


def check_fields(fields: list[str], schema: pa.Schema) -> list[str]:
    for name in fields:
        if schema.get_field_index(name) < 0:
            raise UserError(f"no field {name!r} in the output (fields: {', '.join(schema.names)})")
    return fields


def parse_where(text: str, schema: pa.Schema) -> Filter:
    match = _WHERE.match(text)
    if match is None:
        raise UserError(f"--where {text!r}: expected 'FIELD OP VALUE' with OP one of = != < <= > >=")
    name, op, raw = match.groups()
    if op not in _OPERATORS:
        raise UserError(f"--where {text!r}: {op!r} is not an operator (one of = != < <= > >=)")
    index = schema.get_field_index(name)
    if index < 0:
        raise UserError(f"--where {text!r}: no field {name!r} (fields: {', '.join(schema.names)})")
    field_type = schema.field(index).type
    raw = raw.strip("'\"")
    try:
        value = pa.scalar(raw).cast(field_type) if not pa.types.is_timestamp(field_type) else \
            pa.scalar(raw, pa.string()).cast(field_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise UserError(f"--where {text!r}: {raw!r} is not a {field_type}") from None
    return lambda batch: _OPERATORS[op](batch.column(name), value)


def reorder_buffer(replay, programs, site: str):
    """The reorder buffer for the target's output (None for a target without an event time:
    its rows go out as they come)."""
    from ramen.replay.order import ReorderBuffer, disorder_bound_us, stable_sort_keys
    function = replay.function
    if function.event_time is None:
        return None
    disorder_us = disorder_bound_us(replay.plan, programs, _source_disorder(replay.plan, site))
    log.debug("replay of %s: reorder buffer of %d µs", replay.plan.target, disorder_us)
    return ReorderBuffer(replay.schema, function.event_time, disorder_us,
                         stable_sort_keys(replay.schema, function.event_time, function.window is not None))


def _source_disorder(plan, site: str) -> dict[str, int]:
    """Each source's largest recorded disorder among its recordings of the range (time indexes).
    One that cannot be read counts as 0: its late rows are printed and counted, not lost."""
    from ramen import paths
    from ramen.archive.coverage import recordings_for
    from ramen.archive.errors import ArchiveError
    from ramen.archive.time_index import TimeIndex, index_path
    archive_dir = paths.archive_dir(site)
    found: dict[str, int] = {}
    for source in plan.sources:
        try:
            for r in recordings_for(archive_dir, source, plan.since_us, plan.until_us):
                index = TimeIndex.open(index_path(archive_dir, r.recording_id), r.recording_id)
                found[source] = max(found.get(source, 0), index.disorder_us)
                index.close()
        except (ArchiveError, OSError) as e:
            log.warning("%s: no disorder from its time index (%s): taken as 0", source, e)
    return found


def filtered(batch: pa.RecordBatch, filters: list[Filter]) -> pa.RecordBatch:
    """The batch's rows where every --where holds."""
    for keep in filters:
        batch = batch.filter(keep(batch))
    return batch


def ordered(batches: Iterable[pa.RecordBatch], filters: list[Filter], reorder, fields: list[str]) -> Iterator[pa.Table]:
    """The batches through the filters and the reorder buffer (if any), as tables of the fields asked."""
    def tables():
        for batch in batches:
            batch = filtered(batch, filters)
            if reorder is None:
                yield pa.Table.from_batches([batch])
            else:
                yield from reorder.add(batch)
        if reorder is not None:
            yield from reorder.finish()

    for table in tables():
        yield table.select(fields) if fields else table


class LastRows:
    """The last `count` rows of what is added, in bounded memory: batches are kept until the rows
    after them are enough."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._tables: list[pa.Table] = []
        self._rows = 0

    def add(self, table: pa.Table) -> None:
        if not table.num_rows or not self.count:
            return
        self._tables.append(table)
        self._rows += table.num_rows
        while self._rows - self._tables[0].num_rows >= self.count:
            self._rows -= self._tables.pop(0).num_rows

    @property
    def rows(self) -> int:
        return min(self._rows, self.count)

    def batches(self) -> list[pa.RecordBatch]:
        if not self._tables:
            return []
        table = pa.concat_tables(self._tables)
        return table.slice(max(0, table.num_rows - self.count)).to_batches()


def warn_of_uncovered(replay, command: str) -> None:
    """One line on stderr naming what the archives do not cover of the range (a lenient plan)."""
    from ramen.replay.plan import uncovered_warning
    warning = uncovered_warning(replay.plan)
    if warning is not None:
        print(f"ramen: {command}: warning: {warning}", file=sys.stderr)


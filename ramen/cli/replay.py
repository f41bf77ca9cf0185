"""`ramen replay --since S --until U TARGET [FIELD…]`: what TARGET produced (or would have) over a
past range, from the archives, through the workers on the way, printed in event-time order.

Progress (rows, time to first row) goes to stderr when it is a terminal.
"""

from __future__ import annotations

import re
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ramen.cli import conf
from ramen.cli.errors import UserError
from ramen.times import TIME_FORMS

IDENTITY = "user"
FORMATS = ("table", "csv", "jsonl")
PROGRESS_INTERVAL_S = 0.5
_WHERE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(==|=|!=|<=|>=|<|>)\s*(.+?)\s*$")
_OPERATORS = {"==": pc.equal, "=": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal,
              ">": pc.greater, ">=": pc.greater_equal}


def add_parser(sub) -> None:
    parser = sub.add_parser("replay",
                            description="Replay TARGET (prog/func) over [--since, --until) from the archives "
                                        "and print its tuples in event-time order.")
    parser.add_argument("target", metavar="TARGET", help="the function, as prog/func")
    parser.add_argument("fields", nargs="*", metavar="FIELD", help="fields to print (default: all)")
    parser.add_argument("--since", required=True,
                        help=f"start, included, UTC: {TIME_FORMS}")
    parser.add_argument("--until", default=None,
                        help="end, excluded, same forms, /d rounding up (default: now; a range that ends now or later "
                             "ends as far as the archives reach)")
    parser.add_argument("--where", action="append", default=[], metavar="'FIELD OP VALUE'",
                        help="keep only rows where this holds (OP: = != < <= > >=); repeatable")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    parser.add_argument("--with-header", action="store_true", help="print a header line with csv")
    parser.add_argument("--no-merge", action="store_true",
                        help="no merge window: neither wait for nor merge with concurrent replays (for measurements)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="give up after S seconds (default 300)")
    conf.add_arguments(parser, IDENTITY, site=True)
    parser.set_defaults(run=run)


def run(args) -> int:
    from ramen.replay.client import DEFAULT_REPLAY_TIMEOUT_S, ReplayFailed
    from ramen.replay.plan import ReplayPlanError, check_range
    from ramen.times import TimeError, parse_time
    now_us = time.time_ns() // 1000
    try:
        since_us, until_us = parse_time(args.since, now_us), parse_time(args.until or "now", now_us, end=True)
        check_range(since_us, until_us)
    except (TimeError, ReplayPlanError) as e:
        raise UserError(str(e)) from None
    with conf.connected(args) as client:
        programs = conf.loaded_programs(client)
        schema = _schema_of(programs, args.target)
        fields = _check_fields(args.fields, schema) if schema is not None else []
        filters = [_parse_where(w, schema) for w in args.where] if schema is not None else []
        try:
            replay = _plan(client, programs, args.target, since_us, until_us, to_newest=until_us >= now_us,
                           site=args.site, timeout_s=args.timeout or DEFAULT_REPLAY_TIMEOUT_S, no_merge=args.no_merge)
        except (ReplayPlanError, ReplayFailed) as e:
            raise UserError(str(e)) from None
        progress = _Progress() if sys.stderr.isatty() else None
        with replay:
            replay.start()
            try:
                batches = list(replay.batches(progress))
            except ReplayFailed as e:
                raise UserError(str(e)) from None
        if progress is not None:
            progress.done(replay.progress)
    table = pa.Table.from_batches(batches, schema=replay.schema)
    for keep in filters:
        table = table.filter(keep(table))
    event_time = replay.function.event_time
    if event_time is not None and table.num_rows:
        table = table.sort_by(event_time)
    if fields:
        table = table.select(fields)
    _print(table, args.format, args.with_header)
    return 0


def _plan(client, programs, target: str, since_us: int, until_us: int, *, to_newest: bool, **options):
    """The replay. A range that ends now (no --until, `--until now`, or a time to come) ends as far
    as the archives reach: the newest tuples are still on their way to the disk."""
    from ramen.replay.client import Replay, replay_to_newest
    return (replay_to_newest if to_newest else Replay)(client, programs, target, since_us, until_us, **options)


def _schema_of(programs, target: str) -> pa.Schema | None:
    """The target's output schema, to check fields and filters before anything is asked; None for
    an unknown target (the plan says so, with suggestions)."""
    program, _, function = target.partition("/")
    if program in programs and function in programs[program]:
        return programs[program].function(function).schema
    return None


def _check_fields(fields: list[str], schema: pa.Schema) -> list[str]:
    for name in fields:
        if schema.get_field_index(name) < 0:
            raise UserError(f"no field {name!r} in the output (fields: {', '.join(schema.names)})")
    return fields


def _parse_where(text: str, schema: pa.Schema):
    match = _WHERE.match(text)
    if match is None:
        raise UserError(f"--where {text!r}: expected 'FIELD OP VALUE' with OP one of = != < <= > >=")
    name, op, raw = match.groups()
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
    return lambda table: _OPERATORS[op](table.column(name), value)


def _print(table: pa.Table, output_format: str, with_header: bool) -> None:
    out = sys.stdout
    if output_format == "csv":
        sink = pa.BufferOutputStream()
        pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=with_header))
        out.write(sink.getvalue().to_pybytes().decode())
    elif output_format == "jsonl":
        import json
        for row in table.to_pylist():
            out.write(json.dumps(row, default=str) + "\n")
    else:
        _print_table(table, out)
    out.flush()


def _print_table(table: pa.Table, out) -> None:
    columns = [[str(v) for v in column.to_pylist()] for column in table.columns]
    widths = [max([len(name), *(len(v) for v in values)]) for name, values in zip(table.column_names, columns)]
    out.write("  ".join(n.ljust(w) for n, w in zip(table.column_names, widths)).rstrip() + "\n")
    for row in zip(*columns):
        out.write("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() + "\n")


class _Progress:
    """Rows so far and time to the first row, on one stderr line rewritten in place."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self, progress) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_INTERVAL_S:
            self.last = now
            print(f"\rreplay: {progress.rows:,} rows, {now - progress.started:.1f} s", end="", file=sys.stderr,
                  flush=True)

    def done(self, progress) -> None:
        first = f", first row after {progress.first_row_s:.2f} s" if progress.first_row_s is not None else ""
        print(f"\rreplay: {progress.rows:,} rows in {time.monotonic() - progress.started:.1f} s{first}",
              file=sys.stderr, flush=True)


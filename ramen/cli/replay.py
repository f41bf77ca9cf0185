"""`ramen replay --since S --until U TARGET [FIELD…]`: what TARGET produced (or would have) over a
past range, from the archives, through the workers on the way, printed in event-time order.

Rows are written as they arrive (ramen/cli/output.py), in event-time order through a reorder
buffer as deep as the target's output can be out of order (ramen/replay/order.py says how deep,
and what is guaranteed), so memory holds a few batches whatever the range. A reader that goes
away (`| head`) or `--limit` ends the replay at once: leaving the `with replay` withdraws the
request, and the supervisor stops its replayers.

Timestamps print as RFC 3339 in UTC (`2026-11-25T12:15:00Z`), or in the local zone with --local.
`--json` is `--format jsonl`: one JSON object per row, as `ramen ps --json` prints one per worker.
A windowed target's first and last windows, when the range cuts them, hold only part of their rows:
one warning line on stderr names them, and --whole-windows narrows the range to whole windows.

Progress (rows, time to first row) goes to stderr when it is a terminal.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, Iterable

import pyarrow as pa

from ramen.cli import argtypes, conf, rows
from ramen.cli.errors import OutputError, UserError, silence_stdout, writing
from ramen.cli.output import open_sink
from ramen.times import TIME_FORMS

if TYPE_CHECKING:
    from ramen.cli.output import RowWriter
    from ramen.replay.order import ReorderBuffer

log = logging.getLogger(__name__)

IDENTITY = "user"
PROGRESS_INTERVAL_S = 0.5


def add_parser(sub) -> None:
    parser = sub.add_parser("replay",
                            description="Replay TARGET (prog/func) over [--since, --until) from the archives "
                                        "and print its tuples in event-time order, as they come.")
    parser.add_argument("target", metavar="TARGET", help="the function, as prog/func")
    rows.add_output_arguments(parser, default_format="table")
    parser.add_argument("--since", required=True,
                        help=f"start, included, UTC: {TIME_FORMS}")
    parser.add_argument("--until", default=None,
                        help="end, excluded, same forms, /d rounding up (default: now; a range that ends now or later "
                             "ends as far as the archives reach)")
    parser.add_argument("--limit", type=argtypes.count, default=None, metavar="N",
                        help="stop after N rows (ends the replay)")
    parser.add_argument("--whole-windows", action="store_true",
                        help="a windowed TARGET: leave out the first and last windows when the range cuts them")
    parser.add_argument("--strict", action="store_true",
                        help="refuse a range the archives do not cover whole (default: replay the part they cover, "
                             "with a warning naming the rest)")
    parser.add_argument("--explain", action="store_true",
                        help="print the plan (the range covered, the recordings and positions to read, the functions "
                             "to run) and exit without replaying; with --json, as one JSON object")
    parser.add_argument("--no-merge", action="store_true",
                        help="no merge window: neither wait for nor merge with concurrent replays (for measurements)")
    parser.add_argument("--timeout", type=argtypes.seconds, default=None, metavar="S",
                        help="give up after S seconds (default 300)")
    parser.add_argument("--via-confserver", action="store_true",
                        help="receive the result through the confserver, not a log on this host (for a host with "
                             "no worker of the site; results up to 16 MiB)")
    conf.add_arguments(parser, IDENTITY, site=True)
    parser.set_defaults(run=run)


def run(args) -> int:
    from ramen.replay.client import DEFAULT_REPLAY_TIMEOUT_S, LOST_REPLAY_ATTEMPTS, ReplayFailed
    from ramen.replay.plan import ReplayPlanError, check_range
    from ramen.times import TimeError, parse_time
    output_format = rows.output_format(args)
    now_us = time.time_ns() // 1000
    try:
        since_us, until_us = parse_time(args.since, now_us), parse_time(args.until or "now", now_us, end=True)
        check_range(since_us, until_us)
    except (TimeError, ReplayPlanError) as e:
        raise UserError(str(e)) from None
    with conf.connected(args) as client:
        programs = conf.loaded_programs(client)
        if args.explain:
            return _explain(client, programs, args.target, since_us, until_us, args, to_newest=until_us >= now_us)
        schema = rows.schema_of(programs, args.target)
        fields = rows.check_fields(args.fields, schema) if schema is not None else []
        filters = [rows.parse_where(w, schema) for w in args.where] if schema is not None else []
        options = dict(site=args.site, timeout_s=args.timeout or DEFAULT_REPLAY_TIMEOUT_S, no_merge=args.no_merge,
                       strict=args.strict, relay=args.via_confserver)
        try:
            replay = _plan(client, programs, args.target, since_us, until_us, to_newest=until_us >= now_us,
                           whole_windows=args.whole_windows, **options)
        except (ReplayPlanError, ReplayFailed) as e:
            raise UserError(str(e)) from None
        rows.warn_of_uncovered(replay, "replay")
        _warn_of_partial_windows(replay, programs)
        progress = _Progress() if sys.stderr.isatty() else None
        sink = open_sink(args.output)
        complete = failed = False
        try:
            writer = rows.open_row_writer(args, output_format, sink, replay.schema, fields)
            for attempt in range(1, LOST_REPLAY_ATTEMPTS + 1):
                try:
                    if attempt > 1:
                        replay = _plan(client, programs, args.target, since_us, until_us,
                                       to_newest=until_us >= now_us, whole_windows=args.whole_windows, **options)
                    reorder = rows.reorder_buffer(replay, programs, args.site)
                    with replay:
                        replay.start()
                        complete = _stream(replay.batches(progress), filters, reorder, fields, writer, args.limit)
                        writer.close()
                    break
                except (ReplayFailed, ReplayPlanError) as e:
                    # Lost to a process's death before a row was written: the same replay asked again
                    # may well succeed, and prints nothing twice.
                    if isinstance(e, ReplayFailed) and e.lost and writer.rows == 0 and attempt < LOST_REPLAY_ATTEMPTS:
                        print(f"ramen: replay: {e}: asking again", file=sys.stderr, flush=True)
                        continue
                    failed = True
                    writer.abandon()
                    raise UserError(str(e)) from None
                except OutputError:  # a full disk: what was written is half a result
                    failed = True
                    writer.abandon()
                    raise
                except BrokenPipeError:
                    # The reader went away (`| head`): leaving `with replay` withdraws the request.
                    silence_stdout()
                    log.info("replay %s: the reader of the output went away after %d rows", replay.channel,
                             writer.rows)
                    return 0
        finally:
            if args.output is not None:
                try:
                    with writing(str(args.output)):
                        sink.close()
                finally:
                    if failed:  # half a file (a parquet file without its footer) is worth less than none
                        args.output.unlink(missing_ok=True)
    if progress is not None and complete:
        progress.done(replay.progress)
    if reorder is not None and reorder.late:
        print(f"ramen: replay: warning: {reorder.late:,} rows came more than "
              f"{reorder.disorder_us / 1e6:g} s behind newer ones and were printed out of event-time order",
              file=sys.stderr)
    return 0


def _stream(batches: Iterable[pa.RecordBatch], filters: list[rows.Filter], reorder: ReorderBuffer | None,
            fields: list[str], writer: RowWriter, limit: int | None) -> bool:
    """Batches through filters and the reorder buffer to the writer, until the end or `limit` rows;
    returns whether the result was read to its end."""
    if limit == 0:
        return False
    for table in rows.ordered(batches, filters, reorder, fields):
        for batch in table.to_batches():
            if limit is not None and writer.rows + batch.num_rows >= limit:
                writer.write(batch.slice(0, limit - writer.rows))
                return False
            writer.write(batch)
    return True


def _explain(client, programs, target: str, since_us: int, until_us: int, args, *, to_newest: bool) -> int:
    """`--explain`: the plan, as lines or (with --json) one JSON object, and no replay; a range that
    ends now ends where the archives reach, as its replay would (`to_newest`)."""
    import json

    from ramen import paths
    from ramen.archive.errors import ArchiveError
    from ramen.replay.client import ReplayFailed, replay_coverage, source_sites
    from ramen.replay.explain import explain
    from ramen.replay.plan import ReplayPlanError
    try:
        found = explain(target, since_us, until_us, programs, replay_coverage(client, programs, args.site),
                        paths.archive_dir(args.site), strict=args.strict,
                        source_sites=lambda plan: source_sites(plan, programs, args.site), to_newest=to_newest)
    except (ReplayPlanError, ArchiveError, ReplayFailed) as e:
        raise UserError(str(e)) from None
    text = json.dumps(found.to_dict(), indent=2) if args.json else "\n".join(found.lines())
    if args.output is None:
        print(text)
    else:
        args.output.write_text(text + "\n")
    return 0


def _rows_window(programs, target: str):
    """The window the target's rows come at: its own, or its windowed parents' (ramen/program/windows.py):
    a range that cuts one cuts the rows of every function downstream of it."""
    from ramen.program.windows import row_windows
    return row_windows({f.qualified_name: f for p in programs.values() for f in p}).get(target)


def _warn_of_partial_windows(replay, programs) -> None:
    """One line on stderr naming the first and last windows the target's rows come at (its own or
    its windowed parents') that the range cuts: they hold only part of their rows."""
    from ramen.times import format_range
    window = _rows_window(programs, replay.plan.target)
    if window is None:
        return
    every, since, until = window.every_us, replay.plan.since_us, replay.plan.until_us
    cut = []
    if since % every:
        first = since // every * every
        cut.append(f"the first window ({format_range(first, first + every)})")
    if until % every:
        last = until // every * every
        if not cut or last != since // every * every:
            cut.append(f"the last ({format_range(last, last + every)})" if cut else
                       f"the last window ({format_range(last, last + every)})")
    if cut:
        print(f"ramen: replay: warning: {' and '.join(cut)} of {replay.plan.target} cover only part of "
              f"the range asked; --whole-windows leaves them out", file=sys.stderr)


def _plan(client, programs, target: str, since_us: int, until_us: int, *, to_newest: bool,
          whole_windows: bool = False, **options):
    """The replay. A range that ends now (no --until, `--until now`, or a time to come) ends as far
    as the archives reach: the newest tuples are still on their way to the disk. `whole_windows`:
    the range narrowed to the windows the target's rows come at (its own or its windowed parents')
    that it holds whole (after the archives' reach)."""
    from ramen.replay.client import Replay, replay_to_newest
    from ramen.times import format_range
    replay = (replay_to_newest if to_newest else Replay)(client, programs, target, since_us, until_us, **options)
    window = _rows_window(programs, target)
    if not whole_windows or window is None:
        return replay
    every = window.every_us
    since, until = -(-replay.plan.since_us // every) * every, replay.plan.until_us // every * every
    if since >= until:
        raise UserError(f"--whole-windows: {format_range(replay.plan.since_us, replay.plan.until_us)} holds no "
                        f"whole window of {target}")
    if (since, until) == (replay.plan.since_us, replay.plan.until_us):
        return replay
    return Replay(client, programs, target, since, until, **options)


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


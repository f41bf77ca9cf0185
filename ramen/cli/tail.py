"""`ramen tail [-n N] [-f] [--since S] [--until U] TARGET [FIELD…]`: a function's latest output, or
follow it live.

- `-n N`: the last N rows (default 10), from a replay of the recent past: a lookback that grows
  until it holds N rows or reaches the archives' start, so that a lazy function (never running)
  is computed from its ancestors' archives as a replay would. A function the archives hold nothing
  of has no past: its next N live rows are printed instead (it is run meanwhile, even if lazy).
- `--since S [--until U]`: the rows of [S, U) (U: now), as `ramen replay` prints them; with -n,
  only the last N of them.
- `-f`: follow: a `tails/<id>` key (ephemeral) makes the choreographer run the function and its
  ancestors, even a lazy one, for as long as this command runs. With --since (or -n, which
  follows from the time of the N-th last row), the archives are replayed first, then the live
  output follows without gap or duplicate: the live stream is joined first, and the rows before
  the cut (_Tail._cut) come from the archives, the others live. --until ends the following there.

Rows go through the same fields, --where, formats and times as `ramen replay` (ramen/cli/rows.py);
the default format is jsonl, a line a row, written as rows come.
"""

from __future__ import annotations

import contextlib
import time
import uuid

import numpy as np
import pyarrow as pa

from ramen import keyspace, paths
from ramen.cli import argtypes, conf, rows
from ramen.cli.errors import UserError, silence_stdout, writing
from ramen.cli.output import RowWriter, open_sink
from ramen.message import KIND_TUPLES, LIVE_CHANNEL, decode_header
from ramen.tails import TailRequest
from ramen.times import TIME_FORMS
from ramen.transport import (BackoffIdleStrategy, CountersFile, FragmentAssembler, Image, LogBuffer,
                             LogBufferError)
from ramen.transport.frame_walk import last_event_time_us
from ramen.tuples import decode_tuples, event_times_us


IDENTITY = "user"
DEFAULT_LINES = 10
LOG_WAIT_TIMEOUT_S = 30.0
"""How long a tail waits for a live log to appear, or (a function with no past) for its next rows."""
ARCHIVE_CATCH_UP_S = 10.0
"""How long a follow waits for the archives to reach the first live row."""
ARCHIVE_POLL_S = 0.1
FIRST_LOOKBACK_US = 60_000_000
"""The first lookback of `-n` (a windowed function's: as many windows as rows asked, and two more)."""
ARCHIVE_LAG_US = 5_000_000
"""How far behind now the archives may be: a windowed function's `-n` ends at the last window that
closed before that, which they hold whole."""
LOOKBACK_GROWTH = 4
MAX_LOOKBACK_US = 7 * 24 * 3600 * 1_000_000
"""`-n` looks back no further than this for its rows."""
FRAGMENT_LIMIT = 256


def add_parser(sub) -> None:
    parser = sub.add_parser("tail",
                            description="Print the last rows of TARGET (prog/func), or follow its output.")
    parser.add_argument("target", metavar="TARGET")
    rows.add_output_arguments(parser, default_format="jsonl")
    parser.add_argument("-n", "--lines", type=argtypes.count, default=None,
                        help=f"rows to print: the last N (default {DEFAULT_LINES}, or all with --since)")
    parser.add_argument("-f", "--follow", action="store_true", help="go on printing new rows until interrupted")
    parser.add_argument("--since", help=f"the rows from this time on, UTC: {TIME_FORMS}")
    parser.add_argument("--until", help="the rows before this time (default now; with -f: follow until then)")
    conf.add_arguments(parser, IDENTITY, site=True)
    parser.set_defaults(run=run)


def run(args) -> int:
    now_us = time.time_ns() // 1000
    since_us, until_us = _parse_times(args, now_us)
    output_format = rows.output_format(args)
    lines = args.lines if args.lines is not None else (None if since_us is not None else DEFAULT_LINES)
    with conf.connected(args) as client:
        programs = conf.loaded_programs(client)
        schema = rows.schema_of(programs, args.target)
        if schema is None:
            raise UserError(f"unknown function {args.target}")
        program, _, name = args.target.partition("/")
        function = programs[program].function(name)
        fields = rows.check_fields(args.fields, schema)
        tail = _Tail(client, programs, function, args.site, [rows.parse_where(w, schema) for w in args.where], fields)
        sink = open_sink(args.output)
        writer = rows.open_row_writer(args, output_format, sink, schema, fields)
        try:
            if not args.follow:
                tail.print_past(writer, since_us, min(until_us or now_us, now_us), lines, now_us)
            else:
                if since_us is None:
                    since_us = tail.time_of_last(lines, now_us)
                with tail.used():
                    tail.follow(writer, since_us, until_us)
            writer.close()
        except BrokenPipeError:
            silence_stdout()  # the reader went away (`| head`): leaving tears the replay down
        except KeyboardInterrupt:
            writer.close()
        finally:
            if args.output is not None:
                with writing(str(args.output)):
                    sink.close()
    return 0


def _parse_times(args, now_us: int) -> tuple[int | None, int | None]:
    """--since and --until, read before anything is asked of the site, relative to when the command started."""
    from ramen.replay.plan import ReplayPlanError, check_range
    from ramen.times import TimeError, parse_time
    try:
        since_us = None if args.since is None else parse_time(args.since, now_us)
        until_us = None if args.until is None else parse_time(args.until, now_us, end=True)
        if since_us is not None:
            check_range(since_us, until_us if until_us is not None else max(now_us, since_us + 1))
    except (TimeError, ReplayPlanError) as e:
        raise UserError(str(e)) from None
    return since_us, until_us


class _Tail:
    """One function's rows, past and live, through the fields and filters asked."""

    def __init__(self, client, programs, function, site: str, filters: list[rows.Filter], fields: list[str]) -> None:
        self.client = client
        self.programs = programs
        self.function = function
        self.site = site
        self.filters = filters
        self.fields = fields

    @contextlib.contextmanager
    def used(self):
        """While inside, a `tails/<id>` key (ephemeral) makes the choreographer run the function
        and its ancestors, even a lazy one."""
        key = f"{keyspace.TAILS}/{uuid.uuid4().hex[:12]}"
        self.client.create(key, TailRequest(self.function.qualified_name, self.site).to_value(), ephemeral=True)
        try:
            yield
        finally:
            self.client.delete(key)

    # -- the past ------------------------------------------------------------------------------

    def print_past(self, writer: RowWriter, since_us: int | None, until_us: int, lines: int | None,
                   now_us: int) -> None:
        if since_us is not None:
            self._replay(writer, since_us, until_us, lines, to_newest=until_us >= now_us)
            return
        last = self._last_rows(lines, now_us)
        if last is None:  # no past: the rows to come
            with self.used():
                self._print_next_live(writer, lines)
            return
        for batch in last.batches():
            writer.write(batch)

    def time_of_last(self, lines: int, now_us: int) -> int | None:
        """Where `-f -n N` starts following from: the event time of the N-th last row (None: from
        the live rows to come, when there is no past or no row is asked for)."""
        if not lines or self.function.event_time is None:
            return None
        last = self._last_rows(lines, now_us)
        if last is None or not last.rows:
            return None
        return int(_event_times(last.batches()[0], self.function.event_time)[0])

    def _last_rows(self, lines: int, now_us: int) -> rows.LastRows | None:
        """The last `lines` rows, from replays looking further back until they hold enough, or
        reach the start of the archives; None when nothing archived feeds the function."""
        from ramen.replay.client import replay_to_newest
        from ramen.replay.plan import ReplayGapError
        window = self.function.window
        lookback = max(FIRST_LOOKBACK_US, 0 if window is None else (lines + 2) * window.every_us)
        end_us = now_us
        if window is not None:  # whole windows only: the one still open would show part of its rows
            end_us = (now_us - ARCHIVE_LAG_US) // window.every_us * window.every_us
        while True:
            since_us = end_us - lookback
            try:
                replay = self._planned(lambda: replay_to_newest(self.client, self.programs,
                                                                self.function.qualified_name, since_us, end_us,
                                                                site=self.site, strict=False, no_merge=True),
                                       gaps=True)
            except ReplayGapError:
                replay = None
            if replay is not None:
                last = rows.LastRows(lines)
                for table in self._rows_of(replay):
                    last.add(table)
                if last.rows >= lines or replay.plan.since_us > since_us:
                    return last  # enough, or the archives start after since: nothing older
            if lookback >= MAX_LOOKBACK_US:
                return None if replay is None else last
            lookback = min(lookback * LOOKBACK_GROWTH, MAX_LOOKBACK_US)

    def _replay(self, writer: RowWriter, since_us: int, until_us: int, lines: int | None, *, to_newest: bool) -> None:
        from ramen.replay.client import Replay, replay_to_newest
        make = replay_to_newest if to_newest else Replay
        replay = self._planned(lambda: make(self.client, self.programs, self.function.qualified_name, since_us,
                                            until_us, site=self.site, strict=False, no_merge=True))
        rows.warn_of_uncovered(replay, "tail")
        last = rows.LastRows(lines) if lines is not None else None
        for table in self._rows_of(replay):
            if last is not None:
                last.add(table)
                continue
            for batch in table.to_batches():
                writer.write(batch)
        for batch in last.batches() if last is not None else ():
            writer.write(batch)

    def _rows_of(self, replay):
        """The replay's rows, in event-time order, through the filters and fields asked."""
        from ramen.replay.client import ReplayFailed
        reorder = rows.reorder_buffer(replay, self.programs, self.site)
        with replay:
            replay.start()
            try:
                yield from rows.ordered(replay.batches(), self.filters, reorder, self.fields)
            except ReplayFailed as e:
                raise UserError(str(e)) from None

    @staticmethod
    def _planned(make, *, gaps: bool = False):
        """A replay made, its planning's errors as one line each; with `gaps`, a range nothing
        covers is the caller's to judge (ReplayGapError)."""
        from ramen.replay.client import ReplayFailed
        from ramen.replay.plan import ReplayGapError, ReplayPlanError
        try:
            return make()
        except (ReplayPlanError, ReplayFailed) as e:
            if gaps and isinstance(e, ReplayGapError):
                raise
            raise UserError(str(e)) from None

    # -- live ----------------------------------------------------------------------------------

    def follow(self, writer: RowWriter, since_us: int | None, until_us: int | None) -> None:
        """The live rows, until `until_us` or an interrupt; from `since_us`, the archives' rows
        first, up to the cut (see _cut), and the live ones from there."""
        function = self.function
        log_buffer = _wait_for_log(paths.output_log(self.site, function.qualified_name))
        counters = CountersFile.open(paths.counters_path())
        image = Image(log_buffer, counters, name=f"tail {function.qualified_name}")
        live = _LiveRows(image, function.schema)
        idle = BackoffIdleStrategy()
        pending: list[pa.RecordBatch] = []
        cut_us = None
        try:
            if since_us is not None:
                cut_us, pending = self._cut(log_buffer, live, idle)
                stop_us = cut_us if until_us is None else min(cut_us, until_us)
                if since_us < stop_us:
                    self._replay_up_to_live(writer, since_us, stop_us, live, pending)
            while True:
                for batch in pending:
                    if not self._write_live(writer, batch, cut_us, until_us):
                        return
                pending = live.read()
                idle.idle(len(pending))
        finally:
            image.close()
            counters.close()

    def _cut(self, log_buffer: LogBuffer, live: _LiveRows, idle) -> tuple[int, list[pa.RecordBatch]]:
        """Where the archives' rows end and the live ones begin, and the live batches read meanwhile.

        The live log is joined first. Rows written before we joined are at most as late as the
        latest event time in the log (a stream in event-time order), so every row from just past
        it (a windowed function: from the next window, whose rows all come together) is in what
        we read live, and every row before it is in the archives. A log that held nothing when
        we joined (a lazy function just started) is cut past its first live row the same way:
        that first window may hold only what the worker saw since it started."""
        function = self.function
        pending: list[pa.RecordBatch] = []
        base_us = last_event_time_us(log_buffer)
        if base_us is None:
            while not pending:
                pending = [b for b in live.read() if b.num_rows]
                idle.idle(len(pending))
            base_us = int(_event_times(pending[0], function.event_time).min())
        every = None if function.window is None else function.window.every_us
        return (base_us // every + 1) * every if every else base_us + 1, pending

    def _replay_up_to_live(self, writer: RowWriter, since_us: int, until_us: int, live: _LiveRows,
                           pending: list[pa.RecordBatch]) -> None:
        """[since, until) from the archives, once they reach `until` (the live rows just before
        were written, and their recorder, reading the same log, is a moment behind). The live log
        is read meanwhile into `pending`, so that its writer does not take us for a dead reader."""
        from ramen.replay.client import Replay
        deadline = time.monotonic() + ARCHIVE_CATCH_UP_S
        while True:
            replay = self._planned(lambda: Replay(self.client, self.programs, self.function.qualified_name,
                                                  since_us, until_us, site=self.site, strict=False, no_merge=True))
            if replay.plan.until_us >= until_us or time.monotonic() > deadline:
                break
            pending += live.read()
            time.sleep(ARCHIVE_POLL_S)
        rows.warn_of_uncovered(replay, "tail")
        for table in self._rows_of(replay):
            for batch in table.to_batches():
                writer.write(batch)
            pending += live.read()
        writer.sink.flush()

    def _write_live(self, writer: RowWriter, batch: pa.RecordBatch, from_us: int | None, until_us: int | None) -> bool:
        """Write a live batch's rows in [from_us, until_us); False once the stream has passed until_us."""
        batch = rows.filtered(batch, self.filters)
        going_on = True
        if (from_us is not None or until_us is not None) and batch.num_rows:
            times = _event_times(batch, self.function.event_time)
            keep = np.ones(len(times), dtype=bool)
            if from_us is not None:
                keep &= times >= from_us
            if until_us is not None:
                keep &= times < until_us
                going_on = bool((times < until_us).all())
            batch = batch.filter(pa.array(keep))
        if self.fields:
            batch = batch.select(self.fields)
        writer.write(batch)
        writer.sink.flush()
        return going_on

    def _print_next_live(self, writer: RowWriter, lines: int) -> None:
        """The next `lines` live rows of a function the archives hold nothing of."""
        log_buffer = _wait_for_log(paths.output_log(self.site, self.function.qualified_name))
        counters = CountersFile.open(paths.counters_path())
        image = Image(log_buffer, counters, name="tail -n")
        live = _LiveRows(image, self.function.schema)
        idle = BackoffIdleStrategy()
        deadline = time.monotonic() + LOG_WAIT_TIMEOUT_S
        written = writer.rows
        try:
            while writer.rows - written < lines:
                if time.monotonic() > deadline:
                    raise UserError(f"the archives hold nothing of {self.function.qualified_name}, and it wrote "
                                    f"{writer.rows - written} of the {lines} rows asked in {LOG_WAIT_TIMEOUT_S:g} s")
                batches = live.read()
                for batch in batches:
                    batch = rows.filtered(batch, self.filters).slice(0, lines - (writer.rows - written))
                    writer.write(batch.select(self.fields) if self.fields else batch)
                idle.idle(len(batches))
        finally:
            image.close()
            counters.close()


def _wait_for_log(path) -> LogBuffer:
    deadline = time.monotonic() + LOG_WAIT_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise UserError(f"{path} did not appear within {LOG_WAIT_TIMEOUT_S:g} s: is the function running?")
        time.sleep(ARCHIVE_POLL_S)
    try:
        return LogBuffer.open(path, writable=False)
    except LogBufferError as e:
        raise UserError(str(e)) from None


class _LiveRows:
    """The row batches of a live log as they come. One assembler for the image, so that a message
    whose last fragments are not committed yet at one read comes whole at the next."""

    def __init__(self, image: Image, schema: pa.Schema) -> None:
        self.image = image
        self.schema = schema
        self._batches: list[pa.RecordBatch] = []
        self._assembler = FragmentAssembler(self._on_message, hand_over=True)

    def _on_message(self, message, offset, length, header) -> None:  # a message of its own (hand_over)
        head = decode_header(message)
        if head is not None and head.kind == KIND_TUPLES and head.channel == LIVE_CHANNEL:
            self._batches.append(decode_tuples(message, self.schema))

    def read(self) -> list[pa.RecordBatch]:
        """The batches readable now."""
        while self.image.poll(self._assembler.on_fragment, FRAGMENT_LIMIT):
            pass
        batches, self._batches = self._batches, []
        return batches


def _event_times(batch: pa.RecordBatch, event_time: str | None):
    """The batch's event times, µs (numpy)."""
    if event_time is None:
        raise UserError("--since and -f -n need a function with an event time")
    return event_times_us(batch, event_time)

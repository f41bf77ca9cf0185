"""`ramen tail [-n N] [-f] [--since S] TARGET`: a function's latest output, or follow it live.

- `-n N`: the last N tuples: from the archive (its last minute) for an archived function, else the
  next N from the live stream (a live log keeps nothing behind its slowest reader: it is zeroed).
- `-f`: follow: a `tails/<id>` key (ephemeral) makes the choreographer run the function and its
  ancestors, even a lazy one, for as long as this command runs.
- `--since S`: first replay the archives from S, then go on live, without gap or duplicate: the live
  stream is joined first and its first tuple's event time is where the replay stops.
"""

from __future__ import annotations

import json
import sys
import time
import uuid

import pyarrow as pa

from ramen import keyspace, paths
from ramen.cli import argtypes, conf
from ramen.cli.errors import UserError
from ramen.message import KIND_TUPLES, LIVE_CHANNEL, decode_header
from ramen.times import TIME_FORMS
from ramen.transport import BackoffIdleStrategy, CountersFile, FragmentAssembler, Image, LogBuffer
from ramen.tuples import decode_tuples

IDENTITY = "user"
DEFAULT_LINES = 10
LOG_WAIT_TIMEOUT_S = 30.0
ARCHIVE_CATCH_UP_S = 10.0
"""How long --since waits for the archive to reach the first live tuple."""
ARCHIVE_POLL_S = 0.1
ARCHIVE_LOOKBACK_US = 60_000_000
"""How far back `-n` looks in an archive for the last tuples."""
FRAGMENT_LIMIT = 256


def add_parser(sub) -> None:
    parser = sub.add_parser("tail",
                            description="Print the last tuples of TARGET (prog/func), or follow its output.")
    parser.add_argument("target", metavar="TARGET")
    parser.add_argument("-n", "--lines", type=argtypes.count, default=DEFAULT_LINES, help="tuples to print (default 10)")
    parser.add_argument("-f", "--follow", action="store_true", help="go on printing new tuples until interrupted")
    parser.add_argument("--since", help=f"replay from this time first (implies --follow), UTC: {TIME_FORMS}")
    conf.add_arguments(parser, IDENTITY, site=True)
    parser.set_defaults(run=run)


def run(args) -> int:
    since_us = _parse_since(args.since)
    with conf.connected(args) as client:
        programs = conf.loaded_programs(client)
        program, _, name = args.target.partition("/")
        if program not in programs or name not in programs[program]:
            raise UserError(f"unknown function {args.target}")
        function = programs[program].function(name)
        follow = args.follow or since_us is not None
        tail_key = f"{keyspace.TAILS}/{uuid.uuid4().hex[:12]}"
        if follow:
            client.create(tail_key, {"target": args.target}, ephemeral=True)
        try:
            if not follow and function.archived:
                _print_last_archived(client, programs, function, args)
                return 0
            log = _wait_for_log(paths.output_log(args.site, args.target))
            if not follow:
                _print_next(log, function.schema, args.lines)
                return 0
            _follow(client, programs, function, log, args, since_us)
        finally:
            if follow:
                client.delete(tail_key)
    return 0


def _wait_for_log(path) -> LogBuffer:
    deadline = time.monotonic() + LOG_WAIT_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise UserError(f"{path} did not appear within {LOG_WAIT_TIMEOUT_S:g} s: is the function running?")
        time.sleep(0.1)
    return LogBuffer.open(path, writable=False)


def _read_batches(image: Image, schema: pa.Schema, until: int | None) -> list[pa.RecordBatch]:
    """The live batches readable now (up to `until` if given)."""
    batches: list[pa.RecordBatch] = []

    def on_message(message, offset, length, header):  # a message of its own (hand_over)
        head = decode_header(message)
        if head is not None and head.kind == KIND_TUPLES and head.channel == LIVE_CHANNEL:
            batches.append(decode_tuples(message, schema))

    assembler = FragmentAssembler(on_message, hand_over=True)
    while until is None or image.position < until:
        if image.poll(assembler.on_fragment, FRAGMENT_LIMIT) == 0:
            break  # nothing more for now
    return batches


def _print_last_archived(client, programs, function, args) -> None:
    from ramen.replay.client import ReplayFailed, replay_to_newest
    from ramen.replay.plan import ReplayGapError, ReplayPlanError
    until = time.time_ns() // 1000
    since = until - ARCHIVE_LOOKBACK_US
    try:
        try:
            replay = replay_to_newest(client, programs, function.qualified_name, since, until, site=args.site)
        except ReplayGapError as e:
            if e.gap_since_us != since or e.gap_until_us >= until:
                raise
            # An archive younger than the look-back: its last rows are all it has.
            replay = replay_to_newest(client, programs, function.qualified_name, e.gap_until_us, until,
                                      site=args.site)
        with replay:
            replay.start()
            table = pa.Table.from_batches(list(replay.batches()), schema=function.schema)
    except (ReplayPlanError, ReplayFailed) as e:
        raise UserError(str(e)) from None
    if function.event_time is not None and table.num_rows:
        table = table.sort_by(function.event_time)
    _print_rows(table.slice(max(0, table.num_rows - args.lines)))


def _print_next(log: LogBuffer, schema: pa.Schema, lines: int) -> None:
    """The next `lines` live tuples (a function that is not archived keeps no past)."""
    counters = CountersFile.open(paths.counters_path())
    image = Image(log, counters, name="tail -n")
    idle = BackoffIdleStrategy()
    deadline = time.monotonic() + LOG_WAIT_TIMEOUT_S
    rows: list[pa.RecordBatch] = []
    try:
        while sum(b.num_rows for b in rows) < lines and time.monotonic() < deadline:
            batches = _read_batches(image, schema, None)
            rows.extend(batches)
            idle.idle(len(batches))
    finally:
        image.close()
        counters.close()
    _print_rows(pa.Table.from_batches(rows, schema=schema).slice(0, lines))


def _parse_since(text: str | None) -> int | None:
    """--since, read before anything is asked of the site, relative to when the command started."""
    if text is None:
        return None
    from ramen.times import TimeError, parse_time
    try:
        return parse_time(text, time.time_ns() // 1000)
    except TimeError as e:
        raise UserError(str(e)) from None


def _follow(client, programs, function, log: LogBuffer, args, since_us: int | None) -> None:
    counters = CountersFile.open(paths.counters_path())
    image = Image(log, counters, name=f"tail {args.target}")
    idle = BackoffIdleStrategy()
    first_live: list[pa.RecordBatch] = []
    if since_us is not None:
        while not first_live:  # join live first: its first tuple is where the replay stops
            first_live = [b for b in _read_batches(image, function.schema, None) if b.num_rows]
            idle.idle(len(first_live))
        _replay_until(client, programs, function, args, since_us,
                      _first_event_time(first_live[0], function.event_time))
    for batch in first_live:
        _print_rows(pa.Table.from_batches([batch]))
    try:
        while True:
            batches = _read_batches(image, function.schema, None)
            for batch in batches:
                _print_rows(pa.Table.from_batches([batch]))
            idle.idle(len(batches))
    except KeyboardInterrupt:
        pass
    finally:
        image.close()
        counters.close()


def _first_event_time(batch: pa.RecordBatch, event_time: str | None) -> int:
    if event_time is None:
        raise UserError("--since needs a function with an event time")
    return int(batch.column(event_time).cast(pa.timestamp("us")).cast(pa.int64())[0].as_py())


def _replay_until(client, programs, function, args, since_us: int, until_us: int) -> None:
    from ramen.replay.client import Replay, ReplayFailed
    from ramen.replay.plan import ReplayPlanError
    if since_us >= until_us:
        return
    try:
        replay = _when_archived(lambda: Replay(client, programs, function.qualified_name, since_us, until_us,
                                               site=args.site), until_us)
        with replay:
            replay.start()
            table = pa.Table.from_batches(list(replay.batches()), schema=function.schema)
    except (ReplayPlanError, ReplayFailed) as e:
        raise UserError(str(e)) from None
    if function.event_time is not None and table.num_rows:
        table = table.sort_by(function.event_time)
    _print_rows(table)


def _when_archived(make_replay, until_us: int):
    """The replay, once the archive reaches until_us: the first live tuple was just written, and
    its recorder, reading the same log, is a moment behind it. Any other gap is an error at once."""
    from ramen.replay.plan import ReplayGapError
    deadline = time.monotonic() + ARCHIVE_CATCH_UP_S
    while True:
        try:
            return make_replay()
        except ReplayGapError as e:
            if e.gap_until_us != until_us or time.monotonic() > deadline:
                raise
            time.sleep(ARCHIVE_POLL_S)


def _print_rows(table: pa.Table) -> None:
    for row in table.to_pylist():
        sys.stdout.write(json.dumps(row, default=str) + "\n")
    sys.stdout.flush()

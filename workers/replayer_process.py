"""The replayer process: its key, its function, its recordings and log, the duty cycle of its agent
(workers/replayer.py, Replayer), its stats and its one-line errors.

Run it as `python -m workers.replayer --site SITE --id ID` with $RAMEN_CONFSERVER (and
$RAMEN_CONFSERVER_AUTH, $RAMEN_DIR) set. Errors are one line on stderr and exit 1; the same line
goes into the `error` of each replay it serves (`replays/<channel>`), so that the client prints it
at once (the supervisor, seeing the exit, keeps the first error). SIGTERM stops it with exit 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from ramen import keyspace, paths, service_log
from ramen.archive import checksum as checksums
from ramen.archive.catalog import Catalog, layout_problem
from ramen.archive.coverage import RecordingRange, recordings_for
from ramen.archive.errors import ArchiveError
from ramen.archive.reader import RecordingReader
from ramen.archive.recorder import recording_position
from ramen.archive.replay import replay_log_params
from ramen.archive.time_index import TimeIndex, index_path
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.memory import freeze_startup_objects, retain_freed_memory
from ramen.program import Program, ProgramError, split_qualified
from ramen.replay.contract import ContractError, ReplayerAssignment
from ramen.replay.end import end_replays
from ramen.replay.fail import fail_replay
from ramen.transport.counters import CountersFile, CountersFileError
from ramen.transport.service_counters import allocate_service_counter
from ramen.transport.defaults import IPC_MTU_LENGTH, IPC_TERM_LENGTH
from ramen.transport.errors import TransportError
from ramen.transport.idle import BackoffIdleStrategy
from ramen.transport.logbuffer import LogBuffer, LogBufferError, LogBufferParams
from ramen.transport.publication import ExclusivePublication
from ramen.transport.replay_publication import ReplayPublication
from workers.replayer import SOURCE_MASK, SUBSCRIBER_WAIT_TIMEOUT_S, Replayer, ReplayerError, ReplayerStats, tags_of
from workers.served import ServedChannel, ServedError
from workers.spare import wait_for_key, warm_up_arrow

log = logging.getLogger(__name__)

CONFSERVER_IDENTITY = "worker"
IDLE_MAX_PARK_S = 0.001
"""A replayer outruns its readers, so most of its idle cycles find the log full: it sleeps (as
every duty cycle does, at once: the transport's IDLE_MAX_SPINS), at most 1 ms, since a reader
empties the log's window (2 MiB) in a few."""
STATS_INTERVAL_S = 1.0
"""How often the stats key is rewritten while replaying (and once at the end)."""
EXIT_ERROR = 1


# -- reading the archive ---------------------------------------------------------------------------


def archive_checksum(catalog: Catalog, recording_id: int) -> checksums.Checksum | None:
    """The algorithm of an archive's checksums, found from a descriptor's stored checksum (the
    archiver uses one algorithm for frames and descriptors); None when the archive keeps none.
    A checksum no algorithm gives (a damaged descriptor) is a CatalogError naming the entry."""
    return catalog.descriptor_checksum(recording_id)


# -- setting up ------------------------------------------------------------------------------------


def load_spec(client, site: str, replayer_id: int, wait_s: float = 0.0,
              stop: threading.Event | None = None, parent: int | None = None) -> ReplayerAssignment | None:
    """The replayer's key. A warm replayer (started before its replay is merged, so that its start-up
    overlaps the merge delay) waits up to wait_s for it; None if it never comes, or once `parent`
    (the supervisor that started it) is no longer its parent."""
    key = keyspace.replayer_key(site, replayer_id)
    if wait_s > 0:
        log.info("replayer %d: waiting up to %g s for its key", replayer_id, wait_s)
        entry = wait_for_key(client, key, wait_s, stop, parent)
        if entry is None:
            return None
    else:
        entry = client.get_or_none(key)
    if entry is None:
        raise ReplayerError(f"no replayer key {key}")
    try:
        return ReplayerAssignment.from_value(entry.value, key)
    except ContractError as e:
        raise ReplayerError(str(e)) from None


def load_function(client, qualified_name: str):
    program_name, function_name = split_qualified(qualified_name)
    if not program_name or not function_name:
        raise ReplayerError(f"source {qualified_name!r} is not prog/func")
    entry = client.get_or_none(keyspace.program_key(program_name))
    if entry is None:
        raise ReplayerError(f"source {qualified_name}: no program {program_name} loaded")
    try:
        program = Program.from_dict(entry.value)
    except ProgramError as e:
        raise ReplayerError(f"source {qualified_name}: {e}") from None
    if function_name not in program:
        raise ReplayerError(f"source {qualified_name}: program {program_name} has no function {function_name}")
    function = program.function(function_name)
    if function.event_time is None:
        raise ReplayerError(f"source {qualified_name} has no event time: nothing to replay by time")
    return function


def open_readers(spec: ReplayerAssignment, counters: CountersFile) -> list[RecordingReader]:
    """A reader per recording of the source holding event times of the spec's whole range."""
    archive_dir = Path(spec.archive_dir)
    try:
        ranges: list[RecordingRange] = recordings_for(archive_dir, spec.source, spec.since_us, spec.until_us)
    except ArchiveError as e:
        raise ReplayerError(str(e)) from None
    except OSError as e:
        raise ReplayerError(f"{archive_dir}: {e}") from None
    if not ranges:
        raise ReplayerError(f"no recording of {spec.source} in {archive_dir} covers "
                            f"[{spec.since_us}, {spec.until_us}) µs")
    readers = []
    try:
        with Catalog.open(archive_dir) as catalog:
            for r in ranges:
                descriptor = catalog.get(r.recording_id)
                problem = layout_problem(descriptor)
                if problem is not None:
                    raise ReplayerError(f"{catalog.where(r.recording_id)}: recording {r.recording_id}: {problem} "
                                        f"(damaged descriptor)")
                checksum = archive_checksum(catalog, r.recording_id)
                follow = done_at = None
                if r.stop_position is None:
                    follow = recording_position(counters, r.recording_id)
                    index = TimeIndex.open(index_path(archive_dir, r.recording_id), r.recording_id)
                    done_at = spec.until_us + index.disorder_us
                    index.close()
                readers.append(RecordingReader(archive_dir, descriptor, r.start_position, r.stop_position,
                                               checksum=checksum, follow=follow, done_at_min_time_us=done_at))
    except (ArchiveError, ReplayerError) as e:
        for reader in readers:
            reader.close()
        raise ReplayerError(str(e)) from None
    return readers


def open_output(path: Path, counters: CountersFile, aligned_with: RecordingReader | None = None, *,
                stream_id: int = 0) -> tuple[ExclusivePublication, bool]:
    """The replayer's log, and whether it lines up with `aligned_with`'s recording (positions,
    terms and term ids alike, starting where the reader does: `replay_log_params`), so that its
    range can be replayed in place. Created so when asked; a log already there (a replayer that
    restarted) is opened as it is, and does not. Nothing is cleaned behind its readers: a replay's
    log is never resumed by a restarted writer (replay_publication.py). `stream_id`: the log's
    stream and session ids (ReplayerAssignment.stream_id)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if aligned_with is not None:
        params = replay_log_params(aligned_with.descriptor, aligned_with.position, session_id=stream_id,
                                   stream_id=stream_id)
    else:
        params = LogBufferParams(term_length=IPC_TERM_LENGTH, mtu_length=IPC_MTU_LENGTH, session_id=stream_id,
                                 stream_id=stream_id)
    try:
        log_buffer = LogBuffer.create(path, params)
        aligned = aligned_with is not None
    except LogBufferError:
        log_buffer = LogBuffer.open(path)
        aligned = False
    return ReplayPublication(log_buffer, counters), aligned


def in_place_candidate(spec: ReplayerAssignment, readers: list[RecordingReader]) -> RecordingReader | None:
    """The reader whose range can be replayed in place: the first, when the replay's channels have
    one tag (a message has room for one; channels of one range share it) and the range's end is
    known (an active recording's end is found as it is read, by the reader)."""
    if len(tags_of(spec)) != 1 or not readers or readers[0].stop is None or readers[0].follow is not None:
        return None
    return readers[0]


def wait_for_reader(publication: ExclusivePublication, stop: threading.Event, readers: int = 1, *,
                    sent_to: str | None = None, clock: Clock = SYSTEM_CLOCK, idle=None) -> None:
    """Until `readers` subscribers read the log: each joins where the log is, so one that came
    after the first message would miss the replay's start. `sent_to`: the site whose replay the
    log is sent to (its one reader is this site's netd), for the error. `idle`: an idle strategy
    (a test's moves its clock)."""
    deadline = clock.seconds() + SUBSCRIBER_WAIT_TIMEOUT_S
    idle = idle or BackoffIdleStrategy()
    while (count := publication.subscriber_count) < readers:
        if stop.is_set():
            return
        if clock.seconds() > deadline:
            if sent_to is not None:
                raise ReplayerError(f"site {sent_to} did not start receiving {publication.log.path} within "
                                    f"{SUBSCRIBER_WAIT_TIMEOUT_S:g} s (are both sites' netds running?)")
            raise ReplayerError(f"{count} of the {readers} expected readers subscribed to {publication.log.path} "
                                f"within {SUBSCRIBER_WAIT_TIMEOUT_S:g} s")
        idle.idle(0)


def replay(client, site: str, replayer_id: int, stop: threading.Event,
           wait_for_key_s: float = 0.0, parent: int | None = None) -> ReplayerStats | None:
    """Do the whole replay; None when stopped by a signal before the end (or never given one)."""
    warm_up_arrow(pandas=False)  # before the key: a warm replayer does it while it waits
    freeze_startup_objects()
    spec = load_spec(client, site, replayer_id, wait_for_key_s, stop, parent)
    if spec is None:
        log.info("replayer %d: no replay came within %g s", replayer_id, wait_for_key_s)
        return None
    try:
        return _replay(client, site, replayer_id, spec, stop)
    except ArchiveError as e:  # one a reader did not name as ours (all of them should)
        error = ReplayerError(str(e))
    except ReplayerError as e:
        error = e
    report_failure(client, spec, f"replayer {replayer_id} of {spec.source}: {error}")
    raise error


def report_failure(client, spec: ReplayerAssignment, message: str) -> None:
    """Put the replayer's one-line error into each replay it serves, unless one is there already:
    the client prints it and exits at once, and the supervisor keeps this first error when it sees
    the replayer exit."""
    from confserver.errors import ConfError
    for c in spec.channels:
        try:
            fail_replay(client, c.channel, message)
        except ConfError as e:
            log.warning("cannot fail replay %d (%s): %s", c.channel, message, e)


def _replay(client, site: str, replayer_id: int, spec: ReplayerAssignment,
            stop: threading.Event) -> ReplayerStats | None:
    function = load_function(client, spec.source)
    clock = SYSTEM_CLOCK  # the process's: its parts take theirs injected, so their tests drive a ManualClock
    try:
        counters = CountersFile.open(paths.counters_path())
    except CountersFileError as e:
        raise ReplayerError(str(e)) from None
    readers = open_readers(spec, counters)
    stats_key = keyspace.replayer_stats_key(site, replayer_id)
    bytes_counter = allocate_service_counter(counters, "replayer", "bytes_read", str(replayer_id))
    rollups_counter = allocate_service_counter(counters, "replayer", "rollups", str(replayer_id))
    # Not freed at exit: the figure stays readable by `ramen stat` (and reclaimed once the file fills).
    served = open_served(spec, function, counters)
    publication, aligned = None, False
    if spec.readers:  # else every channel is served here: no log
        candidate = in_place_candidate(spec, readers)
        publication, aligned = open_output(Path(spec.log), counters, candidate, stream_id=spec.stream_id)
    replayer = Replayer(spec, function.schema, function.event_time, readers, publication, bytes_counter,
                        served=served, on_served=lambda channel: end_served(client, channel),
                        rollups_counter=rollups_counter)
    if aligned:
        replayer.attach_in_place(candidate, spec.archive_dir)
    try:
        if publication is not None:
            wait_for_reader(publication, stop, spec.readers, sent_to=spec.sent_to)
        idle = BackoffIdleStrategy(max_park_s=IDLE_MAX_PARK_S)
        next_stats_s = clock.seconds() + STATS_INTERVAL_S
        while not stop.is_set() and not replayer.done:
            idle.idle(replayer.do_work())
            if clock.seconds() >= next_stats_s:
                client.set(stats_key, replayer.stats.to_value())
                next_stats_s = clock.seconds() + STATS_INTERVAL_S
        client.set(stats_key, replayer.stats.to_value())
        if not replayer.done:
            return None
        log.info("replayer %d: %s", replayer_id, replayer.stats.to_value())
        return replayer.stats
    finally:
        replayer.close()
        if publication is not None:
            publication.close(end_of_stream=replayer.done)


def open_served(spec: ReplayerAssignment, function, counters: CountersFile) -> list[ServedChannel]:
    """The channels this replayer is the target of, their recipients open."""
    served: list[ServedChannel] = []
    try:
        for c in spec.channels:
            if c.served:
                served.append(ServedChannel(c, function, spec.id & SOURCE_MASK, counters))
    except ServedError as e:
        for channel in served:
            channel.close()
        raise ReplayerError(str(e)) from None
    return served


def end_served(client, served: ServedChannel) -> None:
    """A channel this replayer served has written its END_OF_REPLAYs: as its target, the replayer
    ends its replays (the supervisor then tears them down), the riders' first."""
    end_replays(client, served.channels)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.replayer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", default=keyspace.default_site())
    parser.add_argument("--id", type=int, required=True, help="the replayer id (its key under sites/<site>/replayers)")
    parser.add_argument("--wait-for-key", type=float, default=0.0, metavar="S",
                        help="start warm: wait up to S seconds for the key (then exit 0 if none came)")
    parser.add_argument("--parent", type=int, metavar="PID",
                        help="a warm replayer exits once this process is no longer its parent (its supervisor died)")
    parser.add_argument("--debug", action="store_true", help="tracebacks and debug logs")
    args = parser.parse_args(argv)
    service_log.configure(logging.DEBUG if args.debug else logging.WARNING)
    retain_freed_memory()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    import confserver
    from confserver.errors import ConfError
    try:
        client = confserver.connect(None, identity=CONFSERVER_IDENTITY,
                                    connect_timeout_s=confserver.SERVICE_CONNECT_TIMEOUT_S)
    except (ConfError, OSError) as e:
        print(f"ramen: replayer {args.id}: cannot reach the confserver: {e}", file=sys.stderr)
        return EXIT_ERROR
    try:
        replay(client, args.site, args.id, stop, args.wait_for_key, args.parent)
    except ReplayerError as e:
        print(f"ramen: replayer {args.id}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except (ConfError, OSError, ArchiveError, TransportError) as e:
        if args.debug:
            raise
        print(f"ramen: replayer {args.id}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The archiver service: runs the recorders of one site and holds the archive's mark file.

One process per archive directory (the mark file refuses a second one while the first is alive).
At start it repairs the catalog after an unclean shutdown (recordings without a stop position get
the one their segments end at), then records the log buffers it is given until SIGTERM/SIGINT,
when every recording is stopped cleanly. Recording never loses a message: each recorder is a
tethered subscriber, so a writer waits for it rather than run past it; while the archiver is down
(killed, or stopped with its writers running), for the tether's hold (`--tether-hold`, 60 s).

Run it as `python -m workers.archiver --dir DIR --counters FILE --record LOG [--record LOG …]`
(`ramen archiver` does the same).

Follow mode, `--follow-site SITE` (docs/runtime.md): the archiver also watches the site's worker
keys in the confserver and records the live output log of every function the choreographer wants
archived and used, under the channel `ramen:<prog>/<func>` that archive coverage and replayers look
for. It stops recording a function that is no longer used, or whose log is gone or replaced.
A function's recording goes on where its last one stopped (Aeron's extendRecording) when its log
still holds every frame from there (ramen/archive/recorder.py continued_recording): after the
archiver was killed and restarted within the hold, nothing is missing. When the log no longer does
(down longer than the hold), the new recording starts at the oldest frame the log still holds, and
the archive's coverage shows the gap, which replays across it name.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import confserver
from confserver.errors import ConfError
from confserver.model import EventKind
from ramen import keyspace, liveness, paths, service_log
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.archive import checksum as checksums
from ramen.archive.catalog import Catalog, RecordingDescriptor, RecordingState
from ramen.archive.coverage import archive_coverage, function_channel
from ramen.archive.coverage_key import COVERAGE_PUBLISH_S, ArchiveCoverage
from ramen.archive.errors import ArchiveError
from ramen.archive.markfile import UPDATE_INTERVAL_MS, ArchiveMarkFile
from ramen.archive.recorder import Recorder, continued_recording, log_id_of, oldest_kept_position
from ramen.transport.counters import CountersFile
from ramen.transport.defaults import TETHER_HOLD_S
from ramen.transport.errors import TransportError
from ramen.transport.idle import BackoffIdleStrategy
from ramen.transport.logbuffer import END_OF_STREAM_UNSET, LogBuffer, LogBufferError
from ramen.transport.service_counters import Count, ServiceCounters
from ramen.worker_keys import ContractError, WorkerSpec

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_LENGTH = 128 * 1024 * 1024
"""Segment file length for new recordings (Aeron's default)."""
DEFAULT_CHECKSUM = checksums.CRC32C
"""Frame and descriptor checksum of new recordings, so that damaged payloads are caught by replays
and `ramen archive verify` (its cost on bench/archive.py: see bench/README.md). `--checksum none`
records without (as Aeron does by default)."""
NO_CHECKSUM = "none"
EXIT_REFUSED = 1
CONFSERVER_IDENTITY = "supervisor"
"""Who the archiver is to the confserver in follow mode (it only reads worker keys)."""
LOG_CHECK_INTERVAL_S = 0.2
"""How often follow mode looks for the logs it waits for, and for recorded logs gone or replaced."""


class ArchiverCounters(ServiceCounters, service="archiver"):
    bytes_recorded = Count("Log bytes recorded, padding included (the recordings' positions advanced).")


class Archiver:
    """The recorders of one archive directory, driven by one duty cycle."""

    def __init__(self, archive_dir: str | Path, counters: CountersFile, *, checksum: str | None = DEFAULT_CHECKSUM,
                 segment_length: int = DEFAULT_SEGMENT_LENGTH, tether_hold_s: float = TETHER_HOLD_S) -> None:
        self.archive_dir = Path(archive_dir)
        self.tether_hold_s = tether_hold_s
        self.archive_dir.mkdir(parents=True, exist_ok=True)
        self.checksum = checksums.optional(checksum)
        self.segment_length = segment_length
        self.counters = counters
        self.mark = ArchiveMarkFile.acquire(self.archive_dir)
        try:
            self.catalog = Catalog.open_or_create(self.archive_dir, checksum=self.checksum)
            repaired = self.catalog.refresh_stop_positions(checksum=self.checksum)
            self.archiver_counters = ArchiverCounters.allocate(counters, str(self.archive_dir))
        except BaseException:
            self.mark.close()
            raise
        self.mark.signal_ready()
        if repaired:
            log.warning("%s: recovered the stop positions of recordings %s after an unclean shutdown",
                        self.archive_dir, repaired)
        self.recorders: list[Recorder] = []
        self._next_activity_s = 0.0

    def record(self, log_path: str | Path, *, channel: str = "", source_identity: str = "",
               extend: RecordingDescriptor | None = None, join_position: int | None = None) -> Recorder:
        """Start recording a log buffer: a new recording from `join_position` (default: where its
        writer is), or `extend` from its stop position."""
        log_buffer = LogBuffer.open(log_path)
        try:
            recorder = Recorder(self.catalog, log_buffer, self.counters, segment_length=self.segment_length,
                                checksum=self.checksum, channel=channel or f"ramen:log?path={log_path}",
                                source_identity=source_identity or str(log_path), join_position=join_position,
                                tether_hold_s=self.tether_hold_s, extend=extend)
        except BaseException:
            log_buffer.close()
            raise
        self.recorders.append(recorder)
        return recorder

    def latest_recording(self, channel: str) -> RecordingDescriptor | None:
        """The newest valid recording of a channel, if any."""
        found = [d for d in self.catalog.descriptors(states=(RecordingState.VALID,)) if d.stripped_channel == channel]
        return max(found, key=lambda d: d.recording_id, default=None)

    def do_work(self) -> int:
        work = 0
        for recorder in self.recorders:
            work += recorder.do_work()
        if work:
            self.archiver_counters.bytes_recorded += work
        if any(r.is_stopped for r in self.recorders):
            self.recorders = [r for r in self.recorders if not r.is_stopped]
        now = time.monotonic()
        if now >= self._next_activity_s:
            self.mark.update_activity()
            self._next_activity_s = now + UPDATE_INTERVAL_MS / 1000
        return work

    def close(self) -> None:
        """Stop every recording, then release the directory (activity -1: a clean shutdown). A
        writer still running waits for the next archiver (for the tether's hold), which goes on
        with its recording: workers stop before the archiver when ramen stops, so a stream that
        has not ended is one whose writer runs on."""
        for recorder in self.recorders:
            recorder.close(keep_tether=not recorder.image.is_end_of_stream)
        self.recorders.clear()
        self.archiver_counters.close()
        self.catalog.close()
        self.mark.close()


class FunctionFollower:
    """Follow mode: records the live output of every archived, used function of one site.

    An agent beside the archiver's: each do_work drains the watch on the site's worker keys, then,
    every LOG_CHECK_INTERVAL_S (or at once after a change), starts recording each wanted function
    whose log exists and is open for writing, and stops the recordings of functions no longer wanted,
    whose log file is gone or was replaced (another inode), or whose stream ended. A stream that
    ended is recorded again only once its log is written anew (its end-of-stream mark reset)."""

    def __init__(self, archiver: Archiver, client, site: str) -> None:
        self.archiver = archiver
        self.site = site
        self.watch = client.watch(keyspace.worker_pattern(site))
        self.wanted: set[str] = set()
        self.recording: dict[str, tuple[Recorder, int]] = {}  # name -> (recorder, inode of its log)
        self._next_check_s = 0.0

    def do_work(self) -> int:
        work = 0
        for event in self.watch.drain():
            if event.kind == EventKind.SYNCED:
                continue
            work += 1
            name = keyspace.qualified_name_of(event.key)
            spec = None
            if event.entry is not None and event.kind != EventKind.DELETED:
                try:
                    spec = WorkerSpec.from_value(event.entry.value, event.key)
                except ContractError as e:
                    log.warning("%s; not recorded", e)
            if spec is not None and spec.archived and spec.is_used:
                self.wanted.add(name)
            else:
                self.wanted.discard(name)
        now = time.monotonic()
        if work or now >= self._next_check_s:
            work += self._reconcile()
            self._next_check_s = now + LOG_CHECK_INTERVAL_S
        return work

    def _reconcile(self) -> int:
        changes = 0
        for name, (recorder, inode) in list(self.recording.items()):
            if recorder.is_stopped or name not in self.wanted or _inode(paths.output_log(self.site, name)) != inode:
                self._stop(name)
                changes += 1
        for name in sorted(self.wanted - self.recording.keys()):
            changes += self._start(name)
        return changes

    def _start(self, name: str) -> int:
        path = paths.output_log(self.site, name)
        inode = _inode(path)
        if inode is None:
            return 0  # its worker has not created it yet
        try:
            log_buffer = LogBuffer.open(path, writable=False)
        except LogBufferError as e:
            log.debug("%s: not recordable yet: %s", name, e)  # being created: look again later
            return 0
        try:
            ended = log_buffer.end_of_stream_position != END_OF_STREAM_UNSET and \
                log_buffer.end_of_stream_position <= log_buffer.producer_position()
        finally:
            log_buffer.close()
        if ended:
            return 0  # its writer is gone: a new writer resets the mark
        channel = function_channel(name)
        try:
            extend, join_position = self._where_to_go_on(name, path, self.archiver.latest_recording(channel))
            recorder = self.archiver.record(path, channel=channel, source_identity=str(path), extend=extend,
                                            join_position=join_position)
        except (TransportError, ArchiveError) as e:
            log.warning("%s: cannot record %s: %s", name, path, e)
            return 0
        self.recording[name] = (recorder, inode)
        log.info("recording %s (%s) as recording %d%s", name, path, recorder.recording_id,
                 " (going on)" if extend is not None else "")
        return 1

    @staticmethod
    def _where_to_go_on(name: str, path: Path, latest: RecordingDescriptor | None
                        ) -> tuple[RecordingDescriptor | None, int | None]:
        """(the recording to go on with, or None; else where a new one joins the log, None: at its
        writer). A log that goes on from the latest recording but no longer holds its stop position
        (the archiver was down longer than the hold) is recorded from the oldest frame it holds."""
        with LogBuffer.open(path, writable=False) as log_buffer:
            extend = continued_recording(latest, log_buffer)
            if extend is not None or latest is None or log_id_of(latest.original_channel) != log_buffer.correlation_id:
                return extend, None
            oldest = oldest_kept_position(log_buffer)
            if latest.stop_position < oldest:
                log.warning("%s: positions %d..%d of its log were never recorded (the archiver was down longer "
                            "than the writer was held for it); the archive has a gap there", name,
                            latest.stop_position, oldest)
                return None, oldest
            return None, None

    def _stop(self, name: str) -> None:
        recorder, _ = self.recording.pop(name)
        if not recorder.is_stopped:
            recorder.close()
        log.info("stopped recording %s (recording %d)", name, recorder.recording_id)

    def close(self) -> None:
        self.watch.close()


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


class CoveragePublisher:
    """Follow mode: keeps `sites/<site>/archive/coverage` (ramen/archive/coverage_key.py) equal to
    what the archive directory can replay, for replay clients that cannot read its files."""

    def __init__(self, archive_dir: Path, client, site: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self.archive_dir = archive_dir
        self.client = client
        self.key = keyspace.archive_coverage_key(site)
        self.clock = clock
        self._published: dict | None = None
        self._next_s = 0.0

    def do_work(self) -> int:
        now = self.clock.seconds()
        if now < self._next_s:
            return 0
        self._next_s = now + COVERAGE_PUBLISH_S
        try:
            coverage = ArchiveCoverage.of(archive_coverage(self.archive_dir), self.clock.epoch_us())
        except ArchiveError as e:  # a damaged catalog: replays say so when they plan; keep the last
            log.warning("%s: cannot read the archive's coverage to publish it: %s", self.archive_dir, e)
            return 0
        if coverage.functions == self._published:
            return 0
        self.client.set(self.key, coverage.to_value())
        self._published = coverage.functions
        return 1

    def close(self) -> None:
        """Publish what the recordings, now stopped, cover: the last second's changes included."""
        self._next_s = 0.0
        try:
            self.do_work()
        except (ConfError, OSError) as e:
            log.warning("could not publish the archive's last coverage: %s", e)


def run(archiver: Archiver, stop: threading.Event, idle: BackoffIdleStrategy | None = None,
        follower: FunctionFollower | None = None, publisher: CoveragePublisher | None = None) -> None:
    idle = idle or BackoffIdleStrategy()
    while not stop.is_set():
        liveness.beat()  # for `ramen start`: this loop still turns
        work = archiver.do_work()
        if follower is not None:
            work += follower.do_work()
        if publisher is not None:
            work += publisher.do_work()
        idle.idle(work)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="ramen archiver", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="archive directory (created if missing)")
    parser.add_argument("--counters", required=True, help="the counters file shared with the writers")
    parser.add_argument("--record", action="append", default=[], metavar="LOG",
                        help="a log buffer to record (repeat for several)")
    parser.add_argument("--checksum", choices=(*checksums.NAMES, NO_CHECKSUM), default=DEFAULT_CHECKSUM,
                        help=f"checksum of every recorded frame and catalog descriptor (default {DEFAULT_CHECKSUM}; "
                             f"{NO_CHECKSUM}: none)")
    parser.add_argument("--segment-length", type=int, default=DEFAULT_SEGMENT_LENGTH,
                        help=f"bytes per segment file (default {DEFAULT_SEGMENT_LENGTH})")
    parser.add_argument("--tether-hold", type=float, default=TETHER_HOLD_S, metavar="S",
                        help="how long a writer waits for a recorder that stopped reading (killed, or this "
                             "archiver stopped) before it goes on without (default %(default)g s)")
    parser.add_argument("--connect-timeout", type=float, default=confserver.SERVICE_CONNECT_TIMEOUT_S, metavar="S",
                        help="with --follow-site, how long to wait for the confserver (default %(default)g s)")
    parser.add_argument("--follow-site", metavar="SITE", default=None,
                        help="also record the live output of every archived, used function of SITE, "
                             "following its worker keys in the confserver ($RAMEN_CONFSERVER)")
    return parser


def serve(args) -> int:
    """Run until SIGTERM/SIGINT; a user error is one line on stderr and exit 1."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before anything is acquired: a stop must be clean
        signal.signal(sig, lambda *_: stop.set())
    client = None
    if args.follow_site:  # before the directory is taken: a follower that cannot follow takes nothing
        try:
            client = confserver.connect(None, identity=CONFSERVER_IDENTITY, connect_timeout_s=args.connect_timeout)
        except (ConfError, OSError) as e:
            print(f"ramen: archiver: cannot follow site {args.follow_site}: {e}", file=sys.stderr)
            return EXIT_REFUSED
    try:
        counters = CountersFile.open(args.counters)
        archiver = Archiver(args.dir, counters, checksum=None if args.checksum == NO_CHECKSUM else args.checksum,
                            segment_length=args.segment_length, tether_hold_s=args.tether_hold)
    except (ArchiveError, TransportError) as e:
        if client is not None:
            client.close()
        print(f"ramen: archiver: {e}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        for path in args.record:
            archiver.record(path)
    except (TransportError, ArchiveError) as e:
        archiver.close()
        if client is not None:
            client.close()
        print(f"ramen: archiver: {e}", file=sys.stderr)
        return EXIT_REFUSED
    follower = publisher = None
    log.info("archiver of %s recording %d log(s)%s", args.dir, len(args.record),
             f", following site {args.follow_site}" if args.follow_site else "")
    try:
        if client is not None:
            follower = FunctionFollower(archiver, client, args.follow_site)
            publisher = CoveragePublisher(archiver.archive_dir, client, args.follow_site)
        run(archiver, stop, follower=follower, publisher=publisher)
    finally:
        if follower is not None:
            follower.close()
        archiver.close()
        if publisher is not None:
            publisher.close()
        if client is not None:
            client.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    service_log.configure(logging.INFO)
    return serve(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

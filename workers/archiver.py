"""The archiver service: runs the recorders of one site and holds the archive's mark file.

One process per archive directory (the mark file refuses a second one while the first is alive).
At start it repairs the catalog after an unclean shutdown (recordings without a stop position get
the one their segments end at), then records the log buffers it is given until SIGTERM/SIGINT,
when every recording is stopped cleanly. Recording never loses a message: each recorder is a
tethered subscriber, so a writer waits for it rather than run past it.

Run it as `python -m workers.archiver --dir DIR --counters FILE --record LOG [--record LOG …]`
(`ramen archiver` does the same).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from ramen.archive import checksum as checksums
from ramen.archive.catalog import Catalog, CatalogError
from ramen.archive.markfile import UPDATE_INTERVAL_MS, ArchiveMarkFile, MarkFileError
from ramen.archive.recorder import Recorder
from ramen.archive.segment import SegmentError
from ramen.transport.counters import CountersFile, CountersFileError
from ramen.transport.idle import BackoffIdleStrategy
from ramen.transport.logbuffer import LogBuffer, LogBufferError

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_LENGTH = 128 * 1024 * 1024
"""Segment file length for new recordings (Aeron's default)."""
EXIT_REFUSED = 1


class Archiver:
    """The recorders of one archive directory, driven by one duty cycle."""

    def __init__(self, archive_dir: str | Path, counters: CountersFile, *, checksum: str | None = None,
                 segment_length: int = DEFAULT_SEGMENT_LENGTH) -> None:
        self.archive_dir = Path(archive_dir)
        self.archive_dir.mkdir(parents=True, exist_ok=True)
        self.checksum = checksums.optional(checksum)
        self.segment_length = segment_length
        self.counters = counters
        self.mark = ArchiveMarkFile.acquire(self.archive_dir)
        try:
            self.catalog = Catalog.open_or_create(self.archive_dir, checksum=self.checksum)
            repaired = self.catalog.refresh_stop_positions(checksum=self.checksum)
        except BaseException:
            self.mark.close()
            raise
        if repaired:
            log.warning("%s: recovered the stop positions of recordings %s after an unclean shutdown",
                        self.archive_dir, repaired)
        self.recorders: list[Recorder] = []
        self._next_activity_s = 0.0

    def record(self, log_path: str | Path, *, channel: str = "", source_identity: str = "") -> Recorder:
        """Start recording a log buffer from its current position."""
        recorder = Recorder(self.catalog, LogBuffer.open(log_path), self.counters, segment_length=self.segment_length,
                            checksum=self.checksum, channel=channel or f"ramen:log?path={log_path}",
                            source_identity=source_identity or str(log_path))
        self.recorders.append(recorder)
        return recorder

    def do_work(self) -> int:
        work = 0
        for recorder in self.recorders:
            work += recorder.do_work()
        if any(r.is_stopped for r in self.recorders):
            self.recorders = [r for r in self.recorders if not r.is_stopped]
        now = time.monotonic()
        if now >= self._next_activity_s:
            self.mark.update_activity()
            self._next_activity_s = now + UPDATE_INTERVAL_MS / 1000
        return work

    def close(self) -> None:
        """Stop every recording, then release the directory (activity -1: a clean shutdown)."""
        for recorder in self.recorders:
            recorder.close()
        self.recorders.clear()
        self.catalog.close()
        self.mark.close()


def run(archiver: Archiver, stop: threading.Event, idle: BackoffIdleStrategy | None = None) -> None:
    idle = idle or BackoffIdleStrategy()
    while not stop.is_set():
        idle.idle(archiver.do_work())


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="ramen archiver", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="archive directory (created if missing)")
    parser.add_argument("--counters", required=True, help="the counters file shared with the writers")
    parser.add_argument("--record", action="append", default=[], metavar="LOG",
                        help="a log buffer to record (repeat for several)")
    parser.add_argument("--checksum", choices=checksums.NAMES, default=None,
                        help="checksum every recorded frame and catalog descriptor")
    parser.add_argument("--segment-length", type=int, default=DEFAULT_SEGMENT_LENGTH,
                        help=f"bytes per segment file (default {DEFAULT_SEGMENT_LENGTH})")
    return parser


def serve(args) -> int:
    """Run until SIGTERM/SIGINT; a user error is one line on stderr and exit 1."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before anything is acquired: a stop must be clean
        signal.signal(sig, lambda *_: stop.set())
    try:
        counters = CountersFile.open(args.counters)
        archiver = Archiver(args.dir, counters, checksum=args.checksum, segment_length=args.segment_length)
    except (MarkFileError, CatalogError, CountersFileError, SegmentError, ValueError) as e:
        print(f"ramen: archiver: {e}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        for path in args.record:
            archiver.record(path)
    except (LogBufferError, ValueError) as e:
        archiver.close()
        print(f"ramen: archiver: {e}", file=sys.stderr)
        return EXIT_REFUSED
    log.info("archiver of %s recording %d log(s), pid ready", args.dir, len(args.record))
    try:
        run(archiver, stop)
    finally:
        archiver.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return serve(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

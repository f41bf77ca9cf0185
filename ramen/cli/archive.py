"""`ramen archive describe|dump|verify|purge`: look into (and trim) an Aeron Archive directory.

These read what ramen's archiver writes and what real Aeron Archive writes alike. Damage is never a
traceback nor a short output with exit 0: `dump` checks every frame, the order of fragments and the
checksums as it streams, and stops with one line naming the file and offset; `verify` lists every
problem, one line each; `describe` prints what the catalog holds and says which descriptors do not
add up.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path
from typing import Iterator

from ramen.archive import checksum as checksums
from ramen.archive import markfile, retention, verify
from ramen.archive.catalog import (NULL_POSITION, Catalog, CatalogError, RecordingDescriptor, UnknownRecordingError,
                                   layout_problem, version_string)
from ramen.archive.checksum import Checksum
from ramen.archive.errors import ArchiveError
from ramen.archive.segment import MessageOrder, SegmentError, SegmentFrame, SegmentReader
from ramen.archive.time_index import TimeIndex, TimeIndexWriter, index_path
from ramen.cli.errors import UserError
from ramen.message import KINDS, NO_EVENT_TIME, decode_header
from ramen.times import format_time
from ramen.transport.frame import BEGIN_FLAG, END_FLAG, FRAME_ALIGNMENT, HDR_TYPE_DATA, HEADER_LENGTH

PREVIEW_BYTES = 32
MAX_RECORDINGS_NAMED = 10
"""Recordings named in verify's line about those without checksums; the rest are counted."""


def add_parser(sub) -> None:
    parser = sub.add_parser("archive")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    describe = actions.add_parser("describe", help="print the catalog header and recording descriptors",
                                  description="Print the catalog header and every field of each recording "
                                              "descriptor (or of one recording).")
    describe.add_argument("dir", help="an archive directory (ours or Aeron's)")
    describe.add_argument("recording_id", nargs="?", type=int, help="only this recording")
    describe.add_argument("--json", action="store_true",
                          help="one JSON object per recording per line, with Aeron's field names")
    describe.set_defaults(run=run_describe)

    dump = actions.add_parser("dump", help="print the messages of a recording",
                              description="Print a recording's messages, reassembled from their fragments. "
                                          "Positions are stream positions after each message.")
    dump.add_argument("dir", help="an archive directory")
    dump.add_argument("recording_id", type=int)
    dump.add_argument("--from", dest="from_position", type=int, metavar="POS",
                      help="start at this position (a frame boundary; default: the recording's start)")
    dump.add_argument("--to", dest="to_position", type=int, metavar="POS",
                      help="stop at this position (default: the recording's stop, or the end of its data)")
    dump.add_argument("--json", action="store_true",
                      help='one JSON object per message: {"position", "length", "payload_b64", "stream_id", '
                           '"session_id"}')
    dump.add_argument("--headers", action="store_true",
                      help="ramen's message headers instead of the payloads: kind, channel, source and event "
                           'times (with --json: {"position", "length", "kind", "channel", "source", '
                           '"min_event_time_us", "max_event_time_us"}; a message not ramen\'s, its length alone)')
    dump.set_defaults(run=run_dump)

    check = actions.add_parser("verify", help="check an archive's files, frames and positions against its catalog",
                               description="Check segment file names, frame headers, stop positions and, with "
                                           "--checksum, frame and descriptor checksums. Exit 0 when sound, 1 with "
                                           "one line per problem otherwise.")
    check.add_argument("dir", help="an archive directory")
    check.add_argument("--checksum", choices=checksums.NAMES,
                       help="check frame checksums (in each DATA frame's sessionId) and descriptor checksums with "
                            "this algorithm (default: each recording's own, found from its descriptor checksum)")
    check.set_defaults(run=run_verify)

    purge = actions.add_parser("purge", help="delete a recording's oldest whole segment files",
                               description="Delete the segment files that lie wholly before POS and move the "
                                           "recording's start position to the first one kept. The segment "
                                           "holding the recording's end is never deleted. Refused while an "
                                           "archiver is running in DIR.")
    purge.add_argument("dir", help="an archive directory")
    purge.add_argument("recording_id", type=int)
    purge.add_argument("--before", required=True, metavar="POS|TIME",
                       help="purge data before this position (an integer), or before this time (as --since reads it, "
                            "e.g. -30d or 2026-11-20T10:00Z: found through the recording's event-time index, else its "
                            "timestamps)")
    purge.set_defaults(run=run_purge)


def _open_catalog(directory: str, *, writable: bool = False) -> Catalog:
    if not Path(directory).is_dir():
        raise UserError(f"{directory}: no such archive directory")
    try:
        return Catalog.open(directory, writable=writable)
    except CatalogError as e:
        raise UserError(str(e)) from None


def _get(catalog: Catalog, recording_id: int) -> RecordingDescriptor:
    try:
        return catalog.get(recording_id)
    except UnknownRecordingError:
        ids = catalog.recording_ids()
        known = f"{min(ids)}..{max(ids)}" if ids else "none"
        raise UserError(f"{catalog.path.parent}: no recording {recording_id} (recordings: {known})") from None


# -- describe ------------------------------------------------------------------------------------


def run_describe(args) -> int:
    with _open_catalog(args.dir) as catalog:
        header = catalog.header
        if args.recording_id is not None:
            descriptors = [_get(catalog, args.recording_id)]
        else:
            descriptors = catalog.descriptors()
        capacity = catalog.capacity
        checks = [_describe_checks(catalog, d) for d in descriptors]
    out = sys.stdout
    if args.json:
        for d in descriptors:
            out.write(json.dumps(d.to_aeron_dict()) + "\n")
        return 0
    out.write(f"{Path(args.dir) / 'archive.catalog'}\n")
    out.write(f"  {'version':<20} {version_string(header.version)}\n")
    out.write(f"  {'length':<20} {header.length}\n")
    out.write(f"  {'nextRecordingId':<20} {header.next_recording_id}\n")
    out.write(f"  {'alignment':<20} {header.alignment}\n")
    out.write(f"  {'capacity':<20} {capacity}\n")
    for d, notes in zip(descriptors, checks):
        out.write(f"recording {d.recording_id}\n")
        for name, value in d.to_aeron_dict().items():
            out.write(f"  {name:<20} {value}\n")
        out.write(f"  {'checksum':<20} {d.checksum}{notes[0]}\n")
        if notes[1]:
            out.write(f"  {'problem':<20} {notes[1]}\n")
    if args.recording_id is None:
        _describe_coverage(Path(args.dir), out)
    return 0


def _describe_coverage(archive_dir: Path, out) -> None:
    """The event times each function's recordings hold, and the gaps between them: where the
    archive misses rows (its source was down, or its archiver longer than the writer waited)."""
    from ramen.archive.coverage import archive_coverage
    from ramen.times import format_range
    for name, intervals in sorted(archive_coverage(archive_dir).items()):
        out.write(f"function {name}\n")
        for interval in intervals:
            out.write(f"  {'covers':<20} {format_range(interval.since_us, interval.until_us)}\n")
        for before, after in zip(intervals, intervals[1:]):
            out.write(f"  {'gap':<20} {format_range(before.until_us, after.since_us)} "
                      f"({(after.since_us - before.until_us) / 1e6:g} s of event time no recording holds)\n")


def _describe_checks(catalog: Catalog, d: RecordingDescriptor) -> tuple[str, str | None]:
    """(what the descriptor checksum says, what makes the descriptor unusable or None)."""
    try:
        algorithm = catalog.descriptor_checksum(d.recording_id)
        note = " (none)" if algorithm is None else f" ({algorithm.name}, stale: made before its stop was written)" \
            if catalog.checksum_is_stale(d.recording_id) else f" ({algorithm.name})"
    except CatalogError:
        note = " (matches no algorithm: damaged descriptor)"
    problem = layout_problem(d)
    return note, None if problem is None else f"{problem} (damaged descriptor)"


# -- dump ----------------------------------------------------------------------------------------


def _messages(frames: Iterator[SegmentFrame], reader: SegmentReader,
              checksum: Checksum | None) -> Iterator[tuple[int, bytes]]:
    """(end position, payload) of each whole message; fragments before the first BEGIN (a range
    that starts inside a message) are skipped. A checksum mismatch or fragments out of order raise
    SegmentError naming the file and offset."""
    parts: list[bytes] | None = None
    order = MessageOrder()
    for f in frames:
        problem = order.problem(f.position, f.type, f.flags)
        if problem is None and checksum is not None and f.type == HDR_TYPE_DATA and \
                checksum.compute(f.padded_payload()) != f.session_id:
            problem = f"{checksum.name} checksum of the payload does not match the frame's (damaged data)"
        if problem is not None:
            raise SegmentError(f"{reader.where(f.position)} (position {f.position}): {problem}")
        if f.type != HDR_TYPE_DATA:
            continue
        flags = f.flags & (BEGIN_FLAG | END_FLAG)
        if flags == BEGIN_FLAG | END_FLAG:
            yield f.end_position, f.payload()
        elif flags & BEGIN_FLAG:
            parts = [f.payload()]
        elif parts is not None:
            parts.append(f.payload())
            if flags & END_FLAG:
                yield f.end_position, b"".join(parts)
                parts = None


def run_dump(args) -> int:
    with _open_catalog(args.dir) as catalog:
        d = _get(catalog, args.recording_id)
        problem = layout_problem(d)
        if problem is not None:
            raise UserError(f"{catalog.where(d.recording_id)}: recording {d.recording_id}: {problem} (damaged "
                            f"descriptor)")
        try:
            checksum = catalog.descriptor_checksum(d.recording_id)
        except CatalogError as e:
            raise UserError(str(e)) from None
    start, stop = d.start_position, d.stop_position
    end_text = "the end of its data" if stop == NULL_POSITION else f"its stop position {stop}"
    from_position = start if args.from_position is None else args.from_position
    if from_position % FRAME_ALIGNMENT:
        raise UserError(f"--from {from_position} is not a frame boundary (a multiple of {FRAME_ALIGNMENT})")
    if from_position < start or (stop != NULL_POSITION and from_position > stop):
        raise UserError(f"--from {from_position} is outside recording {d.recording_id} ({start}..{end_text})")
    to_position = stop if args.to_position is None else args.to_position
    if to_position == NULL_POSITION:
        to_position = None
    elif to_position % FRAME_ALIGNMENT:
        raise UserError(f"--to {to_position} is not a frame boundary (a multiple of {FRAME_ALIGNMENT})")
    elif to_position < from_position:
        raise UserError(f"--to {to_position} is before --from {from_position}")
    elif stop != NULL_POSITION and to_position > stop:
        raise UserError(f"--to {to_position} is past the end of recording {d.recording_id} ({end_text})")
    out = sys.stdout
    try:
        reader = SegmentReader.for_recording(args.dir, d)
    except ArchiveError as e:
        raise UserError(f"recording {d.recording_id}: {e}") from None
    with reader:
        try:
            if from_position != start and not _is_frame_start(reader, d, from_position):
                raise UserError(f"--from {from_position} is not the start of a frame of recording {d.recording_id}")
            # To a stop, the data must reach it (strict): a dump that ends short of it is an error.
            frames = reader.frames(from_position, to_position, strict=to_position is not None)
            if not args.json:
                out.write(f"recording {d.recording_id}: stream {d.stream_id}, session {d.session_id}, "
                          f"positions {from_position}..{'end' if to_position is None else to_position}\n")
                out.write(f"  {'position':>12} {'length':>8}  payload\n")
            for position, payload in _messages(frames, reader, checksum):
                if args.headers:
                    out.write(_header_line(position, payload, args.json))
                elif args.json:
                    out.write(json.dumps({"position": position, "length": len(payload),
                                          "payload_b64": base64.b64encode(payload).decode(),
                                          "stream_id": d.stream_id, "session_id": d.session_id}) + "\n")
                else:
                    preview = payload[:PREVIEW_BYTES]
                    text = preview.decode("ascii", "replace") if preview.isascii() else preview.hex()
                    more = "…" if len(payload) > PREVIEW_BYTES else ""
                    out.write(f"  {position:>12} {len(payload):>8}  {text!r}{more}\n")
        except SegmentError as e:
            out.flush()  # what was good goes out first; the error line then says where it stopped
            raise UserError(f"recording {d.recording_id}: {e}") from None
    return 0


def _header_line(position: int, payload: bytes, as_json: bool) -> str:
    """A message by its ramen header (kind, channel, source, event times; ramen/message.py), not its
    bytes: a dump of a recording of 64 KiB messages was 110 KB of base64 a line."""
    header = decode_header(payload)
    if header is None:
        return (json.dumps({"position": position, "length": len(payload)}) + "\n" if as_json else
                f"  {position:>12} {len(payload):>8}  (not a ramen message)\n")
    times = [None if t == NO_EVENT_TIME else t for t in (header.min_event_time_us, header.max_event_time_us)]
    if as_json:
        return json.dumps({"position": position, "length": len(payload), "kind": KINDS[header.kind],
                           "channel": header.channel, "source": header.source, "min_event_time_us": times[0],
                           "max_event_time_us": times[1]}) + "\n"
    bounds = "" if times[0] is None else f" {format_time(times[0])} .. {format_time(times[1], ceil=True)}"
    return (f"  {position:>12} {len(payload):>8}  {KINDS[header.kind]} channel {header.channel} "
            f"source {header.source}{bounds}\n")


def _is_frame_start(reader: SegmentReader, d: RecordingDescriptor, position: int) -> bool:
    """Whether a frame header sits at position: its termOffset field is the position's (or no data is there yet)."""
    header = bytearray(HEADER_LENGTH)
    reader.read(position, header)
    length = int.from_bytes(header[0:4], "little", signed=True)
    term_offset = int.from_bytes(header[8:12], "little", signed=True)
    return length == 0 or (length >= HEADER_LENGTH and term_offset == position & (d.term_buffer_length - 1))


# -- verify --------------------------------------------------------------------------------------


def run_verify(args) -> int:
    if not Path(args.dir).is_dir():
        raise UserError(f"{args.dir}: no such archive directory")
    try:
        report = verify.verify_archive_report(args.dir, checksum=checksums.optional(args.checksum))
    except OSError as e:
        raise UserError(f"{e.filename or args.dir}: {e.strerror}") from None
    # Recordings made without checksums are not damaged: one line says what --checksum could not check.
    note = _without_checksums_note(report.without_checksums, args.checksum)
    for problem in report.problems:
        sys.stdout.write(problem + "\n")
    if report.problems:
        if note:
            sys.stdout.write(f"{args.dir}: {note}\n")
        return 1
    sys.stdout.write(f"{args.dir}: ok" + (f"; {note}" if note else "") + "\n")
    return 0


def _without_checksums_note(recording_ids: list[int], algorithm: str | None) -> str:
    """'recordings 0, 1 carry no checksums ...', or '' when every recording could be checked."""
    if not recording_ids:
        return ""
    named = ", ".join(str(rid) for rid in recording_ids[:MAX_RECORDINGS_NAMED])
    if len(recording_ids) > MAX_RECORDINGS_NAMED:
        named += f" and {len(recording_ids) - MAX_RECORDINGS_NAMED} more"
    which = f"recordings {named} carry" if len(recording_ids) > 1 else f"recording {named} carries"
    return (f"{which} no checksums (recorded with --checksum none), so --checksum {algorithm} was not checked there; "
            f"everything else was")


# -- purge ---------------------------------------------------------------------------------------


def run_purge(args) -> int:
    if not Path(args.dir).is_dir():
        raise UserError(f"{args.dir}: no such archive directory")
    try:
        owner = markfile.read_info(args.dir)
    except markfile.MarkFileError as e:
        raise UserError(str(e)) from None
    if owner is not None and owner.is_active():
        raise UserError(f"{args.dir}: an archiver is running here (pid {owner.pid}); purge through it, or stop it "
                        f"first")
    before_position, before_time_ms = _parse_before(args.before, time.time_ns() // 1000)
    with _open_catalog(args.dir, writable=True) as catalog:
        _get(catalog, args.recording_id)
        index_file = index_path(args.dir, args.recording_id)
        try:
            if before_position is not None:
                result = retention.purge_before(catalog, args.recording_id, before_position)
            else:
                result = retention.purge_before_time(catalog, args.recording_id, before_time_ms,
                                                     time_to_position=_time_index_lookup(index_file, args.recording_id))
        except ArchiveError as e:
            raise UserError(str(e)) from None
        if result.purged and index_file.exists():
            try:
                writer = TimeIndexWriter(index_file, args.recording_id)
                writer.truncate_before(result.new_start_position)
                writer.close()
            except ArchiveError as e:
                raise UserError(str(e)) from None
    if not result.purged:
        sys.stdout.write(f"recording {args.recording_id}: nothing to purge before {args.before} (start "
                         f"{result.old_start_position}; only whole segments before the last one go)\n")
        return 0
    sys.stdout.write(f"recording {args.recording_id}: start position {result.old_start_position} -> "
                     f"{result.new_start_position}; deleted {len(result.deleted)} segment file(s)\n")
    for path in result.deleted:
        sys.stdout.write(f"  {path.name}\n")
    return 0


def _parse_before(text: str, now_us: int) -> tuple[int | None, int | None]:
    """(position, None) for an integer, (None, epoch ms) for a time as --since reads it (ramen.times):
    a position is what an archive counts in, so a bare integer is one, never epoch seconds or YYYYMMDD."""
    try:
        position = int(text)
    except ValueError:
        pass
    else:
        if position < 0:
            raise UserError(f"--before {position} is negative")
        return position, None
    from ramen.times import TimeError, parse_time
    try:
        return None, parse_time(text, now_us) // 1000
    except TimeError as e:
        raise UserError(f"--before: {e}") from None


def _time_index_lookup(index_file: Path, recording_id: int):
    """Map an epoch-ms time to the first message that can hold an event time at or after it, when
    the recording has an event-time index (event times are in µs)."""
    if not index_file.exists():
        return None

    def lookup(time_ms: int) -> int | None:
        index = TimeIndex.open(index_file, recording_id)
        try:
            return index.seek(time_ms * 1000)
        finally:
            index.close()
    return lookup

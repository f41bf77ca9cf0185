"""Archive benchmark: recording and replay throughput against the raw read rate of the same bytes.

For each message size it
1. records: a writer process offers the messages into a log buffer; this process runs the
   recorder (a tethered subscriber) into segment files; MB/s from first offer to last byte on disk;
2. replays: this process runs a ReplaySession over the recording (from the page cache) into a
   replay log; a reader process counts every message and payload byte (by default it takes whole
   blocks with `block_poll` and reads their frame headers; `--reader fragment` calls a Python
   handler per fragment, which is slower than the replay and so measures the reader); MB/s, msgs/s;
3. reads the same segment files raw: `cat > /dev/null`, and `preadv` in replay-buffer-sized pieces
   into one reused buffer (a memcpy into a cache-hot buffer, as cat does), and into a /dev/shm file
   the size of the replay log (the copy a replay cannot avoid: the bytes must land in the shared
   log, whose 3 terms are not cache-hot when they are larger than the cache).

Steps 2 and 3 go round `--runs` times (default 5), alternating, so that the replay and the raw
reads meet the same machine (this VM's memory bandwidth drifts by tens of percent from minute to
minute); the figures are the medians, with the spread beside them. Every log is pre-touched when
it is created and mapped (`LogBuffer.create/open(pre_touch=True)`, Aeron's pre-touch of mapped
memory): the rates are a replay's steady state, not its first lap's page faults (about 3 µs a 4 KiB
page here: 40 ms for a 48 MiB log, printed beside the figures).

Frames are checksummed as ramen's archiver does by default (CRC-32C, in each DATA frame's sessionId
field), and the replays verify them; `--checksum none` measures without (see bench/README.md for
what the checksums cost).

Run: `.venv/bin/python bench/archive.py [--quick] [--json] [--runs N] [--megabytes N] [--replay-buffer BYTES]
[--checksum crc32c|crc32|none]`.
Goals printed beside the figures: replay >= 1 GB/s for 64 KiB messages, and >= 50% of the raw rate
(the faster of cat and the read into one buffer).
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ramen.archive import checksum as checksums  # noqa: E402
from ramen.archive.catalog import Catalog  # noqa: E402
from ramen.archive.recorder import Recorder  # noqa: E402
from ramen.archive.replay import REPLAY_BUFFER_LENGTH, ReplaySession, replay_log_params  # noqa: E402
from ramen.transport import (ADMIN_ACTION, BackoffIdleStrategy, CountersFile, ExclusivePublication, Image,  # noqa: E402
                             LogBuffer, LogBufferParams, ReplayPublication)
from ramen.transport.defaults import IPC_MTU_LENGTH, IPC_TERM_LENGTH  # noqa: E402
from ramen.transport.frame_walk import walk_budget  # noqa: E402
from ramen.transport.logbuffer import compute_max_message_length  # noqa: E402
from workers.archiver import DEFAULT_CHECKSUM, NO_CHECKSUM  # noqa: E402

TERM_LENGTH = IPC_TERM_LENGTH  # what ramen's own logs use, so what its recordings hold
SEGMENT_LENGTH = 128 * 1024 * 1024
MTU = IPC_MTU_LENGTH
SIZES = (64 * 1024, 1024)
"""Message sizes measured, in bytes."""
GOAL_REPLAY_GBPS = 1.0
GOAL_RAW_FRACTION = 0.5


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _writer(log_path: str, counters_path: str, size: int, count: int) -> None:
    log = LogBuffer.open(log_path)
    counters = CountersFile.open(counters_path)
    publication = ExclusivePublication(log, counters)
    idle = BackoffIdleStrategy()
    while not publication.is_connected:
        idle.idle(0)
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    sent = 0
    while sent < count:
        result = publication.offer(payload)
        if result > 0:
            sent += 1
            idle.reset()
        elif result != ADMIN_ACTION:
            idle.idle(0)
    publication.close()


def _fragment_reader(log_path: str, counters_path: str, join_position: int, done) -> None:
    """A subscriber with a Python handler per fragment (Image.poll)."""
    log = LogBuffer.open(log_path, pre_touch=True)
    counters = CountersFile.open(counters_path)
    image = Image(log, counters, join_position=join_position, name="bench-reader")
    state = {"messages": 0, "bytes": 0}

    def on_fragment(buffer, offset, length, header) -> None:
        if buffer[header.offset + 5] & 0x40:  # END flag: one whole message
            state["messages"] += 1
        state["bytes"] += length

    _read_to_the_end(image, lambda: image.poll(on_fragment, 4096), state, done)


def _block_reader(log_path: str, counters_path: str, join_position: int, done) -> None:
    """A bulk subscriber (Image.block_poll) that still counts every message and payload byte from
    the frame headers. A block of few frames (64 KiB messages) is walked header by header; a block
    of many is scanned with numpy (a frame's term offset field names its own offset, and the frames
    must chain), walking them one by one only if a payload mimics a header. The same choice as the
    replay's (walk_budget), for the same costs."""
    log = LogBuffer.open(log_path, pre_touch=True)
    counters = CountersFile.open(counters_path)
    image = Image(log, counters, join_position=join_position, name="bench-reader")
    state = {"messages": 0, "bytes": 0}
    terms = [np.frombuffer(term, dtype=np.int32) for term in log.terms]
    slot_offsets = np.arange(log.term_length // 32, dtype=np.int32) * 32

    def on_block(term, offset, length, session_id, term_id) -> None:
        words = terms[(term_id - log.initial_term_id) % 3]
        if length < walk_budget(length) * ((int(words[offset >> 2]) + 31) & ~31):
            count_walking(words, offset, offset + length)
            return
        block = words[offset >> 2:(offset + length) >> 2]
        slots = length >> 5
        starts = np.flatnonzero(block[2::8] == slot_offsets[offset >> 5:(offset >> 5) + slots]) << 5
        lengths = block[starts >> 2]
        ends = starts + ((lengths + 31) & ~31)
        if not (len(starts) and starts[0] == 0 and ends[-1] == length and np.array_equal(ends[:-1], starts[1:])):
            count_walking(words, offset, offset + length)
            return
        kinds = block[(starts >> 2) + 1]  # version, flags, type
        data = (kinds >> 16) == 1  # PAD frames carry nothing
        state["messages"] += int(np.count_nonzero(data & ((kinds & 0x4000) != 0)))  # END flag: one whole message
        state["bytes"] += int((lengths[data] - 32).sum())

    def count_walking(words, at: int, end: int) -> None:
        messages = payload = 0
        while at < end:
            frame_length = int(words[at >> 2])
            kind = int(words[(at >> 2) + 1])
            if kind >> 16 == 1:  # DATA
                payload += frame_length - 32
                messages += (kind & 0x4000) != 0
            at += (frame_length + 31) & ~31
        state["messages"] += messages
        state["bytes"] += payload

    _read_to_the_end(image, lambda: image.block_poll(on_block, 1 << 20), state, done)
    terms.clear()


def _read_to_the_end(image: Image, poll, state: dict, done) -> None:
    idle = BackoffIdleStrategy()
    started = None
    while not image.is_end_of_stream:
        n = poll()
        if n and started is None:
            started = time.perf_counter()
        idle.idle(n)
    done.put({**state, "elapsed": time.perf_counter() - (started or time.perf_counter())})


READERS = {"block": _block_reader, "fragment": _fragment_reader}


@dataclass
class Recorded:
    """One recording of `count` messages of `size` bytes, and where its files are."""
    size: int
    count: int
    descriptor: object
    segments: list[Path]
    record_s: float


def record(size: int, total_bytes: int, archive_dir: Path, logdir: Path, counters: CountersFile,
           term_length: int, mtu: int, checksum: checksums.Checksum | None) -> Recorded:
    count = max(1, total_bytes // size)
    ctx = multiprocessing.get_context("spawn")
    live = LogBuffer.create(logdir / f"live-{size}.logbuffer",
                            LogBufferParams(term_length=term_length, mtu_length=mtu, session_id=1, stream_id=1),
                            pre_touch=True)
    catalog = Catalog.open_or_create(archive_dir, checksum=checksum)
    recorder = Recorder(catalog, live, counters, segment_length=SEGMENT_LENGTH, checksum=checksum,
                        index_event_time=False)
    writer = ctx.Process(target=_writer, args=(str(live.path), str(counters.path), size, count))
    writer.start()
    idle = BackoffIdleStrategy()
    started = None
    while not recorder.is_stopped:
        if not writer.is_alive() and writer.exitcode:
            raise SystemExit(f"archive bench: the writer failed (exit {writer.exitcode}); see its error above")
        work = recorder.do_work()
        if work and started is None:
            started = time.perf_counter()
        idle.idle(work)
    record_s = time.perf_counter() - started
    writer.join()
    descriptor = catalog.get(recorder.recording_id)
    catalog.close()
    live.close()
    live.path.unlink()
    segments = sorted(archive_dir.glob(f"{recorder.recording_id}-*.rec"))
    recorded = descriptor.stop_position - descriptor.start_position
    progress(f"  {size} B: recorded {recorded / 1e6:,.0f} MB in {record_s:.2f} s")
    return Recorded(size, count, descriptor, segments, record_s)


def replay_once(rec: Recorded, archive_dir: Path, logdir: Path, counters: CountersFile, *, reader_kind: str,
                replay_buffer: int, checksum: checksums.Checksum | None) -> tuple[float, float]:
    """One replay into a reader process: (seconds from the session's start to the reader's last
    message, seconds the replay log took to create pre-touched)."""
    ctx = multiprocessing.get_context("spawn")
    descriptor = rec.descriptor
    created = time.perf_counter()
    replay_log = LogBuffer.create(logdir / f"replay-{rec.size}.logbuffer",
                                  replay_log_params(descriptor, descriptor.start_position, session_id=2, stream_id=2),
                                  pre_touch=True)
    create_s = time.perf_counter() - created
    done = ctx.Queue()
    reader = ctx.Process(target=READERS[reader_kind],
                         args=(str(replay_log.path), str(counters.path), descriptor.start_position, done))
    reader.start()
    publication = ReplayPublication(replay_log, counters)  # as the replayer's (replayer_process.open_output)
    idle = BackoffIdleStrategy()
    while not publication.is_connected:
        idle.idle(0)
    session = ReplaySession(archive_dir, descriptor, publication, replay_buffer_length=replay_buffer,
                            checksum=checksum)
    started = time.perf_counter()
    while not session.is_done:
        idle.idle(session.do_work())
    session.close()
    publication.close()
    result = done.get(timeout=600)
    replay_s = time.perf_counter() - started
    reader.join()
    replay_log.close()
    replay_log.path.unlink()
    assert session.error is None, session.error
    assert result["messages"] == rec.count, f"reader saw {result['messages']} of {rec.count} messages"
    assert result["bytes"] == rec.count * rec.size, "reader saw the wrong number of bytes"
    return replay_s, create_s


def measure(size: int, total_bytes: int, workdir: Path, logdir: Path, *, runs: int, reader_kind: str = "block",
            replay_buffer: int = REPLAY_BUFFER_LENGTH, term_length: int = TERM_LENGTH, mtu: int = MTU,
            checksum: checksums.Checksum | None = checksums.get(DEFAULT_CHECKSUM)) -> dict:
    counters = CountersFile.open(logdir / "counters.dat")
    archive_dir = workdir / "archive"
    rec = record(size, total_bytes, archive_dir, logdir, counters, term_length, mtu, checksum)
    recorded = rec.descriptor.stop_position - rec.descriptor.start_position
    ring = LogBuffer.create(logdir / "ring.logbuffer", LogBufferParams(term_length=term_length), pre_touch=True)
    # Page-aligned, as cat's buffer is: preadv into a buffer 16 bytes off the page cache's alignment
    # (a bytearray's, from malloc) runs at half the rate here, and would flatter the replay.
    cache_hot = mmap.mmap(-1, replay_buffer)
    times: dict[str, list[float]] = {"replay": [], "create": [], "cat": [], "pread": [], "pread_to_log": []}
    for run in range(runs):
        replay_s, create_s = replay_once(rec, archive_dir, logdir, counters, reader_kind=reader_kind,
                                         replay_buffer=replay_buffer, checksum=checksum)
        times["replay"].append(replay_s)
        times["create"].append(create_s)
        times["cat"].append(timed(lambda: subprocess.run(["cat", *map(str, rec.segments)], stdout=subprocess.DEVNULL,
                                                         check=True)))
        times["pread"].append(timed(lambda: read_into(rec.segments, memoryview(cache_hot))))
        times["pread_to_log"].append(timed(lambda: read_into(rec.segments, ring.buffer, wrap=replay_buffer)))
        progress(f"  {size} B: run {run + 1}/{runs}: replay {recorded / replay_s / 1e6:,.0f} MB/s, "
                 f"cat {recorded / times['cat'][-1] / 1e6:,.0f}, pread {recorded / times['pread'][-1] / 1e6:,.0f}, "
                 f"pread→log {recorded / times['pread_to_log'][-1] / 1e6:,.0f}")
    ring.close()
    ring.path.unlink()
    cache_hot.close()
    for path in rec.segments:
        path.unlink()
    counters.close()
    rates = {name: sorted(recorded / t / 1e6 for t in values) for name, values in times.items() if name != "create"}
    return {
        "message_bytes": size, "messages": rec.count, "recorded_bytes": recorded, "runs": runs,
        "record_mb_s": recorded / rec.record_s / 1e6,
        "replay_mb_s": statistics.median(rates["replay"]),
        "replay_msgs_s": rec.count / statistics.median(times["replay"]),
        "raw_cat_mb_s": statistics.median(rates["cat"]), "raw_pread_mb_s": statistics.median(rates["pread"]),
        "pread_to_log_mb_s": statistics.median(rates["pread_to_log"]),
        "spread_mb_s": {name: [round(v) for v in values] for name, values in rates.items()},
        "replay_log_create_ms": 1000 * statistics.median(times["create"]),
        "replay_buffer": replay_buffer, "reader": reader_kind, "term_length": term_length, "mtu": mtu,
        "checksum": checksum.name if checksum is not None else NO_CHECKSUM,
    }


def read_into(paths: list[Path], target: memoryview, *, wrap: int | None = None) -> None:
    """preadv every file into `target`: the whole of it each time (one reused, cache-hot buffer),
    or, with `wrap`, in pieces of that size going round it (a ring the size of the replay log: the
    copy a replay into its log pays, without finding frames or cleaning)."""
    piece = wrap or len(target)
    at = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            offset = 0
            while True:
                if at + piece > len(target):
                    at = 0
                n = os.preadv(fd, [target[at:at + piece]], offset)
                if n <= 0:
                    break
                offset += n
                if wrap:
                    at += piece
        finally:
            os.close(fd)


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=512, help="bytes recorded per message size (default 512 MB)")
    parser.add_argument("--quick", action="store_true", help="128 MB per size")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--runs", type=int, default=5,
                        help="replays (and raw reads) per size, alternating; medians are reported (default 5)")
    parser.add_argument("--reader", choices=sorted(READERS), default="block",
                        help="how the subscriber reads: whole blocks (default) or a handler per fragment")
    parser.add_argument("--replay-buffer", type=int, default=REPLAY_BUFFER_LENGTH, metavar="BYTES",
                        help=f"bytes a replay reads per duty cycle (default {REPLAY_BUFFER_LENGTH}, as Aeron)")
    parser.add_argument("--term-length", type=int, default=TERM_LENGTH, metavar="BYTES",
                        help=f"term length of the recorded log and so of the replay log (default {TERM_LENGTH})")
    parser.add_argument("--mtu", type=int, default=MTU, metavar="BYTES",
                        help=f"MTU of the recorded log (default {MTU}, ramen's; Aeron's UDP default is 1408)")
    parser.add_argument("--checksum", choices=(*checksums.NAMES, NO_CHECKSUM), default=DEFAULT_CHECKSUM,
                        help=f"frame checksum recorded and verified by the replays (default {DEFAULT_CHECKSUM}, as "
                             f"ramen's archiver)")
    args = parser.parse_args()
    if compute_max_message_length(args.term_length) < max(SIZES):
        parser.error(f"a term of {args.term_length} B cannot hold a {max(SIZES)} B message (a message is at most "
                     f"1/8 of a term): use at least {8 * max(SIZES)}")
    total = (128 if args.quick else args.megabytes) * 1_000_000
    workdir = Path(tempfile.mkdtemp(prefix="ramen-bench-archive-"))
    # Log buffers are shared memory, as Aeron keeps them in /dev/shm: a log on a disk-backed file
    # would pay for writing its dirty pages back. The segments are real files on disk.
    logdir = Path(tempfile.mkdtemp(prefix="ramen-bench-logs-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    checksum = None if args.checksum == NO_CHECKSUM else checksums.get(args.checksum)
    progress(f"archive bench: {os.cpu_count()} CPUs, {total / 1e6:,.0f} MB per size, segments under {workdir} "
             f"(written to disk, read back from the page cache), log buffers under {logdir}, "
             f"replay buffer {args.replay_buffer} B, {args.reader} reader, term {args.term_length} B, "
             f"MTU {args.mtu} B, frame checksum {args.checksum}")
    try:
        rows = [measure(size, total, workdir, logdir, runs=args.runs, reader_kind=args.reader,
                        replay_buffer=args.replay_buffer, term_length=args.term_length, mtu=args.mtu,
                        checksum=checksum)
                for size in SIZES]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(logdir, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'message':>9} {'record MB/s':>12} {'replay MB/s':>12} {'replay msgs/s':>14} {'cat MB/s':>10} "
          f"{'pread MB/s':>11} {'pread→log MB/s':>15} {'replay/raw':>10}")
    for r in rows:
        print(f"{r['message_bytes']:>8}B {r['record_mb_s']:>12,.0f} {r['replay_mb_s']:>12,.0f} {r['replay_msgs_s']:>14,.0f} "
              f"{r['raw_cat_mb_s']:>10,.0f} {r['raw_pread_mb_s']:>11,.0f} {r['pread_to_log_mb_s']:>15,.0f} "
              f"{r['replay_mb_s'] / raw_rate(r):>9.0%}")
    print(f"medians of {rows[0]['runs']} runs; spread (MB/s, lowest to highest):")
    for r in rows:
        print(f"{r['message_bytes']:>8}B " + "; ".join(f"{name} {'-'.join(f'{v:,}' for v in values[::max(1, len(values) - 1)])}"
                                                     for name, values in r["spread_mb_s"].items()))
    print(f"each replay log ({rows[0]['term_length'] * 3 >> 20} MiB) was created pre-touched in "
          f"{rows[0]['replay_log_create_ms']:.0f} ms (median), before the replay's clock starts")
    big = rows[0]
    raw = raw_rate(big)
    for ok, text in ((big["replay_mb_s"] >= GOAL_REPLAY_GBPS * 1000,
                      f"replay of 64 KiB messages >= {GOAL_REPLAY_GBPS:.0f} GB/s: {big['replay_mb_s'] / 1000:.2f} GB/s"),
                     (big["replay_mb_s"] >= GOAL_RAW_FRACTION * raw,
                      (f"replay >= {GOAL_RAW_FRACTION:.0%} of the raw read rate: {big['replay_mb_s'] / raw:.0%} "
                       f"(of the log-sized copy alone: {big['replay_mb_s'] / big['pread_to_log_mb_s']:.0%})"))):
        print(f"{'PASS' if ok else 'MISS'}  {text}")
    return 0


def raw_rate(row: dict) -> float:
    """The raw read rate of the goal: the faster of cat and the read into one reused buffer."""
    return max(row["raw_cat_mb_s"], row["raw_pread_mb_s"])


if __name__ == "__main__":
    sys.exit(main())

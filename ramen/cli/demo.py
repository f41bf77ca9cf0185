"""`ramen demo`: a writer and a reader process through one log buffer, checked end to end.

Until the replay pipeline lands, this is the main job the README runs: it shows the transport
working across processes on this machine, with flow control, and leaves the log buffer behind
for `ramen logbuffer inspect`.
"""

from __future__ import annotations

import multiprocessing
import struct
import sys
import time

import numpy as np

from ramen import paths
from ramen.cli.errors import UserError
from ramen.transport import (ADMIN_ACTION, BackoffIdleStrategy, CountersFile, ExclusivePublication, Image,
                             LogBuffer, LogBufferParams)

DEMO_TERM_LENGTH = 1024 * 1024
DEMO_BATCH = 512
SEQUENCE = struct.Struct("<q")
READER_START_TIMEOUT_S = 30.0
PROGRESS_INTERVAL_S = 0.5


def add_parser(sub) -> None:
    parser = sub.add_parser("demo",
                            description="Write messages from this process to a reader process through a log "
                                        "buffer under $RAMEN_DIR/demo, and check every one arrived in order.")
    parser.add_argument("--messages", type=int, default=2_000_000, help="messages to send (default 2000000)")
    parser.add_argument("--size", type=int, default=64, help="payload bytes per message, >= 8 (default 64)")
    parser.set_defaults(run=run)


def run(args) -> int:
    if args.size < SEQUENCE.size or args.size > DEMO_TERM_LENGTH // 8:
        raise UserError(f"--size must be between {SEQUENCE.size} and {DEMO_TERM_LENGTH // 8} bytes")
    if args.messages < 1:
        raise UserError("--messages must be at least 1")
    directory = paths.ramen_dir() / "demo"
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "stream.logbuffer"
    log_path.unlink(missing_ok=True)
    log = LogBuffer.create(log_path, LogBufferParams(term_length=DEMO_TERM_LENGTH, session_id=1, stream_id=1))
    counters = CountersFile.open(paths.counters_path())
    context = multiprocessing.get_context("spawn")
    done = context.Queue()
    reader = context.Process(target=_read, args=(str(log_path), str(counters.path), args.messages, done),
                             name="ramen-demo-reader")
    reader.start()
    publication = ExclusivePublication(log, counters)
    progress = sys.stderr.isatty()
    try:
        started = _write(publication, args.messages, args.size, reader, progress)
        result = done.get(timeout=60)
        elapsed = time.perf_counter() - started
        back_pressure = publication.back_pressure_events
    finally:
        publication.close()
        reader.join(timeout=10)
    if result["errors"]:
        raise UserError(f"reader saw {result['errors']} out-of-order or corrupt messages")
    mb = args.messages * args.size / 1e6
    print(f"sent {args.messages:,} messages of {args.size} bytes ({mb:,.1f} MB) to another process in {elapsed:.2f} s: "
          f"{args.messages / elapsed:,.0f} msgs/s, {mb / elapsed:,.1f} MB/s")
    print(f"reader checked {result['received']:,} messages in order, none lost or duplicated; "
          f"the writer was back-pressured {back_pressure:,} times")
    print(f"log buffer kept at {log_path} (try: ramen logbuffer inspect {log_path} | tail)")
    return 0


def _write(publication: ExclusivePublication, total: int, size: int, reader, progress: bool) -> float:
    idle = BackoffIdleStrategy()
    deadline = time.monotonic() + READER_START_TIMEOUT_S
    while not publication.is_connected:
        if not reader.is_alive() or time.monotonic() > deadline:
            raise UserError("the reader process did not start")
        idle.idle(0)
    rows = np.zeros((DEMO_BATCH, size), dtype=np.uint8)
    rows[:, SEQUENCE.size:] = np.frombuffer(bytes(range(256)) * (size // 256 + 1), dtype=np.uint8)[:size - SEQUENCE.size]
    sequences = rows[:, :SEQUENCE.size].view(np.int64).reshape(-1)
    started = time.perf_counter()
    next_progress = started + PROGRESS_INTERVAL_S
    sent = 0
    while sent < total:
        n = min(DEMO_BATCH, total - sent)
        sequences[:n] = np.arange(sent, sent + n)
        batch = [rows[i].tobytes() for i in range(n)]
        while batch:
            written, result = publication.offer_batch(batch)
            if written:
                batch = batch[written:]
                sent += written
                idle.reset()
            elif result != ADMIN_ACTION:
                if not reader.is_alive():
                    raise UserError("the reader process died")
                idle.idle(0)
        if progress and time.perf_counter() >= next_progress:
            print(f"\r{sent:,}/{total:,} messages", end="", file=sys.stderr, flush=True)
            next_progress += PROGRESS_INTERVAL_S
    if progress:
        print(file=sys.stderr)
    return started


def _read(log_path: str, counters_path: str, expected: int, done) -> None:
    log = LogBuffer.open(log_path)
    counters = CountersFile.open(counters_path)
    image = Image(log, counters, join_position=0, name="demo-reader")
    state = {"next": 0, "errors": 0}

    def on_message(buffer, offset, length, header) -> None:
        sequence = SEQUENCE.unpack_from(buffer, offset)[0]
        if sequence != state["next"]:
            state["errors"] += 1
        state["next"] = sequence + 1

    idle = BackoffIdleStrategy()
    while state["next"] < expected and not image.is_closed:
        idle.idle(image.poll(on_message, 4096))
    done.put({"received": state["next"], "errors": state["errors"]})
    image.close()
    counters.close()
    log.close()

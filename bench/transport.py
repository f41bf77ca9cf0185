"""Transport benchmark: a writer process and a reader process on this machine, side by side with
multiprocessing.Queue and a plain memory copy.

Run it from the repository root:

    .venv/bin/python bench/transport.py            # about 1 minute
    .venv/bin/python bench/transport.py --quick    # about 15 s, shorter runs
    .venv/bin/python bench/transport.py --json     # the figures as JSON on stdout

Progress goes to stderr, the table (or JSON) to stdout. The exit status is 0 whether the goals are
met or not; it is 2 only if a reader did not receive exactly what its writer sent (a bug).

What is measured
----------------
Throughput (messages/s, and MB/s of payload: 1 MB = 10**6 bytes, frame headers not counted), for
32-byte, 1 KiB and 64 KiB messages. Each run lasts a fixed time (1 s); the bench goes round every
measurement three times and reports the median run, with the spread of the others (this machine is
a VM whose speed drifts from minute to minute). --quick does one round of 0.5 s runs.

* ``log buffer``: ramen's transport. A writer process owns an ExclusivePublication, a reader
  process an Image, on one log buffer file (16 MiB terms, so a flow-control window of 8 MiB) in a
  fresh temporary directory under /dev/shm, with a counters file there for flow control. The MTU
  is raised to 64 KiB + 32 bytes so every message, 64 KiB ones included, is one unfragmented frame
  (the default MTU of 1408 would cut a 64 KiB message into 48 fragments). The terms are written
  through once before the run, as they are in a log that has been running for a while (a fresh
  sparse file is slower while its pages fault in), and each process maps every page of it before
  its clock starts (left to the hot path, that costs about 20 ms a process on the first lap: this
  measures the steady state). Three ways of using it:

  - ``offer / poll``: one ``ExclusivePublication.offer`` per message; the reader calls
    ``Image.poll`` with a handler that counts the message and adds its length.
  - ``offer_batch(N) / block_poll``: ``offer_batch`` of N messages a call (1024 of 32 B, 256 of
    1 KiB, 16 of 64 KiB); the reader takes runs of committed frames with ``Image.block_poll`` and
    walks them itself: it reads every frame's length word and its version/flags/type word (with
    numpy strided views while frames have the same length, else one by one in Python), counts a
    message per data frame and adds its payload length.
  - ``offer_batch(N) / poll``: the same writer, read through ``Image.poll`` and a handler, which
    is what a consumer that looks at each message pays.

  The reader starts first (a publication with a counters file is NOT_CONNECTED until a subscriber
  exists), and the writer retries every NOT_CONNECTED, BACK_PRESSURED and ADMIN_ACTION. When its
  time is up the writer closes the publication, which marks the end of the stream; the reader stops
  there and reports what it counted, and the run is checked: messages and bytes received must equal
  messages and bytes sent. The rate is messages received / (reader's end - writer's start), both on
  CLOCK_MONOTONIC, which all processes share. Both processes busy-poll (there is a core each);
  ``--idle backoff`` makes the reader use BackoffIdleStrategy instead.

* ``mp.Queue``: the same messages through a ``multiprocessing.Queue`` between two processes:
  ``put``/``get`` of one bytes object each, then of lists of N bytes objects (the same N). The queue
  is bounded (about 8 MiB in flight, as the log's window) so the writer cannot run away; the reader
  counts messages and bytes and the same check applies. The writer puts ``None`` at the end.

* ``memcpy``: the physical limit, in one process: numpy copies the same payloads into a 48 MiB
  array laid out as log frames (one 2-D strided assignment, headers skipped), over and over. The
  contiguous single-buffer copy rate is printed under the table too.

Round-trip latency (p50, p99, in µs): a ping process offers a 32-byte message on log A, a pong
process polls A and offers it back on log B, the ping process polls B; the time from before the
offer to after the echo is read is taken with time.perf_counter_ns. Both sides busy-poll. 1000
round trips of warm-up, then 5000 timed ones, in each round (one round of 2000 with --quick); the
percentiles are over the samples of all rounds. The same ping-pong over a pair of
multiprocessing.Queues is measured for comparison.

Goals: >= 2 M msgs/s for 32-byte messages in batches, >= 1 GB/s for 64 KiB messages (best of the
log-buffer runs), p50 RTT < 50 µs. Each is printed PASS or MISS.
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing
import os
import queue as queue_module
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without an installed ramen
    sys.path.insert(0, str(ROOT))

from ramen.transport import frame  # noqa: E402
from ramen.transport.counters import CountersFile  # noqa: E402
from ramen.transport.idle import BackoffIdleStrategy, BusySpinIdleStrategy  # noqa: E402
from ramen.transport.image import Image  # noqa: E402
from ramen.transport.logbuffer import LogBuffer, LogBufferParams  # noqa: E402
from ramen.transport.publication import ExclusivePublication  # noqa: E402
from ramen.transport.status import CLOSED, MAX_POSITION_EXCEEDED, STATUS_NAMES  # noqa: E402

TERM_LENGTH = 16 * 1024 * 1024
MTU_LENGTH = 64 * 1024 + frame.HEADER_LENGTH  # a multiple of 32: 64 KiB payloads fit one frame
SIZES = (32, 1024, 64 * 1024)
BATCH = {32: 1024, 1024: 256, 64 * 1024: 16}
RING = 64  # distinct messages the single-offer writers cycle through
QUEUE_BYTES_IN_FLIGHT = 8 * 1024 * 1024
POLL_FRAGMENT_LIMIT = 4096
BLOCK_LENGTH_LIMIT = 1024 * 1024
START_TIMEOUT_S = 30.0
RESULT_GRACE_S = 60.0
WARMUP_ROUND_TRIPS = 1000

GOAL_SMALL_BATCH_MSGS = 2_000_000
GOAL_LARGE_BYTES = 1_000_000_000
GOAL_RTT_P50_US = 50.0

_DATA_WORD = frame.DATA_WORD_UNFRAGMENTED
_FATAL = (CLOSED, MAX_POSITION_EXCEEDED)


def log_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def size_label(size: int) -> str:
    if size >= 1024 and size % 1024 == 0:
        return f"{size // 1024} KiB"
    return f"{size} B"


def make_messages(size: int, count: int, seed: int = 1) -> list[bytes]:
    """count distinct messages of size bytes: a sequence number, then pseudo-random bytes."""
    rng = np.random.default_rng(seed)
    body = rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()
    return [(i.to_bytes(8, "little") + body[8:])[:size] for i in range(count)]


def make_idle(name: str):
    return BusySpinIdleStrategy() if name == "spin" else BackoffIdleStrategy()


class Failed(RuntimeError):
    pass


# -- log buffer: writer and reader processes ----------------------------------------------------

def prefault(log: LogBuffer) -> None:
    """Map every page of the log into this process before the clock starts.

    A read of one byte a page is enough: the kernel maps 16 pages a fault on a read, and the
    write-through done by new_log() means there is no page left to allocate. Left to the hot path,
    a 48 MiB log costs about 11,000 write faults in each process on its first lap (measured: the
    first lap of 64 KiB offers runs at 1.5 GB/s, the next ones at 5 GB/s).
    """
    int(np.frombuffer(log.buffer, dtype=np.uint8)[::mmap.PAGESIZE].sum())


def busy_cpu_seconds() -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, CPU seconds of this process and its reaped children)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    except (OSError, ValueError, IndexError):
        busy = float("nan")
    t = os.times()
    return busy, t.user + t.system + t.children_user + t.children_system


def _wait_connected(publication: ExclusivePublication) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not publication.is_connected:
        if time.monotonic() > deadline:
            raise Failed("no subscriber appeared")
        time.sleep(0.0005)


def shm_writer(log_path: str, counters_path: str, size: int, mode: str, duration_s: float, results) -> None:
    try:
        log = LogBuffer.open(log_path)
        prefault(log)
        counters = CountersFile.open(counters_path, create=False)
        publication = ExclusivePublication(log, counters)
        _wait_connected(publication)
        duration_ns = int(duration_s * 1e9)
        hard_deadline = time.monotonic_ns() + duration_ns + int(RESULT_GRACE_S * 1e9)
        retries = 0
        sent = 0
        if mode == "single":
            ring = make_messages(size, RING)
            offer = publication.offer
            start = now = time.monotonic_ns()
            end = start + duration_ns
            while now < end:
                for message in ring:
                    while (result := offer(message)) < 0:
                        retries += 1
                        if result in _FATAL or not retries & 0xFFFF:
                            _check_stuck(publication, result, hard_deadline)
                sent += RING
                now = time.monotonic_ns()
        else:
            batch = make_messages(size, BATCH[size])
            whole = len(batch)
            offer_batch = publication.offer_batch
            start = now = time.monotonic_ns()
            end = start + duration_ns
            while now < end:
                rest = batch
                while True:
                    written, result = offer_batch(rest)
                    if written == len(rest):
                        break
                    if written:
                        rest = rest[written:]
                    else:
                        retries += 1
                        if result in _FATAL or not retries & 0xFFFF:
                            _check_stuck(publication, result, hard_deadline)
                sent += whole
                now = time.monotonic_ns()
        write_end = time.monotonic_ns()
        back_pressure = publication.back_pressure_events
        publication.close()  # marks the end of the stream at the current position
        results.put(("writer", {"start_ns": start, "end_ns": write_end, "messages": sent, "bytes": sent * size,
                                "retries": retries, "back_pressure_events": back_pressure}))
    except BaseException as e:  # report, don't hang the parent
        results.put(("writer", {"error": f"{type(e).__name__}: {e}"}))


def _check_stuck(publication: ExclusivePublication, result: int, hard_deadline: int) -> None:
    if result in _FATAL:
        raise Failed(f"offer failed: {STATUS_NAMES.get(result, result)}")
    if time.monotonic_ns() > hard_deadline:
        raise Failed(f"writer stuck at position {publication.position}: {STATUS_NAMES.get(result, result)}")


def shm_reader(log_path: str, counters_path: str, read_mode: str, idle_name: str, results) -> None:
    try:
        log = LogBuffer.open(log_path)
        prefault(log)
        counters = CountersFile.open(counters_path, create=False)
        image = Image(log, counters, join_position=0, name="bench-reader")
        idle = make_idle(idle_name)
        messages = 0
        payload = 0
        first_ns = 0
        if read_mode == "poll":
            def on_fragment(buffer, offset, length, header):
                nonlocal messages, payload
                messages += 1
                payload += length

            poll = image.poll
            while True:
                n = poll(on_fragment, POLL_FRAGMENT_LIMIT)
                if n:
                    if not first_ns:
                        first_ns = time.monotonic_ns()
                    idle.idle(n)
                elif image.is_end_of_stream:
                    break
                else:
                    idle.idle(0)
        else:
            walker = BlockWalker(log)
            block_poll = image.block_poll
            while True:
                n = block_poll(walker, BLOCK_LENGTH_LIMIT)
                if n:
                    if not first_ns:
                        first_ns = time.monotonic_ns()
                    idle.idle(n)
                elif image.is_end_of_stream:
                    break
                else:
                    idle.idle(0)
            messages, payload = walker.messages, walker.payload
        end_ns = time.monotonic_ns()
        image.close()
        results.put(("reader", {"first_ns": first_ns, "end_ns": end_ns, "messages": messages, "bytes": payload,
                                "position": image.position}))
    except BaseException as e:
        results.put(("reader", {"error": f"{type(e).__name__}: {e}"}))


class BlockWalker:
    """A block_poll handler that accounts for every frame of a block.

    It reads each frame's length word and its version/flags/type word. While frames have the same
    length it checks a whole run of them at once through numpy strided views (every header is read,
    just not one Python step each); a frame that breaks the run is stepped over in Python, PAD
    frames are skipped, and a fragmented message counts once, at its END fragment.
    """

    def __init__(self, log: LogBuffer) -> None:
        self.words = [np.frombuffer(term, dtype=np.int32) for term in log.terms]
        self.initial_term_id = log.initial_term_id
        self.messages = 0
        self.payload = 0

    def __call__(self, term, offset: int, length: int, session_id: int, term_id: int) -> None:
        words = self.words[((term_id - self.initial_term_id) & 0xFFFFFFFF) % 3]
        w = offset >> 2
        end = (offset + length) >> 2
        messages = 0
        payload = 0
        while w < end:
            frame_length = int(words[w])
            stride = ((frame_length + 31) & ~31) >> 2
            run = (end - w) // stride
            if run > 1:
                stop = w + run * stride
                same = (words[w:stop:stride] == frame_length) & (words[w + 1:stop:stride] == _DATA_WORD)
                good = run if same.all() else int(same.argmin())
                if good:
                    messages += good
                    payload += good * (frame_length - frame.HEADER_LENGTH)
                    w += good * stride
                    continue
            word = int(words[w + 1])
            if (word >> 16) & 0xFFFF != frame.HDR_TYPE_PAD:
                payload += frame_length - frame.HEADER_LENGTH
                if (word >> 8) & frame.END_FLAG:
                    messages += 1
            w += stride
        self.messages += messages
        self.payload += payload


# -- multiprocessing.Queue: writer and reader processes -----------------------------------------

def queue_writer(q, size: int, mode: str, duration_s: float, ready, results) -> None:
    try:
        ready.wait(START_TIMEOUT_S)
        duration_ns = int(duration_s * 1e9)
        sent = 0
        if mode == "single":
            ring = make_messages(size, RING)
            put = q.put
            start = now = time.monotonic_ns()
            end = start + duration_ns
            while now < end:
                for message in ring:
                    put(message)
                sent += RING
                now = time.monotonic_ns()
        else:
            batch = make_messages(size, BATCH[size])
            put = q.put
            start = now = time.monotonic_ns()
            end = start + duration_ns
            while now < end:
                put(batch)
                sent += len(batch)
                now = time.monotonic_ns()
        write_end = time.monotonic_ns()
        q.put(None)
        results.put(("writer", {"start_ns": start, "end_ns": write_end, "messages": sent, "bytes": sent * size}))
    except BaseException as e:
        results.put(("writer", {"error": f"{type(e).__name__}: {e}"}))


def queue_reader(q, mode: str, ready, results) -> None:
    try:
        get = q.get
        messages = 0
        payload = 0
        first_ns = 0
        ready.set()
        item = get()
        first_ns = time.monotonic_ns()
        if mode == "single":
            while item is not None:
                messages += 1
                payload += len(item)
                item = get()
        else:
            while item is not None:
                messages += len(item)
                payload += sum(map(len, item))
                item = get()
        end_ns = time.monotonic_ns()
        results.put(("reader", {"first_ns": first_ns, "end_ns": end_ns, "messages": messages, "bytes": payload}))
    except BaseException as e:
        results.put(("reader", {"error": f"{type(e).__name__}: {e}"}))


# -- running a pair -----------------------------------------------------------------------------

def run_pair(ctx, reader_target, reader_args, writer_target, writer_args, results, timeout_s: float) -> dict:
    """Start the reader, then the writer; collect both reports."""
    sys.stdout.flush()
    sys.stderr.flush()
    reader = ctx.Process(target=reader_target, args=(*reader_args, results), name="bench-reader")
    reader.start()
    writer = ctx.Process(target=writer_target, args=(*writer_args, results), name="bench-writer")
    writer.start()
    return collect_reports(results, (writer, reader), time.monotonic() + timeout_s)


def collect_reports(results, processes, deadline: float) -> dict:
    """Wait for one report per process; stop early when one reports an error or dies, and
    never leave a process behind."""
    reports = {}
    try:
        while len(reports) < len(processes):
            try:
                role, report = results.get(timeout=0.5)
                reports[role] = report
                if "error" in report:
                    break  # the other side may wait forever: stop both
                continue
            except queue_module.Empty:
                pass
            if time.monotonic() > deadline:
                raise Failed(f"no report in time (have {sorted(reports)})")
            dead = [p.name for p in processes if not p.is_alive() and p.exitcode not in (0, None)]
            if dead:
                raise Failed(f"{', '.join(dead)} died")
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
    for role, report in reports.items():
        if "error" in report:
            raise Failed(f"{role}: {report['error']}")
    return reports


def summarise(reports: dict) -> dict:
    writer, reader = reports["writer"], reports["reader"]
    elapsed_s = (reader["end_ns"] - writer["start_ns"]) / 1e9
    verified = writer["messages"] == reader["messages"] and writer["bytes"] == reader["bytes"]
    out = {
        "messages": reader["messages"],
        "bytes": reader["bytes"],
        "seconds": elapsed_s,
        "msgs_per_s": reader["messages"] / elapsed_s,
        "mb_per_s": reader["bytes"] / elapsed_s / 1e6,
        "sent_messages": writer["messages"],
        "sent_bytes": writer["bytes"],
        "verified": verified,
        "drain_ms": (reader["end_ns"] - writer["end_ns"]) / 1e6,
    }
    if "back_pressure_events" in writer:
        out["back_pressure_events"] = writer["back_pressure_events"]
    return out


def new_log(directory: Path, name: str) -> Path:
    path = directory / f"{name}.logbuffer"
    log = LogBuffer.create(path, LogBufferParams(term_length=TERM_LENGTH, mtu_length=MTU_LENGTH,
                                                 session_id=7, stream_id=1))
    # Write the terms through once (zeros: the log stays valid), as a log that has run for a while.
    np.frombuffer(log.buffer, dtype=np.uint8)[:3 * TERM_LENGTH] = 0
    log.close()
    return path


def bench_shm(ctx, directory: Path, counters_path: Path, size: int, mode: str, duration_s: float,
              idle_name: str) -> dict:
    path = new_log(directory, f"tp-{size}-{mode}")
    write_mode, read_mode = {"single": ("single", "poll"), "batch": ("batch", "block"),
                             "batch-poll": ("batch", "poll")}[mode]
    results = ctx.Queue()
    try:
        reports = run_pair(ctx, shm_reader, (str(path), str(counters_path), read_mode, idle_name),
                           shm_writer, (str(path), str(counters_path), size, write_mode, duration_s),
                           results, duration_s + RESULT_GRACE_S)
    finally:
        path.unlink(missing_ok=True)
    return summarise(reports)


def bench_queue(ctx, size: int, mode: str, duration_s: float) -> dict:
    per_item = size if mode == "single" else size * BATCH[size]
    maxsize = max(4, min(100_000, QUEUE_BYTES_IN_FLIGHT // per_item))
    q = ctx.Queue(maxsize=maxsize)
    ready = ctx.Event()
    results = ctx.Queue()
    reports = run_pair(ctx, queue_reader, (q, mode, ready), queue_writer, (q, size, mode, duration_s, ready),
                       results, duration_s + RESULT_GRACE_S)
    return summarise(reports)


def bench_memcpy(size: int, duration_s: float) -> dict:
    """Copy the payloads into a log-sized array laid out as frames: one strided numpy assignment."""
    stride = frame.align(size + frame.HEADER_LENGTH)
    count = (3 * TERM_LENGTH) // stride
    destination = np.zeros(count * stride, dtype=np.uint8)
    source = np.random.default_rng(2).integers(0, 256, size=(count, size), dtype=np.uint8)
    region = destination.reshape(count, stride)[:, frame.HEADER_LENGTH:frame.HEADER_LENGTH + size]
    region[...] = source  # warm up
    reps = 0
    start = time.perf_counter()
    end = start + duration_s
    while True:
        region[...] = source
        reps += 1
        now = time.perf_counter()
        if now >= end:
            break
    elapsed = now - start
    messages = reps * count
    return {"messages": messages, "bytes": messages * size, "seconds": elapsed, "msgs_per_s": messages / elapsed,
            "mb_per_s": messages * size / elapsed / 1e6, "verified": True}


def bench_bulk_copy(duration_s: float) -> float:
    """Contiguous copy of a 48 MiB array: bytes/s."""
    source = np.random.default_rng(3).integers(0, 256, size=3 * TERM_LENGTH, dtype=np.uint8)
    destination = np.zeros_like(source)
    np.copyto(destination, source)
    reps = 0
    start = time.perf_counter()
    end = start + duration_s
    while True:
        np.copyto(destination, source)
        reps += 1
        now = time.perf_counter()
        if now >= end:
            break
    return reps * source.nbytes / (now - start)


# -- round trips --------------------------------------------------------------------------------

def rtt_ping(log_a: str, log_b: str, counters_path: str, round_trips: int, results) -> None:
    try:
        counters = CountersFile.open(counters_path, create=False)
        logs = [LogBuffer.open(log_a), LogBuffer.open(log_b)]
        for log in logs:
            prefault(log)
        image = Image(logs[1], counters, join_position=0, name="ping")
        publication = ExclusivePublication(logs[0], counters)
        _wait_connected(publication)
        offer = publication.offer
        poll = image.poll
        message = bytes(32)
        perf = time.perf_counter_ns

        def on_pong(buffer, offset, length, header):
            pass

        samples = []
        for i in range(WARMUP_ROUND_TRIPS + round_trips):
            t0 = perf()
            while offer(message) < 0:
                pass
            while not poll(on_pong, 1):
                pass
            samples.append(perf() - t0)
        publication.close()
        results.put(("ping", {"samples_ns": samples[WARMUP_ROUND_TRIPS:]}))
    except BaseException as e:
        results.put(("ping", {"error": f"{type(e).__name__}: {e}"}))


def rtt_pong(log_a: str, log_b: str, counters_path: str, results) -> None:
    try:
        counters = CountersFile.open(counters_path, create=False)
        logs = [LogBuffer.open(log_a), LogBuffer.open(log_b)]
        for log in logs:
            prefault(log)
        image = Image(logs[0], counters, join_position=0, name="pong")
        publication = ExclusivePublication(logs[1], counters)
        _wait_connected(publication)
        offer = publication.offer
        echoed = 0

        def on_ping(buffer, offset, length, header):
            nonlocal echoed
            while offer(buffer, offset, length) < 0:
                pass
            echoed += 1

        poll = image.poll
        while True:
            if not poll(on_ping, 16) and image.is_end_of_stream:
                break
        publication.close()
        results.put(("pong", {"echoed": echoed}))
    except BaseException as e:
        results.put(("pong", {"error": f"{type(e).__name__}: {e}"}))


def queue_ping(to_pong, from_pong, round_trips: int, results) -> None:
    try:
        message = bytes(32)
        perf = time.perf_counter_ns
        put, get = to_pong.put, from_pong.get
        samples = []
        for i in range(WARMUP_ROUND_TRIPS + round_trips):
            t0 = perf()
            put(message)
            get()
            samples.append(perf() - t0)
        put(None)
        results.put(("ping", {"samples_ns": samples[WARMUP_ROUND_TRIPS:]}))
    except BaseException as e:
        results.put(("ping", {"error": f"{type(e).__name__}: {e}"}))


def queue_pong(to_pong, from_pong, results) -> None:
    try:
        echoed = 0
        get, put = to_pong.get, from_pong.put
        item = get()
        while item is not None:
            put(item)
            echoed += 1
            item = get()
        results.put(("pong", {"echoed": echoed}))
    except BaseException as e:
        results.put(("pong", {"error": f"{type(e).__name__}: {e}"}))


def run_round_trips(ctx, ping_target, ping_args, pong_target, pong_args, round_trips: int) -> dict:
    """One ping-pong session: the timed samples (ns) and whether pong echoed every ping."""
    results = ctx.Queue()
    sys.stdout.flush()
    sys.stderr.flush()
    pong = ctx.Process(target=pong_target, args=(*pong_args, results), name="bench-pong")
    ping = ctx.Process(target=ping_target, args=(*ping_args, round_trips, results), name="bench-ping")
    pong.start()
    ping.start()
    reports = collect_reports(results, (ping, pong), time.monotonic() + RESULT_GRACE_S + round_trips * 1e-3)
    return {"samples_ns": reports["ping"]["samples_ns"],
            "verified": reports["pong"]["echoed"] == WARMUP_ROUND_TRIPS + round_trips}


def rtt_stats(sessions: list[dict]) -> dict:
    """Percentiles over the samples of every session, pooled."""
    samples = np.concatenate([np.asarray(s["samples_ns"], dtype=np.float64) for s in sessions]) / 1000.0
    return {
        "round_trips": int(samples.size),
        "sessions": len(sessions),
        "p50_us": float(np.percentile(samples, 50)),
        "p99_us": float(np.percentile(samples, 99)),
        "min_us": float(samples.min()),
        "max_us": float(samples.max()),
        "mean_us": float(samples.mean()),
        "session_p50s_us": [float(np.percentile(np.asarray(s["samples_ns"]) / 1000.0, 50)) for s in sessions],
        "verified": all(s["verified"] for s in sessions),
    }


def combine(runs: list[dict]) -> dict:
    """The median run (by msgs/s) stands for the measurement; the others give its spread."""
    ordered = sorted(runs, key=lambda r: r["msgs_per_s"])
    median = ordered[(len(ordered) - 1) // 2]
    out = dict(median)
    out["runs"] = len(runs)
    out["min_msgs_per_s"] = ordered[0]["msgs_per_s"]
    out["max_msgs_per_s"] = ordered[-1]["msgs_per_s"]
    out["all_msgs_per_s"] = [r["msgs_per_s"] for r in runs]
    out["verified"] = all(r["verified"] for r in runs)
    return out


# -- main -------------------------------------------------------------------------------------

def fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one short round (about 15 s in all)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--seconds", type=float, default=None,
                        help="length of each throughput run (default 1, or 0.5 with --quick)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds over every measurement; the median run is reported (default 3, 1 with --quick)")
    parser.add_argument("--round-trips", type=int, default=None,
                        help="timed round trips a round (default 5000, 2000 with --quick)")
    parser.add_argument("--idle", choices=("spin", "backoff"), default="spin",
                        help="the log-buffer reader's idle strategy in throughput runs (default spin)")
    parser.add_argument("--only", default=None, help="comma-separated subset of shm,queue,memcpy,rtt")
    parser.add_argument("--sizes", default=None, help="comma-separated message sizes (default 32,1024,65536)")
    args = parser.parse_args(argv)
    duration_s = args.seconds if args.seconds is not None else (0.5 if args.quick else 1.0)
    rounds = max(1, args.rounds if args.rounds is not None else (1 if args.quick else 3))
    round_trips = args.round_trips if args.round_trips is not None else (2000 if args.quick else 5000)
    parts = set((args.only or "shm,queue,memcpy,rtt").split(","))
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else SIZES
    for size in sizes:
        if size < 8 or size > MTU_LENGTH - frame.HEADER_LENGTH:
            parser.error(f"message size {size} is outside 8..{MTU_LENGTH - frame.HEADER_LENGTH}")
        BATCH.setdefault(size, max(1, min(1024, (256 * 1024) // size)))

    ctx = multiprocessing.get_context("fork")
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = Path(tempfile.mkdtemp(prefix="ramen-bench-", dir=base))
    counters_path = directory / "counters.dat"
    CountersFile.open(counters_path).close()
    started = time.monotonic()
    cpu_before = busy_cpu_seconds()
    plan = []
    for size in sizes:
        if "shm" in parts:
            plan += [("log buffer", size, "single"), ("log buffer", size, "batch"), ("log buffer", size, "batch-poll")]
        if "queue" in parts:
            plan += [("mp.Queue", size, "single"), ("mp.Queue", size, "batch")]
        if "memcpy" in parts:
            plan += [("memcpy", size, "copy")]
    runs: dict[tuple, list[dict]] = {key: [] for key in plan}
    bulk_copies = []
    rtt_sessions: dict[str, list[dict]] = {"log buffer": [], "mp.Queue": []}
    failures = []
    per_round = len(plan) + (2 if "rtt" in parts else 0) + (1 if "memcpy" in parts else 0)
    steps = per_round * rounds
    log_progress(f"ramen transport bench: {rounds} round(s) of {per_round} measurements, {duration_s:g} s a "
                 f"throughput run, files in {directory}")
    step = 0

    def progress(text: str) -> None:
        log_progress(f"[{step:>2}/{steps}] {text}")

    try:
        for _ in range(rounds):
            for key in plan:
                transport, size, mode = key
                step += 1
                method = describe(transport, size, mode)
                try:
                    if transport == "log buffer":
                        result = bench_shm(ctx, directory, counters_path, size, mode, duration_s, args.idle)
                    elif transport == "mp.Queue":
                        result = bench_queue(ctx, size, mode, duration_s)
                    else:
                        result = bench_memcpy(size, min(duration_s, 1.0))
                except Failed as e:
                    failures.append(f"{transport} {size_label(size)} {method}: {e}")
                    progress(f"{transport} {size_label(size)} {method}: FAILED: {e}")
                    continue
                runs[key].append(result)
                check = "" if result["verified"] else \
                    f"  MISMATCH: sent {result['sent_messages']} msgs/{result['sent_bytes']} B"
                progress(f"{transport:10} {size_label(size):>6} {method:32} {fmt_rate(result['msgs_per_s']):>12} "
                         f"msgs/s {result['mb_per_s']:>10,.1f} MB/s{check}")
            if "memcpy" in parts:
                step += 1
                bulk_copies.append(bench_bulk_copy(min(duration_s, 1.0)))
                progress(f"memcpy, contiguous 48 MiB: {bulk_copies[-1] / 1e9:.1f} GB/s")
            if "rtt" in parts:
                step += 1
                log_a, log_b = new_log(directory, "rtt-a"), new_log(directory, "rtt-b")
                try:
                    session = run_round_trips(ctx, rtt_ping, (str(log_a), str(log_b), str(counters_path)),
                                              rtt_pong, (str(log_a), str(log_b), str(counters_path)), round_trips)
                    rtt_sessions["log buffer"].append(session)
                    stats = rtt_stats([session])
                    progress(f"RTT log buffer: p50 {stats['p50_us']:.1f} µs, p99 {stats['p99_us']:.1f} µs")
                except Failed as e:
                    failures.append(f"RTT log buffer: {e}")
                    progress(f"RTT log buffer: FAILED: {e}")
                finally:
                    log_a.unlink(missing_ok=True)
                    log_b.unlink(missing_ok=True)
                step += 1
                to_pong, from_pong = ctx.Queue(), ctx.Queue()
                try:
                    session = run_round_trips(ctx, queue_ping, (to_pong, from_pong), queue_pong,
                                              (to_pong, from_pong), round_trips)
                    rtt_sessions["mp.Queue"].append(session)
                    stats = rtt_stats([session])
                    progress(f"RTT mp.Queue: p50 {stats['p50_us']:.1f} µs, p99 {stats['p99_us']:.1f} µs")
                except Failed as e:
                    failures.append(f"RTT mp.Queue: {e}")
                    progress(f"RTT mp.Queue: FAILED: {e}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    elapsed = time.monotonic() - started
    cpu_after = busy_cpu_seconds()
    # CPU the rest of the machine used meanwhile, in cores: anything above ~0.05 competes with us.
    other_cores = max(0.0, ((cpu_after[0] - cpu_before[0]) - (cpu_after[1] - cpu_before[1])) / elapsed)

    rows = [{"transport": t, "size": s, "mode": m, "method": describe(t, s, m), **combine(r)}
            for (t, s, m), r in runs.items() if r]
    rtt = {name: rtt_stats(sessions) for name, sessions in rtt_sessions.items() if sessions}
    bulk_copy = float(np.median(bulk_copies)) if bulk_copies else None
    goals = evaluate_goals(rows, rtt)
    mismatches = [r for r in rows if not r["verified"]] + [name for name, r in rtt.items() if not r["verified"]]
    config = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "numpy": np.__version__,
              "term_length": TERM_LENGTH, "mtu_length": MTU_LENGTH, "batch": {str(s): BATCH[s] for s in sizes},
              "seconds_per_run": duration_s, "rounds": rounds, "round_trips_per_round": round_trips,
              "reader_idle": args.idle, "log_directory": base or tempfile.gettempdir(), "elapsed_s": elapsed,
              "other_processes_cores": other_cores}
    if args.json:
        for stats in rtt.values():
            stats.pop("samples_ns", None)
        print(json.dumps({"config": config, "throughput": rows, "memcpy_contiguous_bytes_per_s": bulk_copy,
                          "rtt": rtt, "goals": goals, "failures": failures}, indent=2))
    else:
        print_table(config, rows, bulk_copy, rtt, goals, failures)
    sys.stdout.flush()
    return 2 if mismatches or failures else 0


def describe(transport: str, size: int, mode: str) -> str:
    n = BATCH[size]
    if transport == "log buffer":
        return {"single": "offer / poll", "batch": f"offer_batch({n}) / block_poll",
                "batch-poll": f"offer_batch({n}) / poll"}[mode]
    if transport == "mp.Queue":
        return {"single": "put / get", "batch": f"put / get of list({n})"}[mode]
    return "numpy strided copy into frames"


def evaluate_goals(rows: list[dict], rtt: dict) -> list[dict]:
    goals = []
    small = [r for r in rows if r["transport"] == "log buffer" and r["size"] == 32 and r["mode"] == "batch"]
    if small:
        value = small[0]["msgs_per_s"]
        goals.append({"goal": "32 B messages in batches >= 2 M msgs/s", "value": f"{value / 1e6:.2f} M msgs/s",
                      "pass": value >= GOAL_SMALL_BATCH_MSGS})
    large = [r for r in rows if r["transport"] == "log buffer" and r["size"] == 64 * 1024]
    if large:
        best = max(large, key=lambda r: r["mb_per_s"])
        value = best["mb_per_s"] * 1e6
        goals.append({"goal": "64 KiB messages >= 1 GB/s", "value": f"{value / 1e9:.2f} GB/s ({best['method']})",
                      "pass": value >= GOAL_LARGE_BYTES})
    if "log buffer" in rtt:
        value = rtt["log buffer"]["p50_us"]
        goals.append({"goal": "round trip p50 < 50 µs", "value": f"{value:.1f} µs", "pass": value < GOAL_RTT_P50_US})
    return goals


def spread(row: dict) -> str:
    if row["runs"] < 2:
        return ""
    low = row["min_msgs_per_s"] / row["msgs_per_s"] * 100 - 100
    high = row["max_msgs_per_s"] / row["msgs_per_s"] * 100 - 100
    return f"{low:+.0f}/{high:+.0f}%"


def print_table(config, rows, bulk_copy, rtt, goals, failures) -> None:
    rounds = config["rounds"]
    print(f"ramen transport bench: {config['cpus']} CPUs, Python {config['python']}, numpy {config['numpy']}; "
          f"{rounds} round(s), {config['seconds_per_run']:g} s a throughput run, {config['elapsed_s']:.0f} s in all")
    print(f"log buffers: {config['term_length'] // 2**20} MiB terms (8 MiB window) under {config['log_directory']}, "
          f"MTU {config['mtu_length']} (raised from 1408 so 64 KiB messages are single frames);")
    print(f"writer and reader busy-poll (reader idle: {config['reader_idle']}); "
          "MB/s counts payload bytes (1 MB = 10^6 B)")
    if rounds > 1:
        print(f"figures are the median of {rounds} runs; 'spread' is the slowest and fastest run against it")
    print("'ok': the reader counted exactly the messages and bytes the writer sent, in every run")
    other = config["other_processes_cores"]
    if other >= 0.1:
        print(f"WARNING: other processes kept {other:.1f} of the {config['cpus']} cores busy during the run: "
              "these figures are low; run again on a quiet machine")
    print()
    header = (f"{'transport':<11} {'size':>6}  {'writer / reader':<32} {'msgs/s':>13} {'MB/s':>10}  "
              f"{'spread':>9}  check")
    print(header)
    print("-" * len(header))
    previous_size = None
    for row in rows:
        if previous_size is not None and row["size"] != previous_size:
            print()
        previous_size = row["size"]
        check = "ok" if row["verified"] else "FAIL"
        print(f"{row['transport']:<11} {size_label(row['size']):>6}  {row['method']:<32} "
              f"{fmt_rate(row['msgs_per_s']):>13} {row['mb_per_s']:>10,.1f}  {spread(row):>9}  {check}")
    if bulk_copy is not None:
        print(f"\nmemcpy, one contiguous 48 MiB numpy copy: {bulk_copy / 1e9:.1f} GB/s")
    if rtt:
        print()
        header = (f"{'round trip, 32 B':<20} {'p50 µs':>8} {'p99 µs':>8} {'min µs':>8} {'max µs':>9} "
                  f"{'n':>7}  check")
        print(header)
        print("-" * len(header))
        for name, r in rtt.items():
            print(f"{name:<20} {r['p50_us']:>8.1f} {r['p99_us']:>8.1f} {r['min_us']:>8.1f} {r['max_us']:>9.1f} "
                  f"{r['round_trips']:>7}  {'ok' if r['verified'] else 'FAIL'}")
        if rounds > 1:
            print(f"(samples of the {rounds} rounds pooled, after {WARMUP_ROUND_TRIPS} warm-up round trips each)")
    if goals:
        print()
        for goal in goals:
            print(f"{'PASS' if goal['pass'] else 'MISS'}  {goal['goal']:<42} {goal['value']}")
    for failure in failures:
        print(f"FAILED  {failure}")


if __name__ == "__main__":
    sys.exit(main())

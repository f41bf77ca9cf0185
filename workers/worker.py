"""The worker process: runs one function of a site, live and for replays (docs/runtime.md).

    python -m workers.worker --site SITE --function PROG/FUNC
    python -m workers.worker --site SITE --spare ID [--parent PID] [--wait-for-key S]   (workers/spare.py)

It reads its worker key and program from the confserver, then, as an agent with a duty cycle:
- live (channel 0): reads its parents' live output logs (waiting for logs that do not exist yet),
  or generates rows if it is a source, runs its function (a light one's calls on a compute thread,
  workers/compute_thread.py) and writes its live output log;
- for each `…/<prog>/<func>/replays/<channel>` key the supervisor writes: reads the listed input
  logs, keeps that channel's state (windows, counts) apart from live and other channels, passes
  tuples through when it is one of the plan's sources, writes to its replay output log or, as
  the target, to the client's recipient log; after `expect_eor` END_OF_REPLAYs it flushes the
  channel's windows, writes one END_OF_REPLAY, and the target deletes `replays/<channel>`;
- writes its stats key every second, and counts tuples in/out, late and dropped in counters.dat.

Input logs are joined at their producer position when the worker first finds them: the supervisor
writes the replay keys before it spawns the replayers, and a replayer (like any publication)
writes nothing until a reader is connected.

A live output nobody reads is dropped as Aeron drops it (NOT_CONNECTED), unless the function is
archived: then the worker waits for its recorder. Replay outputs always wait for their reader.

SIGTERM/SIGINT: the current batch is finished and written, the publications closed, exit 0. A bad
worker key, program or callable: one line on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa

import confserver
from confserver import ConfClient, ConfError, EventKind
from ramen import keyspace, paths
from ramen.archive.coverage import last_event_time_us as archived_last_event_time_us
from ramen.cli import argtypes
from ramen.locks import FileLock
from ramen.memory import freeze_startup_objects, retain_freed_memory
from ramen.message import (HEADER_LENGTH, KIND_END_OF_REPLAY, KIND_TUPLES, LIVE_CHANNEL, NO_EVENT_TIME,
                           decode_header, event_time_bounds)
from ramen.program.model import ENGINE_SPARK, Function, Program, split_qualified
from ramen.replay.contract import ContractError, WorkerReplay
from ramen.spark.session import SparkUnavailable
from ramen.transport import (ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED, BackoffIdleStrategy, BlockAssembler,
                             CountersFile, ExclusivePublication, Image, LogBuffer, LogBufferError,
                             LogBufferParams, Subscription, frame)
from ramen.transport.defaults import IPC_MTU_LENGTH, IPC_TERM_LENGTH
from ramen.transport.logbuffer import END_OF_STREAM_UNSET
from ramen.transport.position import int32
from ramen.transport.publication import seal_dead_writer_claims
from ramen.transport.writer_lock import acquire_writer_lock
from ramen.tuples import decode_tuples, encode_tuples, end_of_replay, resumed, with_channel
from workers.compute import ComputeError, PythonRunner, make_runner
from workers.compute_thread import ComputeThread
from workers.defaults import (BATCH_ROWS, COMPUTE_WAIT_S, EXIT_ERROR, LOG_WAIT_INTERVAL_S, MAX_PENDING_MESSAGES,
                              MESSAGE_FILL, POLL_BLOCK_LENGTH, REPLAY_LOG_WAIT_INTERVAL_S, SPARE_WORKER_WAIT_S,
                              SPARK_HEARTBEAT_S, SPARK_RETRY_S, STATS_INTERVAL_S)
from workers import spare
from workers.heavy import Gathered, SparkExecutor
from workers.sources import RowSource, SourceError, make_source
from workers.stats import WorkerStats
from workers.windows import WindowState

log = logging.getLogger(__name__)

IDENTITY = "worker"
STOP_FLUSH_TIMEOUT_S = 2.0
"""On SIGTERM, how long the worker tries to write what it already computed before it closes."""


class WorkerError(Exception):
    """The worker cannot run; the message is one line for the supervisor's log."""


def worker_id(qualified_name: str) -> int:
    """The `source` of the END_OF_REPLAYs this worker forwards: 32 bits of a hash of its name."""
    return int.from_bytes(hashlib.blake2b(qualified_name.encode(), digest_size=4).digest(), "little")


def open_output_log(path: Path, session_id: int = 0) -> tuple[LogBuffer, FileLock]:
    """The writer's log buffer and its writer lock: created if absent, else reopened where its tail
    is (a restarted worker continues its log) once the lock is ours (LogBufferBusy while another
    process writes it), with what a dead writer left claimed and uncommitted padded, and the end
    of stream a clean stop left there cleared."""
    path.parent.mkdir(parents=True, exist_ok=True)
    session_id = int32(session_id)
    try:
        buffer = LogBuffer.create(path, LogBufferParams(term_length=IPC_TERM_LENGTH, mtu_length=IPC_MTU_LENGTH,
                                                        session_id=session_id, stream_id=session_id))
    except LogBufferError:
        if not path.exists():
            raise
        buffer = None
    try:
        lock = acquire_writer_lock(path)
    except LogBufferError:
        if buffer is not None:
            buffer.close()
        raise
    if buffer is None:
        try:
            buffer = LogBuffer.open(path)
        except BaseException:
            lock.release()
            raise
        seal_dead_writer_claims(buffer)
        buffer.end_of_stream_position = END_OF_STREAM_UNSET
    return buffer, lock


def last_event_time_us(buffer: LogBuffer) -> int | None:
    """The largest event time in the messages of the active and previous terms of a log: where a
    restarted source resumes. Frames from older rotations (a stale term id) are ignored."""
    term_count = buffer.active_term_count
    best = None
    for count in (term_count - 1, term_count):
        if count < 0:
            continue
        term = buffer.terms[count % 3]
        term_id = buffer.initial_term_id + count
        offset = 0
        while offset + frame.HEADER_LENGTH <= buffer.term_length:
            fields = frame.HEADER.unpack_from(term, offset)
            length, flags, kind, found_term_id = fields[0], fields[2], fields[3], fields[7]
            if length <= 0 or found_term_id != term_id:
                break
            if kind == frame.HDR_TYPE_DATA and flags & frame.BEGIN_FLAG and \
                    length >= frame.HEADER_LENGTH + HEADER_LENGTH:
                header = decode_header(term, offset + frame.HEADER_LENGTH)
                if header is not None and header.kind == KIND_TUPLES and header.max_event_time_us != NO_EVENT_TIME:
                    best = header.max_event_time_us if best is None else max(best, header.max_event_time_us)
            offset += frame.align(length)
    return best


# -- outputs ------------------------------------------------------------------------------------

@dataclass
class Output:
    """One publication and the messages flow control holds back, written in order."""
    name: str
    log: LogBuffer
    publication: ExclusivePublication
    drop_unread: bool = False
    """Drop messages while no reader is connected (a live, non-archived output)."""
    await_recorder: bool = False
    """Hold the first message until the recorder reads the log (an archived live output): any
    other reader (a downstream worker, started sooner) would otherwise let the start go unrecorded."""
    pending: deque = field(default_factory=deque)
    dropped_rows: int = 0
    ended_channel: int | None = None
    """The replay channel whose end this output (a recipient) still flushes, once in `closing`."""

    @classmethod
    def open(cls, path: Path, counters: CountersFile, *, create: bool, session_id: int = 0,
             drop_unread: bool = False, await_recorder: bool = False) -> Output:
        """Our own log (`create`: created or reopened), or a log created for us to write (a replay
        client's); LogBufferBusy if another process writes it."""
        buffer, lock = open_output_log(path, session_id) if create else (LogBuffer.open(path), None)
        try:
            publication = ExclusivePublication(buffer, counters, writer_lock=lock)
        except BaseException:
            buffer.close()
            if lock is not None:
                lock.release()
            raise
        return cls(str(path), buffer, publication, drop_unread, await_recorder)

    def send(self, message: bytes, rows: int = 0, on_sent: Callable[[], None] | None = None) -> None:
        self.pending.append((message, rows, on_sent))

    def flush(self) -> int:
        """Offer what is pending; returns how many messages went out (or were dropped)."""
        done = 0
        if self.await_recorder and self.pending:
            if not self.publication.has_tethered_subscriber:
                return 0
            self.await_recorder = False
        while self.pending:
            message, rows, on_sent = self.pending[0]
            result = self.publication.offer(message)
            if result == ADMIN_ACTION:
                result = self.publication.offer(message)
            if result == NOT_CONNECTED and self.drop_unread:
                self.dropped_rows += rows
            elif result == BACK_PRESSURED or result == NOT_CONNECTED or result == ADMIN_ACTION:
                break
            elif result < 0:
                raise WorkerError(f"{self.name}: cannot write (status {result})")
            self.pending.popleft()
            done += 1
            if on_sent is not None:
                on_sent()
        return done

    def discard(self, channel: int) -> None:
        """Drop the pending messages of a torn-down replay channel: whoever would read them is gone
        with it, and held here they would count against every other channel's flow."""
        kept = deque(p for p in self.pending if (h := decode_header(p[0])) is None or h.channel != channel)
        if len(kept) != len(self.pending):
            log.info("%s: dropped %d messages of torn-down replay %d", self.name, len(self.pending) - len(kept),
                     channel)
            self.pending = kept

    def close(self) -> None:
        self.publication.close()
        self.log.close()


# -- inputs -------------------------------------------------------------------------------------

@dataclass
class Input:
    """An input log: the schema its TUPLES decode with, and who needs it (live, replay channels)."""
    path: Path
    schema: pa.Schema
    event_time: str | None
    parent: str
    """The parent whose rows this log carries (this function itself for a pass-through source)."""
    shared: bool = False
    """A replayer's log: it carries the replay channels of every worker that reads it."""
    users: set = field(default_factory=set)
    log: LogBuffer | None = None
    image: Image | None = None
    assembler: BlockAssembler | None = None


@dataclass
class ChannelState:
    channel: int
    pass_through: bool = False
    expect_eor: int = 1
    windows: WindowState | None = None
    output: Output | None = None
    recipient: str | None = None
    riders: list[tuple[int, Output]] = field(default_factory=list)
    """Identical replays riding with this one: the target writes the same result to their
    recipients too, tagged with their channels (docs/runtime.md, "also")."""
    eor_received: int = 0
    eor_unsent: int = 0
    inputs: tuple[str, ...] = ()
    gathered: Gathered | None = None
    """A heavy worker's committed rows not run through Spark yet."""
    ending: bool = False
    """Every END_OF_REPLAY is in: the channel ends once its gathered rows have run."""
    retry_at: float = 0.0
    retries: int = 0


# -- the agent ----------------------------------------------------------------------------------

def heartbeating(job: Callable[[], pa.Table], heartbeat: Callable[[], None],
                interval_s: float = SPARK_HEARTBEAT_S) -> pa.Table:
    """Run a job that takes seconds (a Spark job) in a thread while this one calls `heartbeat`:
    the writers of our inputs drop a reader silent for SUBSCRIBER_LIVENESS_TIMEOUT_S, and a replay
    with it. The job's exception is raised here, in the duty cycle's thread."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["table"] = job()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            outcome["error"] = e
    thread = threading.Thread(target=run, name="spark job", daemon=True)
    thread.start()
    while thread.is_alive():
        heartbeat()
        thread.join(interval_s)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["table"]


class Worker:
    def __init__(self, client: ConfClient, site: str, qualified_name: str, counters: CountersFile) -> None:
        self.client = client
        self.site = site
        self.qualified_name = qualified_name
        self.counters = counters
        self.id = worker_id(qualified_name)
        self.worker_key = keyspace.worker_key(site, qualified_name)
        entry = client.get_or_none(self.worker_key)
        if entry is None or not isinstance(entry.value, dict):
            raise WorkerError(f"no worker key {self.worker_key}")
        self.key_value: dict = entry.value
        self.signature = entry.value.get("signature")
        """Of the function this process runs (the supervisor restarts it for another)."""
        self.program, self.function = self._load_function(qualified_name)
        self.parents: dict[str, Function] = {parent: self._parent(parent) for parent in self.function.parents}
        self.runner: PythonRunner | None = None
        self.compute: ComputeThread[ChannelState] | None = None
        self.heavy: SparkExecutor | None = None
        self.source: RowSource | None = None
        if self.function.engine == ENGINE_SPARK:
            self.heavy = SparkExecutor(self.function, client)
        elif self.function.source is None:
            try:
                self.runner = make_runner(self.function, self.program.path)
            except ComputeError as e:
                raise WorkerError(str(e)) from None
            self.compute = ComputeThread(f"compute {qualified_name}")
        self.stats = WorkerStats(qualified_name, counters)
        self.live_event_time_us: int | None = None
        """The largest event time written on the live output (a restarted source resumes after it)."""
        self.live = bool(self.key_value.get("live", True))
        self.archived = bool(self.key_value.get("archived", self.function.archived))
        self.live_output = Output.open(paths.output_log(site, qualified_name), counters, create=True,
                                       session_id=self.id, drop_unread=not self.archived,
                                       await_recorder=self.archived)
        self.replay_output: Output | None = None
        self.channels: dict[int, ChannelState] = {LIVE_CHANNEL: self._live_state()}
        self.finished: set[int] = set()
        self.closing: list[Output] = []
        self.inputs: dict[Path, Input] = {}
        self.subscription = Subscription()
        self._images: dict[int, Input] = {}
        self._next_look_s = 0.0
        self._next_stats_s = 0.0
        self._watches = [client.watch(self.worker_key),
                         client.watch(keyspace.function_key(site, qualified_name, "replays/*"))]
        if self.function.source is not None:
            resume_us = self._resume_after()
            try:
                self.source = make_source(self.function, self.program.path, start_us=resume_us)
            except SourceError as e:
                raise WorkerError(str(e)) from None
            if self.source.resumes_from_us is not None:
                # First in the log, so first in its recording: the archive's coverage goes on from the
                # previous run's without a gap (ramen/message.py, KIND_RESUMED).
                self.live_output.send(resumed(self.source.resumes_from_us, self.id))
        self._set_live(self.live)

    # -- set-up -----------------------------------------------------------------------------

    def _program(self, name: str) -> Program:
        entry = self.client.get_or_none(keyspace.program_key(name))
        if entry is None:
            raise WorkerError(f"program {name} is not loaded (no key {keyspace.program_key(name)})")
        try:
            return Program.from_dict(entry.value)
        except (KeyError, TypeError, ValueError) as e:
            raise WorkerError(f"program {name}: unreadable ({type(e).__name__}: {e})") from None

    def _load_function(self, qualified_name: str) -> tuple[Program, Function]:
        program_name, function_name = split_qualified(qualified_name)
        program = self._program(program_name)
        try:
            return program, program.function(function_name)
        except KeyError:
            raise WorkerError(f"program {program_name} has no function {function_name}") from None

    def _parent(self, qualified_name: str) -> Function:
        """The parent's function (for its event time), or a stand-in built from input_schemas."""
        try:
            return self._load_function(qualified_name)[1]
        except WorkerError as e:
            log.warning("%s: %s; reading it with the schema the program was validated with", qualified_name, e)
            schema = dict(self.function.input_schemas).get(qualified_name)
            if schema is None:
                raise
            program, name = split_qualified(qualified_name)
            event_time = self.function.event_time if self.function.event_time in schema.names else None
            return Function(program, name, schema, event_time=event_time)

    def _live_state(self) -> ChannelState:
        window = self.function.window
        return ChannelState(LIVE_CHANNEL, output=self.live_output, expect_eor=0,
                            windows=WindowState(window.every_us, window.lateness_us) if window else None)

    def _resume_after(self) -> int | None:
        """Where a restarted source goes on: right after the last row in its live log (the two
        terms behind a log's tail are never cleaned, and a message its writer died writing is
        padding by now, not rows), or in its archive if its log is new (it was removed); so its
        stream has no row twice. Only when neither holds a row, after the last its stats name,
        which are up to a second old: rows written since then come again, and a warning says so."""
        in_log = last_event_time_us(self.live_output.log)
        in_archive = archived_last_event_time_us(paths.archive_dir(self.site), self.qualified_name)
        written = [t for t in (in_log, in_archive) if t is not None]
        if written:
            self.live_event_time_us = max(written)
            log.info("%s resumes after event time %d µs (the last row in its live log: %s; in its archive: %s)",
                     self.qualified_name, self.live_event_time_us, in_log, in_archive)
            return self.live_event_time_us + 1
        entry = self.client.get_or_none(keyspace.function_key(self.site, self.qualified_name, "stats"))
        previous = entry.value.get("live_event_time_us") if entry is not None and isinstance(entry.value, dict) \
            else None
        if previous is None:
            return None
        self.live_event_time_us = previous
        log.warning("%s: neither its live log nor its archive holds a row; it resumes after event time %d µs, "
                    "which its last stats name: rows written in the second before they were may come twice",
                    self.qualified_name, previous)
        return previous + 1

    # -- inputs ------------------------------------------------------------------------------

    def _use_input(self, path: Path, function: Function, user) -> None:
        found = self.inputs.get(path)
        if found is None:
            found = self.inputs[path] = Input(path, function.schema, function.event_time, function.qualified_name,
                                              shared=path.parent == paths.replayer_logs_dir(self.site))
        found.users.add(user)

    def _release_input(self, path: Path, user) -> None:
        found = self.inputs.get(path)
        if found is None:
            return
        found.users.discard(user)
        if not found.users:
            del self.inputs[path]
            if found.image is not None:
                self._images.pop(id(found.image), None)
                self.subscription.remove_image(found.image)
                found.log.close()

    def _open_waiting_inputs(self) -> float:
        """Open the input logs that have appeared; returns when to look again (seconds from now):
        soon while a replay waits for one."""
        wait_s = LOG_WAIT_INTERVAL_S
        for found in self.inputs.values():
            if found.image is not None:
                continue
            try:
                found.log = LogBuffer.open(found.path) if found.path.exists() else None
            except LogBufferError as e:
                log.debug("%s not ready yet: %s", found.path, e)  # being created: look again
            if found.log is None:
                if found.users - {LIVE_CHANNEL}:
                    wait_s = REPLAY_LOG_WAIT_INTERVAL_S
                continue
            found.image = Image(found.log, self.counters, name=f"{self.qualified_name} <- {found.path.name}")
            found.assembler = BlockAssembler()
            self._images[id(found.image)] = found
            self.subscription.add_image(found.image)
            log.info("%s reads %s from position %d", self.qualified_name, found.path, found.image.position)
        return wait_s

    def _set_live(self, live: bool) -> None:
        self.live = live
        for parent, function in self.parents.items():
            path = paths.output_log(self.site, parent)
            if live:
                self._use_input(path, function, LIVE_CHANNEL)
            else:
                self._release_input(path, LIVE_CHANNEL)

    # -- confserver events -------------------------------------------------------------------

    def _conf_events(self) -> int:
        events = [event for watch in self._watches for event in watch.drain()]
        for event in events:
            if event.kind == EventKind.SYNCED:
                continue
            if event.key == self.worker_key:
                if event.kind != EventKind.DELETED and isinstance(event.entry.value, dict):
                    self.key_value = event.entry.value
                    live = bool(self.key_value.get("live", True))
                    if live != self.live:
                        log.info("%s: live %s", self.qualified_name, live)
                        self._set_live(live)
                continue
            channel = event.key.rpartition("/")[2]
            if not channel.isdigit():
                continue
            if event.kind == EventKind.DELETED:
                self._end_replay(int(channel), torn_down=True)
            else:
                self._start_replay(int(channel), event.entry.value)
        return len(events)

    def _input_function(self, pass_through: bool, parent: str | None) -> Function:
        """The function whose rows an input log of a replay carries: this one for a pass-through
        source, else the parent the key names for it (a replayer's log says nothing of whose
        rows it holds)."""
        return self.function if pass_through else self.parents[parent]

    def _start_replay(self, channel: int, value) -> None:
        if channel in self.finished:
            return
        try:
            spec = WorkerReplay.from_value(value, keyspace.worker_replay_key(self.site, self.qualified_name, channel))
        except ContractError as e:
            log.error("%s: ignored", e)
            return
        pass_through = spec.pass_through
        if not pass_through and not self.parents:
            log.error("%s: replay %d asks a source to compute (not pass_through): ignored", self.qualified_name,
                      channel)
            return
        if not pass_through and not set(spec.parents) <= set(self.parents):
            log.error("%s: replay %d names parents %s, not this function's: ignored", self.qualified_name, channel,
                      ", ".join(sorted(set(spec.parents) - set(self.parents))))
            return
        state = self.channels.get(channel)
        if state is None:
            window = self.function.window
            state = self.channels[channel] = ChannelState(
                channel, pass_through=pass_through,
                windows=WindowState(window.every_us, window.lateness_us) if window and not pass_through else None)
            log.info("%s: replay %d (%s) from %s", self.qualified_name, channel,
                     "pass-through" if pass_through else "computed", list(spec.inputs))
        state.expect_eor = spec.expect_eor
        recipient = spec.recipient
        if state.output is None:
            try:
                state.output = self._replay_output_for(channel, recipient)
            except LogBufferError as e:
                log.error("%s: replay %d: cannot open its output: %s", self.qualified_name, channel, e)
                del self.channels[channel]
                return
            state.recipient = recipient
        if recipient and not state.riders:
            try:
                state.riders = [(also.channel, Output.open(Path(also.recipient), self.counters, create=False))
                                for also in spec.also]
            except LogBufferError as e:
                log.error("%s: replay %d: cannot open a rider's recipient: %s", self.qualified_name, channel, e)
        inputs = spec.inputs
        parents = spec.parents if not pass_through else (None,) * len(inputs)
        for path, parent in zip(inputs, parents):
            self._use_input(Path(path), self._input_function(pass_through, parent), channel)
        for path in set(state.inputs) - set(inputs):
            self._release_input(Path(path), channel)
        state.inputs = inputs
        self._next_look_s = 0.0  # its inputs: at once, in this duty cycle

    def _replay_output_for(self, channel: int, recipient: str | None) -> Output:
        if recipient:
            return Output.open(Path(recipient), self.counters, create=False)
        if self.replay_output is None:
            self.replay_output = Output.open(paths.replay_output_log(self.site, self.qualified_name),
                                             self.counters, create=True, session_id=self.id)
        return self.replay_output

    def _end_replay(self, channel: int, *, torn_down: bool = False) -> None:
        state = self.channels.pop(channel, None)
        if torn_down:
            self.finished.discard(channel)
            # An ended replay's recipient may still hold messages for a client that is gone: they
            # can never go, and counted as pending they would hold every input back.
            for output in [o for o in self.closing if o.ended_channel == channel]:
                output.close()
                self.closing.remove(output)
            if self.replay_output is not None:  # shared by the channels this worker feeds downstream
                self.replay_output.discard(channel)
        if state is None:
            return
        if torn_down:
            log.info("%s: replay %d torn down", self.qualified_name, channel)
        if state.gathered is not None:
            state.gathered.discard()
        for path in state.inputs:
            self._release_input(Path(path), channel)
        if state.recipient and state.output is not None:
            for output in [state.output, *(o for _, o in state.riders)]:
                if torn_down:
                    output.close()
                else:
                    output.ended_channel = channel
                    self.closing.append(output)

    # -- data --------------------------------------------------------------------------------

    def _read_inputs(self) -> int:
        read = 0
        inbox: list[tuple[Input, bytes]] = []
        for image in self.subscription.images:
            found = self._images.get(id(image))
            if found is not None and image.block_poll(found.assembler.on_block, POLL_BLOCK_LENGTH):
                read += 1
                inbox += [(found, message) for message in found.assembler.take()]
        if not inbox:
            return read
        run: list[tuple[Input, bytes]] = []
        run_channel = None
        for found, message in inbox:
            header = decode_header(message)
            if header is None:
                continue
            if header.channel != run_channel and run:
                self._process(run_channel, run)
                run = []
            run_channel = header.channel
            if header.kind == KIND_TUPLES:
                run.append((found, message))
            elif header.kind == KIND_END_OF_REPLAY:
                if run:
                    self._process(run_channel, run)
                    run = []
                self._on_end_of_replay(header.channel, header.source, found.shared)
        if run:
            self._process(run_channel, run)
        return read

    def _process(self, channel: int, messages: list[tuple[Input, bytes]]) -> None:
        state = self.channels.get(channel)
        if state is None or (channel == LIVE_CHANNEL and not self.live):
            log.debug("%s: %d messages of channel %d nobody here expects", self.qualified_name, len(messages),
                      channel)
            if channel != LIVE_CHANNEL:
                self.stats.add("skipped" if messages[0][0].shared else "unexpected", len(messages))
            return
        if state.pass_through:
            for found, message in messages:
                rows = decode_tuples(message, found.schema).num_rows
                self.stats.add("tuples in", rows, channel)
                self.stats.add("tuples out", rows, channel)
                self._send(state, message, rows)
            return
        batches = [(found, decode_tuples(message, found.schema)) for found, message in messages]
        self.stats.add("tuples in", sum(b.num_rows for _, b in batches), channel)
        if self.heavy is not None:
            self._gather(state, batches, messages)
            return
        if state.windows is None:
            self.compute.submit(state, self.runner,
                                pa.Table.from_batches([b for _, b in batches], schema=batches[0][1].schema))
            return
        late_before = state.windows.late
        for found, table, bounds in by_input(batches, messages, state.windows.every_us):
            for closed in state.windows.add(table, found.event_time or self.function.event_time, bounds=bounds):
                self.compute.submit(state, self.runner, closed.table, (closed.start_us, closed.end_us))
        self.stats.add("late", state.windows.late - late_before, channel)

    def _emit_computed(self, results: list[tuple[ChannelState, pa.Table]]) -> int:
        """Write the light function's results, in the order it was called. A replay torn down
        while its calls ran has no output any more: its results go nowhere."""
        for state, table in results:
            if self.channels.get(state.channel) is state:
                self._emit(state, table)
        return len(results)

    # -- heavy (Spark) functions: committed rows are gathered, then run as one job --------------

    def _gather(self, state: ChannelState, batches: list[tuple[Input, pa.RecordBatch]],
                messages: list[tuple[Input, bytes]]) -> None:
        if state.windows is None:
            self._keep(state, [(found.parent, batch) for found, batch in batches])
        else:
            late_before = state.windows.late
            for found, table, bounds in by_input(batches, messages, state.windows.every_us):
                for closed in state.windows.add(table, found.event_time or self.function.event_time, found.parent,
                                                bounds=bounds):
                    self._keep(state, closed.batches)
            self.stats.add("late", state.windows.late - late_before, state.channel)
        self._run_gathered(state)

    def _keep(self, state: ChannelState, batches) -> None:
        if state.gathered is None:
            state.gathered = self.heavy.gathered()
        for parent, batch in batches:
            state.gathered.add(parent, batch)

    def _run_gathered(self, state: ChannelState) -> bool:
        """Run the channel's gathered rows as one Spark job when it is time: at once for live,
        once enough rows wait (or at the end) for a replay. False while Spark is unreachable."""
        gathered = state.gathered
        if not gathered:
            return True
        if not (state.ending or state.channel == LIVE_CHANNEL or gathered.job_due):
            return True
        now = time.monotonic()
        if now < state.retry_at:
            return False
        jobs_before, job_s_before = self.heavy.jobs, self.heavy.job_s
        try:
            table = heartbeating(lambda: self.heavy.run(gathered), self.subscription.keep_alive)
        except SparkUnavailable as e:
            delay = SPARK_RETRY_S[min(state.retries, len(SPARK_RETRY_S) - 1)]
            state.retries += 1
            state.retry_at = now + delay
            log.warning("%s: channel %d: Spark unavailable (%s); %d rows kept, retrying in %g s",
                        self.qualified_name, state.channel, e, gathered.rows, delay)
            return False
        self.stats.add("spark jobs", self.heavy.jobs - jobs_before)
        self.stats.add("spark ms", round((self.heavy.job_s - job_s_before) * 1000))
        log.info("%s: channel %d: one Spark job over %d rows (gathered over %.2f s) gave %d", self.qualified_name,
                 state.channel, gathered.rows, time.monotonic() - gathered.created_s, table.num_rows)
        gathered.discard()
        state.gathered, state.retries, state.retry_at = None, 0, 0.0
        self._emit(state, table)
        return True

    def _retry_gathered(self) -> int:
        """Channels whose job waits for Spark to come back; a replay then ends."""
        work = 0
        for state in [s for s in self.channels.values() if s.gathered and s.retry_at]:
            if self._run_gathered(state):
                work += 1
                if state.ending:
                    self._send_end_of_replay(state)
        return work

    def _emit(self, state: ChannelState, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        max_bytes = int(state.output.publication.max_message_length * MESSAGE_FILL)
        rows_per_message = BATCH_ROWS
        if table.nbytes > max_bytes * max(1, table.num_rows // BATCH_ROWS):
            rows_per_message = max(1, int(table.num_rows * max_bytes / max(table.nbytes, 1)))
        live = state.channel == LIVE_CHANNEL
        for batch in table.combine_chunks().to_batches(max_chunksize=rows_per_message):
            message = encode_tuples(batch, self.function.event_time, state.channel, self.id)
            written = None
            if live and (bounds := event_time_bounds(message)) is not None:
                written = lambda high=bounds[1]: self._live_written(high)  # noqa: E731
            self._send(state, message, batch.num_rows, written)
            self.stats.add("tuples out", batch.num_rows, state.channel)

    def _live_written(self, high_us: int) -> None:
        """A live message is in the log: a restart resumes after its rows, not after rows that were
        only queued (lost with a killed worker, they would leave a gap the archive could not see)."""
        if self.live_event_time_us is None or high_us > self.live_event_time_us:
            self.live_event_time_us = high_us

    def _send(self, state: ChannelState, message: bytes, rows: int,
              on_sent: Callable[[], None] | None = None) -> None:
        """To the channel's output, and the same tuples to every rider, re-tagged with its channel."""
        state.output.send(message, rows, on_sent)
        for channel, output in state.riders:
            output.send(with_channel(message, channel), rows)

    def _on_end_of_replay(self, channel: int, source: int, shared: bool = False) -> None:
        state = self.channels.get(channel)
        if state is None or channel == LIVE_CHANNEL:
            if not shared:  # on a replayer's log, another reader's replay ended
                log.warning("%s: END_OF_REPLAY of channel %d (from %d) nobody here expects", self.qualified_name,
                            channel, source)
            return
        state.eor_received += 1
        self.stats.channel(channel).eor_received += 1
        if state.eor_received < state.expect_eor:
            return
        state.ending = True
        if state.windows is not None:
            late_before = state.windows.late
            for closed in state.windows.flush():
                if self.heavy is not None:
                    self._keep(state, closed.batches)
                else:
                    self.compute.submit(state, self.runner, closed.table, (closed.start_us, closed.end_us))
            self.stats.add("late", state.windows.late - late_before, channel)
        if self.compute is not None:  # the channel's last results, before its END_OF_REPLAY
            self._emit_computed(self.compute.drain())
        if self.heavy is not None and not self._run_gathered(state):
            return  # ends when Spark is back and the job has run (_retry_gathered)
        self._send_end_of_replay(state)

    def _send_end_of_replay(self, state: ChannelState) -> None:
        channel = state.channel
        state.eor_unsent = 1 + len(state.riders)
        state.output.send(end_of_replay(channel, self.id), on_sent=lambda: self._replay_done(channel, state))
        for rider, output in state.riders:
            output.send(end_of_replay(rider, self.id), on_sent=lambda: self._replay_done(channel, state))
        log.info("%s: replay %d ended (%d END_OF_REPLAY)", self.qualified_name, channel, state.eor_received)
        self.finished.add(channel)
        self._end_replay(channel)

    def _replay_done(self, channel: int, state: ChannelState) -> None:
        """One END_OF_REPLAY is written; once all are, the target ends the replay: the riders'
        keys first, so that nobody takes the leader's end for theirs."""
        state.eor_unsent -= 1
        if not state.recipient or state.eor_unsent > 0:
            return
        for key_channel in [*(rider for rider, _ in state.riders), channel]:
            try:
                self.client.delete(keyspace.replay_key(key_channel))
            except ConfError as e:  # the client or the supervisor may have removed it first
                log.info("replays/%d: %s", key_channel, e)

    def _generate(self) -> int:
        batch = self.source.poll(time.time_ns() // 1000)
        if batch is None or batch.num_rows == 0:
            return 0
        self.stats.add("tuples in", batch.num_rows, LIVE_CHANNEL)
        self._emit(self.channels[LIVE_CHANNEL], pa.Table.from_batches([batch]))
        return 1

    # -- duty cycle --------------------------------------------------------------------------

    def _outputs(self) -> list[Output]:
        outputs = [self.live_output, *([self.replay_output] if self.replay_output else [])]
        outputs += [s.output for s in self.channels.values() if s.recipient and s.output is not None]
        outputs += [o for s in self.channels.values() for _, o in s.riders]
        return outputs + self.closing

    def _flush(self) -> int:
        work = 0
        for output in self._outputs():
            if output.pending:
                work += output.flush()
        if self.live_output.dropped_rows:
            self.stats.add("dropped", self.live_output.dropped_rows, LIVE_CHANNEL)
            self.live_output.dropped_rows = 0
        if self.closing:
            for output in [o for o in self.closing if not o.pending]:
                output.close()
                self.closing.remove(output)
        return work

    def pending(self) -> int:
        return sum(len(o.pending) for o in self._outputs())

    def do_work(self) -> int:
        work = self._conf_events()
        now = time.monotonic()
        if now >= self._next_look_s:
            self._next_look_s = now + self._open_waiting_inputs()
        if self.compute:
            work += self._emit_computed(self.compute.completed())
        work += self._flush()
        if self.heavy is not None:
            work += self._retry_gathered()
        if self.pending() < MAX_PENDING_MESSAGES and not (self.compute is not None and self.compute.full):
            if self.source is not None and self.live:
                work += self._generate()
            work += self._read_inputs()
            work += self._flush()
        else:
            self.subscription.keep_alive()  # held back by our readers, not dead: the writers must wait
        if now >= self._next_stats_s:
            self._next_stats_s = now + STATS_INTERVAL_S
            self.write_stats()
        return work

    def write_stats(self) -> None:
        position_in = sum(image.position for image in self.subscription.images)
        record = self.stats.record(position_in, self.live_output.publication.position, heavy=self.heavy is not None)
        record["live_event_time_us"] = self.live_event_time_us
        record["signature"] = self.signature  # a supervisor adopting this process learns it here
        try:
            self.client.set(keyspace.function_key(self.site, self.qualified_name, "stats"), record)
        except ConfError as e:
            log.warning("%s: cannot write stats: %s", self.qualified_name, e)

    def close(self, flush_timeout_s: float = STOP_FLUSH_TIMEOUT_S) -> None:
        """Write what is computed (for a while), then close every publication and image."""
        if self.compute is not None:
            try:  # the windows that were computing: written, not lost
                self._emit_computed(self.compute.drain())
            except ComputeError as e:  # a later call failed too: the outputs must still be closed
                log.warning("%s", e)
            finally:
                self.compute.close()
        deadline = time.monotonic() + flush_timeout_s
        idle = BackoffIdleStrategy()
        while self.pending() and time.monotonic() < deadline:
            idle.idle(self._flush())
        for watch in self._watches:
            watch.close()
        for state in self.channels.values():
            if state.gathered is not None:
                state.gathered.discard()  # staged files: the rows are the replayer's to send again
        self.write_stats()
        for output in {id(o): o for o in self._outputs()}.values():
            output.close()
        self.closing.clear()
        self.subscription.close()
        for found in self.inputs.values():
            if found.log is not None:
                found.log.close()
        self.stats.close()


def by_input(batches: list[tuple[Input, pa.RecordBatch]], messages: list[tuple[Input, bytes]], every_us: int
             ) -> list[tuple[Input, pa.Table, tuple[int, int] | None]]:
    """Consecutive batches of one input as tables, with the event-time bounds of each table's rows
    from their messages' headers (None if a header has none). Messages whose bounds lie in one
    window of `every_us` go together per window: windows place such a table whole, without a
    look at its rows. The others (across a window's edge, or without bounds) go together too, so
    that the pass over their rows is one per poll, not one per message. A worker that catches up
    takes thousands of messages a poll, spanning many windows: as one table, all their rows would
    be looked at."""
    runs: list[list] = []  # [input, batches, bounds, window or None]
    for (found, batch), (_, message) in zip(batches, messages):
        bounds = event_time_bounds(message) if found.event_time else None
        window = None
        if bounds is not None and bounds[0] // every_us == bounds[1] // every_us:
            window = bounds[0] // every_us
        if runs and runs[-1][0] is found and runs[-1][3] == window:
            run = runs[-1]
            run[1].append(batch)
            if run[2] is not None:
                run[2] = None if bounds is None else (min(run[2][0], bounds[0]), max(run[2][1], bounds[1]))
        else:
            runs.append([found, [batch], bounds, window])
    return [(found, pa.Table.from_batches(run), bounds) for found, run, bounds, _ in runs]


def run(worker: Worker, stop: threading.Event, idle: BackoffIdleStrategy | None = None) -> None:
    idle = idle or BackoffIdleStrategy()
    while not stop.is_set():
        work = worker.do_work()
        if work == 0 and worker.compute:  # woken by the call's return, not a park after it
            worker.compute.wait(COMPUTE_WAIT_S)
            idle.reset()
        else:
            idle.idle(work)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workers.worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", default=keyspace.default_site(), type=argtypes.site, help="the site (default $RAMEN_SITE or local)")
    role = parser.add_mutually_exclusive_group(required=True)
    role.add_argument("--function", metavar="PROG/FUNC", help="the function to run")
    role.add_argument("--spare", type=int, metavar="ID",
                      help="start as a spare: wait for the key sites/SITE/spares/ID to name the function")
    parser.add_argument("--parent", type=int, metavar="PID",
                        help="a spare exits once this process is no longer its parent (its supervisor died)")
    parser.add_argument("--wait-for-key", type=float, default=SPARE_WORKER_WAIT_S, metavar="S",
                        help="how long a spare waits for its key, then exits 0 (default %(default)g)")
    parser.add_argument("--confserver", default=None, help="confserver URL (default $RAMEN_CONFSERVER)")
    return parser


def serve(args) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    name = args.function or f"spare {args.spare}"
    if args.function is not None and "/" not in name:
        print(f"ramen: worker: --function {name!r} must be PROG/FUNC", file=sys.stderr)
        return EXIT_ERROR
    client = counters = worker = None
    try:
        client = confserver.connect(args.confserver, identity=IDENTITY,
                                    connect_timeout_s=confserver.SERVICE_CONNECT_TIMEOUT_S)
        # Before any input: a worker started for a replay does this while the merge delay runs.
        spare.warm_up_arrow()
        if args.spare is not None:
            spare.prewarm(client)
        freeze_startup_objects()  # as a spare, while it waits
        if args.spare is not None:
            log.info("spare worker %d on site %s waiting for its function", args.spare, args.site)
            assignment = spare.wait_for_assignment(client, args.site, args.spare, args.wait_for_key, stop,
                                                    parent=args.parent)
            if assignment is None:
                log.info("spare worker %d: no function came; exiting", args.spare)
                return 0
            if "/" not in assignment.function:
                raise WorkerError(f"its key names {assignment.function!r}, not PROG/FUNC")
            spare.move_output(assignment)
            name = assignment.function
        counters = CountersFile.open(paths.counters_path())
        worker = Worker(client, args.site, name, counters)
        log.info("worker %s on site %s running (pid ready)", name, args.site)
        run(worker, stop)
        return 0
    except (WorkerError, ComputeError, SourceError, ConfError, LogBufferError, OSError) as e:
        print(f"ramen: worker {name}: {e}".replace("\n", " "), file=sys.stderr)
        return EXIT_ERROR
    finally:
        if worker is not None:
            try:
                worker.close()
            except Exception as e:  # noqa: BLE001 - closing must not hide why we stopped
                log.warning("%s: closing: %s", name, e)
        if counters is not None:
            counters.close()
        if client is not None:
            client.close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    retain_freed_memory()
    return serve(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

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

The jobs are in rooms of their own: inputs (workers/inputs.py), channel states and the replays'
start and end (workers/channels.py), compute dispatch, light or heavy (workers/dispatch.py), outputs
(workers/outputs.py), where a restarted source resumes (workers/resume.py). The worker keeps the
duty cycle and wires them; time comes from an injected clock (ramen/clocks.py).

SIGTERM/SIGINT: the current batch is finished and written, the publications closed, exit 0. A bad
worker key, program or callable: one line on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

import pyarrow as pa

import confserver
from confserver import ConfClient, ConfError, EventKind
from ramen import keyspace, paths, service_log
from ramen.archive.errors import ArchiveError
from ramen.cli import argtypes
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.memory import freeze_startup_objects, retain_freed_memory
from ramen.message import (KIND_END_OF_REPLAY, KIND_TUPLES, LIVE_CHANNEL, NO_EVENT_TIME, decode_header,
                           event_time_bounds)
from ramen.program.errors import ProgramError
from ramen.program.model import ENGINE_SPARK, Function, Program, function_id, split_qualified
from ramen.replay.contract import ContractError, WorkerReplay
from ramen.replay.fail import fail_replay
from ramen.rollup import Rollup
from ramen.transport import BackoffIdleStrategy, CountersFile, TransportError
from ramen.transport.frame_walk import last_event_time_us
from ramen.tuples import decode_tuples, gap, resumed, with_channel
from ramen.worker_keys import WorkerSpec, WorkerStats
from workers import spare
from workers.channels import Channels, ChannelState
from workers.compute import ComputeError, make_runner
from workers.defaults import COMPUTE_WAIT_S, EXIT_ERROR, MAX_PENDING_MESSAGES, SPARE_WORKER_WAIT_S, STATS_INTERVAL_S
from workers.dispatch import HeavyDispatch, LightDispatch
from workers.errors import WorkerError
from workers.heavy import SparkExecutor
from workers.inputs import Input, Inputs
from workers.outputs import Output, Outputs, tuple_messages
from workers.resume import last_written_us
from workers.sources import RowSource, SourceError, make_source
from workers.stats import WorkerCounters

log = logging.getLogger(__name__)

IDENTITY = "worker"
STOP_FLUSH_TIMEOUT_S = 2.0
"""On SIGTERM, how long the worker tries to write what it already computed before it closes."""


class Worker:
    """The agent: its duty cycle (`do_work`) wires the rooms, inputs (workers/inputs.py), channel
    states (workers/channels.py), compute dispatch (workers/dispatch.py) and outputs
    (workers/outputs.py). Construction does no I/O; `open()` reads the worker key and the program,
    opens the live output and allocates the counters."""

    def __init__(self, client: ConfClient, site: str, qualified_name: str, counters: CountersFile, *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.client = client
        self.site = site
        self.qualified_name = qualified_name
        self.counters = counters
        self.clock = clock
        self.id = function_id(qualified_name)
        self.worker_key = keyspace.worker_key(site, qualified_name)
        self.stats = WorkerCounters(qualified_name, clock=clock)
        self.inputs = Inputs(site, qualified_name, counters)
        self.outputs = Outputs(site, qualified_name, counters, self.id)
        self.spec: WorkerSpec | None = None
        """The worker key's value (the choreographer's)."""
        self.signature: str | None = None
        """Of the function this process runs (the supervisor restarts it for another)."""
        self.live = False
        self.live_event_time_us: int | None = None
        """The largest event time written on the live output (a restarted source resumes after it)."""
        self._live_begun = False
        """A live message was written: a windowed function's first says where its whole windows begin."""
        self._written_before_us: int | None = None
        """A windowed function's: the last event time in its live log when it started (its previous
        run's last window), from which on a gap may begin."""
        self.program: Program | None = None
        self.function: Function | None = None
        self.rollup: Rollup | None = None
        """What its archived live messages carry for dashboards (ramen/rollup.py)."""
        self.parents: dict[str, Function] = {}
        self.channels: Channels | None = None
        self.dispatch: LightDispatch | HeavyDispatch | None = None
        """None for a source: its rows are generated or passed through, never computed."""
        self.source: RowSource | None = None
        self._watches: list = []
        self._next_stats_s = 0.0

    # -- set-up -----------------------------------------------------------------------------

    def open(self) -> Worker:
        """Read the worker key and the program, open the live output, allocate the counters and
        watch the keys; WorkerError (one line) when the worker cannot run."""
        entry = self.client.get_or_none(self.worker_key)
        if entry is None:
            raise WorkerError(f"no worker key {self.worker_key}")
        try:
            self.spec = WorkerSpec.from_value(entry.value, self.worker_key)
        except ContractError as e:
            raise WorkerError(str(e)) from None
        self.signature = self.spec.signature
        self.program, self.function = self._load_function(self.qualified_name)
        self.rollup = Rollup.of(self.function) if self.spec.archived else None
        self.parents = {parent: self._parent(parent) for parent in self.function.parents}
        if self.function.engine == ENGINE_SPARK:
            self.dispatch = HeavyDispatch(SparkExecutor(self.function, self.client, clock=self.clock), self.stats,
                                          self._emit, self.inputs.keep_alive, clock=self.clock)
        elif self.function.source is None:
            try:
                runner = make_runner(self.function, self.program.path)
            except ComputeError as e:
                raise WorkerError(str(e)) from None
            self.dispatch = LightDispatch(runner, self.stats)
        self.stats.allocate(self.counters)
        live = self.spec.live
        live_output = self.outputs.open_live(archived=self.spec.archived)
        self.channels = Channels(self.client, self.site, self.function, self.parents, self.id, self.inputs,
                                 self.outputs, self.stats)
        self.channels.open_live(live_output)
        self._watches = [self.client.watch(self.worker_key),
                         self.client.watch(keyspace.function_key(self.site, self.qualified_name, "replays/*"))]
        if self.function.source is not None:
            self._open_source(live_output)
        elif self.function.window is not None:
            self._written_before_us = last_event_time_us(live_output.log)
            self.inputs.note_joins = True
            if self._written_before_us is not None:  # restarted: on from the first window it did not write
                window = self.function.window
                first_unwritten = self._written_before_us // window.every_us + 1
                self.channels.get(LIVE_CHANNEL).windows.resume(first_unwritten)
                self.inputs.resume_live_from_us = first_unwritten * window.every_us - window.lateness_us
        self._set_live(live)
        return self

    def _open_source(self, live_output: Output) -> None:
        def last_stats() -> WorkerStats | None:
            key = keyspace.function_key(self.site, self.qualified_name, "stats")
            entry = self.client.get_or_none(key)
            try:
                return None if entry is None else WorkerStats.from_value(entry.value, key)
            except ContractError as e:
                log.warning("%s", e)
                return None
        self.live_event_time_us = last_written_us(self.qualified_name, live_output.log, paths.archive_dir(self.site),
                                                  last_stats)
        resume_us = None if self.live_event_time_us is None else self.live_event_time_us + 1
        try:
            self.source = make_source(self.function, self.program.path, start_us=resume_us, clock=self.clock)
        except SourceError as e:
            raise WorkerError(str(e)) from None
        if self.source.resumes_from_us is not None:
            # First in the log, so first in its recording: the archive's coverage goes on from the
            # previous run's without a gap (ramen/message.py, KIND_RESUMED).
            live_output.send(resumed(self.source.resumes_from_us, self.id))

    def _program(self, name: str) -> Program:
        entry = self.client.get_or_none(keyspace.program_key(name))
        if entry is None:
            raise WorkerError(f"program {name} is not loaded (no key {keyspace.program_key(name)})")
        try:
            return Program.from_dict(entry.value)
        except ProgramError as e:
            raise WorkerError(f"{keyspace.program_key(name)}: {e}") from None

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

    def _set_live(self, live: bool) -> None:
        self.live = live
        for parent, function in self.parents.items():
            path = paths.parent_log(self.site, parent, function.site)
            if live:
                self.inputs.use(path, function, LIVE_CHANNEL)
            else:
                self.inputs.release(path, LIVE_CHANNEL)

    # -- confserver events -------------------------------------------------------------------

    def _conf_events(self) -> int:
        events = [event for watch in self._watches for event in watch.drain()]
        for event in events:
            if event.kind == EventKind.SYNCED:
                continue
            if event.key == self.worker_key:
                if event.kind != EventKind.DELETED:
                    try:
                        self.spec = WorkerSpec.from_value(event.entry.value, self.worker_key)
                    except ContractError as e:
                        log.error("%s; ignored", e)
                        continue
                    live = self.spec.live
                    if live != self.live:
                        log.info("%s: live %s", self.qualified_name, live)
                        self._set_live(live)
                continue
            channel = event.key.rpartition("/")[2]
            if not channel.isdigit():
                continue
            if event.kind == EventKind.DELETED:
                self.channels.end(int(channel), torn_down=True)
            else:
                self._start_replay(int(channel), event.key, event.entry.value)
        return len(events)

    def _start_replay(self, channel: int, key: str, value) -> None:
        try:
            part = WorkerReplay.from_value(value, key)
        except ContractError as e:
            log.error("%s: ignored", e)
            return
        self.channels.start(channel, part)

    # -- data --------------------------------------------------------------------------------

    def _read_inputs(self) -> int:
        """One poll of every input, its messages taken in runs of one channel."""
        read, inbox = self.inputs.poll()
        run: list[tuple[Input, bytes]] = []
        run_key = None  # (input, tag): the channels a run's rows are for
        for found, message in inbox:
            header = decode_header(message)
            if header is None:
                continue
            if run and (found is not run_key[0] or header.channel != run_key[1]):
                self._process(*run_key, run)
                run = []
            run_key = (found, header.channel)
            if header.kind == KIND_TUPLES:
                if header.channel == LIVE_CHANNEL and not found.shared:
                    if found.skipped:
                        self._gap_for_skip(found, header.min_event_time_us)
                    if found.read_up_to_us is None or header.max_event_time_us > found.read_up_to_us:
                        found.read_up_to_us = header.max_event_time_us
                run.append((found, message))
            elif header.kind == KIND_END_OF_REPLAY:
                if run:
                    self._process(*run_key, run)
                    run = []
                found.ended.add(header.channel)
                self._on_end_of_replay(header.channel, header.source, found.shared)
        if run:
            self._process(*run_key, run)
        return read

    def _gap_for_skip(self, found: Input, resumed_us: int) -> None:
        """Rows of a live input were lost to us (Input.skipped), and rows came again from event
        time `resumed_us`: a GAP over what may miss the lost ones, from the last row read before
        (less the lateness, for a windowed function: from the window it falls in) to the rows
        that came again (the window they begin in, included). The archive leaves it out of its
        coverage, so a replay computes it from the parents' archives rather than trust it."""
        found.skipped = False
        after_us, window = found.read_up_to_us, self.function.window
        if resumed_us == NO_EVENT_TIME or after_us is None or after_us == NO_EVENT_TIME or not self.live:
            log.warning("%s: cannot say which event times the rows lost from %s had", self.qualified_name,
                        found.path)
            return
        if window is None:
            since_us, until_us = after_us + 1, resumed_us
        else:
            every = window.every_us
            since_us = (after_us - window.lateness_us) // every * every
            until_us = (resumed_us // every + 1) * every
        if since_us >= until_us:
            return
        log.warning("%s: its output in [%d, %d) µs may miss the rows lost from %s, a gap in its archive",
                    self.qualified_name, since_us, until_us, found.path)
        self.channels.get(LIVE_CHANNEL).send(gap(since_us, until_us, self.id), 0)
        self.stats.add("gaps", 1)

    def _process(self, found: Input, tag: int, messages: list[tuple[Input, bytes]]) -> None:
        """Messages of one input under one tag: for each channel whose rows they carry, decoded once
        (and not at all where a summarised replay takes their rollups)."""
        batches = None
        for channel in found.channels_of(tag):
            state = self.channels.get(channel)
            if state is None or (channel == LIVE_CHANNEL and not self.live):
                log.debug("%s: %d messages of channel %d nobody here expects", self.qualified_name, len(messages),
                          channel)
                if channel != LIVE_CHANNEL:
                    self.stats.add("skipped" if found.shared else "unexpected", len(messages))
                continue
            if state.pass_through and state.summariser is not None:
                self._summarise(state, channel, tag, messages)
                continue
            if batches is None:
                batches = [(f, decode_tuples(message, f.schema)) for f, message in messages]
            rows = sum(b.num_rows for _, b in batches)
            self.stats.add("tuples in", rows, channel)
            if not state.pass_through:
                self.dispatch.process(state, batches, messages)
                continue
            self.stats.add("tuples out", rows, channel)
            for (_, batch), (_, message) in zip(batches, messages):
                state.send(message if channel == tag else with_channel(message, channel), batch.num_rows)

    def _summarise(self, state: ChannelState, channel: int, tag: int, messages: list[tuple[Input, bytes]]) -> None:
        """A summarised replay of the function's own archive: each message folded, by its rollup
        where it carries one (its rows not even decoded), and sent on as it is to the replays that
        take the rows themselves (state.through)."""
        rows = rollups = 0
        for found, message in messages:
            count, rolled_up = state.summarise_message(message, found.schema)
            rows += count
            rollups += rolled_up
            if state.through:
                state.send(message if channel == tag else with_channel(message, channel), count)
        self.stats.add("tuples in", rows, channel)
        self.stats.add("tuples out", rows, channel)
        self.stats.add("rollups", rollups)

    def _on_end_of_replay(self, channel: int, source: int, shared: bool = False) -> None:
        state = self.channels.count_end_of_replay(channel, source, shared)
        if state is None:
            return
        if self.dispatch is not None:
            if not self.dispatch.end(state):
                return  # ends when Spark is back and the job has run (do_work, dispatch.retry)
            self._emit_computed(self.dispatch.drain())  # the channel's last results, before its END_OF_REPLAY
        self.channels.send_end_of_replay(state)

    def _emit_computed(self, results: list[tuple[ChannelState, pa.Table]]) -> int:
        """Write the light function's results, in the order it was called. A replay torn down
        while its calls ran has no output any more: its results go nowhere."""
        for state, table in results:
            if self.channels.is_current(state):
                self._emit(state, table)
        return len(results)

    def _emit(self, state: ChannelState, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if state.summariser is not None:
            state.summarise(table)
            if not state.through:  # nothing takes the rows themselves
                self.stats.add("tuples out", table.num_rows, state.channel)
                return
        live = state.channel == LIVE_CHANNEL
        if live and not self._live_begun:
            self._begin_live(state)
        for message, rows in tuple_messages(table, state.max_message_length, self.function.event_time,
                                            state.channel, self.id, self.rollup if live else None):
            written = None
            if live and (bounds := event_time_bounds(message)) is not None:
                written = lambda high=bounds[1]: self._live_written(high)  # noqa: E731
            state.send(message, rows, written)
            self.stats.add("tuples out", rows, state.channel)

    def _begin_live(self, state: ChannelState) -> None:
        """Before a windowed function's first live rows, when it joined an input at its tail while
        the input held rows (a function loaded while its parents ran, or a worker restarted after
        its input's log overwrote the rows it needed: else it resumes where they begin, and the
        windows are whole): a GAP over the windows that may miss what was written before it read,
        from the first its previous run did not write (or the first a row it reads may fall in) up
        to the first that began after its inputs' last event time. The recorder keeps it beside the
        recording and the archive's coverage leaves it out, so that a replay of those windows
        computes them from the parents' archives, and a range nothing can compute is named as
        missing (--strict refuses it): a window of 7,892 of 30,030 rows was archived as if whole,
        and replayed with exit 0."""
        self._live_begun = True
        window, joined_after_us = self.function.window, self.inputs.joined_after_us()
        if window is None or not self.function.parents or joined_after_us is None:
            return
        every = window.every_us
        whole_from_us = (joined_after_us // every + 1) * every
        since_us = (joined_after_us - window.lateness_us) // every * every
        if self._written_before_us is not None:  # its previous run wrote the windows before this one
            since_us = min(since_us, (self._written_before_us // every + 1) * every)
        if since_us >= whole_from_us:
            return
        log.info("%s joined its inputs after event time %d µs: its windows in [%d, %d) µs may miss rows written "
                 "before, a gap in its archive", self.qualified_name, joined_after_us, since_us, whole_from_us)
        state.send(gap(since_us, whole_from_us, self.id), 0)

    def _live_written(self, high_us: int) -> None:
        """A live message is in the log: a restart resumes after its rows, not after rows that were
        only queued (lost with a killed worker, they would leave a gap the archive could not see)."""
        if self.live_event_time_us is None or high_us > self.live_event_time_us:
            self.live_event_time_us = high_us

    def _generate(self) -> int:
        batch = self.source.poll(self.clock.epoch_us())
        if batch is None or batch.num_rows == 0:
            return 0
        self.stats.add("tuples in", batch.num_rows, LIVE_CHANNEL)
        self._emit(self.channels.get(LIVE_CHANNEL), pa.Table.from_batches([batch]))
        return 1

    # -- duty cycle --------------------------------------------------------------------------

    def _flush(self) -> int:
        work = self.outputs.flush(self.channels.recipients())
        self.stats.add("dropped", self.outputs.take_dropped_rows(), LIVE_CHANNEL)
        return work

    def pending(self) -> int:
        return sum(len(o.pending) for o in self.outputs.all(self.channels.recipients()))

    def do_work(self) -> int:
        """One bounded slice: keys' changes, new input logs, computed results, what the outputs take,
        Spark retries, then one poll of the inputs unless the outputs or the calls hold them back."""
        work = self._conf_events()
        now = self.clock.seconds()
        self.inputs.look(now)
        if self.inputs.lost:
            self._fail_lost()
        dispatch = self.dispatch
        if dispatch is not None:
            work += self._emit_computed(dispatch.completed())
        work += self._flush()
        if dispatch is not None:
            for state in dispatch.retry(self.channels.states.values()):
                work += 1
                if state.ending:
                    self.channels.send_end_of_replay(state)
        if self.pending() < MAX_PENDING_MESSAGES and not (dispatch is not None and dispatch.full):
            if self.source is not None and self.live:
                work += self._generate()
            work += self._read_inputs()
            work += self._flush()
        else:
            self.inputs.keep_alive()  # held back by our readers, not dead: the writers must wait
        if now >= self._next_stats_s:
            self._next_stats_s = now + STATS_INTERVAL_S
            self.write_stats()
        return work

    def _fail_lost(self) -> None:
        """Replays whose input log was replaced under them, or ended before them (inputs.lost): a result
        without what they missed would be short. They fail, naming it."""
        for path, channels, what in self.inputs.lost:
            for channel in sorted(channels):
                message = f"{self.qualified_name}: during replay {channel}, its input {path} {what}"
                try:
                    if fail_replay(self.client, channel, message):
                        log.error("%s", message)
                except ConfError as e:
                    log.warning("cannot fail replay %d (%s): %s", channel, message, e)
        self.inputs.lost.clear()

    def write_stats(self) -> None:
        record = self.stats.record(self.inputs.position, self.outputs.live.publication.position,
                                   signature=self.signature, live_event_time_us=self.live_event_time_us,
                                   heavy=isinstance(self.dispatch, HeavyDispatch))
        try:
            self.client.set(keyspace.function_key(self.site, self.qualified_name, "stats"), record.to_value())
        except ConfError as e:
            log.warning("%s: cannot write stats: %s", self.qualified_name, e)

    def close(self, flush_timeout_s: float = STOP_FLUSH_TIMEOUT_S) -> None:
        """Write what is computed (for a while), then close every publication and image, and the
        dispatch last: a heavy one releases its Spark session, a call to a server that may be slow to
        answer, which must not hold back what the outputs still have to write."""
        try:
            self._close_outputs(flush_timeout_s)
        finally:  # whatever failed on the way: the session is released
            if self.dispatch is not None:
                self.dispatch.close()

    def _close_outputs(self, flush_timeout_s: float) -> None:
        if self.dispatch is not None:
            try:  # the windows that were computing: written, not lost
                self._emit_computed(self.dispatch.drain())
            except ComputeError as e:  # a later call failed too: the outputs must still be closed
                log.warning("%s", e)
        deadline = self.clock.seconds() + flush_timeout_s
        idle = BackoffIdleStrategy()
        while self.pending() and self.clock.seconds() < deadline:
            idle.idle(self._flush())
        for watch in self._watches:
            watch.close()
        self.channels.discard_gathered()
        self.write_stats()
        self.outputs.close(self.channels.recipients())
        self.inputs.close()
        self.stats.close()


def run(worker: Worker, stop: threading.Event, idle: BackoffIdleStrategy | None = None) -> None:
    idle = idle or BackoffIdleStrategy()
    while not stop.is_set():
        work = worker.do_work()
        if work == 0 and worker.dispatch is not None and worker.dispatch.in_flight:
            worker.dispatch.wait(COMPUTE_WAIT_S)  # woken by the call's return, not a park after it
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
        worker = Worker(client, args.site, name, counters).open()
        log.info("worker %s on site %s running (pid ready)", name, args.site)
        run(worker, stop)
        return 0
    except (WorkerError, ComputeError, SourceError, ConfError, TransportError, ArchiveError, OSError) as e:
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
    service_log.configure(logging.INFO)
    retain_freed_memory()
    return serve(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

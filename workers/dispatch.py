"""Compute dispatch: how a channel's rows reach the function, light or heavy.

- Light (engine = "python"): each window's call (or each poll's rows, without a window) runs on
  the worker's compute thread (workers/compute_thread.py), results in call order, so reading
  overlaps computing.
- Heavy (engine = "spark"): committed rows are gathered, then run as one Spark job (workers/heavy.py):
  at once for live, once enough rows wait (or at the end) for a replay. While Spark is unreachable
  the rows are kept and the job retried after SPARK_RETRY_S, a replay's end with it.

Both take the rows of one channel's poll as decoded batches with their messages (whose headers'
event-time bounds let windows place whole tables without a look at their rows).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable, Iterator

import pyarrow as pa

from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.message import LIVE_CHANNEL, event_time_bounds
from ramen.spark.session import SparkUnavailable
from workers.channels import ChannelState
from workers.compute import ComputeError, PythonRunner
from workers.compute_thread import ComputeThread
from workers.defaults import SPARK_HEARTBEAT_S, SPARK_REPLAY_UNREACHABLE_S, SPARK_RETRY_S
from workers.heavy import SparkExecutor
from workers.inputs import Input
from workers.stats import WorkerCounters
from workers.windows import ClosedWindow

log = logging.getLogger(__name__)

Batches = list[tuple[Input, pa.RecordBatch]]
Messages = list[tuple[Input, bytes]]


def by_input(batches: Batches, messages: Messages, every_us: int
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


def committed(state: ChannelState, batches: Batches, messages: Messages, event_time: str | None,
              stats: WorkerCounters, *, by_parent: bool = False) -> Iterator[ClosedWindow]:
    """The windows a poll's rows commit, each as soon as it closes (a light call starts while the
    next rows are placed); rows too late for their window are counted once all are placed.
    `by_parent`: each parent's rows stay apart within a window (a Spark function's views)."""
    late_before = state.windows.late
    for found, table, bounds in by_input(batches, messages, state.windows.every_us):
        yield from state.windows.add(table, found.event_time or event_time, found.parent if by_parent else None,
                                     bounds=bounds)
    stats.add("late", state.windows.late - late_before, state.channel)


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


class LightDispatch:
    """A python function's calls on the compute thread; results come back through `completed`."""

    def __init__(self, runner: PythonRunner, stats: WorkerCounters) -> None:
        self.runner = runner
        self.stats = stats
        self.event_time = runner.function.event_time
        self.compute: ComputeThread[ChannelState] = ComputeThread(f"compute {runner.function.qualified_name}")

    @property
    def in_flight(self) -> int:
        return len(self.compute)

    @property
    def full(self) -> bool:
        return self.compute.full

    def process(self, state: ChannelState, batches: Batches, messages: Messages) -> None:
        if state.windows is None:
            self.compute.submit(state, self.runner,
                                pa.Table.from_batches([b for _, b in batches], schema=batches[0][1].schema))
            return
        for closed in committed(state, batches, messages, self.event_time, self.stats):
            self._call(state, closed)

    def end(self, state: ChannelState) -> bool:
        """Every END_OF_REPLAY is in: the open windows are called (`drain` then has the results)."""
        if state.windows is not None:
            for closed in state.windows.flush():
                self._call(state, closed)
        return True

    def _call(self, state: ChannelState, closed: ClosedWindow) -> None:
        self.compute.submit(state, self.runner, closed.table, (closed.start_us, closed.end_us))

    def completed(self) -> list[tuple[ChannelState, pa.Table]]:
        return self.compute.completed()

    def drain(self) -> list[tuple[ChannelState, pa.Table]]:
        return self.compute.drain()

    def retry(self, states: Iterable[ChannelState]) -> list[ChannelState]:
        return []

    def wait(self, timeout_s: float) -> None:
        self.compute.wait(timeout_s)

    def close(self) -> None:
        self.compute.close()


class HeavyDispatch:
    """A Spark function: each channel's committed rows gathered, run as one job when it is time,
    the result given to `emit` at once."""

    in_flight = 0
    full = False

    def __init__(self, executor: SparkExecutor, stats: WorkerCounters, emit: Callable[[ChannelState, pa.Table], None],
                 keep_alive: Callable[[], None], *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.executor = executor
        self.stats = stats
        self.emit = emit
        self.keep_alive = keep_alive
        self.clock = clock
        self.event_time = executor.function.event_time
        self.name = executor.function.qualified_name

    def process(self, state: ChannelState, batches: Batches, messages: Messages) -> None:
        if state.windows is None:
            self._keep(state, [(found.parent, batch) for found, batch in batches])
        else:
            for closed in committed(state, batches, messages, self.event_time, self.stats, by_parent=True):
                self._keep(state, closed.batches)
        self._run(state)

    def end(self, state: ChannelState) -> bool:
        """Every END_OF_REPLAY is in: the open windows join the rest, and the job runs. False while
        Spark is unreachable: the channel ends when `retry` has run it."""
        if state.windows is not None:
            for closed in state.windows.flush():
                self._keep(state, closed.batches)
        return self._run(state)

    def completed(self) -> list:
        return []

    drain = completed

    def _keep(self, state: ChannelState, batches) -> None:
        if state.gathered is None:
            state.gathered = self.executor.gathered()
        for parent, batch in batches:
            state.gathered.add(parent, batch)

    def _run(self, state: ChannelState) -> bool:
        """Run the channel's gathered rows as one Spark job when it is time: at once for live,
        once enough rows wait (or at the end) for a replay. False while Spark is unreachable."""
        gathered = state.gathered
        if not gathered:
            return True
        if not (state.ending or state.channel == LIVE_CHANNEL or gathered.job_due):
            return True
        now = self.clock.seconds()
        if now < state.retry_at:
            return False
        jobs_before, job_s_before = self.executor.jobs, self.executor.job_s
        try:
            table = heartbeating(lambda: self.executor.run(gathered), self._heartbeat)
        except SparkUnavailable as e:
            if state.unreachable_since is None:
                state.unreachable_since = now
            elif state.channel != LIVE_CHANNEL and now - state.unreachable_since > SPARK_REPLAY_UNREACHABLE_S:
                raise ComputeError(f"{self.name}: Spark unreachable for {now - state.unreachable_since:.0f} s during "
                                   f"a replay ({e})") from None
            delay = SPARK_RETRY_S[min(state.retries, len(SPARK_RETRY_S) - 1)]
            state.retries += 1
            state.retry_at = now + delay
            log.warning("%s: channel %d: Spark unavailable (%s); %d rows kept, retrying in %g s",
                        self.name, state.channel, e, gathered.rows, delay)
            return False
        self.stats.add("spark jobs", self.executor.jobs - jobs_before)
        self.stats.add("spark ms", round((self.executor.job_s - job_s_before) * 1000))
        log.info("%s: channel %d: one Spark job over %d rows (gathered over %.2f s) gave %d", self.name,
                 state.channel, gathered.rows, self.clock.seconds() - gathered.created_s, table.num_rows)
        gathered.discard()
        state.gathered, state.retries, state.retry_at, state.unreachable_since = None, 0, 0.0, None
        self.emit(state, table)
        return True

    def _heartbeat(self) -> None:
        self.keep_alive()
        self.executor.check_progress()

    def retry(self, states: Iterable[ChannelState]) -> list[ChannelState]:
        """The channels whose job waited for Spark to come back and has now run."""
        return [state for state in [s for s in states if s.gathered and s.retry_at] if self._run(state)]

    def wait(self, timeout_s: float) -> None:
        pass

    def close(self) -> None:
        self.executor.close()

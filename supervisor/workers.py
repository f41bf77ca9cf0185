"""Which worker processes run: one per used worker key, restarted with backoff when it crashes,
quarantined when it keeps crashing, and every ended run recorded.

The choreographer decides (`…/worker` {is_used, signature, …}); this module makes the processes
follow: start what is used and not running, stop (SIGTERM, then SIGKILL) what is unused, restart
what runs with an old signature. Each start writes the ephemeral `…/instance` {pid, started_us,
signature}; each end appends a run to `…/instances/<signature>` and sets `last_exit` in `…/stats`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import confserver
from confserver import ConfClient
from ramen import keyspace, paths
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.transport.writer_lock import writer_pids
from ramen.worker_keys import ContractError, WorkerInstance, WorkerRun, WorkerRuns, WorkerSpec, WorkerStats
from supervisor import defaults
from supervisor.counters import SupervisorCounters
from supervisor.processes import Child, adopt, spawn

log = logging.getLogger(__name__)

DEFAULT_WORKER_COMMAND = (sys.executable, "-m", "workers.worker")


@dataclass(frozen=True)
class RestartPolicy:
    """Backoff and quarantine of crashing workers (see supervisor.defaults)."""

    initial_s: float = defaults.RESTART_BACKOFF_INITIAL_S
    factor: float = defaults.RESTART_BACKOFF_FACTOR
    max_s: float = defaults.RESTART_BACKOFF_MAX_S
    reset_after_s: float = defaults.RESTART_BACKOFF_RESET_S
    quarantine_failures: int = defaults.QUARANTINE_FAILURES
    quarantine_window_s: float = defaults.QUARANTINE_WINDOW_S
    quarantine_s: float = defaults.QUARANTINE_S

    def backoff_s(self, consecutive_failures: int) -> float:
        return min(self.max_s, self.initial_s * self.factor ** max(0, consecutive_failures - 1))


@dataclass
class WorkerState:
    name: str
    wanted: WorkerSpec | None = None
    """The worker key's value, None once deleted."""
    child: Child | None = None
    signature: str | None = None
    """Of the running child."""
    failures: deque = field(default_factory=deque)
    """monotonic times of recent crashes, for quarantine."""
    consecutive: int = 0
    not_before: float = 0.0
    quarantined_until: float = 0.0
    crashed: bool = False
    """The last run crashed: the next start is a restart."""
    spare_id: int | None = None
    """The running child started as this spare (its command line says --spare, not --function)."""
    started_at: float = 0.0
    """monotonic time the running child became this worker (a spare may have waited long before)."""
    unused_since: float | None = None
    """Clock seconds since when its running child is no longer used (it lingers, see LAZY_LINGER_S)."""

    @property
    def should_run(self) -> bool:
        return self.wanted is not None and self.wanted.is_used

    @property
    def wanted_signature(self) -> str | None:
        return self.wanted.signature if self.wanted is not None else None


def run_record(child: Child) -> WorkerRun:
    return WorkerRun(pid=child.pid, started_us=child.started_us, ended_us=child.ended_us,
                     exit_status=child.returncode, run_time_s=round(child.run_time_s, 3))


class WorkerSupervision:
    def __init__(self, client: ConfClient, site: str, counters: SupervisorCounters, *,
                 command: Sequence[str] = DEFAULT_WORKER_COMMAND, env: Mapping[str, str],
                 policy: RestartPolicy = RestartPolicy(), stop_grace_s: float = defaults.STOP_GRACE_S,
                 on_death: Callable[[str, str, bool], None] = lambda name, description, lost: None,
                 spares: bool = True, busy: Callable[[], bool] = lambda: False,
                 linger_s: float = defaults.LAZY_LINGER_S, clock: Clock = SYSTEM_CLOCK):
        self.client = client
        self.clock = clock
        self.site = site
        self.counters = counters
        self.command = tuple(command)
        self.env = dict(env)
        self.policy = policy
        self.stop_grace_s = stop_grace_s
        self.on_death = on_death
        """Called with (name, `exit 1`) when a worker that should run ends."""
        self.spares = spares
        """Keep a spare worker started (workers/spare.py), so that a worker starts without waiting
        for Python's imports."""
        self.busy = busy
        """Whether replays are under way: a new spare's start-up would take CPU from them, so it waits."""
        self.linger_s = linger_s
        """How long a worker no longer used runs on (used again meanwhile, it is kept)."""
        self.workers: dict[str, WorkerState] = {}
        self._spare: tuple[int, Child] | None = None

    # -- inputs --------------------------------------------------------------------------------

    def on_worker_key(self, name: str, value: dict | None) -> None:
        state = self.workers.setdefault(name, WorkerState(name))
        try:
            state.wanted = None if value is None else WorkerSpec.from_value(value, keyspace.worker_key(self.site, name))
        except ContractError as e:
            log.error("%s; the worker does not run", e)
            state.wanted = None

    def adopt(self) -> None:
        """Take over the worker processes an earlier supervisor of this site left running.

        Which process runs a function is the kernel's to say: the writer lock of the function's
        output log, held for exactly as long as that process lives (ramen/transport/writer_lock.py).
        An instance key says it only for the session timeout of the supervisor that wrote it (one
        restarted later than that started a second writer of a log); it still names a worker too
        young to have opened its log. What a process runs (its signature) comes from its instance
        key if that is still there, else from the stats it writes; a worker of unknown signature
        is restarted. Instance keys of processes that are gone are deleted."""
        instances = {keyspace.qualified_name_of(e.key): _instance(e)
                     for e in self.client.glob(keyspace.function_key(self.site, "*/*", "instance"))}
        writers = self._writers(paths.output_logs(self.site))
        for name, instance in instances.items():
            self.client.discard(keyspace.function_key(self.site, name, "instance"))
            if name in writers or instance is None:
                continue
            child = adopt(f"worker {name}", instance.pid, instance.started_us,
                          expect_args=("--function", name) if instance.spare is None else ("--spare", str(instance.spare)),
                          clock=self.clock)
            if child is None:
                log.info("worker %s: instance of pid %s is gone; key deleted", name, instance.pid)
            else:
                self._adopted(name, child, instance)
        for name, pid in sorted(writers.items()):
            self._adopt_writer(name, pid, instances.get(name))

    def _writers(self, logs: dict[str, Path]) -> dict[str, int]:
        """name -> pid of the process writing each of these output logs, for those written."""
        pids = writer_pids(logs.values())
        return {name: pids[path] for name, path in logs.items() if path in pids}

    def _signature_in_stats(self, name: str, pid: int) -> str | None:
        key = keyspace.function_key(self.site, name, "stats")
        entry = self.client.get_or_none(key)
        try:
            stats = WorkerStats.from_value(entry.value, key) if entry is not None else None
        except ContractError as e:
            log.warning("%s", e)
            return None
        return stats.signature if stats is not None and stats.pid == pid else None

    def _adopt_writer(self, name: str, pid: int, instance: WorkerInstance | None = None) -> None:
        """Adopt the process that writes the function's log (no need to check its command line:
        the lock says what it is); what it runs, from its instance key if that names it, else
        from its stats."""
        if instance is None or instance.pid != pid:
            instance = WorkerInstance(pid=pid, started_us=0, signature=self._signature_in_stats(name, pid))
        child = adopt(f"worker {name}", pid, instance.started_us, clock=self.clock)
        if child is not None:  # else it ended just now
            self._adopted(name, child, instance)

    def _adopted(self, name: str, child: Child, instance: WorkerInstance) -> None:
        state = self.workers.setdefault(name, WorkerState(name))
        state.child, state.signature, state.spare_id = child, instance.signature, instance.spare
        state.started_at = self.clock.seconds()
        if state.signature is None:
            log.warning("worker %s: adopted pid %d runs an unknown signature: it will be restarted", name, child.pid)
        self._write_instance(state)
        self.counters.adopted += 1

    # -- duty cycle ----------------------------------------------------------------------------

    def do_work(self, now: float) -> int:
        work = 0
        for state in list(self.workers.values()):
            work += self._step(state, now)
            if state.wanted is None and state.child is None:
                del self.workers[state.name]
        return work + self._keep_spare(now)

    def _keep_spare(self, now: float) -> int:
        """Start a spare when there is none and nothing else needs the CPU."""
        if not self.spares:
            return 0
        if self._spare is not None:
            if not self._spare[1].poll():
                return 0
            self._spare[1].drop_unused_log()  # it waited its time out (or died): another one
            self._spare = None
        if self.busy() or any(s.child is not None and now - s.started_at < defaults.SPARE_QUIET_S
                              for s in self.workers.values()):
            return 0
        spare_id = self.client.next_sequence(defaults.SPARE_WORKER_SEQUENCE)
        argv = [*self.command, "--site", self.site, "--spare", str(spare_id), "--parent", str(os.getpid())]
        self._spare = (spare_id, spawn(f"spare worker {spare_id}", argv, self.env,
                                       paths.logs_dir() / "workers" / f"spare-{spare_id}.log", self.clock))
        self.counters.spares += 1
        return 1

    def _step(self, state: WorkerState, now: float) -> int:
        child = state.child
        if child is not None and child.poll():
            self._ended(state, now)
            return 1
        if child is not None:
            if not child.stopping and (why := self._why_stop(state, now)):
                log.info("stopping worker %s (pid %d): %s", state.name, child.pid, why)
                child.stop(self.stop_grace_s)
                return 1
            if child.enforce_stop(now):
                self.counters.kills += 1
                return 1
            return 0
        if state.should_run and now >= state.not_before and now >= state.quarantined_until:
            self._start(state, now)
            return 1
        return 0

    def _why_stop(self, state: WorkerState, now: float) -> str | None:
        """Why the running child must stop now, if it must: its key gone, another signature
        wanted, or unused for `linger_s`."""
        if state.should_run:
            state.unused_since = None
            return None if state.signature == state.wanted_signature else "new signature"
        if state.wanted is None or state.signature != state.wanted_signature:
            return "unused"
        if state.unused_since is None:
            state.unused_since = now
        return "unused" if now - state.unused_since >= self.linger_s else None

    def _start(self, state: WorkerState, now: float) -> None:
        name = state.name
        writer = self._writers({name: paths.output_log(self.site, name)}).get(name)
        if writer is not None:  # a process we did not know of writes its log: it is the worker
            log.warning("worker %s: pid %d already writes its log; adopted, not started again", name, writer)
            self._adopt_writer(name, writer)
            return
        log_path = paths.logs_dir() / "workers" / f"{name}.log"
        spare = self._spare
        if spare is not None and not spare[1].poll():
            spare_id, child = spare
            # The key first: if the confserver fails us here, the spare stays a spare for the next try.
            self.client.set(keyspace.spare_key(self.site, spare_id),
                            {"function": name, "log": str(log_path), "spare_log": str(child.log_path)})
            self._spare = None
            state.spare_id, state.child = spare_id, child
            child.name, child.log_path = f"worker {name}", log_path  # it writes there from now on
            log.info("worker %s: spare %d (pid %d), log %s", name, spare_id, child.pid, log_path)
        else:
            if spare is not None:
                spare[1].drop_unused_log()
                self._spare = None
            argv = [*self.command, "--site", self.site, "--function", name]
            state.spare_id, state.child = None, spawn(f"worker {name}", argv, self.env, log_path, self.clock)
        state.signature, state.started_at = state.wanted_signature, now
        self.counters.starts += 1
        if state.crashed:
            self.counters.restarts += 1
            state.crashed = False
        self._write_instance(state)

    def _write_instance(self, state: WorkerState) -> None:
        key = keyspace.function_key(self.site, state.name, "instance")
        value = WorkerInstance(pid=state.child.pid, started_us=state.child.started_us, signature=state.signature,
                               spare=state.spare_id).to_value()
        try:
            self.client.create(key, value, ephemeral=True)
        except confserver.KeyExists:  # left by an earlier session: make it ours, so it goes with us
            self.client.discard(key)
            self.client.create(key, value, ephemeral=True)

    def _ended(self, state: WorkerState, now: float) -> None:
        child = state.child
        state.child, state.unused_since = None, None
        self.client.discard(keyspace.function_key(self.site, state.name, "instance"))
        if state.spare_id is not None:
            self.client.discard(keyspace.spare_key(self.site, state.spare_id))
            state.spare_id = None
        run = run_record(child)
        quarantined_until_us = None
        if child.stopping:
            self.counters.stops += 1
            log.info("worker %s (pid %d) stopped (%s)", state.name, child.pid, child.describe_exit())
        else:
            self.counters.crashes += 1
            state.crashed = True
            quarantined_until_us = self._count_failure(state, child, now)
            self.on_death(state.name, child.describe_exit(), child.ended_by_signal)
        self._record_run(state.name, state.signature, child, run, quarantined_until_us)

    def _count_failure(self, state: WorkerState, child: Child, now: float) -> int | None:
        """Schedule the restart; returns the end of the quarantine (µs since the epoch) if one starts."""
        policy = self.policy
        state.consecutive = 1 if child.run_time_s >= policy.reset_after_s else state.consecutive + 1
        state.failures.append(now)
        while state.failures and state.failures[0] < now - policy.quarantine_window_s:
            state.failures.popleft()
        if len(state.failures) >= policy.quarantine_failures:
            state.quarantined_until = now + policy.quarantine_s
            state.failures.clear()
            state.consecutive = 0
            self.counters.quarantines += 1
            log.error("worker %s crashed %d times within %.0f s (last: %s): quarantined for %.0f s",
                      state.name, policy.quarantine_failures, policy.quarantine_window_s, child.describe_exit(),
                      policy.quarantine_s)
            return self.clock.epoch_us() + round(policy.quarantine_s * 1e6)
        delay = policy.backoff_s(state.consecutive)
        state.not_before = now + delay
        log.warning("worker %s (pid %d) died (%s) after %.1f s: restart in %.1f s", state.name, child.pid,
                    child.describe_exit(), child.run_time_s, delay)
        return None

    def _record_run(self, name: str, signature: str | None, child: Child, run: WorkerRun,
                    quarantined_until_us: int | None) -> None:
        """Append the run to `…/instances/<signature>` (the last MAX_DEFUNCT_RUNS; `ramen ps` shows
        the latest run's end), with the end of its quarantine if one started."""
        key = keyspace.function_key(self.site, name, f"instances/{signature or 'unknown'}")
        try:
            entry = self.client.get_or_none(key)
            try:
                runs = WorkerRuns.from_value(entry.value, key) if entry is not None else WorkerRuns()
            except ContractError as e:
                log.warning("%s; its runs start over", e)
                runs = WorkerRuns()
            runs = WorkerRuns((*runs.runs, run)[-defaults.MAX_DEFUNCT_RUNS:],
                              runs.quarantined_until_us if quarantined_until_us is None else quarantined_until_us)
            self.client.set(key, runs.to_value())
        except confserver.ConfError as e:
            log.error("worker %s: cannot record its run of pid %d: %s", name, child.pid, e)

    # -- views and shutdown --------------------------------------------------------------------

    def running(self) -> dict[str, Child]:
        return {name: s.child for name, s in self.workers.items() if s.child is not None and not s.child.ended}

    @property
    def spare(self) -> Child | None:
        """The spare worker waiting for a function, if one is started."""
        return self._spare[1] if self._spare is not None else None

    def leaving(self, name: str) -> bool:
        """Whether the process of this worker is on its way out (being stopped, unused, or of an
        old signature): a replay wired to it now would be read by a process about to exit, and the
        rows it took lost to its successor, which joins the log where the writer is."""
        state = self.workers.get(name)
        if state is None or state.child is None:
            return False
        return state.child.stopping or not state.should_run or state.signature != state.wanted_signature

    def quarantined(self, now: float) -> list[str]:
        return sorted(name for name, s in self.workers.items() if s.quarantined_until > now)

    def stop_all(self, timeout_s: float) -> None:
        """Stop every worker we run, and the spare, and wait for them (SIGKILL past the grace, within
        timeout_s)."""
        for state in self.workers.values():
            if state.child is not None:
                state.child.stop(min(self.stop_grace_s, timeout_s))
        spare = self.spare
        self._spare = None
        if spare is not None:
            spare.stop(min(self.stop_grace_s, timeout_s))
        deadline = self.clock.seconds() + timeout_s
        while any(s.child is not None for s in self.workers.values()) or (spare is not None and not spare.poll()):
            now = self.clock.seconds()
            if spare is not None and not spare.poll():
                spare.follow_stop(now, deadline)
            for state in self.workers.values():
                child = state.child
                if child is None:
                    continue
                if child.poll():
                    state.child = None
                    self.client.discard(keyspace.function_key(self.site, state.name, "instance"))
                    self._record_run(state.name, state.signature, child, run_record(child), None)
                else:
                    child.follow_stop(now, deadline)
            time.sleep(defaults.POLL_INTERVAL_S)
        if spare is not None and spare.poll():
            spare.drop_unused_log()


def _instance(entry) -> WorkerInstance | None:
    """The instance key's value; None (logged) if it does not follow its contract."""
    try:
        return WorkerInstance.from_value(entry.value, entry.key)
    except ContractError as e:
        log.warning("%s; the process it named is not adopted", e)
        return None

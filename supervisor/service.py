"""The supervisor of one site: runs the worker processes the choreographer asks for, and the
replayers of replays (see docs/runtime.md, "Who does what, for one replay").

It is an agent: the watches of `sites/<site>/workers/*/*/worker`, `replays/*` and
`sites/<site>/lent-replayers/*` (other sites' replays of our archive) and `sites/*/net/endpoint`
(where their logs go) push their events into one queue; `do_work()` applies them, then looks at its children (ended? past their grace?),
launches replays whose merge delay has passed, expires old replays, and writes
`sites/<site>/supervisor/stats` every second.

A supervisor that starts where an earlier one died adopts what it left: worker processes whose
instance key names a live pid (a dead pid's key is deleted), replayer keys (their process adopted if
its pid runs; replays they serve count as launched, not launched again), and it deletes the keys of
replays that ended meanwhile. Adopted processes are not its children: their exit status is unknown.
On SIGTERM it stops every process it runs (workers, then replayers), setting `error` on the replays
in flight, and exits. `--stop-left-over` does only the adoption and that stop: nothing else is left
to stop the processes of a supervisor that died when its site shuts down.

Run it with `ramen supervisor` (or `python -m supervisor.service --site SITE`).
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import sys
import threading
from collections.abc import Mapping, Sequence

import confserver
from confserver import ConfClient, EventKind
from confserver.url import CONFSERVER_ENV
from ramen import keyspace, liveness, paths, service_log
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.cli import argtypes
from ramen.locks import FileLock, LockHeld
from ramen.transport.errors import TransportError
from ramen.supervisor_stats import Standby, SupervisorStats
from ramen.wait_queue import wait_queue
from supervisor import defaults
from supervisor.counters import SupervisorCounters
from supervisor.replays import DEFAULT_REPLAYER_COMMAND, ReplaySupervision
from supervisor.workers import DEFAULT_WORKER_COMMAND, RestartPolicy, WorkerSupervision

log = logging.getLogger(__name__)

IDENTITY = "supervisor"
#: How long a clean shutdown waits for the children (SIGKILL after their grace within it).
SHUTDOWN_TIMEOUT_S = 10.0
#: After a confserver error the duty cycle waits this long before trying again.
ERROR_PAUSE_S = 0.5
_WORKERS, _REPLAYS, _LENT, _ENDPOINTS = "workers", "replays", "lent", "endpoints"


class Supervisor:
    def __init__(self, client: ConfClient, site: str = keyspace.DEFAULT_SITE, *,
                 env: Mapping[str, str] | None = None,
                 worker_command: Sequence[str] = DEFAULT_WORKER_COMMAND,
                 replayer_command: Sequence[str] = DEFAULT_REPLAYER_COMMAND,
                 delay_before_replay_s: float = defaults.DELAY_BEFORE_REPLAY_S,
                 stop_grace_s: float = defaults.STOP_GRACE_S,
                 restart_policy: RestartPolicy = RestartPolicy(),
                 merge: bool = True, spares: bool = True, counters: SupervisorCounters | None = None,
                 linger_s: float = defaults.LAZY_LINGER_S, clock: Clock = SYSTEM_CLOCK):
        """`env` is what the children get (default: ours); the commands are prefixes to which
        `--site SITE --function PROG/FUNC` (workers) or `--site SITE --id ID` (replayers) are added.
        `merge=False` gives every replay request replayers of its own, as `no_merge` does per request.
        `spares` keeps a worker (workers/spare.py) and a replayer started ahead of need, so that
        neither makes a replay wait for Python's start-up. `counters`: in the site's counters
        file (main), else in memory. `linger_s`: how long a worker no longer used runs on.
        `clock` times every delay, grace and stamp."""
        self.client = client
        self.clock = clock
        self.site = site
        self.counters = SupervisorCounters() if counters is None else counters
        env = dict(os.environ if env is None else env)
        self.workers = WorkerSupervision(client, site, self.counters, command=worker_command, env=env,
                                         policy=restart_policy, stop_grace_s=stop_grace_s,
                                         on_death=self._on_worker_death, spares=spares,
                                         busy=lambda: self.replays.busy(), linger_s=linger_s, clock=clock)
        self.replays = ReplaySupervision(client, site, self.counters, command=replayer_command, env=env,
                                         delay_s=delay_before_replay_s, stop_grace_s=stop_grace_s, merge=merge,
                                         worker_leaving=self.workers.leaving, keep_warm=spares, clock=clock)
        self.events: queue.Queue = wait_queue()
        self._next_stats = 0.0
        self.workers.adopt()
        self.replays.adopt()
        self._watches = [
            client.watch(keyspace.worker_pattern(site), lambda event: self.events.put((_WORKERS, event))),
            client.watch(keyspace.REPLAYS, lambda event: self.events.put((_REPLAYS, event))),
            client.watch(f"{keyspace.lent_replayers_prefix(site)}/*", lambda event: self.events.put((_LENT, event))),
            client.watch(keyspace.net_endpoint_key("*"), lambda event: self.events.put((_ENDPOINTS, event))),
        ]

    def _on_worker_death(self, name: str, description: str, lost: bool) -> None:
        self.replays.on_worker_death(name, description, lost)

    # -- duty cycle ----------------------------------------------------------------------------

    def do_work(self, first: tuple | None = None) -> int:
        """Apply the events received so far (after `first`, already taken off the queue), then
        one pass over workers and replays; returns how much was done."""
        work = 0
        while True:
            if first is not None:
                item, first = first, None
            else:
                try:
                    item = self.events.get_nowait()
                except queue.Empty:
                    break
            self._on_event(*item)
            work += 1
        now = self.clock.seconds()
        work += self.workers.do_work(now)
        work += self.replays.do_work(now)
        work += self.replays.relays.do_work(now)
        if now >= self._next_stats:
            self._next_stats = now + defaults.STATS_INTERVAL_S
            self.write_stats(now)
        return work

    def _on_event(self, source: str, event) -> None:
        if source == _WORKERS:
            if event.kind is EventKind.SYNCED:
                return
            value = None if event.kind is EventKind.DELETED else event.entry.value
            self.workers.on_worker_key(keyspace.qualified_name_of(event.key), value)
            return
        if source == _ENDPOINTS:
            if event.kind is not EventKind.SYNCED:
                self.replays.on_endpoint(event.key.split("/")[1],
                                         None if event.kind is EventKind.DELETED else event.entry.value)
            return
        if source == _LENT:
            replayer_id = event.key.rpartition("/")[2]
            if event.kind is EventKind.SYNCED:
                self.replays.lent_synced()
            elif replayer_id.isdigit():
                self.replays.on_lent(int(replayer_id), None if event.kind is EventKind.DELETED else event.entry.value)
            return
        if event.kind is EventKind.SYNCED:
            self.replays.synced()
            return
        channel = keyspace.replay_channel_of(event.key)
        if channel is None:
            return  # replays/<x>/... or a non-numeric name: not a request
        value = None if event.kind is EventKind.DELETED else event.entry.value
        self.replays.on_replay(channel, value, existing=event.kind is EventKind.EXISTING)

    def write_stats(self, now: float) -> None:
        stats = SupervisorStats(self.counters.to_dict(), running_workers=len(self.workers.running()),
                                updated_us=self.clock.epoch_us(), quarantined=tuple(self.workers.quarantined(now)),
                                replayers=tuple(sorted(self.replays.replayers)),
                                replays=tuple(sorted(self.replays.requests)),
                                spare_worker=_standby(self.workers.spare), warm_replayer=_standby(self.replays.warm))
        self.client.set(keyspace.supervisor_stats_key(self.site), stats.to_value())

    def run(self, stop: threading.Event) -> None:
        """Until stop is set: wait for an event or the poll interval, then do_work. A confserver
        error is logged and the cycle tried again (the client reconnects by itself)."""
        self.announce()
        item = None
        while not stop.is_set():
            liveness.beat()  # for `ramen start`: this loop still turns
            try:
                self.do_work(item)
            except confserver.ConfError as e:
                log.error("confserver: %s; trying again", e)
                stop.wait(ERROR_PAUSE_S)
            try:
                item = self.events.get(timeout=self.wait_s())
            except queue.Empty:
                item = None

    def wait_s(self) -> float:
        """How long the loop may wait for an event: the poll interval, or less when a batch of
        replays is due sooner (it launches then, not up to a poll interval late: 25 ms on average,
        each render of a dashboard waited)."""
        due_in = self.replays.launch_due_in(self.clock.seconds())
        return defaults.POLL_INTERVAL_S if due_in is None else max(0.0, min(defaults.POLL_INTERVAL_S, due_in))

    def announce(self) -> None:
        """Write the site's ephemeral supervisor key, which replay clients watch: they fail at once
        (after a grace) when nobody would serve them."""
        key = keyspace.supervisor_alive_key(self.site)
        value = liveness.SupervisorAlive(pid=os.getpid(), started_us=self.clock.epoch_us()).to_value()
        try:
            self.client.create(key, value, ephemeral=True)
        except confserver.KeyExists:  # left by the session of a supervisor killed: make it ours, to go with us
            self.client.discard(key)
            self.client.create(key, value, ephemeral=True)

    def close(self, *, stop_children: bool = True, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        for watch in self._watches:
            watch.close()
        try:
            self.client.discard(keyspace.supervisor_alive_key(self.site))
        except confserver.ConfError as e:  # the key goes with the session anyway
            log.warning("could not withdraw the supervisor key: %s", e)
        if stop_children:
            self.workers.stop_all(timeout_s)
            self.replays.stop_all(timeout_s)
        log.info("supervisor of site %s stopped: %s", self.site, self.counters)


def _standby(child) -> Standby | None:
    """A process started ahead of need, for `ramen ps --all`."""
    return None if child is None or child.ended else Standby(child.pid, child.started_us)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ramen supervisor",
                                     description="Run the workers and replayers of one site.")
    parser.add_argument("--confserver", metavar="URL", help="default $RAMEN_CONFSERVER, else the local server")
    parser.add_argument("--site", default=keyspace.default_site(), type=argtypes.site, help="site to supervise (default %(default)s)")
    parser.add_argument("--delay-before-replay", type=float, default=defaults.DELAY_BEFORE_REPLAY_S, metavar="S",
                        help="wait this long for concurrent replays to merge (default %(default)s s)")
    parser.add_argument("--stop-grace", type=float, default=defaults.STOP_GRACE_S, metavar="S",
                        help="between SIGTERM and SIGKILL (default %(default)s s)")
    parser.add_argument("--no-merge", action="store_true", help="never merge replay requests")
    parser.add_argument("--no-spares", action="store_true",
                        help="start workers and replayers when needed, not ahead (saves two idle processes)")
    parser.add_argument("--stop-left-over", action="store_true",
                        help="only adopt what an earlier supervisor of the site left running, stop it, and exit "
                             "(what `ramen start` runs on its way down when its supervisor had died)")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    service_log.configure(logging.DEBUG if args.debug else logging.INFO)
    if args.delay_before_replay < 0 or args.stop_grace < 0:
        print("ramen: supervisor: --delay-before-replay and --stop-grace must not be negative", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        site_lock = hold_site(args.site)
    except LockHeld as e:
        print(f"ramen: supervisor: site {args.site} has a supervisor already (pid {e.pid or '?'})", file=sys.stderr)
        return 1
    env = dict(os.environ)
    if args.confserver:
        env[CONFSERVER_ENV] = args.confserver  # so the children reach the same server
    try:
        with confserver.connect(args.confserver, identity=IDENTITY,
                                connect_timeout_s=confserver.SERVICE_CONNECT_TIMEOUT_S) as client, \
                SupervisorCounters.in_file(paths.counters_path(), args.site) as counters:
            supervisor = Supervisor(client, args.site, env=env, delay_before_replay_s=args.delay_before_replay,
                                    stop_grace_s=args.stop_grace, merge=not args.no_merge,
                                    spares=not (args.no_spares or args.stop_left_over), counters=counters)
            log.info("supervisor of site %s on %s%s", args.site, args.confserver or "the local confserver",
                     ": stopping what the earlier one left" if args.stop_left_over else "")
            try:
                if not args.stop_left_over:
                    supervisor.run(stop)
            finally:
                supervisor.close()
    except (confserver.ConfError, TransportError) as e:
        print(f"ramen: supervisor: {e}", file=sys.stderr)
        return 1
    finally:
        site_lock.release()
    return 0


def hold_site(site: str) -> FileLock:
    """The lock of the one supervisor of a site on this host: two would each start the workers
    (and the second's would be refused their logs, and crash)."""
    path = paths.supervisor_lock(site)
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock.acquire(path, create=True)


if __name__ == "__main__":
    sys.exit(main())

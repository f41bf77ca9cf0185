"""The choreographer service: follows programs, replays and tails in the confserver and keeps one
worker key per function (`sites/<site>/workers/<prog>/<func>/worker`) saying whether it must run.

It is an agent: watches push their events into one queue, `do_work()` takes what is there and
acts. A new replay takes the fast path: the functions on its paths (from its plan) are marked used
at once, with no recompute. Anything else (a program loaded, changed or killed; a replay deleted; a
tail started or ended) recomputes the whole graph, so lazy workers nobody needs any more fall back
to unused. Either way only keys whose value changes are written, under their locks, and the keys
of functions that no longer exist are deleted. Nothing is decided before every watch has shown the
keys that exist (SYNCED): a restarted choreographer would otherwise delete the keys of what it has
not seen yet.

Run it with `ramen choreographer` (or `python -m choreographer.service`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import queue
import signal
import sys
import threading

import networkx as nx

import confserver
from choreographer.counters import ChoreographerCounters
from choreographer import sites
from choreographer.graph import Usage, build_graph, compute_usage, worker_value
from confserver import ConfClient, EventKind
from ramen import keyspace, liveness, paths, service_log
from ramen.cli import argtypes
from ramen.netd.contract import NetEndpoint
from ramen.program import Program, ProgramError
from ramen.key_value import ContractError
from ramen.replay.contract import ReplayRequest
from ramen.tails import TailRequest
from ramen.worker_keys import WorkerSpec
from ramen.wait_queue import wait_queue
from ramen.transport.errors import TransportError

log = logging.getLogger(__name__)

IDENTITY = "choreographer"
#: How long a rewrite waits for the locks of the worker keys it changes.
LOCK_TIMEOUT_S = 10.0
#: How long the service waits for an event before looking again (it also stops within this).
POLL_INTERVAL_S = 0.5
PROGRAMS, REPLAYS, TAILS = keyspace.PROGRAMS, keyspace.REPLAYS, keyspace.TAILS
ENDPOINTS = "endpoints"
"""The queue's tag of the netd endpoint keys' events."""


class Choreographer:
    def __init__(self, client: ConfClient, site: str = keyspace.DEFAULT_SITE, *,
                 counters: ChoreographerCounters | None = None):
        """`counters`: in the site's counters file (main), else in memory."""
        self.client = client
        self.site = site
        self.programs: dict[str, Program] = {}
        self.replays: dict[int, ReplayRequest | None] = {}
        """None: a request that does not read (the supervisor fails it); it marks nothing."""
        self.tails: dict[str, TailRequest | None] = {}
        """None: a tail key that does not follow its contract (it marks nothing)."""
        self.workers: dict[str, dict] = {}  # worker key -> value, as last written or read
        self.graph = nx.DiGraph()
        self.counters = ChoreographerCounters() if counters is None else counters
        self.events: queue.Queue = wait_queue()
        self._needs_recompute = True
        self._unsynced = {PROGRAMS, REPLAYS, TAILS, ENDPOINTS}
        """Watches whose existing keys have not all come yet: until they have, the programs and
        replays known here are a part of what is there, and a recompute would delete the worker
        keys of the rest (a restarted choreographer stopped every running worker for a moment)."""
        self.endpoints: dict[str, str] = {}
        """Each site's netd endpoint channel (sites/<site>/net/endpoint), where this site sends
        the streams its children there read (choreographer/sites.py)."""
        self._watches = [client.watch(prefix, lambda event, p=prefix: self.events.put((p, event)))
                         for prefix in (PROGRAMS, REPLAYS, TAILS)]
        self._watches.append(client.watch(keyspace.net_endpoint_key("*"),
                                          lambda event: self.events.put((ENDPOINTS, event))))

    # -- duty cycle ----------------------------------------------------------------------------

    def do_work(self, first: tuple | None = None) -> int:
        """Apply every event received so far (after `first`, already taken off the queue by a
        waiting caller); returns how many there were."""
        new_replays: list[int] = []
        count = 0
        while True:
            if first is not None:
                (prefix, event), first = first, None
            else:
                try:
                    prefix, event = self.events.get_nowait()
                except queue.Empty:
                    break
            count += 1
            if event.kind is EventKind.SYNCED:
                self._unsynced.discard(prefix)
            else:
                self._on_event(prefix, event, new_replays)
        if self._unsynced:
            return count
        if self._needs_recompute:
            self.recompute()
        elif new_replays:
            self.fast_path(new_replays)
        return count

    def _on_event(self, prefix: str, event, new_replays: list[int]) -> None:
        if prefix == ENDPOINTS:
            self._on_endpoint(event)
            return
        name = event.key[len(prefix) + 1:]
        if "/" in name or not name:
            return  # not one of ours (e.g. programs/x/y)
        deleted = event.kind is EventKind.DELETED
        if prefix == PROGRAMS:
            self._needs_recompute = True
            if deleted:
                self.programs.pop(name, None)
                return
            try:
                self.programs[name] = Program.from_dict(event.entry.value)
            except ProgramError as e:
                self.counters.bad_programs += 1
                log.error("programs/%s cannot be read (%s); keeping what was there", name, e)
        elif prefix == REPLAYS:
            try:
                channel = int(name)
            except ValueError:
                log.warning("ignoring %s: replay keys are channel numbers", event.key)
                return
            if deleted:
                self.replays.pop(channel, None)
                self._needs_recompute = True
            else:
                if channel not in self.replays and event.kind is not EventKind.EXISTING:
                    new_replays.append(channel)
                else:
                    self._needs_recompute = True
                try:
                    self.replays[channel] = ReplayRequest.from_value(event.entry.value, event.key)
                except ContractError as e:
                    log.error("%s", e)
                    self.replays[channel] = None
        elif prefix == TAILS:
            self._needs_recompute = True
            if deleted:
                self.tails.pop(name, None)
            else:
                try:
                    self.tails[name] = TailRequest.from_value(event.entry.value, event.key)
                except ContractError as e:
                    log.error("%s", e)
                    self.tails[name] = None

    def _on_endpoint(self, event) -> None:
        site = event.key.split("/")[1]
        channel = None
        if event.kind is not EventKind.DELETED:
            try:
                channel = NetEndpoint.from_value(event.entry.value, event.key).channel
            except ContractError as e:
                log.error("%s; no stream is sent to site %s", e, site)
        if self.endpoints.get(site) != channel:
            self._needs_recompute = True
            if channel is None:
                self.endpoints.pop(site, None)
            else:
                self.endpoints[site] = channel

    # -- decisions -----------------------------------------------------------------------------

    def replay_functions(self, replay: ReplayRequest | None) -> tuple[str, ...]:
        """The functions a replay this site serves needs: those on its plan's paths."""
        return replay.plan.functions if replay is not None and replay.site == self.site else ()

    def recompute(self) -> None:
        self._needs_recompute = False
        self.counters.recomputes += 1
        self.graph = build_graph(self.programs.values())
        usage = compute_usage(self.graph,
                              {ch: self.replay_functions(r) for ch, r in self.replays.items()},
                              [t.target for t in self.tails.values() if t is not None and t.site == self.site])
        versions = {name: program.version for name, program in self.programs.items()}
        desired = {keyspace.worker_key(self.site, name): worker_value(self.graph, name, u, versions)
                   for name, u in usage.items() if sites.runs_on(self.graph, name, self.site)}
        existing = {e.key: e.value for e in self.client.glob(keyspace.worker_pattern(self.site))}
        self._write(desired, existing)
        self.workers = desired
        net = sites.net_keys(self.graph, usage, self.site, self.endpoints)
        existing_net = {e.key: e.value for e in self.client.glob(f"{keyspace.SITES}/{self.site}/net/*/**")
                        if sites.owned(e.key, self.site)}
        self._write(net, existing_net)

    def fast_path(self, channels: list[int]) -> None:
        """Mark each new replay's functions used at once, adding the replay to their lists."""
        self.counters.fast_paths += 1
        desired = {}
        for channel in channels:
            for name in self.replay_functions(self.replays[channel]):
                key = keyspace.worker_key(self.site, name)
                value = desired.get(key) or self.workers.get(key)
                if value is None:
                    continue  # not a function we know: the next recompute will say
                spec = WorkerSpec.from_value(value, key)
                if channel not in spec.replays:
                    replays = frozenset((*spec.replays, channel))
                    desired[key] = dataclasses.replace(spec, replays=tuple(sorted(replays)),
                                                       is_used=Usage(spec.live, replays).is_used).to_value()
        if desired:
            self._write(desired, dict(self.workers), delete_missing=False)
            self.workers.update(desired)

    def _write(self, desired: dict[str, dict], existing: dict[str, dict], *, delete_missing: bool = True) -> None:
        changed = sorted(key for key, value in desired.items() if existing.get(key) != value)
        removed = sorted(key for key in existing if key not in desired) if delete_missing else []
        if not changed and not removed:
            return
        with self.client.lock_all(changed + removed, LOCK_TIMEOUT_S):
            for key in changed:
                self.client.set(key, desired[key])
                self.counters.writes += 1
            for key in removed:
                self.client.discard(key)
                self.counters.deletes += 1
        log.info("%d keys written, %d deleted", len(changed), len(removed))

    def close(self) -> None:
        for watch in self._watches:
            watch.close()


def run(choreographer: Choreographer, stop: threading.Event) -> None:
    """Wait for events without spinning (the watch callbacks wake us), then act on them all."""
    choreographer.do_work()
    while not stop.is_set():
        liveness.beat()  # for `ramen start`: this loop still turns
        try:
            item = choreographer.events.get(timeout=POLL_INTERVAL_S)
        except queue.Empty:
            continue
        choreographer.do_work(item)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ramen choreographer",
                                     description="Decide which workers must run, from programs, replays and tails.")
    parser.add_argument("--confserver", metavar="URL", help="default $RAMEN_CONFSERVER, else the local server")
    parser.add_argument("--site", default=keyspace.default_site(), type=argtypes.site, help="site whose workers to decide (default %(default)s)")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    service_log.configure(logging.DEBUG if args.debug else logging.INFO)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        with confserver.connect(args.confserver, identity=IDENTITY,
                                connect_timeout_s=confserver.SERVICE_CONNECT_TIMEOUT_S) as client, \
                ChoreographerCounters.in_file(paths.counters_path(), args.site) as counters:
            choreographer = Choreographer(client, args.site, counters=counters)
            log.info("choreographer of site %s on %s", args.site, args.confserver or "the local confserver")
            run(choreographer, stop)
            choreographer.close()
    except (confserver.ConfError, TransportError) as e:
        print(f"ramen: choreographer: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replays, from the supervisor's side: when a batch goes, replayer processes, teardown and faults.

A new `replays/<channel>` waits `delay_before_replay_s` so that requests arriving together can
share replayers. Then the batch is launched as supervisor/wiring.py says (merged per source,
identical requests riding on one channel): replayer ids come from a confserver sequence (or the
warm replayer); every path worker gets its `…/replays/<channel>` key; then each replayer gets its
key and its process. A replay through a worker whose process is on its way out (a lazy worker
stopping after the last replay) waits for it to go, so that the worker's next process is the one
that reads it.

When `replays/<channel>` is deleted, the workers' keys of that channel go, and a replayer none of
whose channels is alive any more is stopped, its key and log removed. A replayer that fails, or a
worker on a launched replay's path that dies, sets `error` on the replays concerned; a replay
older than its `timeout_s` is deleted.

A request with `relay` gets its result log from us (supervisor/relays.py), created before it is
wired and read by our Relays agent, which writes the result to the confserver.

Across sites (ReplayRequest.source_sites), a source archived on another site is replayed there:
we borrow its replayer (wiring.Lent: an ephemeral `sites/<other>/lent-replayers/<id>`, and our
netd's receive of its stream), and that site's supervisor, this same class there, lends it: runs
it (its warm replayer if it has one) with its netd's send to ours as its one reader
(`sites/<site>/net/sends/replayer-<id>`, to wherever our netd's endpoint is). The lender fails the
replays its lent replayer fails, and stops it when the key goes: the replay is over, or its
borrower is gone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import confserver
from confserver import ConfClient
from ramen import keyspace, paths
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.netd.contract import NetEndpoint, NetSend, replayer_stream_name
from ramen.replay.contract import (DEFAULT_REPLAY_TIMEOUT_S, ChannelRange, ContractError, LentReplayer,
                                   ReplayerAssignment, ReplayerStats, ReplayRequest, WorkerReplay)
from ramen.replay.fail import fail_replay
from ramen.replay.plan import ReplayPlan
from supervisor import defaults, wiring
from supervisor.counters import SupervisorCounters
from supervisor.processes import Child, adopt, spawn
from supervisor.relays import Relays, max_bytes_from_env

log = logging.getLogger(__name__)

DEFAULT_REPLAYER_COMMAND = (sys.executable, "-m", "workers.replayer")


@dataclass
class Request:
    """A replay as the supervisor follows it."""

    channel: int
    spec: ReplayRequest | None
    """None: the value does not follow the contract (the replay fails at once)."""
    seen_at: float
    """Clock seconds when the supervisor first saw it."""
    launched: bool = False
    leader: int | None = None
    """The channel of an identical request this one rides along with (wiring.collapse_identical)."""
    failed: bool = False
    """error set (by us or found set): no further error is written."""
    timed_out: bool = False

    @property
    def plan(self) -> ReplayPlan | None:
        return self.spec.plan if self.spec is not None else None


@dataclass
class Replayer:
    id: int
    source: str
    channels: set[int]
    child: Child | None = None
    retiring: bool = False
    """None of its channels is alive: stop it, then remove its key and log."""
    borrowed: wiring.Lent | None = None
    """Run by another site for our replays (no process of ours): our keys and log of its stream."""
    lent_to: str | None = None
    """Run for that site's replays: it lives while their key (LentReplayer) does, whatever ours do."""
    lent_id: int | None = None
    """Lent: the LentReplayer's id, its log's stream id (ours may differ: a warm replayer's)."""


class ReplaySupervision:
    def __init__(self, client: ConfClient, site: str, counters: SupervisorCounters, *,
                 command: Sequence[str] = DEFAULT_REPLAYER_COMMAND, env: Mapping[str, str],
                 delay_s: float = defaults.DELAY_BEFORE_REPLAY_S, stop_grace_s: float = defaults.STOP_GRACE_S,
                 merge: bool = True, worker_leaving: Callable[[str], bool] = lambda name: False,
                 keep_warm: bool = True, clock: Clock = SYSTEM_CLOCK):
        """`worker_leaving(name)`: a replay through that worker waits until its process is gone or
        wanted again (WorkerSupervision.leaving)."""
        self.client = client
        self.clock = clock
        self.site = site
        self.counters = counters
        self.command = tuple(command)
        self.env = dict(env)
        self.delay_s = delay_s
        self.stop_grace_s = stop_grace_s
        self.merge = merge
        self.worker_leaving = worker_leaving
        self.requests: dict[int, Request] = {}
        self.replayers: dict[int, Replayer] = {}
        self._warm: tuple[int, Child] | None = None
        self.keep_warm = keep_warm
        """Start the warm replayer ahead, while no replay runs, not only when a replay is asked."""
        self._last_busy = -defaults.QUIET_AFTER_REPLAYS_S
        """Clock seconds when a replay was last under way."""
        self._next_timeout_check = 0.0
        self._unserved: set[int] = set()
        """Channels launched whose replayers were not all given them (the confserver failed in the
        middle of the launch): they fail, `lost`, as soon as the confserver takes the error."""
        self.relays = Relays(client, site, fail=self.set_error, max_bytes=max_bytes_from_env(self.env), clock=clock)
        """Reads the result logs of relayed requests (their own agent of the duty cycle)."""
        self.endpoints: dict[str, str] = {}
        """Each site's netd endpoint channel (sites/<site>/net/endpoint), where lent replayers' logs go."""
        self._sent: dict[int, str] = {}
        """Lent replayer id -> the endpoint its NetSend names."""
        self._lent_keys: set[int] = set()
        """The ids of our site's lent-replayers/ keys, as their watch told."""
        self.carried: dict[int, set[int]] = {}
        """A replay whose client went while others go on from its target's output (their worker
        keys' `via`) -> those others: its worker keys stay, the target's `carried`, until they end."""

    # -- inputs --------------------------------------------------------------------------------

    def adopt(self) -> None:
        """Take over the replayers an earlier supervisor left: a replayer key means spawned (its
        process adopted if its pid still runs); replays they serve count as launched."""
        for entry in self.client.glob(f"{keyspace.replayers_prefix(self.site)}/*"):
            try:
                assignment = ReplayerAssignment.from_value(entry.value, entry.key)
            except ContractError as e:
                log.warning("ignoring %s", e)
                continue
            replayer_id = assignment.id
            channels = {c.channel for c in assignment.channels} | set(assignment.riders)
            replayer = Replayer(replayer_id, assignment.source, channels, lent_to=assignment.sent_to,
                                lent_id=assignment.stream_id or None)
            replayer.child = adopt(f"replayer {replayer_id} of {replayer.source}", assignment.pid or 0,
                                   assignment.started_us or 0, expect_args=("--id", str(replayer_id)),
                                   clock=self.clock)
            if replayer.child is not None:
                self.counters.adopted += 1
            elif not self._finished(replayer):
                # It died while nobody watched: its replays would wait for it until their timeout.
                self.counters.replayer_failures += 1
                for channel in sorted(channels):
                    self.set_error(channel, f"replayer {replayer_id} of {replayer.source} died before the end of "
                                            f"its range, while the supervisor was down", lost=True)
            self.replayers[replayer_id] = replayer

    def on_replay(self, channel: int, value: dict | None, *, existing: bool = False) -> None:
        """A replay key was created, updated (value) or deleted (None)."""
        if value is None:
            self.teardown(channel)
            return
        try:
            spec, problem = ReplayRequest.from_value(value, keyspace.replay_key(channel)), None
        except ContractError as e:
            spec, problem = None, str(e)
        if spec is not None and spec.site != self.site:
            return  # another site's supervisor serves it
        request = self.requests.get(channel)
        if request is not None:
            if spec is not None and spec.relay and request.spec is not None:
                spec = dataclasses.replace(spec, recipient=request.spec.recipient)  # our log, as wired
            request.spec = spec or request.spec
            request.failed = request.failed or spec is None or bool(spec.error)
            return
        request = Request(channel, spec, self.clock.seconds(), failed=spec is not None and bool(spec.error))
        self.requests[channel] = request
        if existing and any(channel in r.channels for r in self.replayers.values()):
            request.launched = True  # launched by an earlier supervisor
        if existing and spec is not None and spec.source_sites and \
                self.client.glob(keyspace.function_key(self.site, "*/*", f"replays/{channel}")):
            # Launched by an earlier supervisor (its workers' keys are there): the lent replayers'
            # keys were ephemeral to it, and went with it.
            request.launched = True
            self.set_error(channel, f"the supervisor of site {self.site} restarted during replay {channel}, which "
                                    f"read the archive of site {', '.join(sorted(set(spec.source_sites.values())))}")
            return
        if spec is not None and spec.relay:
            if request.launched:  # its relay died with that supervisor, and the result read so far with it
                # its log, left by the dead one, is removed at teardown
                request.spec = dataclasses.replace(spec, recipient=str(paths.recipient_log(channel)))
                self.set_error(channel, f"the supervisor of site {self.site} restarted during replay {channel}, "
                                        f"whose result it relayed through the confserver")
                return
            request.spec = spec = dataclasses.replace(spec, recipient=self.relays.open(channel))
        if spec is None:
            request.launched = True
            self.set_error(channel, f"replay {channel} cannot be wired: {problem}")
            return
        log.info("replay %d of %s [%d, %d): %d sources%s", channel, spec.target, spec.since_us,
                 spec.until_us, len(spec.plan.sources), " (adopted)" if request.launched else "")
        if not request.launched:
            self._ensure_warm()

    def on_lent(self, replayer_id: int, value: dict | None) -> None:
        """Our `lent-replayers/<id>` key was created (value) or deleted (None): run the replayer
        another site's replay asks of our archive, or stop it."""
        if value is None:
            self._lent_keys.discard(replayer_id)
            if (replayer := self._lent(replayer_id)) is not None:
                replayer.retiring = True
            return
        self._lent_keys.add(replayer_id)
        if self._lent(replayer_id) is not None:
            return  # adopted: ours already
        key = keyspace.lent_replayer_key(self.site, replayer_id)
        try:
            lent = LentReplayer.from_value(value, key)
        except ContractError as e:
            log.error("%s; not served", e)
            for channel in _channels_of(value):
                self.set_error(channel, f"site {self.site} cannot replay {key}: {e}")
            return
        # The warm replayer if there is one: the other site's replay then waits for no process start.
        ours, child = (self._warm if self._warm is not None and not self._warm[1].poll() else (replayer_id, None))
        if child is not None:
            self._warm = None
        assignment = ReplayerAssignment(ours, lent.source, str(paths.replayer_log(self.site, ours)),
                                        str(paths.archive_dir(self.site)), lent.channels, sent_to=lent.to_site,
                                        stream_id=replayer_id)
        try:
            self._spawn(assignment, wiring.Group(lent.source, tuple(c.channel for c in lent.channels)), child)
        except confserver.ConfError:
            if child is not None:  # the key is seen again once the confserver is back
                self._retire_taken(ours, lent.source, child)
            raise
        self.replayers[ours].lent_to, self.replayers[ours].lent_id = lent.to_site, replayer_id

    def _lent(self, lent_id: int) -> Replayer | None:
        """Our replayer serving LentReplayer `lent_id`."""
        return next((r for r in self.replayers.values() if r.lent_id == lent_id), None)

    def lent_synced(self) -> None:
        """Every lent-replayers/ key is known: a lent replayer adopted without its key is over."""
        for replayer in self.replayers.values():
            if replayer.lent_id is not None and replayer.lent_id not in self._lent_keys:
                replayer.retiring = True

    def on_endpoint(self, site: str, value: dict | None) -> None:
        """A site's netd endpoint key was written (value) or deleted (None)."""
        self.endpoints.pop(site, None)
        if value is not None:
            try:
                self.endpoints[site] = NetEndpoint.from_value(value, keyspace.net_endpoint_key(site)).channel
            except ContractError as e:
                log.error("%s; no lent replayer's log is sent there", e)

    def _send_lent(self) -> int:
        """Have our netd send each lent replayer's log to its borrower's netd, where that one is now:
        started on demand, it may come a moment after the request, and a restarted one listens
        elsewhere (a replayer that has not written yet is then sent whole, one that has fails the
        replay there: its workers see their input rebuilt anew)."""
        sent = 0
        for replayer in self.replayers.values():
            if replayer.lent_to is None or replayer.retiring:
                continue
            channel = self.endpoints.get(replayer.lent_to)
            if channel is None or self._sent.get(replayer.id) == channel:
                continue
            send = NetSend(log=str(paths.replayer_log(self.site, replayer.id)), channel=channel)
            self.client.set(_send_key(self.site, replayer.lent_id), send.to_value())
            self._sent[replayer.id] = channel
            log.info("replayer %d: its log goes to site %s at %s", replayer.id, replayer.lent_to, channel)
            sent += 1
        return sent

    @property
    def warm(self) -> Child | None:
        """The replayer started ahead and waiting for its channels, if one is."""
        return self._warm[1] if self._warm is not None else None

    def _ensure_warm(self) -> None:
        """Have one replayer started and waiting for its channels, so that a replay waits for
        nothing but its data (started while no replay runs, or at the latest when one is asked,
        to overlap the merge delay)."""
        if self._warm is not None:
            return
        replayer_id = self.client.next_sequence(defaults.REPLAYER_SEQUENCE)
        argv = [*self.command, "--site", self.site, "--id", str(replayer_id),
                "--wait-for-key", f"{defaults.WARM_REPLAYER_WAIT_S:g}", "--parent", str(os.getpid())]
        child = spawn(f"warm replayer {replayer_id}", argv, self.env,
                      paths.logs_dir() / "replayers" / f"{replayer_id}.log", self.clock)
        self._warm = (replayer_id, child)

    def synced(self) -> None:
        """Every existing replay is known: clean what belongs to replays that ended meanwhile."""
        for replayer in self.replayers.values():
            if replayer.lent_to is None and not replayer.channels & set(self.requests):
                replayer.retiring = True
        keys = self._worker_replays()
        for key, channel, _ in keys:
            if channel is None:
                self.client.discard(key)
        for channel in {c for _, c, _ in keys if c is not None and c not in self.requests}:
            if not self._carry(channel, keys):  # a replay others go on from stays for them, as at a teardown
                self._unwire(channel, keys)
        self.relays.found(set(self.requests))

    def on_worker_death(self, name: str, description: str, lost: bool) -> None:
        """A worker that should run ended: every launched replay through it fails (`lost` when it
        was killed or crashed rather than failing on an error of its own)."""
        for request in self.requests.values():
            if request.launched and request.spec is not None and name in request.spec.workers:
                self.set_error(request.channel, f"worker {name} died ({description}) during the replay", lost=lost)

    # -- duty cycle ----------------------------------------------------------------------------

    def busy(self) -> bool:
        """Replays are under way (ours, or another site's with our replayers), or ended less than
        QUIET_AFTER_REPLAYS_S ago: start-ups wait."""
        return self._replaying() or self.clock.seconds() - self._last_busy < defaults.QUIET_AFTER_REPLAYS_S

    def _replaying(self) -> bool:
        return bool(self.requests) or any(r.lent_to is not None for r in self.replayers.values())

    def do_work(self, now: float) -> int:
        work = 0
        if self._replaying():
            self._last_busy = now
        if self._warm is not None and self._warm[1].poll():
            self._warm[1].drop_unused_log()  # it gave up waiting (or died): another one
            self._warm = None
        if self._warm is None and self.keep_warm and not self.busy():
            self._ensure_warm()
            work += 1
        if self._unserved:
            work += self._fail_unserved()
        pending, held = self._pending()
        unmerged = [r for r in pending if r.spec.no_merge and r not in held]  # no merge window: no wait
        if unmerged:
            self.launch(unmerged)
            work += 1
        due_in = self._due_in(pending, held, now)
        if due_in is not None and due_in <= 0:
            self.launch([r for r in pending if not r.spec.no_merge])
            work += 1
        for replayer in list(self.replayers.values()):
            work += self._step(replayer, now)
        work += self._send_lent()
        if now >= self._next_timeout_check:
            self._next_timeout_check = now + 1.0
            work += self._expire(now)
        return work

    def _pending(self) -> tuple[list[Request], list[Request]]:
        """The requests not launched yet, and those of them through a worker on its way out."""
        pending = [r for r in self.requests.values() if not r.launched]
        return pending, [r for r in pending if any(map(self.worker_leaving, r.spec.workers))]

    def launch_due_in(self, now: float) -> float | None:
        """Seconds until the waiting batch's merge delay ends (<= 0: due); None when no batch waits
        for it. The service sleeps no longer than this, so that a batch starts as its delay ends,
        not up to a poll interval later. A request through a worker on its way out waits for it to
        go, and the rest of its batch waits with it, so that the batch still reads the archive once
        (a dashboard refreshing right after its previous refresh finds its lazy workers leaving)."""
        return self._due_in(*self._pending(), now)

    def _due_in(self, pending: list[Request], held: list[Request], now: float) -> float | None:
        batch = [r for r in pending if not r.spec.no_merge]
        if not batch or any(r in held for r in batch):
            return None
        return min(r.seen_at for r in batch) + self.delay_s - now

    def launch(self, batch: list[Request]) -> None:
        specs = {r.channel: r.spec for r in batch}
        served = wiring.batch_of(specs, allow_merge=self.merge)
        ids: list[int] = []
        taken: dict[int, Child] = {}
        try:
            for group in served.groups:
                if group.site(specs) is None and self._warm is not None and not self._warm[1].poll():
                    replayer_id, taken[replayer_id] = self._warm
                    self._warm = None
                else:
                    replayer_id = self.client.next_sequence(defaults.REPLAYER_SEQUENCE)
                ids.append(replayer_id)
            wired = wiring.wire(self.site, specs, served, ids)
            for key, value in wired.workers.items():
                self.client.set(key, value.to_value())
            for request in batch:
                request.launched = True
                request.leader = wired.riders.get(request.channel)
                self.counters.replays_wired += 1
            for replayer_id, group in zip(ids, served.groups):
                if replayer_id in wired.lent:
                    self._borrow(wired.lent[replayer_id], group)
                else:
                    self._spawn(wired.replayers[replayer_id], group, taken.get(replayer_id))
        except confserver.ConfError:
            self._abandon(served, ids, taken)
            raise

    def _abandon(self, served: wiring.Batch, ids: list[int], taken: dict[int, Child]) -> None:
        """A launch the confserver failed in the middle of. The warm replayers it took and gave no
        channels retire (their key and log go with them, whether or not the key was written). Had
        the requests been marked launched, the channels of the groups left without a replayer fail
        `lost` (launched again, they would be wired anew while workers may follow the keys written);
        otherwise they are still pending, and launched again next cycle."""
        for replayer_id, group in zip(ids, served.groups):
            if replayer_id not in self.replayers:
                self._unserved.update(c for c in (*group.channels, *group.riders)
                                      if (r := self.requests.get(c)) is not None and r.launched)
        for replayer_id, child in taken.items():
            self._retire_taken(replayer_id, served.groups[ids.index(replayer_id)].source, child)

    def _retire_taken(self, replayer_id: int, source: str, child: Child) -> None:
        """The warm replayer `child` was taken for work the confserver failed in the middle of
        giving it: unless it got its channels, it is stopped, and its key and log removed."""
        if replayer_id not in self.replayers:
            self.replayers[replayer_id] = Replayer(replayer_id, source, set(), child, retiring=True)
            log.warning("replayer %d, started ahead, retires: the confserver failed as it was given channels",
                        replayer_id)

    def _fail_unserved(self) -> int:
        channels = sorted(self._unserved)
        for channel in channels:  # one raising (the confserver again) leaves the rest for the next cycle
            self.set_error(channel, f"the confserver failed while replay {channel} was launched", lost=True)
            self._unserved.discard(channel)
        return len(channels)

    def _borrow(self, lent: wiring.Lent, group: wiring.Group) -> None:
        """Ask another site for a group's replayer: our netd's receive first (it starts our netd,
        whose endpoint that site's supervisor waits for), then that site's key, ephemeral to us."""
        lent_key, receive_key = lent.keys(self.site)
        self.client.set(receive_key, lent.receive.to_value())
        self.client.set(lent_key, lent.replayer.to_value(), ephemeral=True)
        self.replayers[lent.replayer.id] = Replayer(lent.replayer.id, group.source, {*group.channels, *group.riders},
                                                    borrowed=lent)
        log.info("replayer %d of %s lent by site %s: channels %s", lent.replayer.id, group.source, lent.site,
                 ", ".join(map(str, group.channels)))

    def _spawn(self, assignment: ReplayerAssignment, group: wiring.Group, child: Child | None = None) -> None:
        """Give a group its replayer: the warm one (its key wakes it up) or a new process."""
        key = keyspace.replayer_key(self.site, assignment.id)
        self.client.set(key, assignment.to_value())
        name = f"replayer {assignment.id} of {group.source}"
        if child is None:
            argv = [*self.command, "--site", self.site, "--id", str(assignment.id)]
            child = spawn(name, argv, self.env, paths.logs_dir() / "replayers" / f"{assignment.id}.log", self.clock)
        # It serves the riders too (through their leaders): it lives, and fails them, as theirs.
        channels = {*group.channels, *group.riders}
        self.replayers[assignment.id] = Replayer(assignment.id, group.source, channels, child)
        self.counters.replayers_spawned += 1
        self.counters.merged_requests += len(channels) - 1
        # pid and start let a restarted supervisor adopt it
        self.client.set(key, dataclasses.replace(assignment, pid=child.pid, started_us=child.started_us).to_value())
        log.info("%s: channels %s", name, ", ".join(map(str, group.channels)))

    def _step(self, replayer: Replayer, now: float) -> int:
        child = replayer.child
        if replayer.retiring:
            if child is not None and not child.poll():
                child.stop(self.stop_grace_s)
                if child.enforce_stop(now):
                    self.counters.kills += 1
                return 0
            self._remove(replayer)
            return 1
        if child is not None and child.ended is False and child.poll():
            # An adopted replayer's exit status is unknown (None): its stats say whether it finished.
            if child.returncode not in (0, None) or (child.returncode is None and not self._finished(replayer)):
                self.counters.replayer_failures += 1
                how = child.describe_exit() if child.returncode is not None else "before the end of its range"
                description = f"replayer {replayer.id} of {replayer.source} died ({how})"
                if replayer.lent_to is not None:
                    description = f"site {self.site}'s {description}"
                log.error("%s", description)
                for channel in sorted(replayer.channels):
                    if channel in self.requests or replayer.lent_to is not None:
                        self.set_error(channel, description, lost=child.ended_by_signal)
            else:
                log.info("replayer %d of %s ended (%s)", replayer.id, replayer.source, child.describe_exit())
            return 1
        return 0

    def _finished(self, replayer: Replayer) -> bool:
        """Whether the replayer said, in its last stats, that it ended every channel."""
        key = keyspace.replayer_stats_key(self.site, replayer.id)
        try:
            entry = self.client.get_or_none(key)
            return entry is not None and ReplayerStats.from_value(entry.value, key).done
        except (confserver.ConfError, ContractError) as e:
            log.error("replayer %d: cannot read its stats: %s", replayer.id, e)
            return False

    def _remove(self, replayer: Replayer) -> None:
        del self.replayers[replayer.id]
        self._sent.pop(replayer.id, None)
        if replayer.borrowed is not None:
            keys, log_path = replayer.borrowed.keys(self.site), paths.received_replayer_log(self.site, replayer.id)
        else:
            keys, log_path = (keyspace.replayer_key(self.site, replayer.id),), paths.replayer_log(self.site, replayer.id)
            if replayer.lent_id is not None:
                keys += (_send_key(self.site, replayer.lent_id),)
        try:
            for key in keys:
                self.client.delete_tree(key)
        except confserver.ConfError as e:
            log.error("replayer %d: cannot delete its keys: %s", replayer.id, e)
        log_path.unlink(missing_ok=True)
        if replayer.child is not None:
            replayer.child.drop_empty_log()
        log.info("replayer %d of %s removed", replayer.id, replayer.source)

    def teardown(self, channel: int) -> None:
        """The replay is over (done, failed, abandoned): unwire it and retire idle replayers. One
        that others go on from keeps its workers' keys for them (`carried`) until they end."""
        request = self.requests.pop(channel, None)
        keys = self._worker_replays()
        if not self._carry(channel, keys):
            self._unwire(channel, keys)
        for leader in [c for c, followers in self.carried.items() if channel in followers]:
            self.carried[leader].discard(channel)
            if not self.carried[leader]:
                del self.carried[leader]
                self._unwire(leader, keys)
        for rider in [r for r in self.requests.values() if r.leader == channel]:
            # The target ends leader and riders together; a leader gone alone took their data with it.
            self.set_error(rider.channel, f"replay {rider.channel} rode with replay {channel}, which ended first")
        for replayer in self.replayers.values():
            if replayer.lent_to is None and channel in replayer.channels and not replayer.channels & set(self.requests):
                replayer.retiring = True
        if request is not None:
            self.counters.teardowns += 1
            if request.spec is not None and request.spec.relay:
                self.relays.finish(channel, request.spec.created_us, request.spec.timeout_s)
            self._remove_result_log(request)
            log.info("replay %d torn down", channel)

    def _worker_replays(self) -> list[tuple[str, int | None, WorkerReplay | None]]:
        """Every `…/replays/<channel>` key of the site's workers: the key, its channel (None: not a
        number) and its value (None: one that does not read)."""
        found = []
        for entry in self.client.glob(keyspace.function_key(self.site, "*/*", "replays/*")):
            channel = entry.key.rpartition("/")[2]
            try:
                part = WorkerReplay.from_value(entry.value, entry.key)
            except ContractError:
                part = None
            found.append((entry.key, int(channel) if channel.isdigit() else None, part))
        return found

    def _unwire(self, channel: int, keys: list[tuple[str, int | None, WorkerReplay | None]]) -> None:
        for key, found, _ in keys:
            if found == channel:
                self.client.discard(key)

    def _carry(self, channel: int, keys: list[tuple[str, int | None, WorkerReplay | None]]) -> bool:
        """Whether live replays go on from `channel`'s target (a worker key of theirs has via = it):
        then its keys stay for them, the target's rewritten without its client (carried), since a
        worker that had not read it yet (one starting for the replay) would otherwise never read
        the inputs they need, and their replayer would wait for it in vain."""
        followers = {part.channel for _, _, part in keys
                     if part is not None and part.via == channel and part.channel in self.requests}
        if not followers:
            return False
        self.carried[channel] = followers
        for key, found, part in keys:
            if found == channel and part is not None and part.recipient:
                carried = dataclasses.replace(part, recipient=None, also=(), summary=None, carried=True)
                self.client.set(key, carried.to_value())
        log.info("replay %d: its client went; its workers go on for replays %s", channel,
                 ", ".join(map(str, sorted(followers))))
        return True

    @staticmethod
    def _remove_result_log(request: Request) -> None:
        """The result log of a replay that is over: a client that ended normally removes it after
        reading (and keeps reading it once removed, as it has it mapped); one killed before it could
        would leave it, 50 MB a replay. Only the log at the channel's own place, whatever the key says."""
        path = paths.recipient_log(request.channel)
        if request.spec is not None and request.spec.recipient == str(path):
            path.unlink(missing_ok=True)

    def _expire(self, now: float) -> int:
        """Delete the replays older than their timeout (one that does not read: counted from when we saw it)."""
        expired = 0
        now_us = self.clock.epoch_us()
        for request in self.requests.values():
            if request.timed_out:
                continue
            if request.spec is not None:
                timeout_s, age_us = request.spec.timeout_s, now_us - request.spec.created_us
            else:
                timeout_s, age_us = DEFAULT_REPLAY_TIMEOUT_S, round((now - request.seen_at) * 1e6)
            if age_us > timeout_s * 1e6:
                request.timed_out = True
                expired += 1
                self.counters.replays_timed_out += 1
                log.warning("replay %d is older than its timeout (%s s): deleted", request.channel, timeout_s)
                self.client.discard(keyspace.replay_key(request.channel))
        return expired

    def set_error(self, channel: int, message: str, *, lost: bool = False) -> None:
        """Add `error` to replays/<channel>, keeping the rest; the first error stays. `lost`: a
        process on its path died under it (the client may ask again)."""
        request = self.requests.get(channel)
        if request is not None and request.failed:
            return
        written = fail_replay(self.client, channel, message, lost=lost)  # raising, it is not marked failed
        if request is not None:
            request.failed = True
        if not written:
            return  # gone, changed under us (the next fault will say again), or failed already
        self.counters.replay_errors += 1
        log.error("replay %d failed: %s", channel, message)

    # -- shutdown ------------------------------------------------------------------------------

    def stop_all(self, timeout_s: float) -> None:
        """Stop our replayers, then remove their keys and logs (their replays fail: nobody is left
        to watch them). One retiring as we stop would otherwise leave its log behind."""
        for channel, request in self.requests.items():
            if request.launched:
                self.set_error(channel, f"the supervisor of site {self.site} stopped during the replay")
        for replayer in self.replayers.values():
            if replayer.lent_to is not None:
                for channel in sorted(replayer.channels):
                    self.set_error(channel, f"the supervisor of site {self.site}, which replayed {replayer.source} "
                                            f"for it, stopped during the replay")
        children = [r.child for r in self.replayers.values() if r.child is not None]
        warm = self.warm
        self._warm = None
        if warm is not None:
            children.append(warm)
        for child in children:
            child.stop(min(self.stop_grace_s, timeout_s))
        deadline = self.clock.seconds() + timeout_s
        while not all(child.poll() for child in children):
            now = self.clock.seconds()
            for child in children:
                child.follow_stop(now, deadline)
            time.sleep(defaults.POLL_INTERVAL_S)
        if warm is not None:
            warm.drop_unused_log()
        for replayer in list(self.replayers.values()):  # their replays failed: nobody will read their logs
            self._remove(replayer)
        self.relays.close()



def _send_key(site: str, replayer_id: int) -> str:
    return f"{keyspace.net_sends_prefix(site)}/{replayer_stream_name(replayer_id)}"


def _channels_of(value) -> list[int]:
    """The channels of a lent-replayers/ value that does not follow its contract, as far as they can be read."""
    try:
        return [ChannelRange.from_value(c).channel for c in value["channels"]]
    except (ContractError, KeyError, TypeError):
        return []


__all__ = ["ReplaySupervision", "Request"]

"""Replays, from the supervisor's side: wiring, merging, replayers, teardown and faults.

A new `replays/<channel>` waits `delay_before_replay_s` so that requests arriving together can
share replayers. Then the batch is launched: per source function, the requests whose ranges
overlap (and that did not ask for `no_merge`) form one replayer; replayer ids come from a
confserver sequence; every path worker gets its `…/replays/<channel>` key (its inputs name the
replayer logs and parents' replay logs); then each replayer gets its key and its process. A
replay through a worker whose process is on its way out (a lazy worker stopping after the last
replay) waits for it to go, so that the worker's next process is the one that reads it.

When `replays/<channel>` is deleted, the workers' keys of that channel go, and a replayer none of
whose channels is alive any more is stopped, its key and log removed. A replayer that fails, or a
worker on a launched replay's path that dies, sets `error` on the replays concerned; a replay
older than its `timeout_s` is deleted.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import confserver
from confserver import ConfClient
from ramen import keyspace, paths
from ramen.replay.plan import ReplayPlan
from supervisor import defaults
from supervisor.counters import SupervisorCounters
from supervisor.processes import Child, adopt, now_us, spawn

log = logging.getLogger(__name__)

DEFAULT_REPLAYER_COMMAND = (sys.executable, "-m", "workers.replayer")


# -- pure parts: plan, merge, wiring ------------------------------------------------------------

def plan_of(request: dict) -> ReplayPlan:
    """The request's plan (a JSON string, as ReplayPlan.to_json(), or the dict itself);
    ValueError if it has none that reads."""
    plan = request.get("plan")
    try:
        if isinstance(plan, dict):
            return ReplayPlan.from_dict(plan)
        if isinstance(plan, (str, bytes)):
            return ReplayPlan.from_json(plan)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"unreadable plan ({e})") from None
    raise ValueError("no plan")


@dataclass
class Request:
    """A replay as the supervisor follows it."""

    channel: int
    value: dict
    plan: ReplayPlan | None
    seen_at: float
    """monotonic time the supervisor first saw it."""
    launched: bool = False
    leader: int | None = None
    """The channel of an identical request this one rides along with (see collapse_identical)."""
    failed: bool = False
    """error set (by us or found set): no further error is written."""
    timed_out: bool = False

    @property
    def since_us(self) -> int:
        return int(self.value.get("since_us", self.plan.since_us))

    @property
    def until_us(self) -> int:
        return int(self.value.get("until_us", self.plan.until_us))

    @property
    def no_merge(self) -> bool:
        return bool(self.value.get("no_merge"))


@dataclass
class Group:
    """Requests one replayer serves: all read `source`."""

    source: str
    requests: list[Request]


def collapse_identical(requests: Iterable[Request], *, allow: bool = True) -> dict[int, list[Request]]:
    """Identical requests (same plan, same range, merging allowed) by the channel of the first one.

    They travel as one channel, the leader's, through the replayer and every worker; only the
    target writes the result to each of their recipients. Twenty dashboards asking for the same
    hour then cost one replay, not twenty copies of it flowing through every worker."""
    leaders: dict[tuple, int] = {}
    by_leader: dict[int, list[Request]] = {}
    for request in sorted(requests, key=lambda r: r.channel):
        identity = (request.plan.to_json(), request.since_us, request.until_us)
        leader = leaders.get(identity) if allow and not request.no_merge else None
        if leader is None:
            leaders[identity] = request.channel
            by_leader[request.channel] = [request]
        else:
            by_leader[leader].append(request)
    return by_leader


def merge(requests: Iterable[Request], *, allow: bool = True) -> list[Group]:
    """One group per source and per run of overlapping [since, until) ranges; a request with
    no_merge (or every request when `allow` is false) gets a group of its own."""
    by_source: dict[str, list[Request]] = {}
    for request in requests:
        for source in request.plan.sources:
            by_source.setdefault(source, []).append(request)
    groups: list[Group] = []
    for source, members in sorted(by_source.items()):
        current: Group | None = None
        current_until = 0
        for request in sorted(members, key=lambda r: (r.since_us, r.channel)):
            if request.no_merge or not allow:
                groups.append(Group(source, [request]))
            elif current is not None and request.since_us < current_until:
                current.requests.append(request)
                current_until = max(current_until, request.until_us)
            else:
                current, current_until = Group(source, [request]), request.until_us
                groups.append(current)
    return groups


def worker_replay_values(site: str, request: Request, replayer_of: Mapping[str, int]) -> dict[str, dict]:
    """`…/replays/<channel>` of every worker on the request's paths (ReplayPlan.workers), by
    qualified name. `replayer_of` maps each of the plan's sources to the replayer that feeds it
    this channel: a source's children read its replayer's log directly, with no hop through the
    source's own worker."""
    plan = request.plan
    values = {}
    for name in plan.workers:
        parents = (name,) if name in plan.sources else plan.inputs_of(name)
        inputs = [str(paths.replayer_log(site, replayer_of[parent]) if parent in plan.sources
                      else paths.replay_output_log(site, parent)) for parent in parents]
        values[name] = {"channel": request.channel, "since_us": request.since_us, "until_us": request.until_us,
                        "inputs": inputs, "parents": list(parents), "pass_through": name in plan.sources,
                        "expect_eor": len(inputs),
                        "recipient": request.value.get("recipient") if name == plan.target else None}
    return values


def replayer_value(site: str, replayer_id: int, group: Group) -> dict:
    """`readers`: how many workers subscribe to the replayer's log; it waits for them all before
    its first message, so that none joins late and misses the start."""
    readers = {reader for r in group.requests for reader in r.plan.readers_of(group.source)}
    return {"id": replayer_id, "source": group.source, "log": str(paths.replayer_log(site, replayer_id)),
            "archive_dir": str(paths.archive_dir(site)), "readers": max(1, len(readers)),
            "channels": [{"channel": r.channel, "since_us": r.since_us, "until_us": r.until_us}
                         for r in sorted(group.requests, key=lambda r: r.channel)]}


# -- the service part ---------------------------------------------------------------------------

@dataclass
class Replayer:
    id: int
    source: str
    channels: set[int]
    child: Child | None = None
    retiring: bool = False
    """None of its channels is alive: stop it, then remove its key and log."""


class ReplaySupervision:
    def __init__(self, client: ConfClient, site: str, counters: SupervisorCounters, *,
                 command: Sequence[str] = DEFAULT_REPLAYER_COMMAND, env: Mapping[str, str],
                 delay_s: float = defaults.DELAY_BEFORE_REPLAY_S, stop_grace_s: float = defaults.STOP_GRACE_S,
                 merge: bool = True, worker_leaving: Callable[[str], bool] = lambda name: False,
                 keep_warm: bool = True):
        """`worker_leaving(name)`: a replay through that worker waits until its process is gone or
        wanted again (WorkerSupervision.leaving)."""
        self.client = client
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
        self._next_timeout_check = 0.0

    # -- inputs --------------------------------------------------------------------------------

    def adopt(self) -> None:
        """Take over the replayers an earlier supervisor left: a replayer key means spawned (its
        process adopted if its pid still runs); replays they serve count as launched."""
        for entry in self.client.glob(f"{keyspace.replayers_prefix(self.site)}/*"):
            value = entry.value if isinstance(entry.value, dict) else {}
            try:
                replayer_id = int(value.get("id", entry.key.rpartition("/")[2]))
                channels = {int(c["channel"]) for c in value.get("channels", [])}
            except (ValueError, TypeError, KeyError):
                log.warning("ignoring %s: not a replayer key", entry.key)
                continue
            replayer = Replayer(replayer_id, str(value.get("source")), channels)
            replayer.child = adopt(f"replayer {replayer_id} of {replayer.source}", int(value.get("pid") or 0),
                                   int(value.get("started_us") or 0), expect_args=("--id", str(replayer_id)))
            if replayer.child is not None:
                self.counters.adopted += 1
            elif not self._finished(replayer):
                # It died while nobody watched: its replays would wait for it until their timeout.
                self.counters.replayer_failures += 1
                for channel in sorted(channels):
                    self.set_error(channel, f"replayer {replayer_id} of {replayer.source} died before the end of "
                                            f"its range, while the supervisor was down")
            self.replayers[replayer_id] = replayer

    def on_replay(self, channel: int, value: dict | None, *, existing: bool = False) -> None:
        """A replay key was created, updated (value) or deleted (None)."""
        if value is None:
            self.teardown(channel)
            return
        request = self.requests.get(channel)
        if request is not None:
            request.value = value
            request.failed = request.failed or bool(value.get("error"))
            return
        request = Request(channel, value, None, time.monotonic(), failed=bool(value.get("error")))
        self.requests[channel] = request
        if existing and any(channel in r.channels for r in self.replayers.values()):
            request.launched = True  # launched by an earlier supervisor
        try:
            request.plan = plan_of(value)
        except ValueError as e:
            request.launched = True
            self.set_error(channel, f"replay {channel} cannot be wired: {e}")
            return
        log.info("replay %d of %s [%d, %d): %d sources%s", channel, request.plan.target, request.since_us,
                 request.until_us, len(request.plan.sources), " (adopted)" if request.launched else "")
        if not request.launched:
            self._ensure_warm()

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
                      paths.logs_dir() / "replayers" / f"{replayer_id}.log")
        self._warm = (replayer_id, child)

    def synced(self) -> None:
        """Every existing replay is known: clean what belongs to replays that ended meanwhile."""
        for replayer in self.replayers.values():
            if not replayer.channels & set(self.requests):
                replayer.retiring = True
        for entry in self.client.glob(keyspace.function_key(self.site, "*/*", "replays/*")):
            channel = entry.key.rpartition("/")[2]
            if not channel.isdigit() or int(channel) not in self.requests:
                self.client.discard(entry.key)

    def on_worker_death(self, name: str, description: str) -> None:
        """A worker that should run ended: every launched replay through it fails."""
        for request in self.requests.values():
            if request.launched and request.plan is not None and name in request.plan.workers:
                self.set_error(request.channel, f"worker {name} died ({description}) during the replay")

    # -- duty cycle ----------------------------------------------------------------------------

    def do_work(self, now: float) -> int:
        work = 0
        if self._warm is not None and self._warm[1].poll():
            self._warm[1].drop_unused_log()  # it gave up waiting (or died): another one
            self._warm = None
        if self._warm is None and self.keep_warm and not self.requests:
            self._ensure_warm()
            work += 1
        pending = [r for r in self.requests.values()
                   if not r.launched and not any(map(self.worker_leaving, r.plan.workers))]
        unmerged = [r for r in pending if r.no_merge]  # no merge window: nothing to wait for
        if unmerged:
            self.launch(unmerged)
            pending = [r for r in pending if not r.no_merge]
            work += 1
        if pending and now - min(r.seen_at for r in pending) >= self.delay_s:
            self.launch(pending)
            work += 1
        for replayer in list(self.replayers.values()):
            work += self._step(replayer, now)
        if now >= self._next_timeout_check:
            self._next_timeout_check = now + 1.0
            work += self._expire()
        return work

    def launch(self, batch: list[Request]) -> None:
        identical = collapse_identical(batch, allow=self.merge)
        followers = {leader: members[1:] for leader, members in identical.items()}
        batch = [members[0] for members in identical.values()]
        for members in identical.values():
            for follower in members[1:]:
                follower.leader, follower.launched = members[0].channel, True
                self.counters.replays_wired += 1
        groups = merge(batch, allow=self.merge)
        replayer_of: dict[int, dict[str, int]] = {r.channel: {} for r in batch}
        ids = []
        warm_children: dict[int, Child] = {}
        for group in groups:
            if self._warm is not None and not self._warm[1].poll():
                replayer_id, warm_children[replayer_id] = self._warm
            else:
                replayer_id = self.client.next_sequence(defaults.REPLAYER_SEQUENCE)
            self._warm = None
            ids.append(replayer_id)
            for request in group.requests:
                replayer_of[request.channel][group.source] = replayer_id
        for request in batch:
            values = worker_replay_values(self.site, request, replayer_of[request.channel])
            also = [{"channel": f.channel, "recipient": f.value.get("recipient")} for f in followers[request.channel]]
            if also:
                values[request.plan.target]["also"] = also
            for name, value in values.items():
                self.client.set(keyspace.worker_replay_key(self.site, name, request.channel), value)
            request.launched = True
            self.counters.replays_wired += 1
        for replayer_id, group in zip(ids, groups):
            riders = {f.channel for r in group.requests for f in followers[r.channel]}
            self._spawn(replayer_id, group, warm_children.get(replayer_id), riders)

    def _spawn(self, replayer_id: int, group: Group, child: Child | None = None,
               riders: set[int] = frozenset()) -> None:
        """Give a group its replayer: the warm one (its key wakes it up) or a new process."""
        key = keyspace.replayer_key(self.site, replayer_id)
        value = replayer_value(self.site, replayer_id, group)
        self.client.set(key, value)
        name = f"replayer {replayer_id} of {group.source}"
        if child is None:
            argv = [*self.command, "--site", self.site, "--id", str(replayer_id)]
            child = spawn(name, argv, self.env, paths.logs_dir() / "replayers" / f"{replayer_id}.log")
        channels = {r.channel for r in group.requests}
        # It serves the riders too (through their leaders): it lives, and fails them, as theirs.
        self.replayers[replayer_id] = Replayer(replayer_id, group.source, channels | riders, child)
        self.counters.replayers_spawned += 1
        self.counters.merged_requests += len(channels | riders) - 1
        # pid and start let a restarted supervisor adopt it (beyond the contract's fields)
        self.client.set(key, dict(value, pid=child.pid, started_us=child.started_us))
        log.info("%s: channels %s", name, ", ".join(map(str, sorted(channels))))

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
                log.error("%s", description)
                for channel in sorted(replayer.channels):
                    if channel in self.requests:
                        self.set_error(channel, description)
            else:
                log.info("replayer %d of %s ended (%s)", replayer.id, replayer.source, child.describe_exit())
            return 1
        return 0

    def _finished(self, replayer: Replayer) -> bool:
        """Whether the replayer said, in its last stats, that it ended every channel."""
        try:
            entry = self.client.get_or_none(keyspace.replayer_stats_key(self.site, replayer.id))
        except confserver.ConfError as e:
            log.error("replayer %d: cannot read its stats: %s", replayer.id, e)
            return False
        return isinstance(entry.value if entry else None, dict) and entry.value.get("done") is True

    def _remove(self, replayer: Replayer) -> None:
        del self.replayers[replayer.id]
        try:
            self.client.delete_tree(keyspace.replayer_key(self.site, replayer.id))
        except confserver.ConfError as e:
            log.error("replayer %d: cannot delete its keys: %s", replayer.id, e)
        try:
            os.unlink(paths.replayer_log(self.site, replayer.id))
        except FileNotFoundError:
            pass
        log.info("replayer %d of %s removed", replayer.id, replayer.source)

    def teardown(self, channel: int) -> None:
        """The replay is over (done, failed, abandoned): unwire it and retire idle replayers."""
        request = self.requests.pop(channel, None)
        for entry in self.client.glob(keyspace.function_key(self.site, "*/*", f"replays/{channel}")):
            self.client.discard(entry.key)
        for rider in [r for r in self.requests.values() if r.leader == channel]:
            # The target ends leader and riders together; a leader gone alone took their data with it.
            self.set_error(rider.channel, f"replay {rider.channel} rode with replay {channel}, which ended first")
        for replayer in self.replayers.values():
            if channel in replayer.channels and not replayer.channels & set(self.requests):
                replayer.retiring = True
        if request is not None:
            self.counters.teardowns += 1
            self._remove_result_log(request)
            log.info("replay %d torn down", channel)

    @staticmethod
    def _remove_result_log(request: Request) -> None:
        """The result log of a replay that is over: a client that ended normally removes it after
        reading (and keeps reading it once removed, as it has it mapped); one killed before it could
        would leave it, 50 MB a replay. Only the log at the channel's own place, whatever the key says."""
        path = paths.recipient_log(request.channel)
        if request.value.get("recipient") == str(path):
            path.unlink(missing_ok=True)

    def _expire(self) -> int:
        expired = 0
        now = now_us()
        for request in self.requests.values():
            if request.timed_out:
                continue
            timeout_s = request.value.get("timeout_s") or defaults.REPLAY_TIMEOUT_S
            created_us = request.value.get("created_us")
            if not isinstance(created_us, int):
                created_us = now - round((time.monotonic() - request.seen_at) * 1e6)
            if now - created_us > timeout_s * 1e6:
                request.timed_out = True
                expired += 1
                self.counters.replays_timed_out += 1
                log.warning("replay %d is older than its timeout (%s s): deleted", request.channel, timeout_s)
                self.client.discard(keyspace.replay_key(request.channel))
        return expired

    def set_error(self, channel: int, message: str) -> None:
        """Add `error` to replays/<channel>, keeping the rest; the first error stays."""
        request = self.requests.get(channel)
        if request is not None:
            if request.failed:
                return
            request.failed = True
        key = keyspace.replay_key(channel)
        try:
            entry = self.client.get(key)
            if isinstance(entry.value, dict) and entry.value.get("error"):
                return
            value = dict(entry.value) if isinstance(entry.value, dict) else {"request": entry.value}
            self.client.update(key, dict(value, error=message), version=entry.version)
        except (confserver.NoSuchKey, confserver.VersionMismatch):
            return  # gone, or changed under us (the next fault will say again)
        self.counters.replay_errors += 1
        log.error("replay %d failed: %s", channel, message)

    # -- shutdown ------------------------------------------------------------------------------

    def stop_all(self, timeout_s: float) -> None:
        """Stop our replayers (their replays fail: nobody is left to watch them)."""
        for channel, request in self.requests.items():
            if request.launched:
                self.set_error(channel, f"the supervisor of site {self.site} stopped during the replay")
        children = [r.child for r in self.replayers.values() if r.child is not None]
        warm = self.warm
        self._warm = None
        if warm is not None:
            children.append(warm)
        for child in children:
            child.stop(min(self.stop_grace_s, timeout_s))
        deadline = time.monotonic() + timeout_s
        while not all(child.poll() for child in children):
            now = time.monotonic()
            for child in children:
                child.follow_stop(now, deadline)
            time.sleep(defaults.POLL_INTERVAL_S)
        if warm is not None:
            warm.drop_unused_log()



__all__ = ["Group", "ReplaySupervision", "Request", "merge", "plan_of", "replayer_value", "worker_replay_values"]

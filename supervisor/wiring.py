"""How a batch of replay requests is served: merged into replayers and wired through the workers.

Pure: it takes the requests (channel -> ReplayRequest) and the replayer ids to use, and returns the
key values to write; no confserver, no process, no clock. supervisor/replays.py decides when a batch
goes and writes what this returns.

- Identical requests (same plan, same range, same summary, merging allowed) ride on the first
  one's channel: only that channel goes through the replayer and the workers, and the target
  writes the result to each rider's recipient too. Twenty dashboards asking for the same hour
  then cost one replay, not twenty copies of it flowing through every worker.
- A request whose path goes through the target of another (same range, and the same archives and
  links up to that function) goes on from that target's output: the worker computes it once, for
  the other channel, and writes it under this channel too (WorkerReplay.via). A dashboard charting
  per_minute beside top_talkers (computed from per_minute) computes per_minute once, not twice.
- Per source, the other requests whose [since, until) ranges overlap or touch share one replayer,
  which reads the archive once for them all; a request with no_merge (or every request when merging
  is off) gets a replayer of its own.
- Every worker on a request's paths (ReplayRequest.workers) gets its `…/replays/<channel>` value; a
  source's children read its replayer's log directly, with no hop through the source's worker. A
  summarised replay of a source (a dashboard's chart of it) has no worker at all: its replayer
  folds the messages and writes the buckets to the client itself (ChannelRange.recipient).
- A source archived on another site (ReplayRequest.source_sites) is replayed there: its group is
  lent to that site (a LentReplayer key there, whose supervisor runs the replayer and has its netd
  send the log to ours), and our netd rebuilds the stream (a NetReceive holding it for all its
  readers), which the source's children read as they would the replayer's log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ramen import keyspace, paths
from ramen.netd.contract import NetReceive, replayer_stream_name
from ramen.replay.contract import (ChannelRange, LentReplayer, ReplayerAssignment, ReplayRequest, Rider,
                                   WorkerReplay)
from ramen.replay.plan import ReplayPlan
from supervisor.defaults import LENT_REPLAYER_WINDOW_BYTES

__all__ = ["Batch", "Group", "Lent", "Wiring", "ancestry", "batch_of", "collapse_identical", "goes_through", "merge",
           "own_sources", "replayer_assignment", "wire", "worker_replays"]


@dataclass(frozen=True)
class Group:
    """The requests one replayer serves: all read `source`."""

    source: str
    channels: tuple[int, ...]
    """Sorted: the channels the replayer writes."""
    riders: tuple[int, ...] = ()
    """Sorted: requests that need the replayer without it writing their channel (identical ones riding
    on its channels, and those going on from their targets' output): it lives, and fails them, as theirs."""

    def site(self, requests: Mapping[int, ReplayRequest]) -> str | None:
        """The other site whose archive the source is replayed from; None: ours."""
        return requests[self.channels[0]].source_sites.get(self.source)


@dataclass(frozen=True)
class Lent:
    """A group replayed on another site for us: the keys that ask that site for it, and ours for
    its stream."""

    site: str
    replayer: LentReplayer
    """At `sites/<site>/lent-replayers/<id>`."""
    receive: NetReceive
    """At `sites/<our site>/net/receives/replayer-<id>`."""

    def keys(self, our_site: str) -> tuple[str, str]:
        """The lent replayer's key (on the other site), and the receive's (on ours)."""
        return (keyspace.lent_replayer_key(self.site, self.replayer.id),
                f"{keyspace.net_receives_prefix(our_site)}/{replayer_stream_name(self.replayer.id)}")


@dataclass(frozen=True)
class Wiring:
    """The values launching a batch writes."""

    workers: dict[str, WorkerReplay]
    """By key: `sites/<site>/workers/<prog>/<func>/replays/<channel>`."""
    replayers: dict[int, ReplayerAssignment]
    """By replayer id, in the order of the groups: those of our archive."""
    riders: dict[int, int]
    """Rider channel -> the channel it rides on."""
    lent: dict[int, Lent] = field(default_factory=dict)
    """By replayer id: those of other sites' archives."""


def collapse_identical(requests: Mapping[int, ReplayRequest], *, allow: bool = True) -> dict[int, list[int]]:
    """Channels of identical requests by the first (lowest) one's channel, the leader's first."""
    leaders: dict[tuple, int] = {}
    by_leader: dict[int, list[int]] = {}
    for channel in sorted(requests):
        request = requests[channel]
        identity = (request.plan, request.since_us, request.until_us, request.summary)
        leader = leaders.get(identity) if allow and not request.no_merge else None
        if leader is None:
            leaders[identity] = channel
            by_leader[channel] = [channel]
        else:
            by_leader[leader].append(channel)
    return by_leader


def merge(requests: Mapping[int, ReplayRequest], *, allow: bool = True,
          sources: Mapping[int, Sequence[str]] | None = None) -> list[Group]:
    """One group per source and per run of overlapping or touching [since, until) ranges (a chart's
    range and its moving window's reach before it: one read of the archive, one process); a
    request with no_merge (or every request when `allow` is false) gets a group of its own.
    `sources`: the sources each request reads itself (by default its plan's)."""
    by_source: dict[str, list[int]] = {}
    for channel, request in requests.items():
        for source in (sources[channel] if sources is not None else request.plan.sources):
            by_source.setdefault(source, []).append(channel)
    runs: list[tuple[str, list[int]]] = []
    for source, channels in sorted(by_source.items()):
        current: list[int] | None = None
        current_until = 0
        for channel in sorted(channels, key=lambda c: (requests[c].since_us, c)):
            request = requests[channel]
            if request.no_merge or not allow:
                runs.append((source, [channel]))
            elif current is not None and request.since_us <= current_until:
                current.append(channel)
                current_until = max(current_until, request.until_us)
            else:
                current, current_until = [channel], request.until_us
                runs.append((source, current))
    return [Group(source, tuple(sorted(channels))) for source, channels in runs]


def ancestry(plan: ReplayPlan, name: str) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The functions of `plan` that `name` is computed from (itself included) and their links, sorted:
    what a plan with `name` as its target over the same archives holds."""
    names, todo = {name}, [name]
    while todo:
        for parent in plan.inputs_of(todo.pop()):
            if parent not in names:
                names.add(parent)
                todo.append(parent)
    return tuple(sorted(names)), tuple(sorted(link for link in plan.links if link[1] in names))


def goes_through(request: ReplayRequest, other: ReplayRequest) -> bool:
    """Whether `request` can go on from `other`'s target's output: that target is a computed
    function on its path (not its own target), over the same range, planned from the same archives."""
    plan, through = request.plan, other.plan.target
    if request.no_merge or other.no_merge or through == plan.target or through in plan.sources \
            or through not in plan.functions:
        return False
    if (request.since_us, request.until_us, plan.since_us, plan.until_us) != \
            (other.since_us, other.until_us, other.plan.since_us, other.plan.until_us):
        return False
    functions, links = ancestry(plan, through)
    return (set(other.plan.functions), set(other.plan.links), set(other.plan.sources)) == \
        (set(functions), set(links), set(plan.sources) & set(functions))


@dataclass(frozen=True)
class Batch:
    """How a batch of requests is served."""

    leaders: dict[int, tuple[int, ...]]
    """Channel of each request that goes through the replayers -> the channels riding on it."""
    groups: list[Group]
    """One per replayer."""
    vias: dict[int, dict[str, int]] = field(default_factory=dict)
    """Leader -> {function on its path: the leader whose target it is}, where it goes on from that
    target's output (goes_through); the outermost such functions only."""


def batch_of(requests: Mapping[int, ReplayRequest], *, allow_merge: bool = True) -> Batch:
    """Identical requests collapsed onto their leader; each leader going on from other leaders'
    targets where it can; the leaders merged into groups over the sources they read themselves."""
    identical = collapse_identical(requests, allow=allow_merge)
    leaders = {leader: tuple(channels[1:]) for leader, channels in identical.items()}
    vias = _vias({leader: requests[leader] for leader in leaders}) if allow_merge else {}
    own = {leader: own_sources(requests[leader], _covered(requests, vias.get(leader, {}))) for leader in leaders}
    groups = merge({leader: requests[leader] for leader in leaders}, allow=allow_merge, sources=own)
    served = []
    for g in groups:
        needing = _needing(set(g.channels), vias)
        riders = {r for c in needing for r in leaders[c]} | (needing - set(g.channels))
        served.append(Group(g.source, g.channels, tuple(sorted(riders))))
    return Batch(leaders, served, vias)


def _vias(leaders: Mapping[int, ReplayRequest]) -> dict[int, dict[str, int]]:
    vias = {}
    for channel, request in leaders.items():
        found = {other.plan.target: c for c, other in leaders.items() if c != channel and goes_through(request, other)}
        inner = {name for through in found for name in ancestry(request.plan, through)[0] if name != through}
        if outermost := {name: c for name, c in found.items() if name not in inner}:
            vias[channel] = outermost
    return vias


def _covered(requests: Mapping[int, ReplayRequest], via: Mapping[str, int]) -> set[str]:
    """The functions a leader's vias compute for it."""
    return {name for c in via.values() for name in requests[c].plan.functions}


def own_sources(request: ReplayRequest, covered: set[str]) -> tuple[str, ...]:
    """The sources a request's own workers (those not `covered` by its vias) read, or its replayer
    serves."""
    if request.served_by_replayer:
        return request.plan.sources
    plan, own = request.plan, set(request.workers) - covered
    return tuple(s for s in plan.sources if s in own or any(c in own for c in plan.readers_of(s)))


def _needing(channels: set[int], vias: Mapping[int, Mapping[str, int]]) -> set[int]:
    """`channels` and every leader going on, directly or not, from one of them."""
    needing = set(channels)
    while more := {c for c, via in vias.items() if c not in needing and needing & set(via.values())}:
        needing |= more
    return needing


def worker_replays(site: str, channel: int, request: ReplayRequest, replayer_of: Mapping[str, int],
                   riders: Sequence[Rider] = (), via: Mapping[str, int] | None = None,
                   covered: set[str] = frozenset(), tag_of: Mapping[str, int] | None = None
                   ) -> dict[str, WorkerReplay]:
    """`…/replays/<channel>` of every worker on the request's paths, by qualified name.
    `replayer_of` maps each source the request reads itself to the replayer that feeds it this
    channel, `tag_of` to the channel its rows carry there (default: this one); `via`: {function:
    channel} where it goes on from another leader's target, whose workers (`covered`) compute for
    it and get no key of this channel but that function's."""
    tag_of = tag_of or {}
    plan = request.plan
    values = {name: WorkerReplay(channel, request.since_us, request.until_us, (), expect_eor=0, via=other)
              for name, other in (via or {}).items()}
    for name in request.workers:
        if name in covered:
            continue
        parents = (name,) if name in plan.sources else plan.inputs_of(name)
        inputs = tuple(str(_replayer_log(site, replayer_of[parent], parent in request.source_sites)
                           if parent in plan.sources else paths.replay_output_log(site, parent)) for parent in parents)
        target = name == plan.target
        tags = tuple(tag_of.get(parent, channel) if parent in plan.sources else channel for parent in parents)
        values[name] = WorkerReplay(channel, request.since_us, request.until_us, inputs, expect_eor=len(inputs),
                                    tags=tags if set(tags) != {channel} else (),
                                    parents=parents, pass_through=name in plan.sources,
                                    recipient=request.recipient if target else None,
                                    also=tuple(riders) if target else (),
                                    summary=request.summary if target else None)
    return values


def _replayer_log(site: str, replayer_id: int, lent: bool):
    """Where our workers read a replayer's log: its own, or, lent by another site, as our netd rebuilds it."""
    return paths.received_replayer_log(site, replayer_id) if lent else paths.replayer_log(site, replayer_id)


def replayer_assignment(site: str, replayer_id: int, group: Group, requests: Mapping[int, ReplayRequest],
                        riders: Mapping[int, Sequence[int]]) -> ReplayerAssignment:
    """`readers`: how many workers subscribe to the replayer's log; it waits for them all before
    its first message, so that none joins late and misses the start. Channels of one range are
    tagged with the first of them (ChannelRange.tag): a dashboard's charts of several functions
    over one source and range share every message of the log, each read once by every reader.
    A channel the replayer serves (ReplayRequest.served_by_replayer) names its recipient, its
    riders' (`riders`: leader -> the channels riding on it) and its summary, and is not on the log."""
    readers = {reader for c in group.channels if not requests[c].served_by_replayer
               for reader in requests[c].plan.readers_of(group.source)}
    first: dict[tuple[int, int], int] = {}
    channels = []
    for c in group.channels:
        request = requests[c]
        span = (request.since_us, request.until_us)
        if request.served_by_replayer:
            also = tuple(Rider(rider, requests[rider].recipient) for rider in riders.get(c, ()))
            channels.append(ChannelRange(c, *span, recipient=request.recipient, also=also, summary=request.summary))
            continue
        tag = first.setdefault(span, c)
        channels.append(ChannelRange(c, *span, tag=tag if tag != c else None))
    served = all(c.served for c in channels)
    return ReplayerAssignment(replayer_id, group.source, str(paths.replayer_log(site, replayer_id)),
                              str(paths.archive_dir(site)), tuple(channels),
                              readers=0 if served else max(1, len(readers)), riders=group.riders)


def wire(site: str, requests: Mapping[int, ReplayRequest], batch: Batch, replayer_ids: Sequence[int]) -> Wiring:
    """The values that launch `batch` (batch_of `requests`), its groups served by `replayer_ids`.
    The keys of the workers computing for another leader (`via`) come first, so that each such
    worker knows of them before the leader's own key, and before any of its data."""
    assignments = {replayer_id: replayer_assignment(site, replayer_id, group, requests, batch.leaders)
                   for replayer_id, group in zip(replayer_ids, batch.groups, strict=True)}
    lent = {}
    for replayer_id, group in zip(replayer_ids, batch.groups):
        if (other := group.site(requests)) is not None:
            assignment = assignments[replayer_id]
            lent[replayer_id] = Lent(other, LentReplayer(replayer_id, group.source, assignment.channels, site),
                                     NetReceive(stream_id=replayer_id, readers=assignment.readers,
                                                log=str(paths.received_replayer_log(site, replayer_id)),
                                                window=LENT_REPLAYER_WINDOW_BYTES))
    replayer_of: dict[int, dict[str, int]] = {leader: {} for leader in batch.leaders}
    tag_of: dict[int, dict[str, int]] = {leader: {} for leader in batch.leaders}
    for replayer_id, assignment in assignments.items():
        for c in assignment.channels:
            replayer_of[c.channel][assignment.source] = replayer_id
            tag_of[c.channel][assignment.source] = c.tagged
    via_keys, workers = {}, {}
    for leader, riders in sorted(batch.leaders.items()):
        also = [Rider(rider, requests[rider].recipient) for rider in riders]
        via = batch.vias.get(leader, {})
        for name, value in worker_replays(site, leader, requests[leader], replayer_of[leader], also, via,
                                          _covered(requests, via), tag_of[leader]).items():
            (via_keys if value.via is not None else workers)[keyspace.worker_replay_key(site, name, leader)] = value
    return Wiring({**via_keys, **workers}, {i: a for i, a in assignments.items() if i not in lent},
                  {rider: leader for leader, riders in batch.leaders.items() for rider in riders}, lent)

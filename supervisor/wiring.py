"""How a batch of replay requests is served: merged into replayers and wired through the workers.

Pure: it takes the requests (channel -> ReplayRequest) and the replayer ids to use, and returns the
key values to write; no confserver, no process, no clock. supervisor/replays.py decides when a batch
goes and writes what this returns.

- Identical requests (same plan, same range, merging allowed) ride on the first one's channel: only
  that channel goes through the replayer and the workers, and the target writes the result to each
  rider's recipient too. Twenty dashboards asking for the same hour then cost one replay, not
  twenty copies of it flowing through every worker.
- Per source, the other requests whose [since, until) ranges overlap share one replayer, which reads
  the archive once for them all; a request with no_merge (or every request when merging is off)
  gets a replayer of its own.
- Every worker on a request's paths (ReplayPlan.workers) gets its `…/replays/<channel>` value; a
  source's children read its replayer's log directly, with no hop through the source's worker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ramen import keyspace, paths
from ramen.replay.contract import ChannelRange, ReplayerAssignment, ReplayRequest, Rider, WorkerReplay

__all__ = ["Batch", "Group", "Wiring", "batch_of", "collapse_identical", "merge", "replayer_assignment", "wire",
           "worker_replays"]


@dataclass(frozen=True)
class Group:
    """The requests one replayer serves: all read `source`."""

    source: str
    channels: tuple[int, ...]
    """Sorted: the channels the replayer writes."""
    riders: tuple[int, ...] = ()
    """Sorted: identical requests riding on those channels (the replayer lives, and fails them, as theirs)."""


@dataclass(frozen=True)
class Wiring:
    """The values launching a batch writes."""

    workers: dict[str, WorkerReplay]
    """By key: `sites/<site>/workers/<prog>/<func>/replays/<channel>`."""
    replayers: dict[int, ReplayerAssignment]
    """By replayer id, in the order of the groups."""
    riders: dict[int, int]
    """Rider channel -> the channel it rides on."""


def collapse_identical(requests: Mapping[int, ReplayRequest], *, allow: bool = True) -> dict[int, list[int]]:
    """Channels of identical requests by the first (lowest) one's channel, the leader's first."""
    leaders: dict[tuple, int] = {}
    by_leader: dict[int, list[int]] = {}
    for channel in sorted(requests):
        request = requests[channel]
        identity = (request.plan, request.since_us, request.until_us)
        leader = leaders.get(identity) if allow and not request.no_merge else None
        if leader is None:
            leaders[identity] = channel
            by_leader[channel] = [channel]
        else:
            by_leader[leader].append(channel)
    return by_leader


def merge(requests: Mapping[int, ReplayRequest], *, allow: bool = True) -> list[Group]:
    """One group per source and per run of overlapping [since, until) ranges; a request with
    no_merge (or every request when `allow` is false) gets a group of its own."""
    by_source: dict[str, list[int]] = {}
    for channel, request in requests.items():
        for source in request.plan.sources:
            by_source.setdefault(source, []).append(channel)
    runs: list[tuple[str, list[int]]] = []
    for source, channels in sorted(by_source.items()):
        current: list[int] | None = None
        current_until = 0
        for channel in sorted(channels, key=lambda c: (requests[c].since_us, c)):
            request = requests[channel]
            if request.no_merge or not allow:
                runs.append((source, [channel]))
            elif current is not None and request.since_us < current_until:
                current.append(channel)
                current_until = max(current_until, request.until_us)
            else:
                current, current_until = [channel], request.until_us
                runs.append((source, current))
    return [Group(source, tuple(sorted(channels))) for source, channels in runs]


@dataclass(frozen=True)
class Batch:
    """How a batch of requests is served."""

    leaders: dict[int, tuple[int, ...]]
    """Channel of each request that goes through the replayers -> the channels riding on it."""
    groups: list[Group]
    """One per replayer."""


def batch_of(requests: Mapping[int, ReplayRequest], *, allow_merge: bool = True) -> Batch:
    """Identical requests collapsed onto their leader, then the leaders merged into groups."""
    identical = collapse_identical(requests, allow=allow_merge)
    leaders = {leader: tuple(channels[1:]) for leader, channels in identical.items()}
    groups = merge({leader: requests[leader] for leader in leaders}, allow=allow_merge)
    return Batch(leaders, [Group(g.source, g.channels, tuple(sorted(r for c in g.channels for r in leaders[c])))
                           for g in groups])


def worker_replays(site: str, channel: int, request: ReplayRequest, replayer_of: Mapping[str, int],
                   riders: Sequence[Rider] = ()) -> dict[str, WorkerReplay]:
    """`…/replays/<channel>` of every worker on the request's paths, by qualified name.
    `replayer_of` maps each of the plan's sources to the replayer that feeds it this channel."""
    plan = request.plan
    values = {}
    for name in plan.workers:
        parents = (name,) if name in plan.sources else plan.inputs_of(name)
        inputs = tuple(str(paths.replayer_log(site, replayer_of[parent]) if parent in plan.sources
                           else paths.replay_output_log(site, parent)) for parent in parents)
        target = name == plan.target
        values[name] = WorkerReplay(channel, request.since_us, request.until_us, inputs, expect_eor=len(inputs),
                                    parents=parents, pass_through=name in plan.sources,
                                    recipient=request.recipient if target else None,
                                    also=tuple(riders) if target else ())
    return values


def replayer_assignment(site: str, replayer_id: int, group: Group,
                        requests: Mapping[int, ReplayRequest]) -> ReplayerAssignment:
    """`readers`: how many workers subscribe to the replayer's log; it waits for them all before
    its first message, so that none joins late and misses the start."""
    readers = {reader for c in group.channels for reader in requests[c].plan.readers_of(group.source)}
    channels = tuple(ChannelRange(c, requests[c].since_us, requests[c].until_us) for c in group.channels)
    return ReplayerAssignment(replayer_id, group.source, str(paths.replayer_log(site, replayer_id)),
                              str(paths.archive_dir(site)), channels, readers=max(1, len(readers)))


def wire(site: str, requests: Mapping[int, ReplayRequest], batch: Batch, replayer_ids: Sequence[int]) -> Wiring:
    """The values that launch `batch` (batch_of `requests`), its groups served by `replayer_ids`."""
    replayer_of: dict[int, dict[str, int]] = {leader: {} for leader in batch.leaders}
    for replayer_id, group in zip(replayer_ids, batch.groups, strict=True):
        for channel in group.channels:
            replayer_of[channel][group.source] = replayer_id
    workers = {}
    for leader, riders in sorted(batch.leaders.items()):
        also = [Rider(rider, requests[rider].recipient) for rider in riders]
        for name, value in worker_replays(site, leader, requests[leader], replayer_of[leader], also).items():
            workers[keyspace.worker_replay_key(site, name, leader)] = value
    replayers = {replayer_id: replayer_assignment(site, replayer_id, group, requests)
                 for replayer_id, group in zip(replayer_ids, batch.groups)}
    return Wiring(workers, replayers, {rider: leader for leader, riders in batch.leaders.items() for rider in riders})

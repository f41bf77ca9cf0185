"""The pure wiring of replays, without processes or a confserver: which requests share a replayer,
which ride on another's channel, and the key values launching them writes."""

from __future__ import annotations

import dataclasses

from ramen import keyspace, paths
from ramen.replay.contract import ChannelRange, ReplayRequest, Rider, Summary, WorkerReplay
from ramen.replay.plan import ReplayPlan
from supervisor.wiring import Group, batch_of, merge, wire

SITE = "s1"
SOURCE = "p/src"
CHAIN = ReplayPlan("p/t", 0, 100, (SOURCE,), ((SOURCE, "p/t"),), (SOURCE, "p/t"))
DIAMOND = ReplayPlan("p/t", 0, 100, (SOURCE,), (("p/a", "p/t"), ("p/b", "p/t"), (SOURCE, "p/a"), (SOURCE, "p/b")),
                     ("p/a", "p/b", SOURCE, "p/t"))


def request(channel: int, since_us: int = 0, until_us: int = 100, plan: ReplayPlan = CHAIN, *,
            no_merge: bool = False) -> ReplayRequest:
    return ReplayRequest(plan.target, since_us, until_us, plan, str(paths.recipient_log(channel)), created_us=0,
                         timeout_s=300.0, no_merge=no_merge)


def test_overlapping_or_touching_requests_for_one_source_share_a_group_and_disjoint_ones_do_not():
    requests = {1: request(1, 0, 100), 2: request(2, 50, 200), 3: request(3, 150, 300), 4: request(4, 400, 500),
                5: request(5, 0, 100, no_merge=True), 6: request(6, 500, 560), 7: request(7, 561, 600)}
    assert sorted(g.channels for g in merge(requests)) == [(1, 2, 3), (4, 6), (5,), (7,)]
    assert len(merge({1: request(1), 2: request(2, 0, 90)}, allow=False)) == 2


def test_identical_requests_ride_on_the_first_ones_channel():
    requests = {3: request(3), 5: request(5), 7: request(7, 50, 150), 8: request(8, no_merge=True)}
    batch = batch_of(requests)
    assert batch.leaders == {3: (5,), 7: (), 8: ()}
    assert batch.groups == [Group(SOURCE, (3, 7), riders=(5,)), Group(SOURCE, (8,))]
    assert batch_of(requests, allow_merge=False).leaders == {3: (), 5: (), 7: (), 8: ()}


def test_a_diamond_wires_both_children_of_the_source_to_its_replayer_and_the_target_to_both(ramen_dir):
    requests = {9: request(9, plan=DIAMOND)}
    wired = wire(SITE, requests, batch_of(requests), [42])
    replayer_log = str(paths.replayer_log(SITE, 42))
    for middle in ("p/a", "p/b"):
        assert wired.workers[keyspace.worker_replay_key(SITE, middle, 9)] == WorkerReplay(
            9, 0, 100, (replayer_log,), expect_eor=1, parents=(SOURCE,))
    assert wired.workers[keyspace.worker_replay_key(SITE, "p/t", 9)] == WorkerReplay(
        9, 0, 100, (str(paths.replay_output_log(SITE, "p/a")), str(paths.replay_output_log(SITE, "p/b"))),
        expect_eor=2, parents=("p/a", "p/b"), recipient=str(paths.recipient_log(9)))
    assert keyspace.worker_replay_key(SITE, SOURCE, 9) not in wired.workers  # its replayer stands in for it
    (assignment,) = wired.replayers.values()
    assert (assignment.id, assignment.source, assignment.log, assignment.readers) == (42, SOURCE, replayer_log, 2)
    assert assignment.archive_dir == str(paths.archive_dir(SITE))
    assert assignment.channels == (ChannelRange(9, 0, 100),)


def test_a_replay_of_a_source_itself_passes_through_its_worker(ramen_dir):
    plan = ReplayPlan(SOURCE, 0, 100, (SOURCE,), (), (SOURCE,))
    requests = {4: request(4, plan=plan)}
    wired = wire(SITE, requests, batch_of(requests), [1])
    assert wired.workers == {keyspace.worker_replay_key(SITE, SOURCE, 4): WorkerReplay(
        4, 0, 100, (str(paths.replayer_log(SITE, 1)),), expect_eor=1, parents=(SOURCE,), pass_through=True,
        recipient=str(paths.recipient_log(4)))}
    assert wired.replayers[1].readers == 1


def test_the_target_of_a_leader_writes_to_its_riders_and_only_the_leader_is_wired(ramen_dir):
    requests = {1: request(1), 2: request(2), 3: request(3), 4: request(4, 50, 150)}
    batch = batch_of(requests)
    wired = wire(SITE, requests, batch, [10])
    assert wired.riders == {2: 1, 3: 1}
    assert wired.workers[keyspace.worker_replay_key(SITE, "p/t", 1)].also == (
        Rider(2, str(paths.recipient_log(2))), Rider(3, str(paths.recipient_log(3))))
    assert wired.workers[keyspace.worker_replay_key(SITE, "p/t", 4)].also == ()
    assert sorted(wired.workers) == [keyspace.worker_replay_key(SITE, "p/t", c) for c in (1, 4)]
    assert wired.replayers[10].channels == (ChannelRange(1, 0, 100), ChannelRange(4, 50, 150))


def test_the_values_wired_follow_the_contract(ramen_dir):
    requests = {1: request(1, plan=DIAMOND), 2: request(2, plan=DIAMOND)}
    wired = wire(SITE, requests, batch_of(requests), [7])
    for value in wired.workers.values():
        assert WorkerReplay.from_value(value.to_value()) == value
    assert [type(v).from_value(v.to_value()) for v in wired.replayers.values()] == list(wired.replayers.values())


MIDDLE = ReplayPlan("p/a", 0, 100, (SOURCE,), ((SOURCE, "p/a"),), ("p/a", SOURCE))
THROUGH = ReplayPlan("p/t", 0, 100, (SOURCE,), (("p/a", "p/t"), (SOURCE, "p/a")), ("p/a", SOURCE, "p/t"))


def test_a_replay_through_another_ones_target_goes_on_from_its_output(ramen_dir):
    requests = {1: request(1, plan=MIDDLE), 2: request(2, plan=THROUGH), 3: request(3, plan=THROUGH)}
    batch = batch_of(requests)
    assert batch.leaders == {1: (), 2: (3,)} and batch.vias == {2: {"p/a": 1}}
    # Only the middle's channel is replayed; the replayer lives for both, and for 2's rider.
    assert batch.groups == [Group(SOURCE, (1,), riders=(2, 3))]
    wired = wire(SITE, requests, batch, [5])
    via_key = keyspace.worker_replay_key(SITE, "p/a", 2)
    assert list(wired.workers)[0] == via_key  # before 1's own key, so p/a knows of it before any data
    assert wired.workers[via_key] == WorkerReplay(2, 0, 100, (), expect_eor=0, via=1)
    assert wired.workers[keyspace.worker_replay_key(SITE, "p/t", 2)] == WorkerReplay(
        2, 0, 100, (str(paths.replay_output_log(SITE, "p/a")),), expect_eor=1, parents=("p/a",),
        recipient=str(paths.recipient_log(2)), also=(Rider(3, str(paths.recipient_log(3))),))
    assert wired.workers[keyspace.worker_replay_key(SITE, "p/a", 1)].recipient == str(paths.recipient_log(1))
    assert wired.replayers[5].channels == (ChannelRange(1, 0, 100),)
    for value in wired.workers.values():
        assert WorkerReplay.from_value(value.to_value()) == value


def test_a_replay_goes_through_another_only_over_the_same_range_archives_and_merging():
    archived_middle = ReplayPlan("p/t", 0, 100, ("p/a",), (("p/a", "p/t"),), ("p/a", "p/t"))
    assert batch_of({1: request(1, plan=MIDDLE), 2: request(2, 0, 90, plan=THROUGH)}).vias == {}
    assert batch_of({1: request(1, plan=MIDDLE), 2: request(2, plan=archived_middle)}).vias == {}
    assert batch_of({1: request(1, plan=MIDDLE), 2: request(2, plan=THROUGH, no_merge=True)}).vias == {}
    assert batch_of({1: request(1, plan=MIDDLE), 2: request(2, plan=THROUGH)}, allow_merge=False).vias == {}
    # Its target's parent is not the other one's target: nothing to go on from.
    assert batch_of({1: request(1), 2: request(2, plan=DIAMOND)}).vias == {}


def test_a_join_through_another_ones_target_still_reads_the_source_it_joins_itself(ramen_dir):
    join = ReplayPlan("p/t", 0, 100, (SOURCE,), (("p/a", "p/t"), (SOURCE, "p/a"), (SOURCE, "p/t")),
                      ("p/a", SOURCE, "p/t"))
    requests = {1: request(1, plan=MIDDLE), 2: request(2, plan=join)}
    batch = batch_of(requests)
    assert batch.vias == {2: {"p/a": 1}} and batch.groups == [Group(SOURCE, (1, 2))]
    wired = wire(SITE, requests, batch, [5])
    assert wired.workers[keyspace.worker_replay_key(SITE, "p/t", 2)].inputs == (
        str(paths.replay_output_log(SITE, "p/a")), str(paths.replayer_log(SITE, 5)))
    assert wired.replayers[5].readers == 2


def test_a_summary_goes_to_the_target_and_requests_ride_together_only_with_the_same_one(ramen_dir):
    summarised = {1: dataclasses.replace(request(1), summary=Summary(60)), 2: request(2),
                  3: dataclasses.replace(request(3), summary=Summary(60))}
    batch = batch_of(summarised)
    assert batch.leaders == {1: (3,), 2: ()}
    wired = wire(SITE, summarised, batch, [4])
    assert wired.workers[keyspace.worker_replay_key(SITE, "p/t", 1)].summary == Summary(60)
    assert wired.workers[keyspace.worker_replay_key(SITE, "p/t", 2)].summary is None


def test_channels_of_one_range_on_one_replayer_share_the_first_ones_tag(ramen_dir):
    source = ReplayPlan(SOURCE, 0, 100, (SOURCE,), (), (SOURCE,))
    requests = {1: request(1), 2: request(2, plan=source), 3: request(3, 50, 150, plan=source)}
    wired = wire(SITE, requests, batch_of(requests), [6])
    assert wired.replayers[6].channels == (ChannelRange(1, 0, 100), ChannelRange(2, 0, 100, tag=1),
                                           ChannelRange(3, 50, 150))
    assert wired.workers[keyspace.worker_replay_key(SITE, SOURCE, 2)].tags == (1,)
    assert wired.workers[keyspace.worker_replay_key(SITE, SOURCE, 3)].tags == ()
    assert wired.workers[keyspace.worker_replay_key(SITE, "p/t", 1)].tags == ()


SOURCE_ITSELF = ReplayPlan(SOURCE, 0, 100, (SOURCE,), (), (SOURCE,))


def summarised(channel: int, since_us: int = 0, until_us: int = 100, plan: ReplayPlan = SOURCE_ITSELF) -> ReplayRequest:
    return dataclasses.replace(request(channel, since_us, until_us, plan), summary=Summary(60, ("host",), ("bytes",)))


def test_a_summarised_replay_of_a_source_is_served_by_its_replayer_with_no_worker(ramen_dir):
    requests = {1: summarised(1), 2: summarised(2), 3: summarised(3, 50, 150)}
    batch = batch_of(requests)
    assert batch.leaders == {1: (2,), 3: ()}
    wired = wire(SITE, requests, batch, [8])
    assert wired.workers == {}  # neither the source's worker nor any other takes part
    (assignment,) = wired.replayers.values()
    assert assignment.readers == 0  # no log: nobody reads it
    assert assignment.channels == (
        ChannelRange(1, 0, 100, recipient=str(paths.recipient_log(1)), also=(Rider(2, str(paths.recipient_log(2))),),
                     summary=Summary(60, ("host",), ("bytes",))),
        ChannelRange(3, 50, 150, recipient=str(paths.recipient_log(3)), summary=Summary(60, ("host",), ("bytes",))))
    assert type(assignment).from_value(assignment.to_value()) == assignment
    assert all(requests[c].workers == () for c in requests)


def test_a_served_replay_shares_its_replayer_with_the_logs_readers_and_is_not_on_the_log(ramen_dir):
    requests = {1: request(1), 2: summarised(2), 3: request(3, plan=SOURCE_ITSELF)}
    wired = wire(SITE, requests, batch_of(requests), [6])
    (assignment,) = wired.replayers.values()
    assert assignment.channels == (ChannelRange(1, 0, 100),
                                   ChannelRange(2, 0, 100, recipient=str(paths.recipient_log(2)),
                                                summary=Summary(60, ("host",), ("bytes",))),
                                   ChannelRange(3, 0, 100, tag=1))
    assert assignment.readers == 2  # p/t and the source's worker (for 3): the served channel adds none
    assert sorted(wired.workers) == sorted([keyspace.worker_replay_key(SITE, "p/t", 1),
                                            keyspace.worker_replay_key(SITE, SOURCE, 3)])


def test_a_summarised_replay_of_a_function_past_the_source_still_goes_through_the_workers(ramen_dir):
    requests = {1: dataclasses.replace(request(1), summary=Summary(60))}
    wired = wire(SITE, requests, batch_of(requests), [2])
    assert not requests[1].served_by_replayer
    assert wired.replayers[2].channels == (ChannelRange(1, 0, 100),) and wired.replayers[2].readers == 1
    assert wired.workers[keyspace.worker_replay_key(SITE, "p/t", 1)].summary == Summary(60)


def test_a_summarised_replay_of_a_source_on_another_site_is_not_served_here():
    lent = dataclasses.replace(summarised(1), source_sites={SOURCE: "s2"})
    assert not lent.served_by_replayer and lent.workers == (SOURCE,)

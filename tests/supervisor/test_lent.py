"""Replays across sites, from each supervisor's side (issue 23): the serving site borrows a replayer
of a source archived on another site; that site's supervisor lends it (runs it, has its netd send
its log where the borrower's netd is). Here one supervisor of site s1 plays either part, the test
the other site's; its replayers are tests/supervisor/fake_process.py."""

from __future__ import annotations

from ramen import keyspace, paths
from ramen.clocks import ManualClock
from ramen.netd.contract import NetEndpoint, NetReceive, NetSend
from ramen.replay.contract import ChannelRange, LentReplayer, ReplayerAssignment, WorkerReplay
from supervisor import defaults
from supervisor.defaults import LENT_REPLAYER_WINDOW_BYTES
from tests.supervisor.conftest import SITE, drive, pid_alive, value_of, wait_for
from tests.supervisor.test_replays import DIAMOND, request_replay, worker_replay

OTHER = "edge"


def lent_keys(admin, site: str = OTHER) -> dict[int, LentReplayer]:
    return {int(e.key.rpartition("/")[2]): LentReplayer.from_value(e.value, e.key)
            for e in admin.glob(f"{keyspace.lent_replayers_prefix(site)}/*")}


def net_key(kind: str, site: str, replayer_id: int) -> str:
    return f"{keyspace.SITES}/{site}/net/{kind}/replayer-{replayer_id}"


def test_a_source_archived_on_another_site_is_borrowed_from_it_and_given_back_at_teardown(admin, start_supervisor):
    supervisor = start_supervisor(delay_before_replay_s=0.0)
    channel = request_replay(admin, DIAMOND, source_sites={"p/src": OTHER})
    (replayer_id, lent), = wait_for(lambda: list(lent_keys(admin).items()) or None, what="a lent-replayers key")
    assert lent == LentReplayer(replayer_id, "p/src", (ChannelRange(channel, 0, 100),), SITE)
    assert admin.get(keyspace.lent_replayer_key(OTHER, replayer_id)).ephemeral
    # Our netd receives its stream where both children of the source read it, held for the two of them.
    received = str(paths.received_replayer_log(SITE, replayer_id))
    receive = NetReceive.from_value(value_of(admin, net_key("receives", SITE, replayer_id)))
    assert receive == NetReceive(stream_id=replayer_id, log=received, readers=2, window=LENT_REPLAYER_WINDOW_BYTES)
    for child in ("p/a", "p/b"):
        assert WorkerReplay.from_value(worker_replay(admin, child, channel)).inputs == (received,)
    # No replayer of ours: nothing spawned, no replayer key on our site.
    assert supervisor.counters.replayers_spawned == 0
    assert not admin.glob(f"{keyspace.replayers_prefix(SITE)}/*")

    admin.delete(keyspace.replay_key(channel))
    wait_for(lambda: not lent_keys(admin) and value_of(admin, net_key("receives", SITE, replayer_id)) is None,
             what="the lent key and our receive gone")
    assert supervisor.replays.replayers == {}


def test_a_replayer_lent_to_another_site_runs_here_and_its_log_follows_that_sites_netd(admin, start_supervisor):
    supervisor = start_supervisor()
    channel = request_replay(admin, site=OTHER)  # the other site's replay, which that site serves
    replayer_id = admin.next_sequence("sequences/replayer")
    admin.create(keyspace.lent_replayer_key(SITE, replayer_id),
                 LentReplayer(replayer_id, "p/src", (ChannelRange(channel, 0, 100),), OTHER).to_value())
    assignment = wait_for(lambda: (v := value_of(admin, keyspace.replayer_key(SITE, replayer_id))) and "pid" in v
                          and ReplayerAssignment.from_value(v), what="the lent replayer spawned")
    assert (assignment.source, assignment.sent_to, assignment.stream_id, assignment.readers) == \
        ("p/src", OTHER, replayer_id, 1)
    assert assignment.log == str(paths.replayer_log(SITE, replayer_id)) and pid_alive(assignment.pid)
    # Its log is sent once the other site's netd says where it listens, and again where a new one does.
    send_key = net_key("sends", SITE, replayer_id)
    assert value_of(admin, send_key) is None
    for port in (40001, 40002):
        endpoint = f"aeron:udp?endpoint=127.0.0.1:{port}"
        admin.set(keyspace.net_endpoint_key(OTHER), NetEndpoint(channel=endpoint, pid=1).to_value())
        wait_for(lambda: value_of(admin, send_key) == NetSend(log=assignment.log, channel=endpoint).to_value(),
                 what=f"the send to port {port}")
    # The other site's replay ending does not stop it: only its lent key going does.
    admin.delete(keyspace.replay_key(channel))
    wait_for(lambda: channel not in supervisor.replays.requests and supervisor.replays.replayers[replayer_id],
             what="the replay's deletion seen")
    assert not supervisor.replays.replayers[replayer_id].retiring
    admin.delete(keyspace.lent_replayer_key(SITE, replayer_id))
    wait_for(lambda: not pid_alive(assignment.pid) and value_of(admin, send_key) is None
             and value_of(admin, keyspace.replayer_key(SITE, replayer_id)) is None, what="the lent replayer removed")


def test_a_lent_replayer_that_dies_fails_the_other_sites_replay(admin, start_supervisor):
    start_supervisor(replayer_mode="crash")
    channel = request_replay(admin, site=OTHER)
    replayer_id = admin.next_sequence("sequences/replayer")
    admin.create(keyspace.lent_replayer_key(SITE, replayer_id),
                 LentReplayer(replayer_id, "p/src", (ChannelRange(channel, 0, 100),), OTHER).to_value())
    error = wait_for(lambda: value_of(admin, keyspace.replay_key(channel)).get("error"), what="the replay's error")
    assert error.startswith(f"site {SITE}'s replayer {replayer_id} of p/src died (exit 1")


def test_the_warm_replayer_serves_a_lent_replayer_under_its_own_id_with_the_lenders_stream_id(admin, start_supervisor):
    supervisor = start_supervisor(spares=True)
    warm = wait_for(lambda: supervisor.replays.warm, what="the warm replayer")
    warm_id = int(warm.popen.args[warm.popen.args.index("--id") + 1])
    channel = request_replay(admin, site=OTHER)
    lent_id = admin.next_sequence("sequences/replayer")
    admin.create(keyspace.lent_replayer_key(SITE, lent_id),
                 LentReplayer(lent_id, "p/src", (ChannelRange(channel, 0, 100),), OTHER).to_value())
    assignment = wait_for(lambda: (v := value_of(admin, keyspace.replayer_key(SITE, warm_id))) and "pid" in v
                          and ReplayerAssignment.from_value(v), what="the warm replayer's key")
    assert (assignment.pid, assignment.stream_id, assignment.sent_to) == (warm.pid, lent_id, OTHER)
    admin.set(keyspace.net_endpoint_key(OTHER), NetEndpoint(channel="aeron:udp?endpoint=127.0.0.1:40003", pid=1).to_value())
    send = wait_for(lambda: value_of(admin, net_key("sends", SITE, lent_id)), what="the send, named after the lent id")
    assert send["log"] == str(paths.replayer_log(SITE, warm_id))
    admin.delete(keyspace.lent_replayer_key(SITE, lent_id))
    wait_for(lambda: value_of(admin, keyspace.replayer_key(SITE, warm_id)) is None
             and value_of(admin, net_key("sends", SITE, lent_id)) is None, what="the lent replayer removed")


def test_while_it_lends_a_replayer_and_a_moment_after_no_warm_replayer_starts(admin, start_supervisor):
    """The other site's replay runs on this host too (its replayer, our netd sending its log): a
    start-up then would take a core from it, as for our own replays (QUIET_AFTER_REPLAYS_S)."""
    clock = ManualClock()
    supervisor = start_supervisor(spares=True, clock=clock, thread=False)
    warm = drive(supervisor, lambda: supervisor.replays.warm, what="a replayer started ahead")
    channel = request_replay(admin, site=OTHER)
    lent_id = admin.next_sequence("sequences/replayer")
    admin.create(keyspace.lent_replayer_key(SITE, lent_id),
                 LentReplayer(lent_id, "p/src", (ChannelRange(channel, 0, 100),), OTHER).to_value())
    drive(supervisor, lambda: supervisor.replays.warm is None and supervisor.replays.replayers, what="the warm one lent")
    clock.advance(defaults.QUIET_AFTER_REPLAYS_S)
    supervisor.do_work()
    assert supervisor.replays.warm is None and supervisor.replays.busy()
    admin.delete(keyspace.lent_replayer_key(SITE, lent_id))
    drive(supervisor, lambda: not supervisor.replays.replayers and not pid_alive(warm.pid), what="the lent one removed")
    clock.advance(defaults.QUIET_AFTER_REPLAYS_S - 0.1)
    supervisor.do_work()
    assert supervisor.replays.warm is None and supervisor.replays.busy()
    clock.advance(0.1)
    follower = drive(supervisor, lambda: supervisor.replays.warm, what="the next replayer started ahead")
    assert follower.pid != warm.pid

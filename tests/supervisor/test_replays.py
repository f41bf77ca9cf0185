"""The supervisor's side of replays, with its processes: the wiring written, merged requests
sharing a replayer, teardown, faults and timeouts. Replayers are tests/supervisor/fake_process.py;
the wiring itself is tested without processes in test_wiring.py."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import confserver
from ramen import keyspace, paths
from ramen.clocks import ManualClock
from ramen.replay.contract import ReplayerStats, ReplayRequest, Summary, WorkerReplay
from ramen.replay.plan import ReplayPlan
from supervisor import defaults
from tests.supervisor.conftest import SITE, drive, pid_alive, set_worker, value_of, wait_for

SOURCE = "p/src"
CHAIN = ReplayPlan("p/t", 0, 100, ("p/src",), (("p/src", "p/t"),), ("p/src", "p/t"))
DIAMOND = ReplayPlan("p/t", 0, 100, ("p/src",),
                     (("p/a", "p/t"), ("p/b", "p/t"), ("p/src", "p/a"), ("p/src", "p/b")),
                     ("p/a", "p/b", "p/src", "p/t"))


def request_replay(admin, plan: ReplayPlan = CHAIN, since_us: int | None = None, until_us: int | None = None,
                   **extra) -> int:
    channel = admin.next_sequence(keyspace.REPLAY_CHANNEL_SEQUENCE)
    request = ReplayRequest(plan.target, plan.since_us if since_us is None else since_us,
                            plan.until_us if until_us is None else until_us, plan, str(paths.recipient_log(channel)),
                            created_us=time.time_ns() // 1000, timeout_s=300.0, no_merge=False, site=SITE)
    admin.create(keyspace.replay_key(channel), dataclasses.replace(request, **extra).to_value())
    return channel


def replayers(admin) -> dict[int, dict]:
    return {e.value["id"]: e.value for e in admin.glob(f"{keyspace.replayers_prefix(SITE)}/*")}


def worker_replay(admin, name: str, channel: int) -> dict | None:
    return value_of(admin, keyspace.worker_replay_key(SITE, name, channel))


def channels_of(replayer: dict) -> list[int]:
    return [c["channel"] for c in replayer["channels"]]


def test_requests_within_the_delay_that_overlap_are_merged_into_one_replayer(admin, start_supervisor):
    supervisor = start_supervisor(delay_before_replay_s=1.0)
    first = request_replay(admin, since_us=0, until_us=100)
    second = request_replay(admin, since_us=50, until_us=200)
    apart = request_replay(admin, since_us=300, until_us=400)
    found = wait_for(lambda: len(r := replayers(admin)) == 2 and all("pid" in v for v in r.values()) and r,
                     what="two replayer keys")
    merged, alone = sorted(found.values(), key=lambda v: len(v["channels"]), reverse=True)
    assert channels_of(merged) == [first, second] and channels_of(alone) == [apart]
    assert merged["channels"][1] == {"channel": second, "since_us": 50, "until_us": 200}
    assert merged["source"] == SOURCE and merged["log"] == str(paths.replayer_log(SITE, merged["id"]))
    assert merged["archive_dir"] == str(paths.archive_dir(SITE))
    assert pid_alive(merged["pid"]) and pid_alive(alone["pid"])
    for channel in (first, second):  # the source's child reads the replayer: the source's worker is not on the path
        assert worker_replay(admin, "p/t", channel)["inputs"] == [merged["log"]]
        assert worker_replay(admin, SOURCE, channel) is None
    assert worker_replay(admin, "p/t", apart)["inputs"] == [alone["log"]]
    assert merged["readers"] == alone["readers"] == 1
    assert supervisor.counters.replayers_spawned == 2 and supervisor.counters.merged_requests == 1


def test_a_replay_another_site_serves_is_left_to_it(admin, start_supervisor):
    supervisor = start_supervisor(delay_before_replay_s=0.0)
    elsewhere = request_replay(admin, site="elsewhere")
    ours = request_replay(admin)  # taken after the other: once it is wired, the other was seen
    found = wait_for(lambda: (r := replayers(admin)) and all("pid" in v for v in r.values()) and r,
                     what="a replayer key")
    assert [channels_of(v) for v in found.values()] == [[ours]]
    assert worker_replay(admin, "p/t", elsewhere) is None
    assert "error" not in value_of(admin, keyspace.replay_key(elsewhere))
    assert supervisor.counters.replays_wired == 1


def test_no_merge_gives_each_request_its_own_replayer(admin, start_supervisor):
    supervisor = start_supervisor(delay_before_replay_s=1.0)
    request_replay(admin)
    request_replay(admin, no_merge=True)
    found = wait_for(lambda: len(r := replayers(admin)) == 2 and r, what="two replayer keys")
    assert sorted(len(v["channels"]) for v in found.values()) == [1, 1]
    wait_for(lambda: supervisor.counters.replayers_spawned == 2)
    assert supervisor.counters.merged_requests == 0


def test_path_workers_of_a_diamond_get_their_inputs_and_the_target_its_recipient(admin, start_supervisor):
    """Both children of the source read its replayer's log, which waits for the two of them; the
    source's own worker takes no part."""
    start_supervisor()
    channel = request_replay(admin, DIAMOND)
    replayer = wait_for(lambda: next(iter(replayers(admin).values()), None), what="a replayer key")
    keys = {name: wait_for(lambda: worker_replay(admin, name, channel)) for name in ("p/a", "p/b", "p/t")}
    assert replayer["readers"] == 2
    for middle in ("p/a", "p/b"):
        assert WorkerReplay.from_value(keys[middle]) == WorkerReplay(channel, 0, 100, (replayer["log"],), expect_eor=1,
                                                                     parents=("p/src",))
    assert keys["p/t"]["inputs"] == [str(paths.replay_output_log(SITE, "p/a")),
                                     str(paths.replay_output_log(SITE, "p/b"))]
    assert keys["p/t"]["parents"] == ["p/a", "p/b"]
    assert keys["p/t"]["expect_eor"] == 2 and keys["p/t"]["recipient"] == str(paths.recipient_log(channel))
    assert worker_replay(admin, SOURCE, channel) is None


def test_a_replay_of_a_source_itself_passes_through_its_worker(admin, start_supervisor):
    start_supervisor()
    plan = ReplayPlan(SOURCE, 0, 100, (SOURCE,), (), (SOURCE,))
    channel = request_replay(admin, plan)
    replayer = wait_for(lambda: next(iter(replayers(admin).values()), None), what="a replayer key")
    key = wait_for(lambda: worker_replay(admin, SOURCE, channel))
    assert key["inputs"] == [replayer["log"]] and key["parents"] == [SOURCE] and key["pass_through"]
    assert key["recipient"] == str(paths.recipient_log(channel)) and replayer["readers"] == 1


def test_deleting_the_replays_tears_down_their_keys_then_the_replayer_they_shared(admin, start_supervisor):
    supervisor = start_supervisor(delay_before_replay_s=1.0)
    first, second = request_replay(admin), request_replay(admin, since_us=50, until_us=150)  # overlapping
    replayer = wait_for(lambda: (r := replayers(admin)) and "pid" in (v := next(iter(r.values()))) and v)
    assert channels_of(replayer) == [first, second]
    log_path = paths.replayer_log(SITE, replayer["id"])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")
    admin.set(keyspace.replayer_stats_key(SITE, replayer["id"]), ReplayerStats(1, 0, 0, {}, False).to_value())

    admin.delete(keyspace.replay_key(first))
    wait_for(lambda: worker_replay(admin, "p/t", first) is None and worker_replay(admin, SOURCE, first) is None,
             what="keys of the first channel deleted")
    assert worker_replay(admin, "p/t", second) is not None and pid_alive(replayer["pid"]) and log_path.exists()

    admin.delete(keyspace.replay_key(second))
    wait_for(lambda: not replayers(admin) and not pid_alive(replayer["pid"]), what="replayer torn down")
    wait_for(lambda: not log_path.exists(), what="replayer log removed")
    assert admin.glob(f"{keyspace.replayers_prefix(SITE)}/**") == []
    assert admin.glob(keyspace.function_key(SITE, "*/*", "replays/*")) == []
    assert supervisor.counters.teardowns == 2


def test_a_supervisor_that_stops_removes_the_keys_and_logs_of_its_replayers(admin, start_supervisor):
    """Whether still serving or retiring (its replay over a moment before the stop), a replayer
    the supervisor stops leaves neither key nor log: nobody would ever remove them."""
    supervisor = start_supervisor()
    serving, retiring = request_replay(admin, since_us=0, until_us=100), request_replay(admin, no_merge=True)
    found = wait_for(lambda: len(r := replayers(admin)) == 2 and all("pid" in v for v in r.values()) and r,
                     what="two replayer keys")
    logs = [paths.replayer_log(SITE, replayer_id) for replayer_id in found]
    for log_path in logs:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_bytes(b"")
    supervisor.stop_thread()
    admin.delete(keyspace.replay_key(retiring))
    supervisor.replays.teardown(retiring)
    assert [r.retiring for r in supervisor.replays.replayers.values()].count(True) == 1

    supervisor.close(timeout_s=5)
    assert not any(map(pid_alive, (v["pid"] for v in found.values())))
    assert [p for p in logs if p.exists()] == []
    assert replayers(admin) == {}
    assert value_of(admin, keyspace.replay_key(serving))["error"] == "the supervisor of site s1 stopped during the replay"


def test_the_result_log_of_a_replay_whose_client_vanished_is_removed_at_teardown(admin, start_supervisor,
                                                                                   ramen_dir):
    """The client, killed, never removes its result log; its replay key goes with its session,
    and the supervisor removes the log at the channel's own place (and no file a key names)."""
    start_supervisor()
    channel = request_replay(admin)
    result = paths.recipient_log(channel)
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_bytes(b"50 MB of a result nobody will read")
    elsewhere = ramen_dir / "not-a-result.logbuffer"
    elsewhere.write_bytes(b"")
    sly = request_replay(admin, since_us=0, until_us=90, recipient=str(elsewhere))
    wait_for(lambda: worker_replay(admin, "p/t", channel) and worker_replay(admin, "p/t", sly), what="both wired")

    admin.delete(keyspace.replay_key(channel))
    admin.delete(keyspace.replay_key(sly))
    wait_for(lambda: not result.exists(), what="the result log removed")
    wait_for(lambda: worker_replay(admin, "p/t", sly) is None, what="the second replay torn down")
    assert elsewhere.exists()


def test_a_replayer_that_fails_sets_the_error_of_its_replays(admin, start_supervisor):
    start_supervisor(replayer_mode="crash")
    channel = request_replay(admin)
    value = wait_for(lambda: (v := value_of(admin, keyspace.replay_key(channel))).get("error") and v)
    replayer_id = next(iter(replayers(admin)))
    assert value["error"] == f"replayer {replayer_id} of {SOURCE} died (exit 1)"
    assert not value["lost"]  # an exit on an error of its own: it would fail again
    assert value["target"] == "p/t" and value["recipient"] == str(paths.recipient_log(channel))


def test_a_worker_on_the_path_that_dies_fails_the_replay(admin, start_supervisor):
    set_worker(admin, "p/t")
    start_supervisor()
    pid = wait_for(lambda: value_of(admin, keyspace.function_key(SITE, "p/t", "instance")))["pid"]
    channel = request_replay(admin)
    wait_for(lambda: replayers(admin), what="the replay launched")
    os.kill(pid, signal.SIGKILL)
    value = wait_for(lambda: (v := value_of(admin, keyspace.replay_key(channel))).get("error") and v)
    assert value["error"] == "worker p/t died (killed by signal 9) during the replay"
    assert value["lost"]  # killed under it: asked again, it may succeed


def test_a_chart_of_a_source_is_served_by_its_replayer_and_outlives_the_sources_worker(admin, start_supervisor):
    """A summarised replay of a source goes through no worker (ReplayRequest.served_by_replayer):
    the replayer is its target, so the death of the source's worker fails only the replay of the
    same range that passes through it."""
    set_worker(admin, SOURCE)
    start_supervisor()
    pid = wait_for(lambda: value_of(admin, keyspace.function_key(SITE, SOURCE, "instance")))["pid"]
    plan = ReplayPlan(SOURCE, 0, 100, (SOURCE,), (), (SOURCE,))
    chart = request_replay(admin, plan, summary=Summary(60))
    rows = request_replay(admin, plan)
    (replayer,) = wait_for(lambda: list(replayers(admin).values()), what="the replays launched")
    wait_for(lambda: worker_replay(admin, SOURCE, rows), what="the source's key for the replay of its rows")
    assert worker_replay(admin, SOURCE, chart) is None
    assert [(c["channel"], c.get("recipient")) for c in replayer["channels"]] == [
        (chart, str(paths.recipient_log(chart))), (rows, None)]
    assert replayer["readers"] == 1  # the source's worker, for `rows` only
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: value_of(admin, keyspace.replay_key(rows)).get("error"), what="the death to fail `rows`")
    assert "error" not in value_of(admin, keyspace.replay_key(chart))


def test_a_replay_older_than_its_timeout_is_deleted(admin, start_supervisor):
    supervisor = start_supervisor()
    channel = request_replay(admin, timeout_s=1, created_us=time.time_ns() // 1000 - 2_000_000)
    wait_for(lambda: value_of(admin, keyspace.replay_key(channel)) is None, what="replay deleted")
    assert supervisor.counters.replays_timed_out == 1
    wait_for(lambda: not replayers(admin), what="its replayer torn down")


def test_a_restarted_supervisor_adopts_launched_replays_and_tears_them_down(admin, start_supervisor):
    first = start_supervisor(stop_children=False)
    channel = request_replay(admin)
    rider = request_replay(admin)  # identical: rides on channel, which alone the replayer writes
    replayer = wait_for(lambda: (r := replayers(admin)) and "pid" in (v := next(iter(r.values()))) and v)
    assert channels_of(replayer) == [channel] and replayer["riders"] == [rider]
    first.stop_thread()  # as if it died
    clock = ManualClock()
    second = start_supervisor(clock=clock, thread=False)
    assert second.counters.adopted == 1
    drive(second, lambda: {channel, rider} <= set(second.replays.requests), what="the replays seen")
    clock.advance(1.0)  # past the merge delay (0.3 s): an adopted replay is not launched again, nor its rider
    second.do_work()
    assert second.counters.replayers_spawned == 0 and list(replayers(admin)) == [replayer["id"]]
    assert worker_replay(admin, "p/t", rider) is None
    for done in (rider, channel):  # as the target deletes them: riders first
        admin.delete(keyspace.replay_key(done))
    drive(second, lambda: not replayers(admin) and not pid_alive(replayer["pid"]), what="adopted replayer torn down")


def test_an_adopted_replayer_that_ends_unfinished_fails_its_replay_and_one_that_finished_does_not(
        admin, start_supervisor):
    """A restarted supervisor cannot read an adopted replayer's exit status: the replayer's last
    stats say whether it ended its channels. Without them, the client would wait out its timeout."""
    first = start_supervisor(stop_children=False)
    finished, unfinished = request_replay(admin, since_us=0, until_us=100), request_replay(admin, since_us=500,
                                                                                           until_us=600)
    found = wait_for(lambda: len(r := replayers(admin)) == 2 and all("pid" in v for v in r.values()) and r,
                     what="two replayer keys")
    by_channel = {channels_of(v)[0]: v for v in found.values()}
    first.stop_thread()  # as if it died
    second = start_supervisor()
    wait_for(lambda: second.counters.adopted == 2, what="replayers adopted")
    done = by_channel[finished]
    admin.set(keyspace.replayer_stats_key(SITE, done["id"]), ReplayerStats(10, 1, 1, {finished: 1}, True).to_value())
    for replayer in by_channel.values():
        os.kill(replayer["pid"], signal.SIGKILL)
    value = wait_for(lambda: (v := value_of(admin, keyspace.replay_key(unfinished))).get("error") and v,
                     what="the unfinished replay's error")
    assert value["error"] == (f"replayer {by_channel[unfinished]['id']} of {SOURCE} died "
                              f"(before the end of its range)")
    wait_for(lambda: second.counters.replayer_failures == 1, what="one failure counted")
    assert "error" not in value_of(admin, keyspace.replay_key(finished))


def test_a_replayer_that_died_while_no_supervisor_watched_fails_its_replay_at_adoption(admin, start_supervisor):
    """Found dead by the next supervisor, not finished by its stats: its replay fails at once,
    not after its timeout (seen in the chaos soak: a replayer gave up waiting for its reader while
    the supervisor was down, and its client waited 60 s)."""
    first = start_supervisor(stop_children=False)
    channel = request_replay(admin)
    replayer = wait_for(lambda: (r := replayers(admin)) and "pid" in (v := next(iter(r.values()))) and v)
    first.stop_thread()  # as if it died
    os.kill(replayer["pid"], signal.SIGKILL)
    wait_for(lambda: not pid_alive(replayer["pid"]), what="the replayer gone")

    second = start_supervisor()
    value = wait_for(lambda: (v := value_of(admin, keyspace.replay_key(channel))).get("error") and v,
                     what="the replay's error")
    assert value["error"] == (f"replayer {replayer['id']} of {SOURCE} died before the end of its range, "
                              f"while the supervisor was down")
    assert value["lost"]
    assert second.counters.replayer_failures == 1 and second.counters.adopted == 0


def test_a_replayer_is_started_warm_during_the_delay_and_given_the_merged_channels(admin, start_supervisor):
    supervisor = start_supervisor(delay_before_replay_s=2.0)
    channel = request_replay(admin)
    warm = wait_for(lambda: supervisor.replays.warm, what="a warm replayer")  # before the delay is over
    assert replayers(admin) == {}  # it has no key yet: it is waiting for one
    found = wait_for(lambda: (r := replayers(admin)) and all("pid" in v for v in r.values()) and r,
                     what="the replayer key")
    (replayer,) = found.values()
    assert replayer["pid"] == warm.pid  # the warm process got the channels
    assert channels_of(replayer) == [channel] and supervisor.counters.replayers_spawned == 1


def test_with_spares_a_warm_replayer_waits_before_any_replay_and_another_follows_once_it_ends(admin,
                                                                                              start_supervisor):
    supervisor = start_supervisor(spares=True, delay_before_replay_s=0.1)
    warm = wait_for(lambda: supervisor.replays.warm, what="a replayer started ahead")
    assert replayers(admin) == {} and supervisor.counters.replayers_spawned == 0
    channel = request_replay(admin)
    (replayer,) = wait_for(lambda: (r := replayers(admin)) and all("pid" in v for v in r.values()) and r,
                           what="the replayer key").values()
    assert replayer["pid"] == warm.pid and channels_of(replayer) == [channel]
    assert supervisor.replays.warm is None  # not while the replay runs
    admin.delete(keyspace.replay_key(channel))
    wait_for(lambda: not pid_alive(warm.pid), what="the replayer stopped at teardown")
    follower = wait_for(lambda: supervisor.replays.warm, what="the next replayer started ahead")
    assert follower.pid != warm.pid
    wait_for(lambda: follower.log_path.exists() and "ready" in follower.log_path.read_text(), what="its handlers")
    supervisor.stop_thread()
    supervisor.close(timeout_s=5)
    assert not pid_alive(follower.pid) and not follower.log_path.exists()  # unused: its log said only that it waited
    assert warm.log_path.exists()  # the one that replayed keeps its log


def test_the_next_warm_replayer_waits_until_replays_ended_a_moment_ago(admin, start_supervisor):
    """A replay's client (a dashboard's render) still works on its result right after the replay:
    the next warm replayer's start-up waits QUIET_AFTER_REPLAYS_S, on the supervisor's clock."""
    clock = ManualClock()
    supervisor = start_supervisor(spares=True, delay_before_replay_s=0.1, clock=clock, thread=False)
    warm = drive(supervisor, lambda: supervisor.replays.warm, what="a replayer started ahead")
    channel = request_replay(admin)
    drive(supervisor, lambda: channel in supervisor.replays.requests, what="the request seen")
    clock.advance(0.1)
    drive(supervisor, lambda: replayers(admin), what="the replayer key")
    admin.delete(keyspace.replay_key(channel))
    drive(supervisor, lambda: not supervisor.replays.requests and not supervisor.replays.replayers
          and not pid_alive(warm.pid), what="the replay torn down")
    clock.advance(defaults.QUIET_AFTER_REPLAYS_S - 0.1)
    supervisor.do_work()
    assert supervisor.replays.warm is None and supervisor.replays.busy()
    clock.advance(0.1)
    follower = drive(supervisor, lambda: supervisor.replays.warm, what="the next replayer started ahead")
    assert follower.pid != warm.pid and not supervisor.replays.busy()


def _lose_the_confserver_once_on(supervisor, prefix: str) -> list[str]:
    """The supervisor's next set of a key under prefix raises, as when the confserver dies
    mid-call; the keys it failed on are listed."""
    failed, real_set = [], supervisor.client.set

    def set_(key, value, **options):
        if key.startswith(prefix) and not failed:
            failed.append(key)
            raise confserver.Disconnected("connection to the confserver lost mid-call")
        return real_set(key, value, **options)
    supervisor.client.set = set_
    return failed


def _drive_through_errors(supervisor, condition, what: str):
    def step():
        try:
            supervisor.do_work()
        except confserver.ConfError:
            pass  # the service's loop logs it and goes on
        return condition()
    return wait_for(step, what=what)


def test_a_launch_the_confserver_failed_before_the_wiring_is_retried_and_its_warm_replayer_retires(admin,
                                                                                                 start_supervisor):
    """Seen in the chaos soak: the warm replayer taken, then the confserver killed before the
    workers' keys were written; the launch was retried with another replayer and the first waited
    out its 10 minutes, its log buffer left behind."""
    clock = ManualClock()
    supervisor = start_supervisor(spares=True, delay_before_replay_s=0.1, clock=clock, thread=False)
    warm = drive(supervisor, lambda: supervisor.replays.warm, what="a replayer started ahead")
    warm_id = int(warm.popen.args[warm.popen.args.index("--id") + 1])
    paths.replayer_log(SITE, warm_id).parent.mkdir(parents=True, exist_ok=True)
    paths.replayer_log(SITE, warm_id).write_bytes(b"as the replayer creates it while it waits")
    failed = _lose_the_confserver_once_on(supervisor, keyspace.workers_prefix(SITE))
    channel = request_replay(admin)
    drive(supervisor, lambda: channel in supervisor.replays.requests, what="the request seen")
    clock.advance(0.1)
    found = _drive_through_errors(supervisor, lambda: (r := replayers(admin)) and all("pid" in v for v in r.values())
                                  and r, what="the replayer key")
    assert failed  # the first launch did fail
    (replayer,) = found.values()
    assert replayer["pid"] != warm.pid and channels_of(replayer) == [channel]
    _drive_through_errors(supervisor, lambda: not pid_alive(warm.pid) and warm_id not in supervisor.replays.replayers,
                          what="the replayer taken ahead stopped and removed")
    assert not paths.replayer_log(SITE, warm_id).exists()
    assert "error" not in value_of(admin, keyspace.replay_key(channel))


def test_a_launch_the_confserver_failed_as_it_gave_a_replayer_its_channels_fails_them_lost(admin, start_supervisor):
    """The workers may already follow their keys: the replay is not wired again, it fails `lost`
    (its client asks again), and the replayer taken ahead, which may have read its key, retires."""
    clock = ManualClock()
    supervisor = start_supervisor(spares=True, delay_before_replay_s=0.1, clock=clock, thread=False)
    warm = drive(supervisor, lambda: supervisor.replays.warm, what="a replayer started ahead")
    warm_id = int(warm.popen.args[warm.popen.args.index("--id") + 1])
    failed = _lose_the_confserver_once_on(supervisor, keyspace.replayers_prefix(SITE))
    channel = request_replay(admin)
    drive(supervisor, lambda: channel in supervisor.replays.requests, what="the request seen")
    clock.advance(0.1)
    value = _drive_through_errors(supervisor, lambda: (v := value_of(admin, keyspace.replay_key(channel)))
                                  .get("error") and v, what="the replay's error")
    assert failed == [keyspace.replayer_key(SITE, warm_id)]
    assert value["error"] == f"the confserver failed while replay {channel} was launched" and value["lost"]
    _drive_through_errors(supervisor, lambda: not pid_alive(warm.pid) and warm_id not in supervisor.replays.replayers,
                          what="the replayer taken ahead stopped and removed")
    assert value_of(admin, keyspace.replayer_key(SITE, warm_id)) is None


def test_identical_requests_ride_on_one_channel_and_the_target_writes_to_each(admin, start_supervisor):
    supervisor = start_supervisor(delay_before_replay_s=1.0)
    leader = request_replay(admin)
    riders = [request_replay(admin), request_replay(admin)]
    different = request_replay(admin, since_us=50, until_us=150)  # overlaps: same replayer, its own channel
    found = wait_for(lambda: (r := replayers(admin)) and all("pid" in v for v in r.values()) and r,
                     what="the replayer key")
    (replayer,) = found.values()
    assert channels_of(replayer) == [leader, different]
    target = wait_for(lambda: worker_replay(admin, "p/t", leader), what="the target's key")
    assert [a["channel"] for a in target["also"]] == riders
    assert [a["recipient"] for a in target["also"]] == [str(paths.recipient_log(c)) for c in riders]
    assert all(worker_replay(admin, name, rider) is None for name in ("p/t", "p/src") for rider in riders)
    assert "also" not in worker_replay(admin, "p/t", different)
    admin.delete(keyspace.replay_key(leader))  # the leader gone alone: its riders cannot finish
    for rider in riders:
        wait_for(lambda: (value_of(admin, keyspace.replay_key(rider)) or {}).get("error"), what="the rider's error")
        assert f"rode with replay {leader}" in value_of(admin, keyspace.replay_key(rider))["error"]
    assert supervisor.counters.replayers_spawned == 1


def test_a_replay_through_a_worker_being_stopped_waits_for_its_next_process(admin, start_supervisor, ramen_dir):
    """The old process would read the replay's first rows and exit with them (its successor joins
    the log where the writer is): the replay is wired once that process is gone."""
    set_worker(admin, "p/stubborn")
    clock = ManualClock()
    supervisor = start_supervisor(stop_grace_s=2.0, clock=clock, thread=False)
    instance_key = keyspace.function_key(SITE, "p/stubborn", "instance")
    old = drive(supervisor, lambda: value_of(admin, instance_key), what="the first process")["pid"]
    wait_for(lambda: "ready" in (ramen_dir / "logs" / "workers" / "p" / "stubborn.log").read_text(),
             what="handlers installed")
    set_worker(admin, "p/stubborn", is_used=False)
    drive(supervisor, lambda: supervisor.workers.leaving("p/stubborn")
          and supervisor.workers.running()["p/stubborn"].stopping, what="the stop begun")
    set_worker(admin, "p/stubborn")
    plan = ReplayPlan("p/stubborn", 0, 100, ("p/src",), (("p/src", "p/stubborn"),), ("p/src", "p/stubborn"))
    channel = request_replay(admin, plan)
    drive(supervisor, lambda: channel in supervisor.replays.requests
          and supervisor.workers.workers["p/stubborn"].should_run, what="the replay and the worker wanted again")
    clock.advance(1.0)  # past the merge delay (0.3 s), within the old process's grace (2 s)
    supervisor.do_work()
    assert pid_alive(old) and worker_replay(admin, "p/stubborn", channel) is None and not replayers(admin)

    clock.advance(2.0)  # past its grace: SIGKILL
    drive(supervisor, lambda: worker_replay(admin, "p/stubborn", channel), what="the replay wired")
    assert not pid_alive(old)
    drive(supervisor, lambda: (value_of(admin, instance_key) or {}).get("pid"), what="the next process")


def test_the_duty_cycle_wakes_up_when_the_merge_delay_ends_not_a_poll_interval_later(admin, start_supervisor):
    clock = ManualClock()
    supervisor = start_supervisor(clock=clock, thread=False, delay_before_replay_s=0.5)
    assert supervisor.wait_s() == defaults.POLL_INTERVAL_S  # nothing waits
    channel = request_replay(admin)
    drive(supervisor, lambda: channel in supervisor.replays.requests, what="the request seen")
    clock.advance(0.5 - defaults.POLL_INTERVAL_S / 5)
    assert abs(supervisor.wait_s() - defaults.POLL_INTERVAL_S / 5) < 1e-9  # woken as the delay ends
    supervisor.do_work()
    assert not replayers(admin)  # not due yet
    clock.advance(defaults.POLL_INTERVAL_S / 5)
    assert supervisor.wait_s() == 0.0
    supervisor.do_work()
    assert channels_of(next(iter(replayers(admin).values()))) == [channel]  # launched on time
    assert supervisor.wait_s() == defaults.POLL_INTERVAL_S


def test_a_batch_waits_whole_for_a_worker_being_stopped_and_reads_the_archive_once(admin, start_supervisor,
                                                                                  ramen_dir):
    """A dashboard refreshing right after its previous refresh: one of its replays goes through a
    lazy worker still on its way out. The others wait with it, and the batch gets one replayer."""
    set_worker(admin, "p/stubborn")
    set_worker(admin, "p/t")
    clock = ManualClock()
    supervisor = start_supervisor(stop_grace_s=2.0, clock=clock, thread=False)
    instance_key = keyspace.function_key(SITE, "p/stubborn", "instance")
    drive(supervisor, lambda: value_of(admin, instance_key), what="the first process")
    wait_for(lambda: "ready" in (ramen_dir / "logs" / "workers" / "p" / "stubborn.log").read_text(),
             what="handlers installed")
    set_worker(admin, "p/stubborn", is_used=False)
    drive(supervisor, lambda: supervisor.workers.leaving("p/stubborn"), what="the stop begun")
    set_worker(admin, "p/stubborn")
    through_leaving = request_replay(admin, ReplayPlan("p/stubborn", 0, 100, ("p/src",), (("p/src", "p/stubborn"),),
                                                       ("p/src", "p/stubborn")))
    other = request_replay(admin, CHAIN)
    drive(supervisor, lambda: {through_leaving, other} <= set(supervisor.replays.requests), what="both requests")
    clock.advance(1.0)  # past the merge delay (0.3 s), within the old process's grace (2 s)
    supervisor.do_work()
    assert worker_replay(admin, "p/t", other) is None and not replayers(admin)  # held with the other
    assert supervisor.wait_s() == defaults.POLL_INTERVAL_S  # no deadline while held: the poll looks again

    clock.advance(2.0)  # past its grace: SIGKILL, then both go together
    drive(supervisor, lambda: worker_replay(admin, "p/stubborn", through_leaving) and worker_replay(admin, "p/t", other),
          what="both replays wired")
    assert supervisor.counters.replayers_spawned == 1


MIDDLE = ReplayPlan("p/a", 0, 100, (SOURCE,), ((SOURCE, "p/a"),), ("p/a", SOURCE))
THROUGH = ReplayPlan("p/t", 0, 100, (SOURCE,), (("p/a", "p/t"), (SOURCE, "p/a")), ("p/a", SOURCE, "p/t"))


def test_a_replay_others_go_on_from_keeps_its_keys_for_them_when_its_client_goes_first(admin, start_supervisor):
    """Deleted, its target's key would be gone before a worker starting for the replay read it: the
    worker would never read the inputs, and the replayer would wait for it in vain."""
    supervisor = start_supervisor(delay_before_replay_s=1.0)
    middle, through = request_replay(admin, MIDDLE), request_replay(admin, THROUGH)
    wait_for(lambda: worker_replay(admin, "p/a", through), what="the key going on from middle's target")
    assert worker_replay(admin, "p/a", through)["via"] == middle
    target = wait_for(lambda: worker_replay(admin, "p/a", middle), what="middle's target key")
    assert target["recipient"] == str(paths.recipient_log(middle))
    admin.delete(keyspace.replay_key(middle))
    carried = wait_for(lambda: (v := worker_replay(admin, "p/a", middle)) and v.get("carried") and v,
                       what="middle's target key carried")
    assert WorkerReplay.from_value(carried) == dataclasses.replace(WorkerReplay.from_value(target), recipient=None,
                                                                   carried=True)
    assert supervisor.replays.carried == {middle: {through}}
    admin.delete(keyspace.replay_key(through))
    wait_for(lambda: admin.glob(keyspace.function_key(SITE, "*/*", "replays/*")) == [], what="every key gone")
    assert supervisor.replays.carried == {}

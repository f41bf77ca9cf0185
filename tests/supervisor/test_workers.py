"""The supervisor runs the used workers of its site as processes, and only those."""

from __future__ import annotations

import signal

from ramen import keyspace, supervisor_stats
from ramen.clocks import ManualClock
from ramen.worker_keys import WorkerStats
from supervisor.workers import RestartPolicy
from tests.supervisor.conftest import SITE, drive, pid_alive, set_worker, value_of, wait_for


def instance(admin, name):
    return value_of(admin, keyspace.function_key(SITE, name, "instance"))


def log_text(ramen_dir, name) -> str:
    path = ramen_dir / "logs" / "workers" / f"{name}.log"
    return path.read_text() if path.exists() else ""


def test_used_workers_start_with_their_environment_and_unused_ones_are_stopped(admin, start_supervisor,
                                                                                ramen_dir, fresh_confserver):
    set_worker(admin, "p/a")
    set_worker(admin, "p/b", is_used=False)
    admin.set(keyspace.function_key(SITE, "p/a", "stats"), {"tuples_in": 5})
    supervisor = start_supervisor()
    running = wait_for(lambda: instance(admin, "p/a"), what="p/a's instance key")
    assert running["signature"] == "sig1" and pid_alive(running["pid"])
    assert admin.get(keyspace.function_key(SITE, "p/a", "instance")).ephemeral
    text = wait_for(lambda: log_text(ramen_dir, "p/a"), what="p/a's log")
    assert f"RAMEN_DIR={ramen_dir}" in text and f"RAMEN_CONFSERVER={fresh_confserver.url}" in text
    assert instance(admin, "p/b") is None and supervisor.counters.starts == 1

    set_worker(admin, "p/a", is_used=False)
    wait_for(lambda: instance(admin, "p/a") is None, what="p/a's instance key deleted")
    wait_for(lambda: not pid_alive(running["pid"]), what="p/a stopped")
    runs = wait_for(lambda: value_of(admin, keyspace.function_key(SITE, "p/a", "instances/sig1")))["runs"]
    assert [(r["pid"], r["exit_status"]) for r in runs] == [(running["pid"], 0)]
    # The worker's stats key is the worker's alone: the supervisor records runs in its own key.
    assert value_of(admin, keyspace.function_key(SITE, "p/a", "stats")) == {"tuples_in": 5}
    assert supervisor.counters.stops == 1 and supervisor.counters.crashes == 0


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(admin, start_supervisor, ramen_dir):
    set_worker(admin, "p/stubborn")
    supervisor = start_supervisor(stop_grace_s=0.3)
    running = wait_for(lambda: instance(admin, "p/stubborn"))
    wait_for(lambda: "ready" in log_text(ramen_dir, "p/stubborn"), what="handlers installed")
    set_worker(admin, "p/stubborn", is_used=False)
    wait_for(lambda: not pid_alive(running["pid"]), what="p/stubborn killed")
    runs = wait_for(lambda: value_of(admin, keyspace.function_key(SITE, "p/stubborn", "instances/sig1")))["runs"]
    assert runs[0]["exit_status"] == -signal.SIGKILL
    assert supervisor.counters.kills == 1


def test_a_new_signature_restarts_the_worker(admin, start_supervisor):
    set_worker(admin, "p/a")
    supervisor = start_supervisor()
    first = wait_for(lambda: instance(admin, "p/a"))
    set_worker(admin, "p/a", signature="sig2")
    second = wait_for(lambda: (i := instance(admin, "p/a")) and i["signature"] == "sig2" and i)
    assert second["pid"] != first["pid"] and not pid_alive(first["pid"])
    assert supervisor.counters.starts == 2 and supervisor.counters.restarts == 0


def test_a_crashing_worker_is_restarted_with_backoff_then_quarantined(admin, start_supervisor):
    set_worker(admin, "p/crash")
    policy = RestartPolicy(initial_s=0.05, factor=2.0, quarantine_failures=3, quarantine_window_s=60.0,
                           quarantine_s=600.0)
    clock = ManualClock()
    supervisor = start_supervisor(policy=policy, clock=clock, thread=False)
    drive(supervisor, lambda: clock.advance(0.05) or supervisor.counters.quarantines == 1, what="quarantine")
    record = wait_for(lambda: (v := value_of(admin, keyspace.function_key(SITE, "p/crash", "instances/sig1")))
                      and "quarantined_until_us" in v and v, what="the quarantine recorded")
    assert [r["exit_status"] for r in record["runs"]] == [1, 1, 1]
    assert record["quarantined_until_us"] > clock.epoch_us() + 500e6
    assert supervisor.counters.starts == 3 and supervisor.counters.restarts == 2
    clock.advance(300.0)  # half the quarantine, far past any backoff: no further start
    supervisor.do_work()
    assert supervisor.counters.starts == 3 and instance(admin, "p/crash") is None
    assert supervisor_stats.read(admin, SITE).quarantined == ("p/crash",)


def test_defunct_runs_keep_only_the_last_ten(admin, start_supervisor):
    set_worker(admin, "p/crash")
    policy = RestartPolicy(initial_s=0.01, factor=1.0, quarantine_failures=100)
    supervisor = start_supervisor(policy=policy)
    wait_for(lambda: supervisor.counters.crashes >= 12, what="twelve crashes")
    runs = value_of(admin, keyspace.function_key(SITE, "p/crash", "instances/sig1"))["runs"]
    assert len(runs) == 10
    assert all(r["run_time_s"] >= 0 and r["ended_us"] >= r["started_us"] for r in runs)


def test_a_restarted_supervisor_adopts_running_workers_and_cleans_keys_of_dead_ones(admin, start_supervisor):
    set_worker(admin, "p/a")
    first = start_supervisor(stop_children=False)
    running = wait_for(lambda: instance(admin, "p/a"))
    first.stop_thread()  # as if it died: its session (and so p/a's instance key) lingers a while
    admin.set(keyspace.function_key(SITE, "p/gone", "instance"), {"pid": 2 ** 22 + 12345, "started_us": 1,
                                                                  "signature": "x"})
    second = start_supervisor()
    wait_for(lambda: admin.get(keyspace.function_key(SITE, "p/a", "instance")).owner == "supervisor"
             and second.counters.adopted == 1, what="adoption")
    assert instance(admin, "p/a")["pid"] == running["pid"] and second.counters.starts == 0
    assert instance(admin, "p/gone") is None
    set_worker(admin, "p/a", is_used=False)
    wait_for(lambda: not pid_alive(running["pid"]), what="adopted p/a stopped")


def test_a_supervisor_restarted_after_the_instance_keys_expired_adopts_the_writer_of_each_log(
        admin, start_supervisor):
    """The earlier supervisor's session is over, and its instance keys with it: the process that
    holds a log's writer lock is adopted, with the signature its stats name, and no second writer
    of the log is started."""
    set_worker(admin, "p/a")
    first = start_supervisor(stop_children=False)
    running = wait_for(lambda: instance(admin, "p/a"))
    wait_for(lambda: writer_of("p/a") == running["pid"], what="p/a holding its log")
    admin.set(keyspace.function_key(SITE, "p/a", "stats"), WorkerStats(
        pid=running["pid"], updated_us=0, tuples_in=0, tuples_out=0, late=0, dropped=0, unexpected=0, skipped=0,
        cpu_s=0.0, rss_bytes=0, position_in=0, position_out=0, channels={}, signature="sig1").to_value())
    first.stop_thread()
    first.client.close()  # as if it died long enough ago: its session ended, its ephemeral keys went
    assert instance(admin, "p/a") is None

    second = start_supervisor()
    wait_for(lambda: second.counters.adopted == 1, what="adoption")
    assert instance(admin, "p/a") == {"pid": running["pid"], "started_us": 0, "signature": "sig1"}
    assert writer_of("p/a") == running["pid"] and second.counters.starts == 0
    set_worker(admin, "p/a", is_used=False)
    wait_for(lambda: not pid_alive(running["pid"]), what="adopted p/a stopped")


def writer_of(name: str) -> int | None:
    from ramen import paths
    from ramen.transport.writer_lock import writer_pids
    path = paths.output_log(SITE, name)
    return writer_pids([path]).get(path)


def spare_pids(ramen_dir) -> dict[int, int]:
    """Spare id -> pid, from the spare logs the fake wrote `ready <pid>` into."""
    pids = {}
    for path in (ramen_dir / "logs" / "workers").glob("spare-*.log"):
        words = path.read_text().split()
        if "ready" in words:
            pids[int(path.stem.partition("-")[2])] = int(words[words.index("ready") + 1])
    return pids


def test_a_spare_worker_started_ahead_becomes_the_next_worker_and_another_takes_its_place(
        admin, start_supervisor, ramen_dir):
    supervisor = start_supervisor(spares=True)
    (spare_id, spare_pid), = wait_for(lambda: spare_pids(ramen_dir), what="a spare").items()
    assert supervisor.counters.spares == 1 and supervisor.counters.starts == 0

    set_worker(admin, "p/a")
    running = wait_for(lambda: instance(admin, "p/a"), what="p/a's instance key")
    assert (running["pid"], running["spare"]) == (spare_pid, spare_id)  # no new process
    assigned = value_of(admin, keyspace.spare_key(SITE, spare_id))
    assert assigned["function"] == "p/a"
    assert assigned["log"] == str(ramen_dir / "logs" / "workers" / "p/a.log")
    assert supervisor.counters.starts == 1

    # Once p/a has run a while, a new spare waits for the next worker.
    wait_for(lambda: len(spare_pids(ramen_dir)) == 2, what="the next spare")
    (next_id, next_pid), = ((i, p) for i, p in spare_pids(ramen_dir).items() if i != spare_id)
    assert next_pid != spare_pid and supervisor.counters.spares == 2

    set_worker(admin, "p/a", is_used=False)
    wait_for(lambda: not pid_alive(spare_pid), what="p/a stopped")
    wait_for(lambda: value_of(admin, keyspace.spare_key(SITE, spare_id)) is None, what="the used spare's key deleted")
    supervisor.stop_thread()
    supervisor.close(timeout_s=5)
    assert not pid_alive(next_pid)  # the waiting spare goes with the supervisor
    assert not (ramen_dir / "logs" / "workers" / f"spare-{next_id}.log").exists()  # it only said it waited


def test_a_restarted_supervisor_adopts_a_worker_that_started_as_a_spare(admin, start_supervisor, ramen_dir):
    first = start_supervisor(spares=True, stop_children=False)
    wait_for(lambda: spare_pids(ramen_dir), what="a spare")
    set_worker(admin, "p/a")
    running = wait_for(lambda: instance(admin, "p/a"), what="p/a's instance key")
    assert running["spare"] is not None
    first.stop_thread()
    second = start_supervisor()
    wait_for(lambda: second.counters.adopted == 1, what="adoption")
    assert instance(admin, "p/a")["pid"] == running["pid"] and second.counters.starts == 0
    set_worker(admin, "p/a", is_used=False)
    wait_for(lambda: not pid_alive(running["pid"]), what="adopted p/a stopped")


def test_a_worker_no_longer_used_lingers_and_is_kept_when_used_again(admin, start_supervisor):
    set_worker(admin, "p/lazy")
    clock = ManualClock()
    supervisor = start_supervisor(clock=clock, thread=False, linger_s=10.0)
    running = drive(supervisor, lambda: instance(admin, "p/lazy"), what="p/lazy running")
    state = supervisor.workers.workers["p/lazy"]

    set_worker(admin, "p/lazy", is_used=False)  # its last replay ended
    drive(supervisor, lambda: state.unused_since is not None, what="p/lazy unused")
    clock.advance(9.9)
    supervisor.do_work()
    assert not state.child.stopping and supervisor.counters.stops == 0
    set_worker(admin, "p/lazy")  # a dashboard's next refresh
    drive(supervisor, lambda: state.unused_since is None, what="p/lazy used again")
    clock.advance(60.0)
    supervisor.do_work()
    assert not state.child.stopping and instance(admin, "p/lazy")["pid"] == running["pid"]

    set_worker(admin, "p/lazy", is_used=False)
    drive(supervisor, lambda: state.unused_since is not None, what="p/lazy unused again")
    clock.advance(10.0)
    drive(supervisor, lambda: supervisor.counters.stops == 1, what="p/lazy stopped after lingering")
    wait_for(lambda: not pid_alive(running["pid"]), what="p/lazy's process gone")

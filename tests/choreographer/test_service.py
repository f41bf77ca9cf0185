"""The choreographer service against a real built-in confserver."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading

import pytest

import confserver
from choreographer.service import Choreographer, run
from ramen import keyspace
from ramen.replay.contract import ReplayRequest
from ramen.replay.plan import ReplayPlan
from ramen.tails import TailRequest
from tests import waiting
from tests.choreographer.programs import program

EVENTUALLY_S = 10.0
wait_for = functools.partial(waiting.wait_for, timeout_s=EVENTUALLY_S, poll_s=0.01)
SITE = "s1"
NET = [("traffic", False, []), ("per_minute", True, ["net/traffic"]), ("top", True, ["net/per_minute"]),
       ("other", True, ["net/traffic"])]


@pytest.fixture
def admin(fresh_confserver):
    with confserver.connect(fresh_confserver.url, identity="admin", auth_file=fresh_confserver.auth_file) as c:
        yield c


@pytest.fixture
def choreographer(fresh_confserver):
    client = confserver.connect(fresh_confserver.url, identity="choreographer", auth_file=fresh_confserver.auth_file)
    service = Choreographer(client, SITE)
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(service, stop), daemon=True)
    thread.start()
    yield service
    stop.set()
    thread.join(5)
    service.close()
    client.close()


def workers(admin) -> dict[str, dict]:
    return {keyspace.qualified_name_of(e.key): e.value for e in admin.glob(keyspace.worker_pattern(SITE))}


def used(admin) -> set[str]:
    return {name for name, w in workers(admin).items() if w["is_used"]}


def load(admin, name, functions):
    admin.set(keyspace.program_key(name), program(name, functions).to_dict())


def replay_of_top(site: str = SITE) -> dict:
    """A request for net/top, answered from net/traffic's archive, served by `site`."""
    plan = ReplayPlan("net/top", 0, 1, ("net/traffic",), (("net/per_minute", "net/top"),
                                                          ("net/traffic", "net/per_minute")),
                      ("net/per_minute", "net/top", "net/traffic"))
    return ReplayRequest(plan.target, plan.since_us, plan.until_us, plan, "/nowhere", created_us=0,
                         timeout_s=300.0, no_merge=False, site=site).to_value()


def synced_worker_watch(admin):
    """A watch of the site's worker keys, past the keys that exist: its next event is a change."""
    watch = admin.watch(keyspace.worker_pattern(SITE))
    while watch.next(EVENTUALLY_S).kind is not confserver.EventKind.SYNCED:
        pass
    return watch


def next_write_is_the_marker(admin, watch) -> None:
    """Load a program of one function: the choreographer acts on events in order, so when the next
    worker key written is the marker's, nothing was written before it (no waiting for silence)."""
    load(admin, "marker", [("m", True, [])])
    event = watch.next(EVENTUALLY_S)
    assert (event.kind, event.key) == (confserver.EventKind.CREATED, keyspace.worker_key(SITE, "marker/m"))


def test_one_worker_key_per_function_with_its_place_in_the_graph(admin, choreographer):
    load(admin, "net", NET)
    wait_for(lambda: len(workers(admin)) == 4)
    w = workers(admin)
    assert used(admin) == {"net/traffic"}
    assert w["net/per_minute"]["parents"] == ["net/traffic"]
    assert w["net/traffic"]["children"] == ["net/other", "net/per_minute"]
    assert w["net/top"]["lazy"] and not w["net/top"]["is_used"]
    assert admin.get(keyspace.worker_key(SITE, "net/top")).owner == "choreographer"


def test_a_replay_marks_its_paths_used_and_its_deletion_unmarks_them(admin, choreographer):
    load(admin, "net", NET)
    wait_for(lambda: len(workers(admin)) == 4)
    fast_paths = choreographer.counters.fast_paths
    admin.set(keyspace.replay_key(5), replay_of_top())
    wait_for(lambda: used(admin) == {"net/traffic", "net/per_minute", "net/top"})
    assert choreographer.counters.fast_paths == fast_paths + 1
    assert workers(admin)["net/top"]["replays"] == [5]
    admin.delete(keyspace.replay_key(5))
    wait_for(lambda: used(admin) == {"net/traffic"})
    assert workers(admin)["net/top"]["replays"] == []


def test_a_replay_another_site_serves_marks_nothing_here(admin, choreographer):
    load(admin, "net", NET)
    wait_for(lambda: len(workers(admin)) == 4)
    watch = synced_worker_watch(admin)
    admin.set(keyspace.replay_key(6), replay_of_top(site="elsewhere"))
    next_write_is_the_marker(admin, watch)
    assert used(admin) == {"net/traffic"}


def test_a_request_that_does_not_follow_the_contract_marks_nothing(admin, choreographer):
    load(admin, "net", NET)
    wait_for(lambda: len(workers(admin)) == 4)
    admin.set(keyspace.replay_key(6), {"target": "net/top"})  # no plan: the supervisor fails it
    admin.set(keyspace.replay_key(7), replay_of_top())
    wait_for(lambda: workers(admin)["net/top"]["replays"] == [7])
    assert choreographer.replays[6] is None


def test_a_tail_marks_its_chain_live_until_it_ends(admin, choreographer):
    load(admin, "net", NET)
    wait_for(lambda: len(workers(admin)) == 4)
    # Taken in order: once t1 shows, the two before it were seen and marked nothing.
    admin.set(f"{keyspace.TAILS}/elsewhere", TailRequest("net/per_minute", site="elsewhere").to_value())
    admin.set(f"{keyspace.TAILS}/broken", {"function": "net/per_minute"})
    admin.set(f"{keyspace.TAILS}/t1", TailRequest("net/other", site=SITE).to_value())
    wait_for(lambda: used(admin) == {"net/traffic", "net/other"})
    admin.delete(f"{keyspace.TAILS}/t1")
    wait_for(lambda: used(admin) == {"net/traffic"})


def test_nothing_is_written_when_nothing_changed(admin, choreographer):
    load(admin, "net", NET)
    wait_for(lambda: len(workers(admin)) == 4)
    watch = synced_worker_watch(admin)
    writes, recomputes = choreographer.counters.writes, choreographer.counters.recomputes
    load(admin, "net", NET)  # the same program again
    load(admin, "unrelated", [("x", True, [])])  # one new key, nothing else changes
    event = watch.next(EVENTUALLY_S)
    assert (event.kind, event.key) == (confserver.EventKind.CREATED, keyspace.worker_key(SITE, "unrelated/x"))
    next_write_is_the_marker(admin, watch)
    wait_for(lambda: choreographer.counters.writes >= writes + 2)  # counted just after the write
    assert choreographer.counters.recomputes > recomputes
    assert choreographer.counters.writes == writes + 2


def test_functions_that_no_longer_exist_lose_their_keys(admin, choreographer):
    load(admin, "net", NET)
    wait_for(lambda: len(workers(admin)) == 4)
    load(admin, "net", NET[:2])
    wait_for(lambda: set(workers(admin)) == {"net/traffic", "net/per_minute"})
    admin.delete(keyspace.program_key("net"))
    wait_for(lambda: workers(admin) == {})


def test_an_unreadable_program_is_reported_and_the_rest_goes_on(admin, choreographer):
    admin.set(keyspace.program_key("broken"), {"format": "nonsense"})
    load(admin, "net", NET)
    wait_for(lambda: len(workers(admin)) == 4)
    assert choreographer.counters.bad_programs == 1


def test_ramen_choreographer_runs_as_a_service_until_sigterm(fresh_confserver, admin):
    load(admin, "net", NET)
    env = dict(os.environ, RAMEN_CONFSERVER=fresh_confserver.url, RAMEN_CONFSERVER_AUTH=str(fresh_confserver.auth_file),
               RAMEN_SITE=SITE)
    process = subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "choreographer"], env=env,
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(workers(admin)) == 4, timeout_s=30)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
    assert "choreographer of site s1" in process.stderr.read()


def test_a_restarted_choreographer_leaves_the_worker_keys_as_they_are(fresh_confserver, admin, choreographer):
    """It decides once it has seen every program, replay and tail there is: deciding from the first
    ones, it deleted the other functions' worker keys and wrote them again a moment later, and the
    supervisor stopped their workers in between. Here its first duty cycle gets one program only,
    as a restarted service's could."""
    load(admin, "net", NET)
    load(admin, "more", [("x", False, []), ("y", True, ["more/x"])])
    wait_for(lambda: len(workers(admin)) == 6)
    watch = synced_worker_watch(admin)
    with confserver.connect(fresh_confserver.url, identity="choreographer",
                            auth_file=fresh_confserver.auth_file) as client:
        restarted = Choreographer(client, SITE)
        try:
            events = []
            while sum(event.kind is confserver.EventKind.SYNCED for _, event in events) < len(restarted._watches):
                events.append(restarted.events.get(timeout=EVENTUALLY_S))
            first_program = next(item for item in events if item[0] == keyspace.PROGRAMS)
            restarted.do_work(first_program)
            for item in events:
                if item is not first_program:
                    restarted.events.put(item)
            restarted.do_work()
            assert restarted.counters.recomputes == 1
            assert restarted.counters.writes == 0 and restarted.counters.deletes == 0
            next_write_is_the_marker(admin, watch)
        finally:
            restarted.close()

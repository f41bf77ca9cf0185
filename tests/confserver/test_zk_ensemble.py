"""The confserver's ZooKeeper backend on a three-server ensemble whose leader is killed (SIGKILL).

What a deployment past one machine relies on: an acknowledged write survives the leader's crash,
a client's session (its ephemeral keys, its locks, its watches) survives the failover when it
reconnects to another server within its session timeout, and writes go on under the new leader.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

import confserver
from confserver.errors import Disconnected, LockTimeout
from confserver.model import EventKind
from tests.confserver.zkensemble import ZooKeeperEnsemble
from tests.confserver.zkserver import missing_prerequisite

#: Long enough to outlast an election (well under a second here) and a reconnect, and within
#: what the servers grant (at most 20 ticks of 500 ms).
SESSION_TIMEOUT_S = 8.0
#: A bound on a failover as a client sees it: the election, then its reconnect.
FAILOVER_TIMEOUT_S = 20.0
EVENT_TIMEOUT_S = 5.0
KEYS_WRITTEN = 50
RETRY_POLL_S = 0.05
#: What confserver/zk.py logs when its connection drops: proof that a test went through a reconnect.
RECONNECT_LOG = "connection to zookeeper"

T = TypeVar("T")


@pytest.fixture(scope="module")
def _ensemble(tmp_path_factory):
    reason = missing_prerequisite()
    if reason:
        pytest.skip(f"no ZooKeeper ensemble: {reason}")
    ensemble = ZooKeeperEnsemble(tmp_path_factory.mktemp("zk-ensemble"))
    with ensemble:
        yield ensemble


@pytest.fixture
def ensemble(_ensemble) -> ZooKeeperEnsemble:
    """The module's ensemble with all three members serving (a test before may have killed one)."""
    _ensemble.heal()
    return _ensemble


@pytest.fixture
def make(ensemble, zk_auth_file, request):
    """Clients of the ensemble under a root of the test's own."""
    root = "t-" + re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name)
    made = []

    def make_client(identity: str = "user") -> confserver.ConfClient:
        client = confserver.connect(ensemble.url(root), identity=identity, auth_file=zk_auth_file,
                                    session_timeout_s=SESSION_TIMEOUT_S)
        made.append(client)
        return client

    yield make_client
    for client in made:
        client.close()


def reconnected(caplog) -> bool:
    return any(RECONNECT_LOG in r.getMessage() for r in caplog.records if r.name == "confserver.zk")


def kill_leader(ensemble: ZooKeeperEnsemble) -> int:
    leader = ensemble.leader()
    assert leader is not None, "the ensemble has no leader before the test kills it"
    ensemble.kill(leader)
    return leader.myid


def retry(call: Callable[[], T], timeout_s: float = FAILOVER_TIMEOUT_S) -> T:
    """call() once it stops raising Disconnected (the answer to a call while no server serves:
    it may or may not have been applied), within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except Disconnected:
            if time.monotonic() > deadline:
                raise
        time.sleep(RETRY_POLL_S)


def retry_until(predicate: Callable[[], bool], timeout_s: float = FAILOVER_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(RETRY_POLL_S)


def iter_events(watch: confserver.Watch, n: int) -> list[confserver.Event]:
    events = []
    for _ in range(n):
        event = watch.next(EVENT_TIMEOUT_S)
        assert event is not None, f"only {len(events)} of {n} events came within " \
                                  f"{EVENT_TIMEOUT_S:g} s each: {events}"
        events.append(event)
    return events


def test_acknowledged_writes_survive_killing_the_leader_and_writes_go_on(ensemble, make, caplog):
    caplog.set_level(logging.INFO, logger="confserver.zk")
    client = make()
    for i in range(KEYS_WRITTEN):
        assert client.set(f"acked/k{i}", {"i": i}).value == {"i": i}

    killed = kill_leader(ensemble)

    # Read through the same client, which reconnects to one of the two servers left.
    for i in range(KEYS_WRITTEN):
        assert retry(lambda: client.get(f"acked/k{i}")).value == {"i": i}
    retry(lambda: client.set("after/first", "new leader"))
    for i in range(KEYS_WRITTEN):
        assert client.set(f"after/k{i}", i).value == i
    new_leader = ensemble.leader()
    assert new_leader is not None and new_leader.myid != killed
    assert reconnected(caplog)

    fresh = make()  # a new session sees the same: nothing acknowledged was lost
    assert {e.key: e.value for e in fresh.glob("acked/*")} == {
        f"acked/k{i}": {"i": i} for i in range(KEYS_WRITTEN)}
    assert len(fresh.glob("after/*")) == KEYS_WRITTEN + 1


def test_writes_racing_the_leaders_death_are_either_acknowledged_and_kept_or_disconnected(
        ensemble, make):
    client = make()
    acknowledged: dict[str, int] = {}
    failures: list[Exception] = []
    killed = threading.Event()
    acked_at_kill = [0]
    stop = threading.Event()

    def write_on() -> None:
        i = 0
        deadline = time.monotonic() + FAILOVER_TIMEOUT_S
        while not stop.is_set() and time.monotonic() < deadline:
            key = f"flow/k{i:05d}"
            try:
                acknowledged[key] = client.set(key, i).value
            except Disconnected:
                pass  # no answer: it may or may not have been applied
            except Exception as e:  # anything else leaking out of a failover is a bug
                failures.append(e)
                return
            i += 1
            if killed.is_set() and len(acknowledged) >= acked_at_kill[0] + KEYS_WRITTEN:
                return

    writer = threading.Thread(target=write_on)
    writer.start()
    retry_until(lambda: len(acknowledged) >= KEYS_WRITTEN)
    kill_leader(ensemble)
    acked_at_kill[0] = len(acknowledged)  # acknowledged from here on: after the leader died
    killed.set()
    writer.join(FAILOVER_TIMEOUT_S + SESSION_TIMEOUT_S)
    stop.set()
    writer.join()
    assert failures == []
    assert len(acknowledged) >= acked_at_kill[0] + KEYS_WRITTEN  # writes went on after the kill

    stored = {e.key: e.value for e in make().glob("flow/*")}
    assert {k: stored.get(k) for k in acknowledged} == acknowledged


def test_an_ephemeral_key_stays_and_a_watch_keeps_delivering_across_the_failover(ensemble, make,
                                                                                  caplog):
    caplog.set_level(logging.INFO, logger="confserver.zk")
    owner = make()
    owner.create("live/owner", "here", ephemeral=True)
    watch = owner.watch("events")
    assert [e.kind for e in iter_events(watch, 1)] == [EventKind.SYNCED]

    kill_leader(ensemble)
    retry(lambda: owner.set("seen/owner", "reconnected"))  # the same session, or SessionExpired
    assert reconnected(caplog)

    other = make()
    entry = other.get("live/owner")
    assert (entry.value, entry.ephemeral) == ("here", True)
    for i in range(10):
        other.set(f"events/e{i}", i)
        (event,) = iter_events(watch, 1)
        assert (event.kind, event.key, event.entry.value) == (EventKind.CREATED, f"events/e{i}", i)


def test_a_lock_held_across_the_failover_stays_with_its_owner(ensemble, make, caplog):
    caplog.set_level(logging.INFO, logger="confserver.zk")
    owner = make("supervisor")
    lock = owner.lock("jobs/one", timeout_s=EVENT_TIMEOUT_S)

    kill_leader(ensemble)
    retry(lambda: owner.set("seen/owner", "reconnected"))
    assert reconnected(caplog)

    rival = make("choreographer")
    with pytest.raises(LockTimeout, match="held by supervisor"):
        rival.lock("jobs/one", timeout_s=1.0)
    lock.release()
    with rival.lock("jobs/one", timeout_s=EVENT_TIMEOUT_S) as taken:
        assert taken.held

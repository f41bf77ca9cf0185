"""The confserver's ZooKeeper backend against a real ZooKeeper server.

The `check_*` functions take a `make` factory (make(identity="user", **connect_kwargs) returns a
connected client under a root of its own) and hold for any backend; the `test_*` functions run
them here and add what only ZooKeeper can show (its own ACL refusals, server kill -9 and restart).
Where ZooKeeper's semantics differ from the built-in server's (docs/confserver-zookeeper.md), the
test says so in its name.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

import confserver
from confserver import auth
from confserver.errors import (
    BadRequest,
    Disconnected,
    KeyExists,
    LockTimeout,
    NoSuchKey,
    PermissionDenied,
    SessionExpired,
    VersionMismatch,
)
from confserver.model import MAX_VALUE_BYTES, EventKind
from tests.confserver.zkserver import TcpProxy, free_port

EVENT_TIMEOUT_S = 5.0
#: Short sessions make a kill -9'd client's ephemeral keys and locks go in about 2 s.
SHORT_SESSION_S = 2.0

# A client process for the kill -9 cases: connects, does one thing, says "ready" and waits.
CHILD = r"""
import sys, time, confserver
url, auth_file, action, key, session_s, count = sys.argv[1:7]
c = confserver.connect(url, identity="user", auth_file=auth_file, session_timeout_s=float(session_s))
if action == "lock":
    c.lock(key)
elif action == "ephemeral":
    c.create(key, "alive", ephemeral=True)
elif action == "sequence":
    print(" ".join(str(c.next_sequence(key)) for _ in range(int(count))), flush=True)
    c.close()
    sys.exit(0)
print("ready", flush=True)
time.sleep(60)
"""


# -- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def auth_file(tmp_path_factory):
    """An auth file with a token for each standard identity and the default rules."""
    path = tmp_path_factory.mktemp("zk-auth") / auth.AUTH_FILE_NAME
    auth.load_or_create(path)
    return path


@pytest.fixture
def root(request) -> str:
    """A root path of the test's own, so tests never see each other's keys."""
    return "t-" + re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name)


@pytest.fixture
def make(zookeeper, auth_file, root):
    made = []

    def make_client(identity: str | None = "user", **kwargs) -> confserver.ConfClient:
        kwargs.setdefault("auth_file", auth_file)
        client = confserver.connect(zookeeper.url(root), identity=identity, **kwargs)
        made.append(client)
        return client

    yield make_client
    for client in made:
        client.close()


def start_child(url: str, auth_file, action: str, key: str, session_s: float = SHORT_SESSION_S,
                count: int = 0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, url, str(auth_file), action, key,
                             str(session_s), str(count)], stdout=subprocess.PIPE, text=True)


def wait_ready(child: subprocess.Popen) -> None:
    line = child.stdout.readline().strip()
    assert line == "ready", f"child said {line!r} (exit {child.poll()})"


def kill9(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait()


def take(watch, n: int) -> list:
    events = []
    for _ in range(n):
        event = watch.next(EVENT_TIMEOUT_S)
        assert event is not None, f"only {len(events)} of {n} events came: {events}"
        events.append(event)
    return events


def kinds(events) -> list[tuple[EventKind, str]]:
    return [(e.kind, e.key) for e in events]


def wait_until(predicate, timeout_s: float, poll_s: float = 0.05) -> float:
    """Seconds until predicate() held; fails after timeout_s."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, "condition not met in time"
        time.sleep(poll_s)
    return time.monotonic() - start


# -- backend-independent cases -------------------------------------------------------------------

def check_create_get_set_update_delete(make):
    c = make()
    created = c.create("programs/p1", {"source": "x"})
    assert (created.key, created.value, created.version, created.owner) == \
        ("programs/p1", {"source": "x"}, 0, "user")
    assert c.get("programs/p1") == created
    with pytest.raises(KeyExists, match="programs/p1"):
        c.create("programs/p1", 2)
    assert c.set("programs/p1", 3).version == 1
    assert c.set("programs/p2", 4).version == 0
    assert c.update("programs/p1", 5).version == 2
    with pytest.raises(NoSuchKey, match="programs/none"):
        c.update("programs/none", 1)
    with pytest.raises(VersionMismatch, match="programs/p1"):
        c.update("programs/p1", 6, version=1)
    assert c.update("programs/p1", 6, version=2).value == 6
    with pytest.raises(VersionMismatch):
        c.delete("programs/p1", version=0)
    c.delete("programs/p1", version=3)
    with pytest.raises(NoSuchKey):
        c.get("programs/p1")
    with pytest.raises(NoSuchKey):
        c.delete("programs/p1")
    assert c.get_or_none("programs/p1") is None
    assert c.get("programs/p2").value == 4


def check_keys_above_others_hold_no_value_until_given_one(make):
    c = make()
    c.create("a/b/c", 1)
    with pytest.raises(NoSuchKey):
        c.get("a/b")
    with pytest.raises(NoSuchKey):
        c.update("a/b", 1)
    assert c.children("a") == ["b"]
    assert [e.key for e in c.glob("a")] == ["a/b/c"]
    c.create("a/b", "mid")
    assert c.get("a/b").value == "mid"
    with pytest.raises(KeyExists):
        c.create("a/b", "again")
    c.delete("a/b")  # its value goes, its children stay
    with pytest.raises(NoSuchKey):
        c.get("a/b")
    assert c.get("a/b/c").value == 1
    c.delete("a/b/c")  # and the empty keys above go with the last one below them
    assert c.children("a") == []
    assert c.glob("**") == []


def check_delete_tree_counts_the_values_it_removed(make):
    c = make()
    for key in ("x", "x/1", "x/2/3", "y"):
        c.create(key, key)
    assert c.delete_tree("x") == 3
    assert [e.key for e in c.glob("**")] == ["y"]
    assert c.delete_tree("x") == 0


def check_children_and_glob(make):
    c = make("admin")
    for site in ("s1", "s2"):
        for func in ("f", "g"):
            c.set(f"sites/{site}/workers/p/{func}/worker", {"site": site})
            c.set(f"sites/{site}/workers/p/{func}/stats", 0)
    c.set("replays/7", {})
    assert c.children("sites") == ["s1", "s2"]
    assert c.children("sites/s1/workers/p") == ["f", "g"]
    assert c.children("nothing/here") == []
    workers = c.glob("sites/*/workers/*/*/worker")
    assert [e.key for e in workers] == [f"sites/{s}/workers/p/{f}/worker"
                                        for s in ("s1", "s2") for f in ("f", "g")]
    assert [e.key for e in c.glob("sites/s2/**/stats")] == ["sites/s2/workers/p/f/stats",
                                                             "sites/s2/workers/p/g/stats"]
    assert [e.key for e in c.glob("replays")] == ["replays/7"]
    assert len(c.glob("**")) == 9


def check_two_clients_racing_on_compare_and_set_one_wins_each_version(make):
    first, second = make(), make()
    first.create("counter", 0)
    rounds = 15
    barrier = threading.Barrier(2)
    wins = {id(first): 0, id(second): 0}

    def race(client):
        for _ in range(rounds):
            barrier.wait()
            entry = client.get("counter")
            barrier.wait()  # both now hold the same version
            try:
                client.update("counter", entry.value + 1, version=entry.version)
                wins[id(client)] += 1
            except VersionMismatch:
                pass

    threads = [threading.Thread(target=race, args=(c,)) for c in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = first.get("counter")
    assert sum(wins.values()) == rounds == final.value == final.version


def check_watch_gives_existing_sorted_then_synced_then_changes(make):
    c, writer = make(), make()
    c.create("w/b", 1)
    c.create("w/a", 1)
    c.create("elsewhere", 1)
    watch = c.watch("w")
    events = take(watch, 3)
    assert kinds(events) == [(EventKind.EXISTING, "w/a"), (EventKind.EXISTING, "w/b"),
                             (EventKind.SYNCED, "")]
    writer.update("w/a", 2)
    writer.update("w/b", 2)
    writer.set("elsewhere", 2)
    assert kinds(take(watch, 2)) == [(EventKind.UPDATED, "w/a"), (EventKind.UPDATED, "w/b")]
    writer.create("w/c", 1)
    [created] = take(watch, 1)
    assert (created.kind, created.key, created.entry.value) == (EventKind.CREATED, "w/c", 1)
    writer.delete("w/a")
    [deleted] = take(watch, 1)
    assert (deleted.kind, deleted.key, deleted.entry.value) == (EventKind.DELETED, "w/a", 2)
    watch.close()
    assert watch.next(0.1) is None


def check_watch_on_a_glob_follows_only_matching_keys(make):
    c, writer = make(), make("admin")
    watch = c.watch("sites/*/workers/*/*/worker")
    assert kinds(take(watch, 1)) == [(EventKind.SYNCED, "")]
    writer.set("sites/s1/workers/p/f/stats", 1)
    writer.set("sites/s1/workers/p/f/worker", {"used": True})
    [event] = take(watch, 1)
    assert (event.kind, event.key) == (EventKind.CREATED, "sites/s1/workers/p/f/worker")
    assert watch.next(0.2) is None


def check_watch_events_of_one_key_come_in_commit_order(make):
    c, writer = make(), make()
    watch = c.watch("k")
    take(watch, 1)
    writer.create("k", 0)
    for i in range(1, 20):
        writer.update("k", i)
    writer.delete("k")
    events = []
    while not events or events[-1].kind != EventKind.DELETED:
        events.append(take(watch, 1)[0])
    assert events[0].kind == EventKind.CREATED
    assert all(e.kind == EventKind.UPDATED for e in events[1:-1])
    versions = [e.entry.version for e in events]
    assert versions == sorted(versions) and len(set(versions[:-1])) == len(versions) - 1
    assert events[-1].entry.value == 19


def check_sequences_are_distinct_and_never_zero_under_concurrency(make, extra_numbers=()):
    clients = [make(), make()]
    got: list[int] = []
    guard = threading.Lock()

    def draw(client):
        mine = [client.next_sequence("replays/ids") for _ in range(20)]
        with guard:
            got.extend(mine)

    threads = [threading.Thread(target=draw, args=(c,)) for c in clients for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    numbers = got + list(extra_numbers())
    assert 0 not in numbers
    assert sorted(numbers) == list(range(1, len(numbers) + 1))


def check_lock_contention_timeout_and_nesting(make):
    first, second = make(), make()
    held = first.lock("workers/p")
    start = time.monotonic()
    with pytest.raises(LockTimeout, match="workers/p"):
        second.lock("workers/p", timeout_s=0.3)
    assert 0.25 < time.monotonic() - start < 2.0
    nested = first.lock("workers/p")  # same session: nests, does not wait for itself
    nested.release()
    with pytest.raises(LockTimeout):
        second.lock("workers/p", timeout_s=0.2)
    got = []
    waiter = threading.Thread(target=lambda: got.append(second.lock("workers/p", timeout_s=5)))
    waiter.start()
    time.sleep(0.2)
    assert not got  # still waiting in line
    held.release()
    waiter.join()
    assert got and got[0].held
    with pytest.raises(LockTimeout):
        first.lock("workers/p", timeout_s=0.2)
    got[0].release()
    with first.lock_all(["b", "a", "workers/p"]) as all_three:
        assert all_three.keys == ("a", "b", "workers/p")
        with pytest.raises(LockTimeout):
            second.lock("b", timeout_s=0.1)
    second.lock("b", timeout_s=1).release()


def check_ephemeral_key_goes_with_its_session(make):
    owner, other = make(), make()
    entry = owner.create("instances/1", {"pid": 1}, ephemeral=True)
    assert entry.ephemeral and not owner.set("instances/2", 1).ephemeral
    assert other.get("instances/1").ephemeral
    owner.close()
    with pytest.raises(NoSuchKey):
        other.get("instances/1")
    assert other.get("instances/2").value == 1


def check_values_that_are_too_large_or_not_json_are_refused(make):
    c = make()
    with pytest.raises(BadRequest, match="limit"):
        c.set("big", "x" * MAX_VALUE_BYTES)
    with pytest.raises(BadRequest, match="JSON"):
        c.set("odd", {1, 2})
    with pytest.raises(BadRequest):
        c.set("bad key", 1)
    with pytest.raises(NoSuchKey):
        c.get("big")
    assert c.set("small", "x" * 1000).version == 0  # and the server carries on


def check_anonymous_clients_may_request_replays_only(make):
    anonymous = make(identity=None)
    assert anonymous.identity == "anonymous"
    assert anonymous.create("replays/1", {"since": 0}).owner == "anonymous"
    with pytest.raises(PermissionDenied, match="anonymous may not write programs/p"):
        anonymous.set("programs/p", 1)
    assert anonymous.get("replays/1").value == {"since": 0}


def check_only_the_choreographer_writes_worker_keys(make):
    choreographer, worker = make("choreographer"), make("worker")
    key = "sites/s1/workers/p/f/worker"
    choreographer.set(key, {"is_used": True})
    with pytest.raises(PermissionDenied, match=f"worker may not write {key}"):
        worker.update(key, {"is_used": False})
    with pytest.raises(PermissionDenied, match=f"worker may not delete {key}"):
        worker.delete(key)
    worker.set("sites/s1/workers/p/f/stats", {"runs": 1})
    assert choreographer.get(key).value == {"is_used": True}


CONTRACT = [check_create_get_set_update_delete,
            check_keys_above_others_hold_no_value_until_given_one,
            check_delete_tree_counts_the_values_it_removed,
            check_children_and_glob,
            check_two_clients_racing_on_compare_and_set_one_wins_each_version,
            check_watch_gives_existing_sorted_then_synced_then_changes,
            check_watch_on_a_glob_follows_only_matching_keys,
            check_watch_events_of_one_key_come_in_commit_order,
            check_lock_contention_timeout_and_nesting,
            check_ephemeral_key_goes_with_its_session,
            check_values_that_are_too_large_or_not_json_are_refused,
            check_anonymous_clients_may_request_replays_only,
            check_only_the_choreographer_writes_worker_keys]


@pytest.mark.parametrize("check", CONTRACT, ids=lambda f: f.__name__.removeprefix("check_"))
def test_contract(check, make):
    check(make)


# -- ZooKeeper specifics -------------------------------------------------------------------------

def test_keys_are_znodes_under_the_root_with_json_envelopes_and_locks_beside_it(zookeeper, make, root):
    c = make()
    c.set("a/b", [1, 2])
    c.lock("a/b")
    raw = KazooClient(hosts=zookeeper.hosts)
    raw.start()
    try:
        data, stat = raw.get(f"/{root}/a/b")
        assert json.loads(data) == {"owner": "user", "value": [1, 2]} and stat.version == 0
        assert raw.get(f"/{root}/a")[0] == b""
        assert len(raw.get_children(f"/{root}~locks/a/b")) == 1
    finally:
        raw.stop()
        raw.close()


def test_a_key_given_a_value_above_others_starts_at_the_znode_version_not_0(make):
    c = make()
    c.create("parent/child", 1)
    assert c.create("parent", 1).version == 1  # the znode was written once already, empty
    assert c.update("parent", 2, version=1).version == 2


def test_zookeeper_itself_refuses_a_worker_key_to_a_client_with_permissive_rules(
        zookeeper, make, tmp_path, auth_file):
    """A client whose own rules would allow it is still refused: the ACL on the znode decides."""
    key = "sites/s1/workers/p/f/worker"
    make("choreographer").set(key, 1)
    config = auth.load(auth_file)
    permissive = tmp_path / "permissive.json"
    permissive.write_text(json.dumps({"tokens": config.to_json()["tokens"],
                                      "rules": [{"pattern": "", "write": ["*"], "delete": ["*"]}]}))
    rogue = make("worker", auth_file=permissive)
    with pytest.raises(PermissionDenied, match=f"worker may not write {key} .*ZooKeeper"):
        rogue.update(key, 2)
    raw = KazooClient(hosts=zookeeper.hosts,
                      auth_data=[("digest", f"worker:{config.token_of('worker')}")])
    raw.start()
    try:
        with pytest.raises(NoAuthError):
            raw.set(f"/{rogue._url.root}/{key}", b'{"owner":"worker","value":2}')
    finally:
        raw.stop()
        raw.close()
    assert rogue.get(key).value == 1


def test_an_unknown_token_is_refused_at_connect(zookeeper, auth_file, root):
    with pytest.raises(PermissionDenied, match="unknown token"):
        confserver.connect(zookeeper.url(root), token="not-a-token", auth_file=auth_file)


def test_an_unreachable_server_raises_disconnected_within_the_connect_timeout():
    start = time.monotonic()
    with pytest.raises(Disconnected, match="did not answer within 1 s"):
        confserver.connect(f"zk://127.0.0.1:{free_port()}/x", connect_timeout_s=1.0,
                           auth_file="/nonexistent")
    assert time.monotonic() - start < 2.5


def test_a_lock_is_released_when_its_holder_is_killed(zookeeper, make, root, auth_file):
    child = start_child(zookeeper.url(root), auth_file, "lock", "jobs/1")
    try:
        wait_ready(child)
        c = make()
        with pytest.raises(LockTimeout):
            c.lock("jobs/1", timeout_s=0.2)
        kill9(child)
        start = time.monotonic()
        with c.lock("jobs/1", timeout_s=10):
            waited = time.monotonic() - start
        assert 0.5 < waited < SHORT_SESSION_S + 3  # after the dead session times out, not before
    finally:
        kill9(child)


def test_an_ephemeral_key_goes_after_its_creator_is_killed(zookeeper, make, root, auth_file):
    c = make()
    watch = c.watch("instances")
    take(watch, 1)
    child = start_child(zookeeper.url(root), auth_file, "ephemeral", "instances/w1")
    try:
        wait_ready(child)
        assert kinds(take(watch, 1)) == [(EventKind.CREATED, "instances/w1")]
        kill9(child)
        start = time.monotonic()
        [gone] = take(watch, 1)
        assert (gone.kind, gone.key, gone.entry.value) == (EventKind.DELETED, "instances/w1", "alive")
        assert time.monotonic() - start < SHORT_SESSION_S + 3
        assert c.get_or_none("instances/w1") is None
    finally:
        kill9(child)


def test_sequences_are_distinct_across_threads_and_processes(zookeeper, make, root, auth_file):
    children = [start_child(zookeeper.url(root), auth_file, "sequence", "replays/ids", count=20)
                for _ in range(2)]

    def from_processes():
        numbers = []
        for child in children:
            out, _ = child.communicate(timeout=30)
            assert child.returncode == 0
            numbers.extend(int(n) for n in out.split())
        return numbers

    check_sequences_are_distinct_and_never_zero_under_concurrency(make, from_processes)


def test_no_acknowledged_write_is_lost_when_the_server_is_killed_and_the_watch_carries_on(
        zookeeper, make):
    watcher, writer = make(session_timeout_s=10), make(session_timeout_s=10)
    writer.create("state", 0)
    watch = watcher.watch("state")
    take(watch, 2)
    acked: dict[str, int] = {}
    stop = threading.Event()

    def write():
        i = 0
        while not stop.is_set():
            i += 1
            try:
                writer.set(f"log/{i:05d}", i)
                acked[f"log/{i:05d}"] = i
            except Disconnected:
                pass  # may or may not have been applied: not counted

    thread = threading.Thread(target=write)
    thread.start()
    try:
        wait_until(lambda: len(acked) >= 50, 10)
        zookeeper.kill()
        before_restart = len(acked)
        time.sleep(0.5)
        zookeeper.restart()
        wait_until(lambda: len(acked) >= before_restart + 50, 20)
    finally:
        stop.set()
        thread.join()
        zookeeper.restart()  # in case an assertion fired while it was down
    assert {e.key: e.value for e in writer.glob("log/*")}.items() >= acked.items()
    writer.update("state", 1)
    [event] = take(watch, 1)
    assert (event.kind, event.key, event.entry.value) == (EventKind.UPDATED, "state", 1)


@pytest.fixture
def proxy(zookeeper):
    proxy = TcpProxy(zookeeper.port).start()
    yield proxy
    proxy.close()


def test_a_watch_cut_off_from_the_server_gets_what_changed_meanwhile_on_reconnect(
        proxy, make, root, auth_file):
    writer = make()
    writer.create("w/a", 1)
    writer.create("w/b", 1)
    follower = confserver.connect(f"zk://127.0.0.1:{proxy.port}/{root}", identity="user",
                                  auth_file=auth_file, session_timeout_s=6)
    try:
        watch = follower.watch("w")
        take(watch, 3)
        proxy.cut()
        writer.update("w/a", 2)
        writer.delete("w/b")
        writer.create("w/c", 1)
        time.sleep(0.5)
        assert watch.drain() == []
        proxy.heal()
        changes = {(e.kind, e.key, e.entry.value) for e in take(watch, 3)}
        assert changes == {(EventKind.UPDATED, "w/a", 2), (EventKind.DELETED, "w/b", 1),
                           (EventKind.CREATED, "w/c", 1)}
        assert follower.get("w/c").value == 1  # and the session is the same one
    finally:
        follower.close()


def test_a_client_cut_off_longer_than_its_session_raises_session_expired(proxy, make, root,
                                                                         auth_file):
    writer = make()
    client = confserver.connect(f"zk://127.0.0.1:{proxy.port}/{root}", identity="user",
                                auth_file=auth_file, session_timeout_s=SHORT_SESSION_S)
    try:
        client.create("mine", 1, ephemeral=True)
        proxy.cut()
        wait_until(lambda: writer.get_or_none("mine") is None, SHORT_SESSION_S + 5)
        proxy.heal()
        with pytest.raises(SessionExpired, match="open a new client"):
            wait_until(lambda: client.get_or_none("mine") is not None, SHORT_SESSION_S + 5)
    finally:
        client.close()

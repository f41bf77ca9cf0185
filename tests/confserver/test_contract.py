"""One contract for every confserver backend: the built-in server and ZooKeeper, both real servers.

Each test works under its own key prefix (`ns`), so tests share a server without seeing each
other; tests that kill the server get their own.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import time
import uuid

import pytest

import confserver
from confserver import EventKind
from tests import waiting
from tests.confserver.backends import BACKENDS, Backend, BuiltinBackend, ZkBackend
from tests.confserver.builtin import BuiltinServer

#: Generous bound on "eventually" for things that happen after a session timeout.
EVENTUALLY_S = 15.0
wait_for = functools.partial(waiting.wait_for, timeout_s=EVENTUALLY_S, poll_s=0.05)


@pytest.fixture(params=BACKENDS)
def backend(request) -> Backend:
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture
def ns() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def client(backend):
    with backend.client() as c:
        yield c


def events_until_synced(watch) -> list:
    out = []
    while True:
        event = watch.next(EVENTUALLY_S)
        assert event is not None, f"no SYNCED event; got {out}"
        if event.kind is EventKind.SYNCED:
            return out
        out.append(event)


def spawn_client(backend: Backend, action: str, key: str, *extra: str, identity: str = "admin"):
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.confserver.client_proc", backend.url, str(backend.auth_file), identity,
         action, key, *extra], stdout=subprocess.PIPE, text=True)
    return process


def wait_ready(process) -> None:
    line = process.stdout.readline()
    assert line.strip() == "ready", f"client process said {line!r}"


# -- keys and values ----------------------------------------------------------------------------

def test_set_then_get_returns_the_value_version_and_owner(client, ns):
    entry = client.set(f"{ns}/a", {"x": [1, 2.5, "s", None, True]})
    assert entry.version == 0 and entry.owner == "admin"
    got = client.get(f"{ns}/a")
    assert got.value == {"x": [1, 2.5, "s", None, True]} and got.version == 0
    assert client.set(f"{ns}/a", 2).version == 1
    assert client.get(f"{ns}/a").value == 2


def test_get_of_a_missing_key_raises_no_such_key(client, ns):
    with pytest.raises(confserver.NoSuchKey, match=f"{ns}/nope"):
        client.get(f"{ns}/nope")
    assert client.get_or_none(f"{ns}/nope") is None


def test_create_refuses_an_existing_key(client, ns):
    client.create(f"{ns}/a", 1)
    with pytest.raises(confserver.KeyExists, match=f"{ns}/a"):
        client.create(f"{ns}/a", 2)
    assert client.get(f"{ns}/a").value == 1


def test_update_needs_the_key_and_compares_the_version(client, ns):
    with pytest.raises(confserver.NoSuchKey):
        client.update(f"{ns}/a", 1)
    client.create(f"{ns}/a", 1)
    assert client.update(f"{ns}/a", 2, version=0).version == 1
    with pytest.raises(confserver.VersionMismatch):
        client.update(f"{ns}/a", 3, version=0)
    assert client.get(f"{ns}/a").value == 2


def test_delete_with_version_and_delete_tree(client, ns):
    for key in ("a", "a/b", "a/b/c", "a/d", "e"):
        client.set(f"{ns}/{key}", key)
    with pytest.raises(confserver.VersionMismatch):
        client.delete(f"{ns}/e", version=5)
    client.delete(f"{ns}/e", version=0)
    with pytest.raises(confserver.NoSuchKey):
        client.delete(f"{ns}/e")
    assert client.delete_tree(f"{ns}/a") == 4
    assert client.glob(f"{ns}/**") == []


def test_discard_deletes_a_key_if_it_is_there(client, ns):
    client.set(f"{ns}/a", 1)
    assert client.discard(f"{ns}/a") is True
    assert client.get_or_none(f"{ns}/a") is None
    assert client.discard(f"{ns}/a") is False


def test_children_and_glob_see_intermediate_levels(client, ns):
    for key in ("sites/s1/workers/p/f/worker", "sites/s1/workers/p/g/worker", "sites/s2/x"):
        client.set(f"{ns}/{key}", key)
    assert client.children(f"{ns}/sites") == ["s1", "s2"]
    assert client.children(f"{ns}/sites/s1/workers/p") == ["f", "g"]
    assert client.children(f"{ns}/nothing") == []
    workers = client.glob(f"{ns}/sites/*/workers/*/*/worker")
    assert [e.key for e in workers] == [f"{ns}/sites/s1/workers/p/f/worker", f"{ns}/sites/s1/workers/p/g/worker"]
    assert [e.key for e in client.glob(f"{ns}/sites/**/x")] == [f"{ns}/sites/s2/x"]
    assert len(client.glob(f"{ns}/sites")) == 3  # a prefix: everything below


@pytest.mark.parametrize("key", ["", "a//b", "../etc", "a/./b", "a b", "x" * 2000])
def test_malformed_keys_are_refused(client, key):
    with pytest.raises(confserver.BadRequest):
        client.set(key, 1)


def test_oversized_and_unserialisable_values_are_refused(client, ns):
    with pytest.raises(confserver.BadRequest, match="limit"):
        client.set(f"{ns}/big", "x" * (confserver.model.MAX_VALUE_BYTES + 1))
    with pytest.raises(confserver.BadRequest):
        client.set(f"{ns}/obj", object())
    assert client.get_or_none(f"{ns}/big") is None


def nested(depth: int):
    value = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def test_values_nested_deeper_than_the_bound_are_refused(client, ns):
    depth = confserver.model.MAX_VALUE_DEPTH
    client.set(f"{ns}/deepest", {"a": nested(depth - 1)})
    assert client.get(f"{ns}/deepest").value == {"a": nested(depth - 1)}
    for too_deep in ({"a": nested(depth)}, nested(10 * sys.getrecursionlimit())):
        with pytest.raises(confserver.BadRequest, match=f"nested deeper than the {depth}-level limit"):
            client.set(f"{ns}/deeper", too_deep)
    assert client.get_or_none(f"{ns}/deeper") is None


#: Larger than the built-in server's frame (576 KiB), many times over: these replies need several.
WIDE_KEYS = 700
WIDE_NAME_CHARS = 1000
BIG_VALUES = 4
BIG_VALUE_CHARS = 400_000


def test_replies_larger_than_a_frame_come_whole(backend, client, ns):
    names = sorted(f"{i:04d}" + "n" * (WIDE_NAME_CHARS - 4) for i in range(WIDE_KEYS))
    threads = [threading.Thread(target=lambda part=part: _set_all(backend, ns, part)) for part in (names[::2], names[1::2])]
    for t in threads:
        t.start()
    for i in range(BIG_VALUES):
        client.set(f"{ns}/big/{i}", f"{i}" * BIG_VALUE_CHARS)
    for t in threads:
        t.join()
    assert client.children(f"{ns}/wide") == names
    big = client.glob(f"{ns}/big/*")
    assert [(e.key, e.value) for e in big] == [(f"{ns}/big/{i}", f"{i}" * BIG_VALUE_CHARS) for i in range(BIG_VALUES)]
    assert len(client.glob(ns)) == WIDE_KEYS + BIG_VALUES
    watch = client.watch(ns)
    existing = events_until_synced(watch)
    assert sorted(e.key for e in existing) == sorted([f"{ns}/wide/{n}" for n in names]
                                                     + [f"{ns}/big/{i}" for i in range(BIG_VALUES)])
    assert all(e.kind is EventKind.EXISTING for e in existing)
    with backend.client() as writer:
        writer.set(f"{ns}/big/0", "changed")
        writer.delete(f"{ns}/big/1")
        writer.create(f"{ns}/small", 1)
    seen = [(e.kind, e.key) for e in (watch.next(EVENTUALLY_S) for _ in range(3))]
    committed = [(EventKind.UPDATED, f"{ns}/big/0"), (EventKind.DELETED, f"{ns}/big/1"),
                 (EventKind.CREATED, f"{ns}/small")]
    assert (sorted(seen) if backend.name == "zk" else seen) == (sorted(committed) if backend.name == "zk" else committed)
    watch.close()


def _set_all(backend, ns: str, names: list[str]) -> None:
    with backend.client() as c:
        for name in names:
            c.set(f"{ns}/wide/{name}", 1)


# -- watches ------------------------------------------------------------------------------------

def test_watch_gets_existing_keys_then_every_change_in_commit_order(backend, client, ns):
    client.set(f"{ns}/a", 0)
    client.set(f"{ns}/b", 0)
    client.set(f"{ns}-other/a", 0)
    watch = client.watch(ns)
    existing = events_until_synced(watch)
    assert sorted((e.kind, e.key) for e in existing) == [(EventKind.EXISTING, f"{ns}/a"),
                                                         (EventKind.EXISTING, f"{ns}/b")]
    with backend.client() as writer:
        writer.create(f"{ns}/c", 1)
        writer.update(f"{ns}/a", 1)
        writer.delete(f"{ns}/b")
        writer.set(f"{ns}-other/a", 1)  # outside the watched prefix
        writer.set(f"{ns}/c", 2)
    seen = [(e.kind, e.key) for e in (watch.next(EVENTUALLY_S) for _ in range(4))]
    committed = [(EventKind.CREATED, f"{ns}/c"), (EventKind.UPDATED, f"{ns}/a"),
                 (EventKind.DELETED, f"{ns}/b"), (EventKind.UPDATED, f"{ns}/c")]
    if backend.name == "zk":
        # kazoo's TreeCache keeps each key's events in order, but not the order across keys
        # (docs/confserver-zookeeper.md): the same events, each key's in commit order.
        assert sorted(seen) == sorted(committed)
        assert [e for e in seen if e[1] == f"{ns}/c"] == [e for e in committed if e[1] == f"{ns}/c"]
    else:
        assert seen == committed
    assert watch.next(0.3) is None
    watch.close()


def test_watch_events_of_one_key_come_in_commit_order(backend, client, ns):
    watch = client.watch(f"{ns}/k")
    assert events_until_synced(watch) == []
    with backend.client() as writer:
        writer.create(f"{ns}/k", 0)
        for i in range(1, 20):
            writer.update(f"{ns}/k", i)
        writer.delete(f"{ns}/k")
    events = [watch.next(EVENTUALLY_S)]
    while events[-1].kind is not EventKind.DELETED:
        events.append(watch.next(EVENTUALLY_S))
    assert events[0].kind is EventKind.CREATED
    assert all(e.kind is EventKind.UPDATED for e in events[1:-1])
    versions = [e.entry.version for e in events[:-1]]
    assert versions == sorted(set(versions))  # ZooKeeper may coalesce, never reorder
    if backend.name != "zk":
        assert versions == list(range(20))
        assert events[-1].entry.value == 19
    else:  # the last updates may be coalesced into the delete, which carries the last value seen
        assert events[-1].entry == events[-2].entry


def test_keys_above_others_hold_no_value_until_given_one(client, ns):
    client.create(f"{ns}/a/b/c", 1)
    with pytest.raises(confserver.NoSuchKey):
        client.get(f"{ns}/a/b")
    with pytest.raises(confserver.NoSuchKey):
        client.update(f"{ns}/a/b", 1)
    assert client.children(f"{ns}/a") == ["b"]
    assert [e.key for e in client.glob(f"{ns}/a")] == [f"{ns}/a/b/c"]
    client.create(f"{ns}/a/b", "mid")
    with pytest.raises(confserver.KeyExists):
        client.create(f"{ns}/a/b", "again")
    client.delete(f"{ns}/a/b")  # its value goes, the keys below stay
    assert client.get_or_none(f"{ns}/a/b") is None
    assert client.get(f"{ns}/a/b/c").value == 1
    client.delete(f"{ns}/a/b/c")
    assert client.children(f"{ns}/a") == []


def test_watch_with_a_glob_sees_only_matching_keys(client, ns):
    watch = client.watch(f"{ns}/sites/*/workers/*/*/worker")
    assert events_until_synced(watch) == []
    client.set(f"{ns}/sites/s/workers/p/f/stats", 1)
    client.set(f"{ns}/sites/s/workers/p/f/worker", 1)
    event = watch.next(EVENTUALLY_S)
    assert (event.kind, event.key) == (EventKind.CREATED, f"{ns}/sites/s/workers/p/f/worker")
    assert watch.next(0.3) is None


def test_watch_callback_may_call_the_client(client, ns):
    seen = []
    done = threading.Event()

    def on_event(event):
        if event.kind is EventKind.CREATED:
            seen.append(client.get(event.key).value)  # a call from inside the callback
            done.set()

    watch = client.watch(ns, on_event)
    client.set(f"{ns}/a", "hello")
    assert done.wait(EVENTUALLY_S)
    assert seen == ["hello"]
    watch.close()


# -- compare-and-set and sequences --------------------------------------------------------------

def test_racing_compare_and_set_loses_no_increment(backend, ns):
    key = f"{ns}/counter"
    rounds, workers = 40, 3
    with backend.client() as c:
        c.create(key, 0)
    wins = []

    def increment():
        with backend.client() as c:
            done = 0
            while done < rounds:
                entry = c.get(key)
                try:
                    c.update(key, entry.value + 1, version=entry.version)
                    done += 1
                except confserver.VersionMismatch:
                    pass
            wins.append(done)

    threads = [threading.Thread(target=increment) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with backend.client() as c:
        final = c.get(key)
    assert final.value == rounds * workers == sum(wins)
    assert final.version == rounds * workers


def test_sequences_never_collide_and_never_hand_out_zero(backend, ns):
    key = f"{ns}/seq"
    drawn: list[int] = []
    lock = threading.Lock()

    def draw():
        with backend.client() as c:
            values = [c.next_sequence(key) for _ in range(30)]
        with lock:
            drawn.extend(values)

    processes = [spawn_client(backend, "sequence", key, "30") for _ in range(2)]
    threads = [threading.Thread(target=draw) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in processes:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        drawn.extend(int(v) for v in out.split())
    assert len(drawn) == 120
    assert len(set(drawn)) == 120
    assert 0 not in drawn and min(drawn) == 1


# -- locks --------------------------------------------------------------------------------------

def test_lock_is_exclusive_nests_for_its_owner_and_times_out_for_others(backend, ns):
    key = f"{ns}/lock"
    with backend.client() as a, backend.client() as b:
        outer = a.lock(key, timeout_s=5)
        inner = a.lock(key, timeout_s=5)  # recursive for the same session
        with pytest.raises(confserver.LockTimeout):
            b.lock(key, timeout_s=0.3)
        inner.release()
        with pytest.raises(confserver.LockTimeout):
            b.lock(key, timeout_s=0.3)  # still held once
        got = threading.Event()

        def wait_for_it():
            with b.lock(key, timeout_s=10):
                got.set()

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        time.sleep(0.3)
        assert not got.is_set()
        outer.release()
        waiter.join(EVENTUALLY_S)
        assert got.is_set()


def test_lock_all_takes_keys_in_one_order_so_crossed_requests_do_not_deadlock(backend, ns):
    keys = [f"{ns}/k{i}" for i in range(4)]
    errors = []

    def worker(order):
        try:
            with backend.client() as c:
                for _ in range(5):
                    with c.lock_all(order, timeout_s=10):
                        pass
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(keys,)), threading.Thread(target=worker, args=(keys[::-1],))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


def test_lock_of_a_killed_client_is_released_when_its_session_ends(backend, ns):
    key = f"{ns}/lock"
    holder = spawn_client(backend, "lock", key)
    try:
        wait_ready(holder)
        with backend.client() as c:
            with pytest.raises(confserver.LockTimeout):
                c.lock(key, timeout_s=0.2)
            holder.kill()
            holder.wait()
            with c.lock(key, timeout_s=EVENTUALLY_S):
                pass
    finally:
        holder.kill()


# -- sessions and ephemeral keys ---------------------------------------------------------------

def test_ephemeral_key_goes_with_a_closed_session(backend, ns):
    with backend.client() as a:
        a.create(f"{ns}/e", 1, ephemeral=True)
        a.set(f"{ns}/p", 1)
        with backend.client() as b:
            assert b.get(f"{ns}/e").ephemeral
    with backend.client() as b:
        wait_for(lambda: b.get_or_none(f"{ns}/e") is None)
        assert b.get(f"{ns}/p").value == 1


def test_an_ephemeral_key_watched_before_it_exists_is_created_and_goes_with_its_session(backend, ns):
    """What a replay client does (it watches its request's key, then creates it ephemeral) and a
    supervisor's alive key meets (watched by others while it is down)."""
    with backend.client() as watcher:
        watch = watcher.watch(f"{ns}/req")
        assert events_until_synced(watch) == []
        alive_watch = watcher.watch(f"{ns}/alive")
        assert events_until_synced(alive_watch) == []
        with backend.client() as a:
            assert a.create(f"{ns}/req", 1, ephemeral=True).ephemeral
            assert a.set(f"{ns}/alive", 1, ephemeral=True).ephemeral
            event = watch.next(EVENTUALLY_S)
            assert (event.kind, event.key, event.entry.ephemeral) == (EventKind.CREATED, f"{ns}/req", True)
        event = watch.next(EVENTUALLY_S)
        assert (event.kind, event.key) == (EventKind.DELETED, f"{ns}/req")
        assert watcher.get_or_none(f"{ns}/alive") is None


def test_ephemeral_key_of_a_killed_client_goes_after_its_session_timeout(backend, ns):
    owner = spawn_client(backend, "ephemeral", f"{ns}/e")
    try:
        wait_ready(owner)
        with backend.client() as c:
            watch = c.watch(ns)
            assert [e.key for e in events_until_synced(watch)] == [f"{ns}/e"]
            owner.kill()
            owner.wait()
            event = watch.next(EVENTUALLY_S)
            assert (event.kind, event.key) == (EventKind.DELETED, f"{ns}/e")
            assert c.get_or_none(f"{ns}/e") is None
    finally:
        owner.kill()


# -- permissions --------------------------------------------------------------------------------

def test_only_the_choreographer_writes_worker_keys(backend, ns):
    key = f"sites/{ns}/workers/p/f/worker"
    with backend.client("choreographer") as chor, backend.client("user") as user:
        chor.set(key, {"is_used": True})
        with pytest.raises(confserver.PermissionDenied, match="user"):
            user.set(key, {"is_used": False})
        with pytest.raises(confserver.PermissionDenied):
            user.delete(key)
        assert user.get(key).value == {"is_used": True}
        chor.delete(key)


def test_anyone_may_request_a_replay_but_not_write_elsewhere(backend, ns):
    with backend.client(identity=None) as anonymous:
        assert anonymous.identity == "anonymous"
        anonymous.set(f"replays/{ns}", {"target": "p/f"})
        with pytest.raises(confserver.PermissionDenied, match=r"no token: point \$RAMEN_CONFSERVER_AUTH"):
            anonymous.set(f"programs/{ns}", {})
        anonymous.delete(f"replays/{ns}")


def test_an_unknown_token_is_refused(backend):
    with pytest.raises(confserver.PermissionDenied, match="token"):
        confserver.connect(backend.url, token="not-a-token", auth_file=backend.auth_file)


def test_an_identity_the_auth_file_does_not_know_is_refused_naming_both(backend):
    with pytest.raises(confserver.PermissionDenied) as refused:
        confserver.connect(backend.url, identity="nobody", auth_file=backend.auth_file)
    assert str(refused.value) == f"identity 'nobody' is not in the auth file {backend.auth_file}"


# -- server restarts ----------------------------------------------------------------------------

def test_no_acknowledged_write_is_lost_when_the_server_is_killed(restartable_backend, ns):
    backend = restartable_backend
    with backend.client() as c:
        for i in range(200):
            c.set(f"{ns}/k{i % 50}", i)
        c.next_sequence(f"{ns}/seq")
        backend.kill_and_restart()
    with backend.client() as c:
        assert {e.key: e.value for e in c.glob(ns) if "/k" in e.key} == {f"{ns}/k{i}": 150 + i for i in range(50)}
        assert c.next_sequence(f"{ns}/seq") == 2


def test_client_reconnects_after_a_restart_and_its_watch_goes_on(restartable_backend, ns):
    backend = restartable_backend
    with backend.client() as c:
        watch = c.watch(ns)
        events_until_synced(watch)
        c.set(f"{ns}/before", 1)
        assert watch.next(EVENTUALLY_S).key == f"{ns}/before"
        backend.kill_and_restart()
        wait_for(lambda: _try(lambda: c.set(f"{ns}/after", 2)))
        keys = []
        while f"{ns}/after" not in keys:
            event = watch.next(EVENTUALLY_S)
            assert event is not None, keys
            keys.append(event.key)
        assert c.get(f"{ns}/before").value == 1


def test_ephemeral_keys_of_sessions_dead_across_a_restart_are_gone(restartable_backend, ns):
    backend = restartable_backend
    owner = spawn_client(backend, "ephemeral", f"{ns}/e")
    try:
        wait_ready(owner)
        owner.kill()
        owner.wait()
        backend.kill_and_restart()
        with backend.client() as c:
            wait_for(lambda: c.get_or_none(f"{ns}/e") is None)
    finally:
        owner.kill()


def _try(call) -> bool:
    try:
        call()
        return True
    except confserver.Disconnected:
        return False



# -- fixtures -----------------------------------------------------------------------------------

@pytest.fixture
def builtin_backend(builtin_server) -> Backend:
    return BuiltinBackend(builtin_server)


@pytest.fixture
def zk_backend(zookeeper, zk_auth_file) -> Backend:
    return ZkBackend(zookeeper, zk_auth_file)


@pytest.fixture(params=BACKENDS)
def restartable_backend(request, tmp_path):
    """A backend whose server this test may kill: the built-in one gets a server of its own."""
    if request.param == "zk":
        yield request.getfixturevalue("zk_backend")
        return
    server = BuiltinServer(tmp_path / "data").start()
    yield BuiltinBackend(server)
    server.stop()


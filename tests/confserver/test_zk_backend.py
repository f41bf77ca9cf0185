"""The confserver's ZooKeeper backend against a real ZooKeeper server.

The contract every backend keeps is tested in test_contract.py, for ZooKeeper too; this file holds
what only ZooKeeper can show (its layout, its own ACL refusals, partitions through a proxy).
Where ZooKeeper's semantics differ from the built-in server's (docs/confserver-zookeeper.md), the
test says so in its name.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

import confserver
from confserver import auth
from confserver.errors import (
    Disconnected,
    PermissionDenied,
    SessionExpired,
)
from confserver.model import EventKind
from tests.confserver.zkserver import TcpProxy, free_port

EVENT_TIMEOUT_S = 5.0
#: Short sessions make a kill -9'd client's ephemeral keys and locks go in about 2 s.
SHORT_SESSION_S = 2.0

# -- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def auth_file(zk_auth_file):
    return zk_auth_file


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


def take(watch, n: int) -> list:
    events = []
    for _ in range(n):
        event = watch.next(EVENT_TIMEOUT_S)
        assert event is not None, f"only {len(events)} of {n} events came: {events}"
        events.append(event)
    return events


def wait_until(predicate, timeout_s: float, poll_s: float = 0.05) -> float:
    """Seconds until predicate() held; fails after timeout_s."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, "condition not met in time"
        time.sleep(poll_s)
    return time.monotonic() - start


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


def test_an_unreachable_server_raises_disconnected_within_the_connect_timeout():
    with pytest.raises(Disconnected, match="did not answer within 1 s"):
        confserver.connect(f"zk://127.0.0.1:{free_port()}/x", connect_timeout_s=1.0,
                           auth_file="/nonexistent")


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

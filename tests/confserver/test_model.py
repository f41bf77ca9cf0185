"""Key patterns, auth rules, URLs and the journal's record format: the pure parts of the confserver."""

from __future__ import annotations

import pytest

import confserver
from confserver import auth
from confserver.journal import decode_records, encode_record
from confserver.keys import check_key, matches, prefix_of
from confserver.store import Store
from confserver.url import parse_url


@pytest.mark.parametrize("pattern, key, expected", [
    ("replays", "replays", True),
    ("replays", "replays/7", True),
    ("replays", "replaysx/7", False),
    ("sites/*/workers", "sites/a/workers/p/f", False),  # a glob matches whole keys
    ("sites/*/workers/**", "sites/a/workers/p/f", True),
    ("sites/*/workers/*/*/worker", "sites/a/workers/p/f/worker", True),
    ("sites/*/workers/*/*/worker", "sites/a/workers/p/worker", False),
    ("a/**/c", "a/c", True),
    ("a/**/c", "a/x/y/c", True),
    ("a/**", "a/x/y", True),
    ("a/*", "a/x/y", False),
    ("a/?", "a/x", True),
    ("a/[xy]", "a/y", True),
    ("a/[!xy]", "a/y", False),
    ("", "anything/at/all", True),
])
def test_patterns(pattern, key, expected):
    assert matches(pattern, key) is expected


def test_prefix_of_a_pattern_is_where_the_search_starts():
    assert prefix_of("sites/*/workers") == "sites"
    assert prefix_of("replays/") == "replays"
    assert prefix_of("**") == ""


@pytest.mark.parametrize("key", ["a/b", "sites/local/workers/net/traffic/worker", "x.y:z@1"])
def test_good_keys(key):
    assert check_key(key) == key


def test_the_most_specific_rule_decides():
    config = auth.AuthConfig({"t1": "choreographer", "t2": "user"})
    assert config.identify(None) == auth.ANONYMOUS
    assert config.identify("t2") == "user"
    with pytest.raises(confserver.PermissionDenied):
        config.identify("forged")
    config.check("user", auth.WRITE, "programs/p")
    config.check(auth.ANONYMOUS, auth.WRITE, "replays/9")
    config.check("choreographer", auth.WRITE, "sites/s/workers/p/f/worker")
    config.check(auth.ADMIN, auth.DELETE, "sites/s/workers/p/f/worker")
    for identity in ("user", auth.ANONYMOUS):
        with pytest.raises(confserver.PermissionDenied):
            config.check(identity, auth.WRITE, "sites/s/workers/p/f/worker")
    with pytest.raises(confserver.PermissionDenied):
        config.check(auth.ANONYMOUS, auth.WRITE, "programs/p")


def test_generated_auth_file_is_private_and_stable(tmp_path):
    path = tmp_path / "auth.json"
    first = auth.load_or_create(path)
    assert path.stat().st_mode & 0o077 == 0
    assert set(first.tokens.values()) == set(auth.STANDARD_IDENTITIES)
    assert auth.load_or_create(path).tokens == first.tokens


def test_malformed_auth_file_is_a_clear_error(tmp_path):
    path = tmp_path / "auth.json"
    path.write_text('{"rules": [{"read": ["*"]}]}')
    with pytest.raises(confserver.BadRequest, match="auth"):
        auth.load(path)


@pytest.mark.parametrize("text, scheme, hosts, root, token", [
    ("ramen://127.0.0.1:1234", "ramen", (("127.0.0.1", 1234),), "", None),
    ("ramen://secret@host", "ramen", (("host", 29340),), "", "secret"),
    ("zk://a:1,b:2/ramen", "zk", (("a", 1), ("b", 2)), "ramen", None),
    ("zk://a", "zk", (("a", 2181),), "", None),
])
def test_urls(text, scheme, hosts, root, token):
    url = parse_url(text)
    assert (url.scheme, url.hosts, url.root, url.token) == (scheme, hosts, root, token)


def test_default_url_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path))  # no instance there
    monkeypatch.setenv("RAMEN_CONFSERVER", "zk://z:9/r")
    assert str(parse_url(None)) == "zk://z:9/r"
    monkeypatch.delenv("RAMEN_CONFSERVER")
    assert str(parse_url(None)) == "ramen://127.0.0.1:29340"


def test_default_url_is_where_the_instance_of_ramen_dir_listens(monkeypatch, tmp_path):
    """What its embedded confserver wrote, else what `ramen start` wrote once ready (any confserver,
    a ZooKeeper one too); $RAMEN_CONFSERVER and an explicit URL still win."""
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path))
    monkeypatch.delenv("RAMEN_CONFSERVER", raising=False)
    (tmp_path / "confserver").mkdir()
    (tmp_path / "confserver" / "address").write_text("127.0.0.1:41234\n")
    assert str(parse_url(None)) == "ramen://127.0.0.1:41234"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "ready").write_text("zk://z:9/r\n")
    assert str(parse_url(None)) == "zk://z:9/r"
    monkeypatch.setenv("RAMEN_CONFSERVER", "ramen://127.0.0.1:7")
    assert str(parse_url(None)) == "ramen://127.0.0.1:7"
    assert str(parse_url("ramen://127.0.0.1:8")) == "ramen://127.0.0.1:8"


@pytest.mark.parametrize("text", ["http://x", "ramen://a:1,b:2", "ramen://h:port"])
def test_bad_urls(text):
    with pytest.raises(confserver.BadRequest):
        parse_url(text)


def test_journal_records_stop_at_a_torn_or_corrupt_one():
    records = [{"t": "put", "key": f"k{i}", "value": i, "owner": "o", "mtime": 1.0} for i in range(3)]
    data = b"".join(encode_record(r) for r in records)
    assert decode_records(data) == (records, len(data))
    assert decode_records(data[:-1])[0] == records[:2]
    corrupt = bytearray(data)
    corrupt[-2] ^= 0xFF
    assert decode_records(bytes(corrupt))[0] == records[:2]


def test_store_snapshot_round_trip_keeps_sessions_ephemerals_and_locks():
    store = Store()
    store.apply({"t": "open", "sid": 1, "secret": "s", "identity": "admin", "timeout_s": 5.0})
    store.apply({"t": "put", "key": "a/b", "value": 1, "owner": "admin", "mtime": 1.0, "eph": 1})
    store.apply({"t": "put", "key": "a/c", "value": 2, "owner": "admin", "mtime": 1.0})
    store.apply({"t": "lock", "key": "l", "sid": 1})
    copy = Store.from_json(store.to_json())
    assert copy.to_json() == store.to_json()
    assert copy.children("a") == ["b", "c"]
    events = copy.apply({"t": "end", "sid": 1})
    assert [(e.kind.value, e.key) for e in events] == [("deleted", "a/b")]
    assert copy.locks == {} and copy.children("a") == ["c"]

"""fail_replay: the one way a supervisor, a replayer or a worker sets a replay's error."""

from __future__ import annotations

import pytest

import confserver
from ramen import keyspace
from ramen.replay.contract import ReplayRequest, error_of
from ramen.replay.fail import fail_replay
from tests.replay.test_contract import REQUEST


@pytest.fixture
def client(fresh_confserver):
    with confserver.connect(fresh_confserver.url, identity="admin", auth_file=fresh_confserver.auth_file) as c:
        yield c


def test_the_first_error_stays(client):
    client.create(keyspace.replay_key(7), REQUEST.to_value())
    assert fail_replay(client, 7, "replayer 3 of p/src died (exit 1)")
    assert not fail_replay(client, 7, "worker p/t died (exit 1)")
    assert error_of(client.get(keyspace.replay_key(7)).value) == "replayer 3 of p/src died (exit 1)"
    assert ReplayRequest.from_value(client.get(keyspace.replay_key(7)).value, keyspace.replay_key(7)).target == "p/t"


def test_a_replay_gone_is_left_alone(client):
    assert not fail_replay(client, 8, "too late")
    assert client.get_or_none(keyspace.replay_key(8)) is None


def test_any_other_confserver_error_is_the_callers_to_handle(fresh_confserver):
    """A supervisor's loop reconnects on a lost connection, so fail_replay must not swallow it."""
    client = confserver.connect(fresh_confserver.url, identity="admin", auth_file=fresh_confserver.auth_file)
    client.create(keyspace.replay_key(9), REQUEST.to_value())
    client.close()
    with pytest.raises(confserver.Disconnected):
        fail_replay(client, 9, "lost")

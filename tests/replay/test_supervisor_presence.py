"""A replay client tells at once that no supervisor of its site runs, instead of waiting out its
timeout (300 s) and blaming the replay."""

from __future__ import annotations

import pytest

import confserver
from ramen import keyspace
from ramen.clocks import ManualClock
from ramen.liveness import SupervisorAlive
from ramen.replay.client import SUPERVISOR_GRACE_S, ReplayFailed, SupervisorPresence
from tests.waiting import wait_for

SITE = "s9"


@pytest.fixture
def connect(fresh_confserver):
    clients = []

    def open_client(identity: str = "admin"):
        client = confserver.connect(fresh_confserver.url, identity=identity, auth_file=fresh_confserver.auth_file)
        clients.append(client)
        return client
    yield open_client
    for client in clients:
        client.close()


def _fails(presence: SupervisorPresence) -> bool:
    try:
        presence.check()
    except ReplayFailed as e:
        assert str(e) == f"no supervisor of site {SITE} is running: start ramen with `ramen start`"
        return True
    return False


def test_no_supervisor_fails_after_the_grace_not_before(connect):
    clock = ManualClock()
    presence = SupervisorPresence(connect(), SITE, clock=clock)
    clock.advance(SUPERVISOR_GRACE_S / 2)
    assert not _fails(presence)
    clock.advance(SUPERVISOR_GRACE_S / 2)
    assert _fails(presence)


def test_a_running_supervisor_keeps_the_replay_waiting_until_its_session_ends(connect):
    supervisor = connect("supervisor")
    supervisor.create(keyspace.supervisor_alive_key(SITE), SupervisorAlive(pid=1, started_us=2).to_value(),
                      ephemeral=True)
    clock = ManualClock()
    presence = SupervisorPresence(connect(), SITE, clock=clock)
    # Its key is seen (the watch's EXISTING event arrives on the watch's thread), then time goes on.
    wait_for(lambda: (presence.check(), presence.seen)[1], "the supervisor's key seen")
    clock.advance(10 * SUPERVISOR_GRACE_S)
    assert not _fails(presence)

    supervisor.close()  # its ephemeral key goes with its session
    wait_for(lambda: (presence.check(), not presence.seen)[1], "the supervisor's key gone")
    assert not _fails(presence)
    clock.advance(SUPERVISOR_GRACE_S)
    assert _fails(presence)

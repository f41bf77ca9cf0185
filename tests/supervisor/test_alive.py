"""The supervisor says it runs (the ephemeral key replay clients watch), and withdraws it on its way out."""

from __future__ import annotations

import os

from ramen import keyspace
from ramen.liveness import SupervisorAlive
from tests.supervisor.conftest import SITE, value_of, wait_for


def test_a_running_supervisor_has_its_key_and_takes_it_away_when_it_stops(admin, start_supervisor):
    key = keyspace.supervisor_alive_key(SITE)
    admin.create(key, {"pid": 1, "started_us": 1}, ephemeral=True)  # a killed one's, its session not yet expired
    supervisor = start_supervisor()
    alive = wait_for(lambda: value_of(admin, key) if value_of(admin, key) != {"pid": 1, "started_us": 1} else None,
                     "the supervisor's own key")
    assert SupervisorAlive.from_value(alive).pid == os.getpid()  # the supervisor runs in this test's thread
    assert admin.get(key).ephemeral
    supervisor.stop_thread()
    supervisor.close(timeout_s=5)
    assert value_of(admin, key) is None

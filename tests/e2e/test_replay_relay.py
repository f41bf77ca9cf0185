"""`ramen replay --via-confserver` end to end: the result comes through the confserver (relayed by
the site's supervisor from a log of its own) and equals the same replay through a local log; past
the relay's bound (lowered for this stack through RAMEN_RELAY_MAX_BYTES) it fails in one line.

Run under `flock /tmp/ramen-e2e.lock`: it starts ramen services.
"""

from __future__ import annotations

import pytest

from ramen import keyspace
from supervisor import defaults
from tests.e2e.test_replay import PROGRAM, Stack, minute_range
from tests.waiting import wait_for

MAX_BYTES = 1024 * 1024
"""The stack's relay bound: 10 s of e2e/traffic (10,000 rows, ~0.4 MB as base64) fit, 3 minutes
(180,000 rows, ~6 MB) do not."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(tmp_path_factory.mktemp("e2e-relay"))
    stack.env[defaults.RELAY_MAX_BYTES_ENV] = str(MAX_BYTES)
    try:
        yield stack.start("e2e", PROGRAM, "e2e/traffic")
    finally:
        stack.stop()


def replay(stack: Stack, target: str, since_us: int, until_us: int, *options: str):
    return stack.ramen("replay", "--since", f"{since_us / 1e6:.6f}", "--until", f"{until_us / 1e6:.6f}",
                       "--format", "csv", "--with-header", *options, target)


def no_result_keys_left(stack: Stack) -> bool:
    with stack.client() as client:
        return client.glob(f"{keyspace.REPLAY_RESULTS}/*/*") == []


@pytest.mark.parametrize("target, seconds", [("e2e/traffic", 10), ("e2e/per_minute", 180)])
def test_a_replay_via_the_confserver_equals_the_one_through_a_local_log(stack, target, seconds):
    since, _ = minute_range(7, 3)
    until = since + seconds * 1_000_000
    local = replay(stack, target, since, until)
    relayed = replay(stack, target, since, until, "--via-confserver")
    assert local.returncode == 0, local.stderr
    assert relayed.returncode == 0, relayed.stderr
    assert len(local.stdout.splitlines()) > 1 + seconds // 60  # rows, not just the header
    assert relayed.stdout == local.stdout  # the same rows in the same order
    assert no_result_keys_left(stack)  # the client deleted them once read
    wait_for(lambda: list((stack.base / "replays").glob("*")) == [], "the relay's log removed")


def test_a_result_over_the_bound_fails_in_one_line(stack):
    since, until = minute_range(8, 3)
    result = replay(stack, "e2e/traffic", since, until, "--via-confserver")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "is over 1 MiB, too big for the confserver: replay from a host of site local (without " \
           "--via-confserver), or a shorter range" in lines[0]
    assert "Traceback" not in result.stderr
    assert no_result_keys_left(stack)
    wait_for(lambda: list((stack.base / "replays").glob("*")) == [], "the relay's log removed")


def test_a_client_on_a_host_without_the_sites_files_gets_the_result_through_the_confserver(stack, tmp_path):
    """Another host: its own empty RAMEN_DIR, the site's confserver. The plan comes from the
    coverage the site's archiver publishes, the result from the relay."""
    since, _ = minute_range(7, 3)
    until = since + 10 * 1_000_000
    local = replay(stack, "e2e/traffic", since, until)
    elsewhere = dict(stack.env, RAMEN_DIR=str(tmp_path / "elsewhere"),
                     RAMEN_CONFSERVER=(stack.base / "run" / "ready").read_text().strip(),
                     RAMEN_CONFSERVER_AUTH=str(stack.base / "confserver" / "auth.json"))
    remote = Stack(tmp_path / "elsewhere")
    remote.env = elsewhere
    relayed = replay(remote, "e2e/traffic", since, until, "--via-confserver")
    assert local.returncode == 0 and relayed.returncode == 0, local.stderr + relayed.stderr
    assert relayed.stdout == local.stdout and len(relayed.stdout.splitlines()) > 1
    assert not list((tmp_path / "elsewhere").rglob("*.logbuffer"))  # nothing mapped here
    without = replay(remote, "e2e/traffic", since, until)
    assert without.returncode != 0 and len(without.stderr.strip().splitlines()) == 1, without.stderr

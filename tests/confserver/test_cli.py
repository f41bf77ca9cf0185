"""`ramen confclient` and `ramen confserver`, run as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.confserver.builtin import BuiltinServer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = BuiltinServer(tmp_path_factory.mktemp("cli") / "data").start()
    yield s
    s.stop()


def ramen(server, *args, timeout=60):
    env = dict(os.environ, RAMEN_CONFSERVER=server.url, RAMEN_CONFSERVER_AUTH=str(server.auth_file))
    return subprocess.run([sys.executable, "-m", "ramen.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_set_get_list_and_delete(server):
    assert ramen(server, "confclient", "set", "cli/a", '{"n": 1}').returncode == 0
    assert ramen(server, "confclient", "set", "cli/b", "hello").returncode == 0
    got = ramen(server, "confclient", "get", "cli/a", "--json")
    assert got.returncode == 0 and json.loads(got.stdout)["value"] == {"n": 1}
    listing = ramen(server, "confclient", "list", "cli", "--json")
    assert [json.loads(line)["value"] for line in listing.stdout.splitlines()] == [{"n": 1}, "hello"]
    human = ramen(server, "confclient", "get", "cli/b")
    assert human.stdout.startswith('cli/b = "hello"  (version 0, by admin')
    assert ramen(server, "confclient", "del", "cli", "-r").stdout.strip() == "deleted 2 keys"


def test_get_of_a_missing_key_exits_1_with_one_line(server):
    result = ramen(server, "confclient", "get", "cli/missing")
    assert result.returncode == 1
    assert result.stderr.strip() == "ramen: confclient: no such key: cli/missing"


def test_compare_and_set_from_the_command_line(server):
    ramen(server, "confclient", "set", "cli/v", "1")
    assert ramen(server, "confclient", "set", "cli/v", "2", "--version", "0").returncode == 0
    stale = ramen(server, "confclient", "set", "cli/v", "3", "--version", "0")
    assert stale.returncode == 1 and "not 0" in stale.stderr
    assert ramen(server, "confclient", "set", "cli/v", "4", "--create").returncode == 1


def test_permission_refused_is_one_line(server):
    result = ramen(server, "confclient", "--identity", "user", "set", "sites/s/workers/p/f/worker", "1")
    assert result.returncode == 1
    assert result.stderr.strip() == "ramen: confclient: user may not write sites/s/workers/p/f/worker"


def test_unreachable_confserver_is_one_line(server):
    result = ramen(server, "confclient", "--confserver", "ramen://127.0.0.1:1", "get", "x")
    assert result.returncode == 1
    assert "cannot reach the confserver at ramen://127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr


def test_watch_prints_existing_keys_then_changes_until_interrupted(server):
    ramen(server, "confclient", "set", "cliw/a", "1")
    env = dict(os.environ, RAMEN_CONFSERVER=server.url, RAMEN_CONFSERVER_AUTH=str(server.auth_file))
    watcher = subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "confclient", "watch", "cliw", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = [json.loads(watcher.stdout.readline()) for _ in range(2)]
        assert [(e["kind"], e["key"]) for e in lines] == [("existing", "cliw/a"), ("synced", "cliw")]
        ramen(server, "confclient", "set", "cliw/b", "2")
        event = json.loads(watcher.stdout.readline())
        assert (event["kind"], event["key"], event["entry"]["value"]) == ("created", "cliw/b", 2)
    finally:
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(10) == 130


def test_confserver_command_serves_and_stops_on_sigterm(tmp_path):
    ready = tmp_path / "ready"
    process = subprocess.Popen([sys.executable, "-m", "ramen.cli.main", "confserver", "--listen", "127.0.0.1:0",
                                "--data-dir", str(tmp_path / "d"), "--ready-file", str(ready)],
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 15
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(10) == 0
    assert "confserver listening on 127.0.0.1:" in process.stderr.read()


def test_an_identity_the_auth_file_does_not_know_is_one_line_not_anonymous(server):
    result = ramen(server, "confclient", "--identity", "nobody", "get", "cli/x")
    assert result.returncode == 1
    assert result.stderr.strip() == f"ramen: confclient: identity 'nobody' is not in the auth file {server.auth_file}"


def test_an_identity_asked_for_without_a_readable_auth_file_is_one_line(server, tmp_path):
    env = dict(os.environ, RAMEN_CONFSERVER=server.url, RAMEN_CONFSERVER_AUTH=str(tmp_path / "absent.json"))
    env.pop("RAMEN_CONFSERVER_TOKEN", None)
    result = subprocess.run([sys.executable, "-m", "ramen.cli.main", "confclient", "--identity", "admin", "get", "x"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().startswith(f"ramen: confclient: cannot act as admin: the auth file {tmp_path / 'absent.json'}")
    anonymous = subprocess.run([sys.executable, "-m", "ramen.cli.main", "confclient", "list", "cli", "--json"],
                               capture_output=True, text=True, env=env, timeout=60)
    assert anonymous.returncode == 0, anonymous.stderr  # the default identity may still read as anonymous

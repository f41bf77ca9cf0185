"""Fixtures for the confserver suites: one real ZooKeeper server for the whole session."""

import pytest

from tests.confserver.zkserver import ZooKeeperServer, missing_prerequisite


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    """A ZooKeeper server on a free 127.0.0.1 port; skipped, saying why, only without Java or
    Debian's zookeeper.jar. Tests that kill it restart it before they end."""
    reason = missing_prerequisite()
    if reason:
        pytest.skip(f"no ZooKeeper server: {reason}")
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")).start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def zk_auth_file(tmp_path_factory):
    """An auth file with a token for each standard identity and the default rules, for ZooKeeper
    clients (which read the rules and everyone's token from it, see docs/confserver-zookeeper.md)."""
    from confserver import auth
    path = tmp_path_factory.mktemp("zk-auth") / auth.AUTH_FILE_NAME
    auth.load_or_create(path)
    return path

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

"""What httpd's tests share."""

import pytest

import confserver


@pytest.fixture
def client(builtin_server):
    """A confserver client as httpd has one: as `user` (ramen's read-only CLI identity)."""
    with confserver.connect(builtin_server.url, identity="user", auth_file=builtin_server.auth_file) as connected:
        yield connected

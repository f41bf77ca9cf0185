"""Fixtures of the worker tests."""

import pytest

from tests.workers.test_worker import Rig


@pytest.fixture
def rig(builtin_server, tmp_path, monkeypatch):
    """A site of the test's own on the shared confserver (see Rig); its processes killed at the end."""
    rig = Rig(builtin_server, tmp_path, monkeypatch)
    try:
        yield rig
    finally:
        rig.close()

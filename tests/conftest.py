"""Fixtures shared by every suite."""

import os
from pathlib import Path

import pytest

VECTORS_ENV = "RAMEN_AERON_VECTORS"
DEFAULT_VECTORS = Path(__file__).resolve().parent.parent.parent / "shared" / "aeron-vectors"


@pytest.fixture(scope="session")
def aeron_vectors() -> Path:
    """Files written by real Aeron; skipped, saying so, only where the folder is absent."""
    path = Path(os.environ.get(VECTORS_ENV, DEFAULT_VECTORS))
    if not path.is_dir():
        pytest.skip(f"Aeron vectors not found at {path} (set {VECTORS_ENV})")
    return path


@pytest.fixture(scope="session")
def builtin_server(tmp_path_factory):
    """One real built-in confserver process for the whole run; tests keep to keys of their own."""
    from tests.confserver.builtin import BuiltinServer
    server = BuiltinServer(tmp_path_factory.mktemp("confserver") / "data").start()
    yield server
    server.stop()


@pytest.fixture
def fresh_confserver(tmp_path):
    """A built-in confserver of the test's own, for tests that need the whole key space empty."""
    from tests.confserver.builtin import BuiltinServer
    server = BuiltinServer(tmp_path / "conf").start()
    yield server
    server.stop()

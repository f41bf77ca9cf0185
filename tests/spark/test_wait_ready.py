"""Waiting for the local Spark Connect server ends at once when `ramen start` is asked to stop."""

from __future__ import annotations

import subprocess

import pytest

from ramen.spark.server import free_port, wait_ready


def test_a_cancelled_wait_ends_at_once(tmp_path):
    """Ctrl-C during a cold start (10-20 s) was only noted by `ramen start`'s handler, and the wait
    went on until Spark answered or READY_TIMEOUT_S passed. A server that never answers (nothing
    listens on the port) and a wait cancelled: KeyboardInterrupt, with the server still running."""
    process = subprocess.Popen(["sleep", "300"])
    try:
        with pytest.raises(KeyboardInterrupt):
            wait_ready(free_port(), process, tmp_path / "spark.log", cancelled=lambda: True)
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()

"""What tests leave running under a directory is found by its RAMEN_DIR and killed at the end of the
session (tests/conftest.py, pytest_sessionfinish), whatever their outcome."""

import os
import subprocess
import sys

from tests.processes import kill_left_under, processes_with


def test_processes_whose_ramen_dir_is_under_a_directory_are_killed_and_others_left(tmp_path):
    under = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             env={**os.environ, "RAMEN_DIR": str(tmp_path / "instance")})
    beside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              env={**os.environ, "RAMEN_DIR": str(tmp_path) + "-other"})
    try:
        assert under.pid in processes_with(f"RAMEN_DIR={tmp_path}", below=True)
        killed = kill_left_under(tmp_path)
        assert under.pid in killed and beside.pid not in killed
        assert under.wait(timeout=30) == -9
        assert beside.poll() is None
    finally:
        for process in (under, beside):
            process.kill()
            process.wait()

"""`--dir DIR`, before or after the command, names the instance: its confserver (where it listens,
written in DIR) and its tokens (DIR/confserver/auth.json)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ramen.cli.main import _take_dir

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "net.toml"


def _ramen(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for name in ("RAMEN_DIR", "RAMEN_CONFSERVER", "RAMEN_CONFSERVER_AUTH"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "ramen.cli.main", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=60)


@pytest.fixture
def instance(fresh_confserver, tmp_path) -> Path:
    """A directory as `ramen start` leaves it: where its confserver listens, and its tokens."""
    base = tmp_path / "instance"
    (base / "confserver").mkdir(parents=True)
    (base / "confserver" / "address").write_text(f"127.0.0.1:{fresh_confserver.port}\n")
    shutil.copy(fresh_confserver.auth_file, base / "confserver" / "auth.json")
    return base


def test_dir_before_or_after_the_command_finds_its_confserver(instance):
    loaded = _ramen("--dir", instance, "run", EXAMPLE)
    assert loaded.returncode == 0, loaded.stderr
    for args in (["--dir", instance, "confclient", "get", "programs/net"],
                 ["confclient", "get", "programs/net", "--dir", instance],
                 ["confclient", f"--dir={instance}", "get", "programs/net"]):
        result = _ramen(*args)
        assert result.returncode == 0 and '"name": "net"' in result.stdout, (args, result.stderr)


def test_a_dir_where_nothing_runs_says_how_to_start_ramen(tmp_path):
    result = _ramen("ps", "--dir", tmp_path, "--confserver", "ramen://127.0.0.1:1")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("ramen: ps: cannot reach the confserver at ramen://127.0.0.1:1") and \
        "`ramen start`" in lines[0] and "--dir" in lines[0] and "--confserver" in lines[0], lines[0]


def test_take_dir():
    assert _take_dir(["--dir", "a", "replay", "x"]) == (["replay", "x"], "a")
    assert _take_dir(["replay", "x", "--dir=b"]) == (["replay", "x"], "b")
    assert _take_dir(["ps"]) == (["ps"], None)
    # The archiver's own --dir (its archive) after the command is the archiver's.
    assert _take_dir(["--dir", "i", "archiver", "--dir", "arch"]) == (["archiver", "--dir", "arch"], "i")

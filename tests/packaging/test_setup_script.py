"""`.ci/setup` is quiet: a few lines say what it does, and apt-get's and pip's output goes to
.venv/setup.log, shown only when a step fails (its end, and the log's path).

The failure is made offline and cheaply: pip may use no index (PIP_NO_INDEX), so the editable
install cannot fetch its build backend. The venv is created for real (a few seconds)."""

from __future__ import annotations

import os
import shutil
import subprocess
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETUP_TIMEOUT_S = 300


def declared_dependencies() -> str:
    """pyproject.toml's names, runtime then test, as the setup line lists them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    return ", ".join(re.match(r"[A-Za-z0-9_.-]+", name).group(0) for name in names)


def test_a_failed_install_shows_pips_error_and_the_logs_path_and_nothing_else_of_pip(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    shutil.copy(REPO / ".ci" / "setup", checkout / ".ci" / "setup")
    shutil.copy(REPO / "pyproject.toml", checkout / "pyproject.toml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}  # no local wheels, no mirror
    env.update(PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull, PYTHON=sys.executable)
    result = subprocess.run(["bash", str(checkout / ".ci" / "setup")], env=env, capture_output=True, text=True,
                            timeout=SETUP_TIMEOUT_S)
    log = checkout / ".venv" / "setup.log"
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == "setup: creating .venv", lines
    expected = f"setup: installing ramen and its dependencies ({declared_dependencies()}) into .venv"
    assert lines[1].startswith(expected), lines
    assert "numpy, pyarrow" in lines[1] and "pytest, selenium" in lines[1], lines
    assert lines[2] == "setup: installing ramen failed:", lines
    assert lines[-1] == f"setup: the whole output is in {log}", lines
    assert any("No matching distribution found for setuptools" in line for line in lines), result.stderr
    # The steps that worked said nothing of their own: pip's output is in the log only.
    logged = log.read_text()
    assert "Requirement already satisfied: pip" in logged
    assert "Requirement already satisfied" not in result.stderr
    assert "No matching distribution found for setuptools" in logged

"""The wheel, installed where no checkout is on the path, is a whole ramen: every module imports,
the command runs. An editable install hides a package left out of the wheel; this does not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOP_LEVEL_PACKAGES = ("ramen", "confserver", "choreographer", "supervisor", "workers")
BUILD_LEFTOVERS = (".git", ".venv", "build", "*.egg-info", "__pycache__", ".ramen", ".pytest_cache")

IMPORT_EVERY_MODULE = """
import importlib, pkgutil, sys
failed, count = [], 0
for top in sys.argv[1:]:
    package = importlib.import_module(top)
    for info in pkgutil.walk_packages(package.__path__, top + "."):
        try:
            module = importlib.import_module(info.name)
        except Exception as e:
            failed.append(f"{info.name}: {type(e).__name__}: {e}")
        else:
            assert module.__file__.startswith(sys.prefix), (info.name, module.__file__)
            count += 1
print(count)
print("\\n".join(failed), file=sys.stderr)
sys.exit(1 if failed else 0)
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv holding the wheel of this checkout; its dependencies come from the test's own
    environment (a path entry, so the editable install's finder there is not loaded)."""
    work = tmp_path_factory.mktemp("wheel")
    # From a copy: setuptools would put whatever an earlier build left in build/ into the wheel.
    source = work / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work), str(source)],
                   check=True, cwd=work)
    (wheel,) = work.glob("ramen-*.whl")
    env_dir = work / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, cwd=work)
    site_packages = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   check=True, capture_output=True, text=True).stdout.strip()
    Path(site_packages, "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return env_dir


def _run(installed: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_every_module_of_the_wheel_imports(installed, tmp_path):
    result = _run(installed, str(installed / "bin" / "python"), "-c", IMPORT_EVERY_MODULE,
                  *TOP_LEVEL_PACKAGES, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    checkout_modules = sum(1 for top in TOP_LEVEL_PACKAGES for p in (REPO / top).rglob("*.py")
                           if p.name != "__init__.py")
    assert int(result.stdout) >= checkout_modules  # nothing of the checkout left out


def test_the_installed_command_runs(installed, tmp_path):
    ramen = str(installed / "bin" / "ramen")
    result = _run(installed, ramen, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "replay" in result.stdout
    result = _run(installed, ramen, "compile", str(REPO / "examples" / "net.toml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "per_minute" in result.stdout and "top_talkers" in result.stdout


def test_the_wheel_holds_the_packages_data_files(installed, tmp_path):
    """Files beside the modules that the code reads (the local Spark server's logging config)."""
    data = sorted(str(p.relative_to(REPO)) for top in TOP_LEVEL_PACKAGES for p in (REPO / top).rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc"))
    assert "ramen/spark/log4j2.properties" in data
    result = _run(installed, str(installed / "bin" / "python"), "-c",
                  "import pathlib, sys, ramen; root = pathlib.Path(ramen.__file__).parents[1]; "
                  "print('\\n'.join(p for p in sys.argv[1:] if not (root / p).is_file()))", *data, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "", result.stdout + result.stderr

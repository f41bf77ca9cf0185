"""A service's text log is bounded: the process rotates its own file once it would pass its size,
keeps a few rotated copies, and moves stdout and stderr along, so that a crash's traceback lands in
the current file. Real processes, their stdout and stderr a real file, as the spawners make them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from ramen.service_log import LOG_FILE_ENV, spawn_env
from supervisor.processes import spawn

MAX_BYTES = 4096
BACKUPS = 2
LINES = 400  # ~80 bytes a line: ~8 rotations of 4 KiB

CHILD = textwrap.dedent(f"""
    import logging, os, sys
    from pathlib import Path
    from ramen import service_log
    service_log.configure(logging.INFO, max_bytes={MAX_BYTES}, backups={BACKUPS})
    log = logging.getLogger("child")
    for n in range({LINES}):
        log.info("line %04d %s", n, "x" * 40)
    os.write(2, b"raw stderr after the rotations\\n")
    print("stdout after the rotations", flush=True)
    if len(sys.argv) > 1:
        service_log.move_to(Path(sys.argv[1]))
        log.info("moved")
        os.write(2, b"raw stderr after the move\\n")
    raise SystemExit("ramen: child: the last error")
""")


def run_child(log_path: Path, *args: str, named: Path | None = None) -> subprocess.CompletedProcess:
    """The child, its stdout and stderr appended to log_path; $RAMEN_LOG_FILE names `named`."""
    with open(log_path, "ab") as out:
        return subprocess.run([sys.executable, "-c", CHILD, *args], stdout=out, stderr=out, timeout=60,
                              env=spawn_env({"PATH": "/usr/bin:/bin"}, named or log_path))


def logged_lines(*paths: Path) -> list[str]:
    return [line for p in paths for line in p.read_text().splitlines()]


def test_the_log_rotates_within_its_size_keeps_its_copies_and_the_newest_lines_in_order(tmp_path):
    log_path = tmp_path / "service.log"
    assert run_child(log_path).returncode == 1
    copies = sorted(p.name for p in tmp_path.iterdir())
    assert copies == ["service.log", "service.log.1", "service.log.2"]
    assert all((tmp_path / name).stat().st_size <= MAX_BYTES for name in copies)
    # Oldest copy first: the lines kept are the newest ones, each once, in order, up to the last.
    lines = logged_lines(tmp_path / "service.log.2", tmp_path / "service.log.1", log_path)
    numbered = [int(line.split("line ")[1][:4]) for line in lines if " line " in line]
    assert numbered == list(range(numbered[0], LINES)) and numbered[0] > 0
    # stdout, stderr and the exit's error went to the current file, after the last logged line.
    current = log_path.read_text().splitlines()
    assert current[-3:] == ["raw stderr after the rotations", "stdout after the rotations",
                            "ramen: child: the last error"]


def test_a_spare_moving_to_a_functions_log_takes_its_stdout_and_stderr_there(tmp_path):
    spare_log, function_log = tmp_path / "spare.log", tmp_path / "workers" / "f.log"
    assert run_child(spare_log, str(function_log)).returncode == 1
    moved = function_log.read_text().splitlines()
    assert moved[0].endswith("INFO child: moved")
    assert moved[1:] == ["raw stderr after the move", "ramen: child: the last error"]
    assert "moved" not in spare_log.read_text()


def test_a_process_whose_stderr_is_another_file_leaves_the_named_log_alone(tmp_path):
    """A process that inherited a service's environment but writes elsewhere must not rotate it."""
    service_log, own_log = tmp_path / "supervisor.log", tmp_path / "own.log"
    service_log.write_text("the supervisor's line\n")
    assert run_child(own_log, named=service_log).returncode == 1
    assert service_log.read_text() == "the supervisor's line\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own.log", "supervisor.log"]
    assert len(logged_lines(own_log)) > LINES  # everything, unrotated, on its stderr


def test_the_supervisors_children_are_told_their_log(tmp_path):
    log_path = tmp_path / "logs" / "worker.log"
    child = spawn("worker", [sys.executable, "-c", f"import os; print(os.environ[{LOG_FILE_ENV!r}])"],
                  {"PATH": "/usr/bin:/bin", LOG_FILE_ENV: "/elsewhere/supervisor.log"}, log_path)
    assert child.popen.wait(60) == 0
    assert log_path.read_text() == f"{log_path}\n"

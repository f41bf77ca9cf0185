"""Child processes of the supervisor: spawn, stop (SIGTERM, then SIGKILL), and notice their end.

Nothing here blocks: the supervisor's duty cycle polls its children (`Child.poll`) and enforces
stop deadlines (`Child.enforce_stop`). Each child gets its own session (so a Ctrl-C on the
supervisor's terminal reaches the supervisor only, which then stops its children in order) and is
signalled as a process group, so whatever it started itself goes with it.

A child may also be *adopted*: a process started by an earlier supervisor that died, found through
its pid. It is not our child, so its exit status is unknown; we only see that it is gone.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.processes import running
from ramen.service_log import spawn_env

log = logging.getLogger(__name__)


@dataclass
class Child:
    """One process we watch. `returncode` follows subprocess: negative means killed by that signal;
    None once ended means unknown (an adopted process)."""

    name: str
    pid: int
    started_us: int
    popen: subprocess.Popen | None = None
    stop_deadline: float | None = None
    """monotonic time after which a stopping child gets SIGKILL; None while it should run."""
    killed: bool = False
    ended: bool = False
    ended_us: int | None = None
    returncode: int | None = None
    log_path: Path | None = None
    """Where its output goes (None for an adopted process)."""
    clock: Clock = SYSTEM_CLOCK
    """Stamps its end and its stop deadline (the supervisor's clock)."""

    @property
    def stopping(self) -> bool:
        return self.stop_deadline is not None

    @property
    def adopted(self) -> bool:
        return self.popen is None

    def poll(self) -> bool:
        """Whether the process has ended (reaping it if it is ours)."""
        if self.ended:
            return True
        if self.popen is not None:
            code = self.popen.poll()
            if code is None:
                return False
            self.returncode = code
        elif running(self.pid):
            return False
        self.ended = True
        self.ended_us = self.clock.epoch_us()
        return True

    def stop(self, grace_s: float) -> None:
        """SIGTERM now, SIGKILL after grace_s (see enforce_stop). Idempotent."""
        if self.stopping or self.poll():
            return
        self.stop_deadline = self.clock.seconds() + grace_s
        self._signal(signal.SIGTERM)

    def enforce_stop(self, now: float) -> bool:
        """SIGKILL a stopping child past its grace; returns whether it did."""
        if self.stop_deadline is None or self.killed or now < self.stop_deadline or self.poll():
            return False
        log.warning("%s (pid %d) still running after SIGTERM: SIGKILL", self.name, self.pid)
        self.killed = True
        self._signal(signal.SIGKILL)
        return True

    def follow_stop(self, now: float, deadline: float) -> None:
        """For a stopping child: SIGKILL past its grace, or at once past `deadline` (a shutdown's bound)."""
        if now > deadline:
            self.kill()
        else:
            self.enforce_stop(now)

    def drop_unused_log(self) -> None:
        """For an ended child started ahead and never given work: its log says only that it
        waited, so it goes; unless the child failed (the log is kept, for its error)."""
        if self.log_path is None:
            return
        if self.returncode == 0 or self.stopping:
            self.log_path.unlink(missing_ok=True)
        else:
            log.warning("%s (pid %d) ended (%s): see %s", self.name, self.pid, self.describe_exit(), self.log_path)

    def drop_empty_log(self) -> None:
        """For an ended child that did its work: a log it wrote nothing to goes (a replayer starts for
        every merged replay, and a dashboard on auto-refresh makes thousands of them a day); a log
        with anything in it stays."""
        if self.log_path is None or not self.ended:
            return
        try:
            if self.log_path.stat().st_size == 0:
                self.log_path.unlink()
        except FileNotFoundError:
            pass

    def kill(self) -> None:
        if not self.poll():
            self.killed = True
            self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        try:
            if _leads_its_group(self.pid):
                os.killpg(self.pid, signum)
            else:
                os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    @property
    def run_time_s(self) -> float:
        end = self.ended_us if self.ended_us is not None else self.clock.epoch_us()
        return max(0.0, (end - self.started_us) / 1e6)

    @property
    def ended_by_signal(self) -> bool:
        """It was killed or crashed (or is an adopted process whose exit nobody saw), rather than
        exiting on an error of its own, which would come again: the replays through it were lost
        to its death, and asked again may succeed."""
        return self.returncode is None or self.returncode < 0

    def describe_exit(self) -> str:
        """How it ended, with the one-line error it printed last if it failed: a replay through a
        worker that failed then says why (the Spark job that stalled, the callable that raised)."""
        described = describe_exit(self.returncode)
        reason = last_error(self.log_path) if self.returncode and self.log_path is not None else None
        return f"{described}: {reason}" if reason else described


def _leads_its_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


ERROR_PREFIX = "ramen: "
"""How every ramen process starts its one-line error on stderr."""
LOG_TAIL_BYTES = 8192


def last_error(log_path: Path) -> str | None:
    """The last one-line error in a child's log, without its `ramen: worker NAME: ` tag."""
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            tail = log.read().decode(errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        if line.startswith(ERROR_PREFIX):
            line = line[len(ERROR_PREFIX):]
            if line.startswith("worker ") and ": " in line:
                line = line.split(": ", 1)[1]
            return line.strip() or None
    return None


def describe_exit(returncode: int | None) -> str:
    """`exit 1`, `killed by signal 9`, or `exit status unknown` (an adopted process)."""
    if returncode is None:
        return "exit status unknown"
    if returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exit {returncode}"


def spawn(name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path, clock: Clock = SYSTEM_CLOCK) -> Child:
    """Start argv with env, its stdout and stderr appended to log_path (created with its folder),
    which it rotates (ramen/service_log.py)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        popen = subprocess.Popen(list(argv), env=spawn_env(env, log_path), stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=out, start_new_session=True)
    child = Child(name, popen.pid, clock.epoch_us(), popen, log_path=log_path, clock=clock)
    log.info("started %s: pid %d, log %s", name, popen.pid, log_path)
    return child


def adopt(name: str, pid: int, started_us: int, *, expect_args: Sequence[str] = (),
          clock: Clock = SYSTEM_CLOCK) -> Child | None:
    """A Child for a running process an earlier supervisor started, or None if pid is gone or is
    now some other program (its command line lacks `expect_args` in order: a reused pid)."""
    if pid <= 0 or not running(pid) or not _has_args(pid, expect_args):
        return None
    log.info("adopted %s: pid %d", name, pid)
    return Child(name, pid, started_us, clock=clock)


def _has_args(pid: int, expected: Sequence[str]) -> bool:
    if not expected:
        return True
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    wanted = [a.encode() for a in expected]
    return any(args[i:i + len(wanted)] == wanted for i in range(len(args)))

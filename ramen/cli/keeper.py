"""Keeping `ramen start`'s services running: the dead are restarted, the stuck killed and restarted.

An agent: `Keeper.do_work(now)` looks once at every service and never blocks, so a test drives it
with a clock of its own. For each service:
- one that exited is started again after a backoff, one step longer per restart
  (RESTART_BACKOFF_S), and from the first step again once it had been healthy for HEALTHY_PERIOD_S;
- one that is running but shows no sign of life for longer than its bound (`stuck_after_s` since
  its last sign, `startup_grace_s` after a start until its first) is killed with SIGKILL, then
  restarted as a dead one. Its signs of life come from its `liveness`: the confserver answers
  probes (confserver.probe), the choreographer, supervisor and archiver beat into a heartbeat file
  (ramen.liveness); a service without one (Spark) is only restarted when it dies.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ramen.liveness import HEARTBEAT_FILE_ENV, HeartbeatFile
from ramen.service_log import spawn_env

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
#: A service that showed life this long after its start had recovered: its next restart is quick.
HEALTHY_PERIOD_S = 60.0
#: How long a started service has to show its first sign of life (imports, a journal to load).
STARTUP_GRACE_S = 60.0
#: A heartbeat silent this long means a stuck loop. Above the 60 s a confserver call may take to
#: fail (confserver.remote: RECONNECT_WAIT_S for the connection, then REQUEST_TIMEOUT_S for the
#: reply), which a healthy loop waits out without beating.
HEARTBEAT_STUCK_AFTER_S = 90.0
#: The archiver's loop makes no blocking call: silent this long, it is stuck, and is killed and
#: restarted well within the hold its writers wait for it (transport defaults.TETHER_HOLD_S, 60 s),
#: so its next run goes on with its recordings and nothing goes unrecorded.
ARCHIVER_STUCK_AFTER_S = 20.0
#: The confserver answers a probe within milliseconds; this long without an answer, it is stuck.
PROBE_STUCK_AFTER_S = 15.0
STOP_GRACE_S = 10.0


class Liveness(Protocol):
    def last_sign_of_life(self, pid: int) -> float | None:
        """When process `pid` last showed life, on time.monotonic's scale; None if it has not."""


def report(text: str) -> None:
    print(f"ramen: {text}", file=sys.stderr, flush=True)


@dataclass
class Service:
    name: str
    argv: list[str]
    log_path: Path = field(default_factory=Path)
    command: list[str] | None = None
    """A command that is not a Python module of ours (Spark's server), with its own `env`."""
    env: dict | None = None
    heartbeat_path: Path | None = None
    """Given to the service in $RAMEN_HEARTBEAT_FILE; its beats are then its signs of life."""
    liveness: Liveness | None = None
    stuck_after_s: float = HEARTBEAT_STUCK_AFTER_S
    startup_grace_s: float = STARTUP_GRACE_S
    launch: Callable[..., subprocess.Popen] = subprocess.Popen
    process: subprocess.Popen | None = None
    restarts: int = 0
    next_start: float | None = None
    started_at: float = 0.0
    last_sign: float = 0.0
    """The latest sign of life of the current process, or its start."""
    killed: bool = False

    def __post_init__(self) -> None:
        if self.heartbeat_path is not None and self.liveness is None:
            self.liveness = HeartbeatFile(self.heartbeat_path)

    def start(self, env: dict, now: float | None = None) -> None:
        child_env = dict(self.env or env)
        if self.heartbeat_path is not None:
            child_env[HEARTBEAT_FILE_ENV] = str(self.heartbeat_path)
        if self.command is None:  # one of ours: it rotates its log itself
            child_env = spawn_env(child_env, self.log_path)
        # In a process group of its own: a terminal's Ctrl-C or hang-up (a signal to its foreground
        # group) reaches `ramen start` alone, which stops the services in order, the confserver
        # last. Signalled together, the confserver stopped first and left the others waiting on it.
        with open(self.log_path, "ab") as log:
            self.process = self.launch(self.command or [sys.executable, "-m", *self.argv], env=child_env,
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       process_group=0)
        self.started_at = self.last_sign = time.monotonic() if now is None else now
        self.killed = False

    def showed_life_within(self, now: float, seconds: float) -> bool:
        return self.process is not None and self.process.poll() is None and now - self.last_sign <= seconds

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Keeper:
    """Keeps `services` (a list the caller may append to) running; see the module docstring."""

    def __init__(self, services: list[Service], env: dict, *, report: Callable[[str], None] = report):
        self.services = services
        self.env = env
        self.report = report

    def do_work(self, now: float) -> int:
        """One look at every service; returns how many were acted on."""
        return sum(self._keep(service, now) for service in list(self.services))

    def _keep(self, service: Service, now: float) -> int:
        status = service.process.poll()
        if status is None:
            return self._judge(service, now)
        if service.next_start is None:
            healthy_s = (service.last_sign if service.liveness is not None else now) - service.started_at
            if healthy_s >= HEALTHY_PERIOD_S:
                service.restarts = 0
            delay = RESTART_BACKOFF_S[min(service.restarts, len(RESTART_BACKOFF_S) - 1)]
            service.next_start = now + delay
            self.report(f"{service.name} exited (status {status}), restarting in {delay:g} s; see {service.log_path}")
            return 1
        if now < service.next_start:
            return 0
        service.restarts += 1
        service.next_start = None
        service.start(self.env, now)
        return 1

    def _judge(self, service: Service, now: float) -> int:
        """Kill a running service that has shown no sign of life for longer than it may."""
        if service.liveness is None or service.killed:
            return 0
        seen = service.liveness.last_sign_of_life(service.process.pid)
        if seen is not None and seen > service.last_sign:
            service.last_sign = seen
        silent_since_start = service.last_sign <= service.started_at
        bound = service.startup_grace_s if silent_since_start else service.stuck_after_s
        silent_s = now - service.last_sign
        if silent_s <= bound:
            return 0
        since = " since its start" if silent_since_start else ""
        self.report(f"{service.name} (pid {service.process.pid}) is running but has shown no sign of life for "
                    f"{silent_s:.0f} s{since} (bound {bound:g} s): killing it to restart it; see {service.log_path}")
        service.process.kill()
        service.killed = True
        return 1

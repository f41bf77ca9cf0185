"""What the supervisor did, as counters: attributes for tests, and `sites/<site>/supervisor/stats`."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class SupervisorCounters:
    starts: int = 0
    """Worker processes started, restarts included."""
    restarts: int = 0
    """Starts of a worker after it crashed."""
    crashes: int = 0
    """Worker runs that ended while the worker should run."""
    stops: int = 0
    """Worker runs ended because we stopped them (unused, or a new signature)."""
    kills: int = 0
    """Processes (workers and replayers) that needed SIGKILL after their grace."""
    quarantines: int = 0
    spares: int = 0
    """Spare workers started (workers/spare.py); `starts` counts those given a function too."""
    adopted: int = 0
    """Processes of an earlier supervisor taken over at start."""
    replays_wired: int = 0
    replayers_spawned: int = 0
    merged_requests: int = 0
    """Replay requests that joined another's replayer instead of getting one of their own."""
    replayer_failures: int = 0
    replay_errors: int = 0
    replays_timed_out: int = 0
    teardowns: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

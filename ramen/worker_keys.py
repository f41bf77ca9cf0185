"""The values of a worker's keys, one typed definition each (ramen.key_value.KeyValue), under
`sites/<site>/workers/<prog>/<func>/`:

    worker                 WorkerSpec      the choreographer's: whether it must run, and as what
    instance               WorkerInstance  the supervisor's, ephemeral: the process running it
    instances/<signature>  WorkerRuns      the supervisor's: the last runs that ended, of that signature
    stats                  WorkerStats     the worker's, every second: its counts, CPU, memory, positions

(its replays' keys, `replays/<channel>`, are ramen/replay/contract.py's WorkerReplay). Each has one
writer; readers (the supervisor, the archiver, `ramen ps`, httpd's /metrics) read them with
`from_value`, which names the key and the field of a value that does not follow its contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ramen.key_value import ContractError, KeyValue

__all__ = ["ChannelCounts", "ContractError", "WorkerInstance", "WorkerRun", "WorkerRuns", "WorkerSpec", "WorkerStats"]


@dataclass(frozen=True)
class WorkerSpec(KeyValue):
    """All a supervisor needs to run the worker, and only what changes when the worker must change
    (no timestamps): a value unchanged is not written again."""

    KEY: ClassVar[str] = "sites/<site>/workers/<prog>/<func>/worker"
    program: str
    function: str
    is_used: bool
    live: bool
    """Used for its live output (non-lazy, tailed, or an ancestor of either), not only for replays."""
    replays: tuple[int, ...]
    """The replay channels whose paths it is on."""
    lazy: bool
    kind: str
    archived: bool
    parents: tuple[str, ...]
    children: tuple[str, ...]
    signature: str
    program_version: str


@dataclass(frozen=True)
class WorkerInstance(KeyValue):
    """The process running the worker (ephemeral: it goes with the supervisor's session)."""

    KEY: ClassVar[str] = "sites/<site>/workers/<prog>/<func>/instance"
    pid: int
    started_us: int
    signature: str | None = None
    spare: int | None = None
    """It started as this spare process (its command line says --spare, not --function)."""


@dataclass(frozen=True)
class WorkerRun(KeyValue):
    """One run of a worker process that ended."""

    KEY: ClassVar[str] = "run"
    pid: int
    started_us: int
    ended_us: int | None
    exit_status: int | None
    run_time_s: float


@dataclass(frozen=True)
class WorkerRuns(KeyValue):
    """The last runs of one signature of the worker, oldest first, and the end of its quarantine if
    it crashed too often."""

    KEY: ClassVar[str] = "sites/<site>/workers/<prog>/<func>/instances/<signature>"
    runs: tuple[WorkerRun, ...] = ()
    quarantined_until_us: int | None = None


@dataclass(frozen=True)
class ChannelCounts(KeyValue):
    """A worker's counts on one channel (0: live, else a replay)."""

    KEY: ClassVar[str] = "channels"
    tuples_in: int = 0
    tuples_out: int = 0
    eor_received: int = 0
    late: int = 0
    dropped: int = 0


@dataclass(frozen=True)
class WorkerStats(KeyValue):
    """What the worker did so far (its totals are also counters in counters.dat, workers/stats.py)."""

    KEY: ClassVar[str] = "sites/<site>/workers/<prog>/<func>/stats"
    pid: int
    updated_us: int
    tuples_in: int
    tuples_out: int
    late: int
    dropped: int
    unexpected: int
    skipped: int
    cpu_s: float
    rss_bytes: int
    position_in: int
    position_out: int
    channels: dict[int, ChannelCounts]
    signature: str | None = None
    """What it runs: a supervisor adopting the process learns it here."""
    live_event_time_us: int | None = None
    """The event time of its last live row: where a restarted source resumes when neither its log
    nor its archive holds a row (workers/resume.py)."""
    spark_jobs: int | None = None
    """A heavy worker's Spark jobs, and the time they took (staging included)."""
    spark_s: float | None = None
    rollups: int = 0
    """Messages whose rollup a summarised replay folded instead of their rows (ramen/rollup.py)."""

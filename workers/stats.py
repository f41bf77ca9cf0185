"""What a worker counts, and the stats record it writes every second (docs/runtime.md).

The totals (tuples in, out, late, dropped) are counters in counters.dat, labelled
`worker <prog>/<func> <what>`, so `ramen stat` and tests read them without the confserver; the
stats key adds CPU, memory, positions and per-channel counts.
"""

from __future__ import annotations

import os
import time
import dataclasses
from dataclasses import dataclass, field

from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.memory import rss_bytes
from ramen.transport import counters as ctr
from ramen.transport.counters import Counter, CountersFile
from ramen.worker_keys import ChannelCounts, WorkerStats

COUNTER_NAMES = ("tuples in", "tuples out", "late", "dropped", "unexpected", "skipped", "spark jobs", "spark ms",
                 "rollups", "gaps")
"""dropped: live tuples written while nobody read the (non-archived) live log, as Aeron drops them;
unexpected: messages of a channel this worker has no state for (a replay it was not told of yet);
skipped: messages of other workers' replays on a replayer's log (a merged replayer writes the
channels of all its readers into one log, and each reader skips those of the others);
spark jobs, spark ms: a heavy worker's Spark jobs and the time they took, staging included;
rollups: messages whose rollup (ramen/rollup.py) a summarised replay folded instead of their rows;
gaps: GAPs written for live input rows lost to the worker (Worker._gap_for_skip)."""


@dataclass
class ChannelStats:
    """A channel's counts as they grow (the stats key has them as ramen.worker_keys.ChannelCounts)."""
    tuples_in: int = 0
    tuples_out: int = 0
    eor_received: int = 0
    late: int = 0
    dropped: int = 0


@dataclass
class WorkerCounters:
    qualified_name: str
    counters: CountersFile | None = None
    clock: Clock = SYSTEM_CLOCK
    channels: dict[int, ChannelStats] = field(default_factory=dict)
    _counters: dict[str, Counter] = field(default_factory=dict)
    _local: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._local.update(dict.fromkeys(COUNTER_NAMES, 0))
        if self.counters is not None:
            self.allocate(self.counters)

    def allocate(self, counters: CountersFile) -> None:
        """The totals' counters in counters.dat (apart from construction, which does no I/O)."""
        self.counters = counters
        type_ids = ctr.SERVICE_COUNTER_TYPE_IDS["worker"]
        for name in COUNTER_NAMES:
            self._counters[name] = counters.allocate(type_ids[name.replace(" ", "_")],
                                                     f"worker {self.qualified_name} {name}")

    def add(self, name: str, value: int, channel: int | None = None) -> None:
        if not value:
            return
        self._local[name] += value
        if name in self._counters:
            self._counters[name].add(value)
        if channel is not None:
            stats = self.channel(channel)
            attribute = name.replace(" ", "_")
            setattr(stats, attribute, getattr(stats, attribute) + value)

    def get(self, name: str) -> int:
        return self._local[name]

    def channel(self, channel: int) -> ChannelStats:
        stats = self.channels.get(channel)
        if stats is None:
            stats = self.channels[channel] = ChannelStats()
        return stats

    def record(self, position_in: int, position_out: int, *, signature: str | None = None,
               live_event_time_us: int | None = None, heavy: bool = False) -> WorkerStats:
        """The value of the stats key (with Spark's job count and time for a heavy worker)."""
        local = self._local
        return WorkerStats(
            pid=os.getpid(), updated_us=self.clock.epoch_us(), tuples_in=local["tuples in"],
            tuples_out=local["tuples out"], late=local["late"], dropped=local["dropped"],
            unexpected=local["unexpected"], skipped=local["skipped"], cpu_s=round(time.process_time(), 3),
            rss_bytes=rss_bytes(), position_in=position_in, position_out=position_out,
            channels={c: ChannelCounts(**dataclasses.asdict(s)) for c, s in sorted(self.channels.items())},
            signature=signature, live_event_time_us=live_event_time_us,
            spark_jobs=local["spark jobs"] if heavy else None, spark_s=local["spark ms"] / 1000 if heavy else None,
            rollups=local["rollups"])

    def close(self) -> None:
        for counter in self._counters.values():
            counter.close()
        self._counters.clear()

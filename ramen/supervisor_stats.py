"""sites/<site>/supervisor/stats: what a site's supervisor did and runs, written every
STATS_INTERVAL_S by the supervisor, read by `ramen ps --all` and httpd's /metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ramen import keyspace
from ramen.key_value import KeyValue


@dataclass(frozen=True)
class Standby(KeyValue):
    """A process started ahead of need (a spare worker, a warm replayer), waiting."""

    pid: int
    started_us: int


@dataclass(frozen=True)
class SupervisorStats(KeyValue):
    KEY: ClassVar[str] = "sites/<site>/supervisor/stats"
    counters: dict[str, int]
    """The supervisor's counters (supervisor/counters.py), by name: starts, crashes, replayers_spawned…"""
    running_workers: int
    updated_us: int
    quarantined: tuple[str, ...] = ()
    """Functions whose worker crashed too often, left stopped for a while."""
    replayers: tuple[int, ...] = ()
    replays: tuple[int, ...] = ()
    """The replay channels it serves."""
    spare_worker: Standby | None = None
    warm_replayer: Standby | None = None


def read(client, site: str) -> SupervisorStats | None:
    """The site's supervisor stats; None if no supervisor wrote them. ContractError off the contract."""
    entry = client.get_or_none(keyspace.supervisor_stats_key(site))
    return None if entry is None else SupervisorStats.from_value(entry.value, entry.key)

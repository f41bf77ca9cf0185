"""What a site's archive can replay, in the confserver: for clients that cannot read its files.

A replay is planned from the archive's coverage (ramen/archive/coverage.py). A client on the
site's host reads the catalog and time indexes itself; a client elsewhere (a relayed replay's,
`ramen replay --via-confserver`) reads this key instead, which the site's archiver rewrites
whenever the coverage changes (at most every COVERAGE_PUBLISH_S). It may lag the files by that
much: a range ending "now" then ends a second short, which replay_to_newest allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ramen.archive.coverage import Interval
from ramen.key_value import KeyValue

COVERAGE_PUBLISH_S = 1.0
"""How often the archiver looks whether its coverage changed (a few small reads)."""


@dataclass(frozen=True)
class ArchiveCoverage(KeyValue):
    """sites/<site>/archive/coverage: per qualified function, its merged [since_us, until_us)."""

    KEY: ClassVar[str] = "sites/<site>/archive/coverage"
    functions: dict[str, tuple[tuple[int, int], ...]]
    updated_us: int

    @classmethod
    def of(cls, coverage: dict[str, list[Interval]], updated_us: int) -> ArchiveCoverage:
        return cls({name: tuple((i.since_us, i.until_us) for i in intervals)
                    for name, intervals in sorted(coverage.items())}, updated_us)

    def intervals(self) -> dict[str, list[Interval]]:
        """As archive_coverage() gives it."""
        return {name: [Interval(since, until) for since, until in pairs] for name, pairs in self.functions.items()}

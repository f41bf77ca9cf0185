"""`ramen replay --explain`: what a replay would do, without doing it (as Ramen's own replay
--explain): the range asked for and the part the archives cover, the sources and the recordings and
positions their replayers would read, and the functions whose workers would run.

Explaining never fails for want of coverage: a range nothing covers is explained too, with the
planner's one line saying what is missing. An unknown target or an empty range is still an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ramen.archive.coverage import RecordingRange, recordings_for
from ramen.program import Program
from ramen.replay.plan import (IntervalLike, ReplayGapError, ReplayPlan, newest_end_us, plan_replay,
                               uncovered_warning, without_newest_tail)
from ramen.times import format_rfc3339


@dataclass(frozen=True)
class SourceReads:
    """One source of the plan, and what of its archive its replayer would read."""
    function: str
    recordings: tuple[RecordingRange, ...]
    site: str | None = None
    """Archived on that other site, whose replayer reads it there (its recordings are not ours to list)."""


@dataclass(frozen=True)
class Explanation:
    target: str
    since_us: int
    until_us: int
    plan: ReplayPlan | None
    """None when the archives cover nothing of the range (`problem` says what is missing)."""
    sources: tuple[SourceReads, ...]
    problem: str | None
    """The planner's line when nothing is covered, or the warning naming what is left out."""

    @property
    def functions(self) -> tuple[str, ...]:
        """The functions whose workers the replay would run (a source's replayer stands in for it)."""
        return self.plan.workers if self.plan is not None else ()

    def to_dict(self) -> dict:
        """The `--json` form: times in RFC 3339, UTC."""
        plan = self.plan
        return {
            "target": self.target,
            "requested": _range(self.since_us, self.until_us),
            "covered": None if plan is None else _range(plan.since_us, plan.until_us),
            "sources": [{"function": s.function, "site": s.site,
                         "recordings": [{"recording_id": r.recording_id, "start_position": r.start_position,
                                         "stop_position": r.stop_position} for r in s.recordings]}
                        for s in self.sources],
            "functions": list(self.functions),
            "uncovered": [] if plan is None else [{"function": name, **_range(since, until)}
                                                  for name, since, until in plan.uncovered],
            "problem": self.problem,
        }

    def lines(self) -> list[str]:
        """The text form, a fact a line."""
        out = [f"target     {self.target}",
               f"requested  {format_rfc3339(self.since_us)} .. {format_rfc3339(self.until_us)}"]
        plan = self.plan
        if plan is None:
            out.append("covered    nothing")
        else:
            out.append(f"covered    {format_rfc3339(plan.since_us)} .. {format_rfc3339(plan.until_us)}")
        if self.problem is not None:
            out.append(f"note       {self.problem}")
        for source in self.sources:
            if source.site is not None:
                out.append(f"source     {source.function}: archived on site {source.site}, read by its replayer there")
                continue
            out.append(f"source     {source.function}: {len(source.recordings)} recording(s)")
            for r in source.recordings:
                stop = "live (followed)" if r.stop_position is None else r.stop_position
                out.append(f"  recording {r.recording_id}: positions {r.start_position} .. {stop}")
        if plan is not None:
            out.append(f"functions  {', '.join(self.functions)}")
            links = ", ".join(f"{parent} -> {child}" for parent, child in plan.links)
            if links:
                out.append(f"links      {links}")
        return out


def explain(target: str, since_us: int, until_us: int, programs: Mapping[str, Program],
            coverage: Mapping[str, Sequence[IntervalLike]], archive_dir: str | os.PathLike, *,
            strict: bool = False, source_sites: Callable[[ReplayPlan], Mapping[str, str]] = lambda plan: {},
            to_newest: bool = False) -> Explanation:
    """What a replay of `target` over [since_us, until_us) would read and run. `coverage`: every
    site's that the replay may read; `source_sites(plan)`: its sources archived on other sites.
    `to_newest`: the range ends now, and ends as far as the archives reach, as the replay would
    (ramen.replay.client.replay_to_newest): the newest second on its way to the disk is no gap."""
    try:
        plan = plan_replay(target, since_us, until_us, programs, coverage, strict=strict)
    except ReplayGapError as e:
        if not to_newest or (end_us := newest_end_us(e, since_us, until_us)) is None:
            return Explanation(target, since_us, until_us, None, (), str(e))
        plan = plan_replay(target, since_us, end_us, programs, coverage, strict=strict)
    if to_newest:
        plan = without_newest_tail(plan, until_us)
    elsewhere = source_sites(plan)
    sources = tuple(SourceReads(name, (), elsewhere[name]) if name in elsewhere else
                    SourceReads(name, tuple(recordings_for(archive_dir, name, plan.since_us, plan.until_us)))
                    for name in plan.sources)
    return Explanation(target, since_us, until_us, plan, sources, uncovered_warning(plan))


def _range(since_us: int, until_us: int) -> dict:
    return {"since": format_rfc3339(since_us), "until": format_rfc3339(until_us)}

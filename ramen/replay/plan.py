"""Replay planning: which archives answer a replay of TARGET over [since, until), and the links
from them to TARGET. Shared by `ramen replay` and the HTTP API; pure (no I/O), so both can plan
from whatever they read (programs from the confserver, coverage from ramen.archive.coverage).

The rules:
- TARGET's own archive answers if it covers [since, until) entirely.
- Otherwise each parent is asked the same question, independently: a parent whose archive covers
  the range is a source, one whose archive does not is expanded to its own parents, recursively.
- A function with no parents (a source) whose archive does not cover the range is a gap: the
  replay cannot be answered, and ReplayGapError names the function and the uncovered part.
- Where paths meet (diamonds) a function is planned once. A function covered by its own archive
  stops the recursion there, even if its parents would cover the range too: reading its output is
  cheaper than recomputing it, and gives what it actually produced.
- A windowed function's coverage reaches to the window boundary after its last recorded output
  (see `covered_times`): the last window is stamped with its start, yet answers to its end.
- Only archived functions are sources: a function whose `archive` was removed from its program
  is not one, whatever old recordings remain.
- Unless `strict`, a range the archives answer only in part is replayed where they do, as graphite
  and Grafana users expect: the range shrinks to what the sources cover at its ends, and a source's
  gaps inside it are replayed around. The plan's `uncovered` names what is left out, for a warning.
  A function whose own archive covers part of the range, and whose ancestors cannot compute any of
  it (a live source archived nowhere, before it), answers that part itself. A range no source
  covers at all stays an error. A plan that needs no leniency is the strict one.

The plan says which archived functions to replay (`sources`), which (parent, child) links carry
the replayed data (`links`), and every function on those paths, TARGET included (`functions`):
what the choreographer marks used and the supervisor wires for the replay's channel.

Times are µs since the epoch, UTC, as in ramen messages, and shown as ramen.times formats them.
Every error is a ReplayPlanError whose message is one line a user can act on.
"""

from __future__ import annotations

import difflib
import json
import logging
from dataclasses import dataclass, replace
from typing import Mapping, Protocol, Sequence

from ramen.program.model import Function, Program
from ramen.times import date_of, format_range, format_time

__all__ = ["ReplayGapError", "ReplayPlan", "ReplayPlanError", "check_range", "covered_times", "gap_error", "holes",
           "newest_end_us", "plan_replay", "uncovered_warning", "without_newest_tail"]

log = logging.getLogger(__name__)

PLAN_FORMAT = 1
"""Bump when the JSON form of a plan changes incompatibly."""
MAX_SUGGESTIONS = 3
"""Close names offered for an unknown target."""
SUGGESTION_CUTOFF = 0.8
"""difflib similarity (0..1) a name needs to be offered."""


class ReplayPlanError(ValueError):
    """A replay that cannot be planned: unknown target, empty range. One line."""


class ReplayGapError(ReplayPlanError):
    """No archive covers part of the range: `function` is the archived (or archivable) function
    with no parents whose archive misses [gap_since_us, gap_until_us) (the first such part)."""

    def __init__(self, message: str, function: str, gap_since_us: int, gap_until_us: int) -> None:
        super().__init__(message)
        self.function = function
        self.gap_since_us = gap_since_us
        self.gap_until_us = gap_until_us


class IntervalLike(Protocol):
    """What planning needs of a covered interval (ramen.archive.coverage.Interval is one);
    a Protocol so ramen/program does not depend on ramen/archive."""
    since_us: int
    until_us: int


@dataclass(frozen=True)
class ReplayPlan:
    target: str
    since_us: int
    until_us: int
    sources: tuple[str, ...]
    """Sorted qualified names of the archived functions to replay."""
    links: tuple[tuple[str, str], ...]
    """Sorted (parent, child) edges on the paths from the sources to the target."""
    functions: tuple[str, ...]
    """Sorted: every function on those paths, sources and target included."""
    uncovered: tuple[tuple[str, int, int], ...] = ()
    """(source, since_us, until_us) of each part of the requested range left out because that source's
    archive misses it (a lenient plan only), in time order; since_us/until_us above are what remains."""

    @property
    def workers(self) -> tuple[str, ...]:
        """Sorted: the functions whose processes the replay goes through. A source's replayer stands
        in for it and feeds its children itself; only a source that is the target takes part, to
        write its replayed rows to the recipient."""
        return tuple(name for name in self.functions if name not in self.sources or name == self.target)

    def readers_of(self, source: str) -> tuple[str, ...]:
        """Sorted: the workers that read `source`'s replayer log (its children on the paths, or the
        source itself when it is the target)."""
        if source == self.target:
            return (source,)
        return tuple(sorted(child for parent, child in self.links if parent == source))

    def inputs_of(self, name: str) -> tuple[str, ...]:
        """The parents whose replayed data `name` receives (empty for a source: a replayer feeds it).
        An intermediate worker forwards END_OF_REPLAY once every one of them has sent it."""
        return tuple(parent for parent, child in self.links if child == name)

    def to_dict(self) -> dict:
        return {"format": PLAN_FORMAT, "target": self.target, "since_us": self.since_us,
                "until_us": self.until_us, "sources": list(self.sources),
                "links": [list(link) for link in self.links], "functions": list(self.functions),
                "uncovered": [list(part) for part in self.uncovered]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict) -> ReplayPlan:
        if data.get("format") != PLAN_FORMAT:
            raise ValueError(f"replay plan JSON format {data.get('format')!r} is not {PLAN_FORMAT}")
        return cls(data["target"], int(data["since_us"]), int(data["until_us"]), tuple(data["sources"]),
                   tuple((parent, child) for parent, child in data["links"]), tuple(data["functions"]),
                   tuple((name, int(since), int(until)) for name, since, until in data.get("uncovered", ())))

    @classmethod
    def from_json(cls, text: str | bytes) -> ReplayPlan:
        return cls.from_dict(json.loads(text))


# -- planning -----------------------------------------------------------------------------------

def plan_replay(target: str, since_us: int, until_us: int, programs: Mapping[str, Program],
                coverage: Mapping[str, Sequence[IntervalLike]], *, strict: bool = True) -> ReplayPlan:
    """The plan to replay `target` over [since_us, until_us) from the archives in `coverage`
    (qualified name -> sorted, merged intervals, as ramen.archive.coverage.archive_coverage).
    `strict` False: what the archives cover of the range, when they do not cover all of it."""
    check_range(since_us, until_us)
    functions = {f.qualified_name: f for program in programs.values() for f in program}
    if target not in functions:
        raise ReplayPlanError(f"unknown function {target}{_suggestion(target, functions)}")
    try:
        planner = _Planner(since_us, until_us, functions, coverage)
        planner.visit(target, ())
    except ReplayGapError as gap:
        if strict:
            raise
        planner = _lenient_planner(target, since_us, until_us, functions, coverage, gap)
    uncovered = sorted((since, until, name) for name, found in planner.holes.items() for since, until in found)
    plan = ReplayPlan(target, planner.since_us, planner.until_us, tuple(sorted(planner.sources)),
                      tuple(sorted(planner.links)), tuple(sorted(planner.planned)),
                      tuple((name, since, until) for since, until, name in uncovered))
    log.debug("replay plan for %s: sources %s, %d links", target, ", ".join(plan.sources), len(plan.links))
    return plan


def _lenient_planner(target: str, since_us: int, until_us: int, functions: Mapping[str, Function],
                     coverage: Mapping[str, Sequence[IntervalLike]], first_gap: ReplayGapError) -> _Planner:
    """Plan again, letting sources have holes, and shrinking the range to a source's covered ends
    until every source reaches both of them (each round shrinks it, so this ends). The planner's
    `holes` gets the parts cut off, under the source that cut them."""
    cut: dict[str, list[tuple[int, int]]] = {}
    while True:
        planner = _Planner(since_us, until_us, functions, coverage, lenient=True)
        try:
            planner.visit(target, ())
        except _Shrink as shrink:
            parts = cut.setdefault(shrink.source, [])
            if shrink.since_us > since_us:
                parts.append((since_us, shrink.since_us))
            if shrink.until_us < until_us:
                parts.append((shrink.until_us, until_us))
            since_us, until_us = shrink.since_us, shrink.until_us
            continue
        except ReplayGapError:  # nothing of what is left is covered: the first gap says best what is missing
            raise first_gap from None
        for source, parts in cut.items():
            planner.holes.setdefault(source, []).extend(parts)
        return planner


def check_range(since_us: int, until_us: int) -> None:
    if since_us >= until_us:
        raise ReplayPlanError(f"--since {format_time(since_us)} is not before --until {format_time(until_us)}")


class _Planner:
    """One planning walk: each function decided once, whatever the number of paths to it."""

    def __init__(self, since_us: int, until_us: int, functions: Mapping[str, Function],
                 coverage: Mapping[str, Sequence[IntervalLike]], *, lenient: bool = False) -> None:
        self.since_us = since_us
        self.until_us = until_us
        self.functions = functions
        self.coverage = coverage
        self.lenient = lenient
        self.sources: set[str] = set()
        self.links: set[tuple[str, str]] = set()
        self.planned: set[str] = set()
        self.holes: dict[str, list[tuple[int, int]]] = {}
        """Lenient: the parts of the range a source's archive misses."""

    def visit(self, name: str, path: tuple[str, ...]) -> None:
        if name in self.planned:
            return
        if name in path:  # validation forbids cycles; a hand-made Mapping might still hold one
            raise ReplayPlanError(f"cannot plan a replay through a cycle: {' -> '.join(path + (name,))}")
        function = self.functions[name]
        if self._covers(function):
            self.sources.add(name)
        elif not function.parents:
            if not self.lenient:
                raise self._gap(function)
            self._cover_around_holes(function)
        else:
            before = (set(self.sources), set(self.links), set(self.planned), dict(self.holes))
            try:
                for parent in function.parents:
                    if parent not in self.functions:
                        raise ReplayPlanError(f"{name} reads {parent}, which is not loaded")
                    self.visit(parent, path + (name,))
                    self.links.add((parent, name))
            except ReplayGapError:
                if not (self.lenient and self._intervals(function)):
                    raise
                # Its ancestors compute none of the range: what its own archive holds of it.
                self.sources, self.links, self.planned, self.holes = before
                self._cover_around_holes(function)
        self.planned.add(name)

    def _covers(self, function: Function) -> bool:
        return any(since <= self.since_us and self.until_us <= until for since, until in self._intervals(function))

    def _cover_around_holes(self, function: Function) -> None:
        """Lenient: a source with holes in the range; one that misses an end of it shrinks the
        range to what it covers there (_Shrink), one that misses all of it is a gap."""
        spans = [(since, until) for since, until in self._intervals(function)
                 if since < self.until_us and self.since_us < until]
        if not spans:
            raise self._gap(function)
        since_us, until_us = max(self.since_us, spans[0][0]), min(self.until_us, spans[-1][1])
        if (since_us, until_us) != (self.since_us, self.until_us):
            raise _Shrink(since_us, until_us, function.qualified_name)
        self.holes[function.qualified_name] = holes(since_us, until_us, [_Span(*span) for span in spans])
        self.sources.add(function.qualified_name)

    def _gap(self, function: Function) -> ReplayGapError:
        return gap_error(function.qualified_name, self.since_us, self.until_us,
                         [_Span(since, until) for since, until in self._intervals(function)],
                         archived=function.archived)

    def _intervals(self, function: Function) -> list[tuple[int, int]]:
        if not function.archived:
            return []
        return covered_times(function, self.coverage.get(function.qualified_name, ()))


class _Shrink(Exception):
    """A lenient round's end: the range must shrink to [since_us, until_us), what `source` covers of it."""

    def __init__(self, since_us: int, until_us: int, source: str) -> None:
        super().__init__(source)
        self.since_us, self.until_us, self.source = since_us, until_us, source


@dataclass(frozen=True)
class _Span:
    since_us: int
    until_us: int


def covered_times(function: Function, intervals: Sequence[IntervalLike]) -> list[tuple[int, int]]:
    """The event times `function`'s archive answers for, from its recordings' coverage.

    A windowed function stamps each window's output with a time inside it (its start, its end,
    or the max of its tuples), and records a window only once committed, so after its last
    recorded output no tuple can come until the next window: its coverage ends at the next
    window boundary (tumbling windows aligned to the epoch). Without this, a per-minute function
    recorded to 10:59 (the start of its last window) would never answer a replay until 11:00."""
    spans = sorted((i.since_us, i.until_us) for i in intervals)
    if function.window is not None:
        every = function.window.every_us
        spans = [(since, -(-until // every) * every) for since, until in spans]
    merged: list[tuple[int, int]] = []
    for since, until in spans:
        if merged and since <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], until))
        else:
            merged.append((since, until))
    return merged


def newest_end_us(gap: ReplayGapError, since_us: int, until_us: int) -> int | None:
    """Where a range that ends now may end instead when a strict plan finds a gap at its end: the
    newest tuples are still on their way to the disk, which is not worth an error. None: the gap
    lies elsewhere (or is the whole range)."""
    return gap.gap_since_us if gap.gap_until_us == until_us and gap.gap_since_us > since_us else None


def without_newest_tail(plan: ReplayPlan, until_us: int) -> ReplayPlan:
    """A lenient plan of a range that ends now, without the uncovered part at its end (the newest
    tuples on their way to the disk: not a gap worth a warning)."""
    if plan.uncovered and plan.uncovered[-1][2] == until_us and plan.until_us < until_us:
        return replace(plan, uncovered=plan.uncovered[:-1])
    return plan


def uncovered_warning(plan: ReplayPlan) -> str | None:
    """One line naming what a lenient plan leaves out of the range, or None if nothing."""
    if not plan.uncovered:
        return None
    parts = ", ".join(f"{format_range(since, until)} ({name})" for name, since, until in plan.uncovered)
    return f"no archive covers {parts}: replaying {format_range(plan.since_us, plan.until_us)}"


# -- gap messages -------------------------------------------------------------------------------

def holes(since_us: int, until_us: int, intervals: Sequence[IntervalLike]) -> list[tuple[int, int]]:
    """The parts of [since_us, until_us) no interval covers, in order."""
    found, cursor = [], since_us
    for interval in sorted(intervals, key=lambda i: i.since_us):
        if interval.until_us <= cursor:
            continue
        if interval.since_us >= until_us:
            break
        if interval.since_us > cursor:
            found.append((cursor, interval.since_us))
        cursor = max(cursor, interval.until_us)
    if cursor < until_us:
        found.append((cursor, until_us))
    return found


def gap_error(name: str, since_us: int, until_us: int, intervals: Sequence[IntervalLike], *,
              archived: bool = True) -> ReplayGapError:
    """The error for `name`'s archive not covering [since_us, until_us), naming what is missing:
    `before X` (only the start is missing), `after Y` (only the end), `before X or after Y`
    (both ends), else `covers A..B` for the first hole, with the archive's oldest or newest time
    when nothing in the range is covered."""
    gaps = holes(since_us, until_us, intervals)
    first_since, first_until = gaps[0]
    at_start = first_since == since_us and first_until < until_us
    last_since, last_until = gaps[-1]
    at_end = last_until == until_us and last_since > since_us
    if len(gaps) == 1 and at_start:
        problem = f"before {format_time(first_until, ceil=True)}"
    elif len(gaps) == 1 and at_end:
        problem = f"after {format_time(last_since)}"
    elif len(gaps) == 2 and at_start and at_end:
        problem = f"before {format_time(first_until, ceil=True)} or after {format_time(last_since)}"
    else:
        problem = f"covers {format_range(first_since, first_until)}"
        problem += _context(since_us, until_us, intervals, archived)
        more = len(gaps) - 1
        if more:
            problem += (f" (and {more} more gap{'s' if more > 1 else ''} up to "
                        f"{format_time(until_us, ceil=True, day=date_of(first_since))})")
    return ReplayGapError(f"no archive of {name} {problem}", name, first_since, first_until)


def _context(since_us: int, until_us: int, intervals: Sequence[IntervalLike], archived: bool) -> str:
    """What the archive does hold, when none of it is in the range."""
    if not archived:
        return " (it is not archived)"
    if not intervals or any(i.since_us < until_us and since_us < i.until_us for i in intervals):
        return ""
    day = date_of(since_us)
    if all(i.since_us >= until_us for i in intervals):
        return f" (oldest: {format_time(min(i.since_us for i in intervals), ceil=True, day=day)})"
    if all(i.until_us <= since_us for i in intervals):
        return f" (newest: {format_time(max(i.until_us for i in intervals), day=day)})"
    return ""


def _suggestion(target: str, functions: Mapping[str, Function]) -> str:
    names = sorted(functions)
    close = difflib.get_close_matches(target, names, n=MAX_SUGGESTIONS, cutoff=SUGGESTION_CUTOFF)
    # `traffic` alone: offer every program's function of that name.
    close += [n for n in names if n.rpartition("/")[2] == target and n not in close]
    if not close:
        return ""
    return f" (did you mean {' or '.join(close[:MAX_SUGGESTIONS])}?)"


"""The metric tree a dashboard sees: `<program>.<function>[.<factor values>].<field>`.

Every replayable function (archived, or fed by an archived ancestor) with numeric fields is a
branch; each of its `factors` adds one level whose names are the factor's values, and its numeric
fields (not the event time, not a factor) are the leaves. A value that would break the dotted path
(a dot, a glob character, a quote) is written in double quotes, inner quotes doubled, as Ramen's
Graphite impersonation does: `net.traffic."10.0.0.1".bytes`.

Globs follow Graphite at every level: `*` and `?`, `[a-z]` classes, `{a,b}` alternatives.
Matching is per level, so `net.*.bytes` never crosses a dot. A tag query (ramen.httpd.tags) names
the same leaves by their tags instead.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

from ramen.httpd.tags import NAME_TAG, TagQuery, tagged_name, tags_of
from ramen.program import Function, Program, Window
from ramen.program.windows import row_windows
from ramen.replay.summary import numeric_fields

SEPARATOR = "."
QUOTE = '"'
_NEEDS_QUOTES = re.compile(r'[.*?\[\]{},"()\s]')
_BRACES = re.compile(r"\{([^{}]*)\}")
MAX_BRACE_EXPANSIONS = 1024
"""`{a,b}{c,d}...` multiplies: past this many alternatives a pattern is refused, not expanded."""


class PathError(ValueError):
    """A metric path or pattern that cannot be read; the message is one line for the user."""


@dataclass(frozen=True)
class Metric:
    """One leaf: a numeric field of a function, for one combination of its factors' values."""
    path: str
    function: str
    """Qualified `prog/func`."""
    factor_values: tuple[str, ...]
    field: str
    tags: tuple[tuple[str, str], ...] = ()
    """Named by a tag query (its path is then its tagged name): its tags (ramen.httpd.tags)."""


@dataclass
class Node:
    """A node of the tree that a pattern matched (what `/metrics/find` lists): a branch (more
    elements below) or a leaf (a metric)."""
    path: str
    leaf: bool
    intervals: list[tuple[int, int]] = field(default_factory=list)
    """[start, end) epoch-second ranges where a leaf has data (graphite-web's IntervalSet)."""

    @property
    def name(self) -> str:
        """The last element, as written in the path (quoted where it holds a dot)."""
        return split_path(self.path)[-1]


def quote(segment: str) -> str:
    """A name as one path segment: quoted when it holds what a path or a glob would read."""
    if segment and not _NEEDS_QUOTES.search(segment):
        return segment
    return QUOTE + segment.replace(QUOTE, QUOTE * 2) + QUOTE


def split_path(path: str) -> list[str]:
    """The segments of a path or pattern, dots inside quotes kept (the quotes too: a quoted
    segment matches its name literally)."""
    segments, current, quoted, i = [], [], False, 0
    while i < len(path):
        char = path[i]
        if char == QUOTE:
            if quoted and path[i + 1:i + 2] == QUOTE:
                current.append(QUOTE * 2)
                i += 2
                continue
            quoted = not quoted
            current.append(char)
        elif char == SEPARATOR and not quoted:
            segments.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    if quoted:
        raise PathError(f"unbalanced quote in {path!r}")
    segments.append("".join(current))
    if any(s == "" for s in segments):
        raise PathError(f"empty segment in {path!r}")
    return segments


def _unquote(segment: str) -> str | None:
    """The literal name of a quoted segment, None for an unquoted one (a glob)."""
    if len(segment) >= 2 and segment[0] == QUOTE and segment[-1] == QUOTE:
        return segment[1:-1].replace(QUOTE * 2, QUOTE)
    return None


def expand_braces(pattern: str) -> list[str]:
    """`a{b,c}d` -> [`abd`, `acd`], every brace group expanded (Graphite's alternatives)."""
    out, todo = [], [pattern]
    while todo:
        item = todo.pop()
        match = _BRACES.search(item)
        if match is None:
            out.append(item)
            continue
        for choice in match.group(1).split(","):
            todo.append(item[:match.start()] + choice + item[match.end():])
        if len(out) + len(todo) > MAX_BRACE_EXPANSIONS:
            raise PathError(f"{pattern!r} expands to more than {MAX_BRACE_EXPANSIONS} alternatives")
    return sorted(set(out))


class SegmentMatcher:
    """Whether a name matches one segment of a pattern."""

    def __init__(self, segment: str) -> None:
        literal = _unquote(segment)
        self.literal = literal
        self._patterns = [] if literal is not None else expand_braces(segment)
        self.is_glob = literal is None and any(c in segment for c in "*?[{")

    def __call__(self, name: str) -> bool:
        if self.literal is not None:
            return name == self.literal
        if not self.is_glob:
            return name == self._patterns[0]
        return any(fnmatch.fnmatchcase(name, p) for p in self._patterns)

    def select(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if self(n)]


_replayable_of: tuple[dict[str, Program], list[Function]] | None = None
"""The last programs asked and their replayable functions: every render builds its trees over the
same programs (httpd reads them again only when one changed), and a dashboard's 20 renders walked
them 40 times at the moment their replays ended."""


def replayable(programs: dict[str, Program]) -> list[Function]:
    """Functions a replay can produce: archived, or with an archived ancestor (a new list, of
    the same programs' last answer)."""
    global _replayable_of
    held = _replayable_of
    if held is not None and held[0] is programs:
        return list(held[1])
    functions = _replayable(programs)
    _replayable_of = (programs, functions)
    return list(functions)


def _replayable(programs: dict[str, Program]) -> list[Function]:
    by_name = {f.qualified_name: f for p in programs.values() for f in p}
    memo: dict[str, bool] = {}

    def fed(name: str) -> bool:
        if name not in memo:
            memo[name] = False  # a cycle (refused at load) cannot loop here
            function = by_name.get(name)
            memo[name] = function is not None and (function.archived or any(fed(p) for p in function.parents))
        return memo[name]

    windows = row_windows(by_name)
    return [_charted(f, windows[name]) for name, f in sorted(by_name.items()) if fed(name) and numeric_fields(f)]


def _charted(function: Function, window: Window | None) -> Function:
    """The function as dashboards chart it: one without a window of its own, whose rows come at its
    parents' window, is charted at that window's step (and its last window left out until whole,
    as theirs) rather than at DEFAULT_STEP_S, where 5 points of 6 would be null. A copy for
    httpd's steps, buckets and cache: a replay names the function, never this copy."""
    if function.window is not None or window is None:
        return function
    return replace(function, window=window)


FactorValues = Callable[[Function], list[tuple[str, ...]]]
"""The known combinations of a function's factor values (one string per factor)."""


class MetricTree:
    """The tree over the loaded programs; factor values come from `factor_values` (what the
    archives and past renders hold), asked only for the functions a pattern reaches."""

    def __init__(self, programs: dict[str, Program], factor_values: FactorValues) -> None:
        self.functions = replayable(programs)
        self._factor_values = factor_values

    def find(self, pattern: str) -> list[Node]:
        """The nodes at the pattern's depth that it matches, branches and leaves, sorted."""
        found = {_path(names): len(names) == _leaf_depth(function)
                 for names, function in self._matches(split_path(pattern))}
        return [Node(path, leaf) for path, leaf in sorted(found.items())]

    def expand(self, pattern: str) -> list[Metric]:
        """The metrics (leaves) the pattern, or a tag query, names, sorted by path."""
        if isinstance(pattern, TagQuery):
            return [Metric(tagged_name(tags), function.qualified_name, values, name, tuple(sorted(tags.items())))
                    for tags, function, values, name in self.tagged(pattern)]
        metrics = {}
        for names, function in self._matches(split_path(pattern), leaves_only=True):
            path = _path(names)
            metrics[path] = Metric(path, function.qualified_name, names[2:-1], names[-1])
        return [metrics[p] for p in sorted(metrics)]

    def tagged(self, query: TagQuery | None = None
               ) -> list[tuple[dict[str, str], Function, tuple[str, ...], str]]:
        """The tagged series (every one, or those `query` names) as (tags, function, factor values,
        field), sorted by tagged name; factor values are asked only of the functions a query may
        name by their other tags."""
        found = []
        for function in self.functions:
            for name in numeric_fields(function):
                metric = f"{function.program}.{function.name}.{name}"
                if query is not None and not query.may_match({NAME_TAG: metric}, function.factors):
                    continue
                for values in self._factor_values(function) if function.factors else [()]:
                    tags = tags_of(metric, function.factors, values)
                    if query is None or query.matches(tags):
                        found.append((tags, function, values, name))
        return sorted(found, key=lambda each: tagged_name(each[0]))

    def functions_matching(self, pattern: str) -> list[Function]:
        """The functions whose leaves the pattern may name: program and function segments match,
        and the pattern is as deep as their leaves; or whose series a tag query may name."""
        if isinstance(pattern, TagQuery):
            return [f for f in self.functions
                    if any(pattern.may_match({NAME_TAG: f"{f.program}.{f.name}.{name}"}, f.factors)
                           for name in numeric_fields(f))]
        segments = split_path(pattern)
        if len(segments) < 3:
            return []
        program, name = SegmentMatcher(segments[0]), SegmentMatcher(segments[1])
        return [f for f in self.functions
                if program(f.program) and name(f.name) and len(segments) == _leaf_depth(f)]

    def _matches(self, segments: list[str], leaves_only: bool = False
                 ) -> Iterator[tuple[tuple[str, ...], Function]]:
        """The names of each node as deep as `segments` that they match, with its function (a
        program's node comes once per function: callers key on the path). Factor values are asked
        only of the functions the pattern reaches below their own level; with `leaves_only`, only of
        those whose leaves it names (a render fetched no others: a branch is no series)."""
        matchers = [SegmentMatcher(s) for s in segments]
        depth = len(matchers)
        for function in self.functions:
            if not matchers[0](function.program) or (leaves_only and depth != _leaf_depth(function)):
                continue
            if depth == 1:
                yield (function.program,), function
                continue
            if not matchers[1](function.name) or depth > _leaf_depth(function):
                continue
            head = (function.program, function.name)
            if depth == 2:
                yield head, function
                continue
            factors = min(depth - 2, len(function.factors))
            combos = sorted({values[:factors] for values in self._factor_values(function)
                             if all(matchers[2 + i](values[i]) for i in range(factors))}) if factors else [()]
            fields = matchers[-1].select(numeric_fields(function)) if depth == _leaf_depth(function) else ()
            for combo in combos:
                if depth < _leaf_depth(function):
                    yield head + combo, function
                else:
                    for name in fields:
                        yield head + combo + (name,), function


def _leaf_depth(function: Function) -> int:
    """program, function, one level per factor, field."""
    return 3 + len(function.factors)


def _path(names: tuple[str, ...]) -> str:
    return SEPARATOR.join(quote(n) for n in names)

"""Closed buckets of past renders, so that a dashboard on "the last 6 h, refreshed every 10 s"
replays only the newest minutes and the holes, not 6 h every 10 s.

Per function (its qualified name and signature: a changed function never serves its old results)
the cache keeps chunks: settled ranges [since_s, until_s) of buckets with their sums and counts
(ramen.httpd.buckets). A range is settled once no row can still come into it (its end is older than
what the archives held at the replay, less the window's lateness and a margin). `holes` says what a
render must replay; `put` adds what a replay settled, merging with touching chunks. Memory is
bounded by `max_bytes`: the least recently used functions go first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import pyarrow as pa

from ramen.httpd import buckets
from ramen.program import Function

DEFAULT_MAX_BYTES = 256 * 1024 * 1024


@dataclass
class _Entry:
    chunks: list[tuple[int, int, pa.Table]] = field(default_factory=list)
    """Sorted, disjoint, not touching (touching chunks are merged)."""

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for _, _, t in self.chunks)


def _key(function: Function) -> tuple[str, str]:
    return function.qualified_name, function.signature


class ResultCache:
    """Thread-safe: renders run their replays on threads of their own."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    def lookup(self, function: Function, since_s: int, until_s: int) -> tuple[pa.Table, list[tuple[int, int]]]:
        """The cached buckets in [since_s, until_s), and the parts of it no chunk holds (the holes,
        in order), from one look: a chunk put meanwhile by another render is in both or in neither."""
        with self._lock:
            entry = self._entries.get(_key(function))
            chunks = list(entry.chunks) if entry else []
            if entry is not None:
                self._entries.move_to_end(_key(function))
        holes, at, parts = [], since_s, []
        for a, b, table in chunks:
            if b <= at or a >= until_s:
                continue
            parts.append(buckets.between(table, since_s, until_s))
            if a > at:
                holes.append((at, a))
            at = max(at, b)
        if at < until_s:
            holes.append((at, until_s))
        return buckets.combine(function, parts), holes

    def put(self, function: Function, since_s: int, until_s: int, table: pa.Table) -> None:
        """Keep the buckets of the settled range [since_s, until_s) (those of `table` in it)."""
        if since_s >= until_s:
            return
        table = buckets.between(table, since_s, until_s)
        with self._lock:
            self._drop_other_signatures(function)
            entry = self._entries.setdefault(_key(function), _Entry())
            self._entries.move_to_end(_key(function))
            kept, merged = [], [(since_s, until_s, table)]
            for a, b, t in entry.chunks:
                if b < since_s or a > until_s:
                    kept.append((a, b, t))
                else:  # touching or overlapping: one chunk (a new replay's buckets win where both are)
                    merged.append((a, b, buckets.between(t, a, since_s)))
                    merged.append((a, b, buckets.between(t, until_s, b)))
            low, high = min(m[0] for m in merged), max(m[1] for m in merged)
            kept.append((low, high, buckets.combine(function, [m[2] for m in merged])))
            entry.chunks = sorted(kept, key=lambda c: c[0])
            self._evict()

    def _drop_other_signatures(self, function: Function) -> None:
        for key in [k for k in self._entries if k[0] == function.qualified_name and k[1] != function.signature]:
            del self._entries[key]

    def _evict(self) -> None:
        total = sum(e.nbytes for e in self._entries.values())
        while total > self.max_bytes and len(self._entries) > 1:
            _, entry = self._entries.popitem(last=False)
            total -= entry.nbytes
        if total > self.max_bytes and self._entries:  # one function alone too big: keep its newest
            entry = next(iter(self._entries.values()))
            while entry.chunks and entry.nbytes > self.max_bytes:
                entry.chunks.pop(0)

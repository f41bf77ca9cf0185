"""Key syntax and pattern matching, the same for every backend.

Keys are `/`-separated paths of non-empty segments (`sites/local/workers/net/traffic/worker`).
Segments are limited to a safe character set because they become ZooKeeper node names and file
names; `.` and `..` are refused so no key can climb out of its tree.

Patterns select keys for `glob` and `watch`: `*` matches within one segment, `**` matches any
number of whole segments (including none), `?` one character. A pattern without any of these is
a prefix: the key itself and everything under it.
"""

from __future__ import annotations

import re
from functools import lru_cache

from confserver.errors import BadRequest

MAX_KEY_LENGTH = 1024
_SEGMENT = re.compile(r"[A-Za-z0-9_.:@=+,-]+")
_GLOB_CHARS = frozenset("*?[")


def check_key(key: str) -> str:
    """Return the key if it is well formed, else raise BadRequest naming it."""
    if not isinstance(key, str) or not key:
        raise BadRequest(f"bad key {key!r}: keys are non-empty strings")
    if len(key) > MAX_KEY_LENGTH:
        raise BadRequest(f"bad key {key[:40]!r}...: longer than {MAX_KEY_LENGTH} characters")
    for segment in key.split("/"):
        if not _SEGMENT.fullmatch(segment) or segment in (".", ".."):
            raise BadRequest(f"bad key {key!r}: segment {segment!r} must be non-empty and use only "
                             "letters, digits and _ . : @ = + , -")
    return key


def parent(key: str) -> str:
    return key.rpartition("/")[0]


def is_pattern(pattern: str) -> bool:
    return any(c in _GLOB_CHARS for c in pattern)


def check_pattern(pattern: str) -> str:
    if not isinstance(pattern, str) or len(pattern) > MAX_KEY_LENGTH:
        raise BadRequest(f"bad pattern {pattern!r}")
    return pattern


def prefix_of(pattern: str) -> str:
    """The longest key prefix every match starts with: where a backend starts looking."""
    if not is_pattern(pattern):
        return pattern.rstrip("/")
    head = []
    for segment in pattern.split("/"):
        if any(c in _GLOB_CHARS for c in segment):
            break
        head.append(segment)
    return "/".join(head)


@lru_cache(maxsize=1024)
def _compile(pattern: str) -> re.Pattern:
    if not is_pattern(pattern):
        prefix = re.escape(pattern.rstrip("/"))
        return re.compile(f"{prefix}(/.*)?" if prefix else ".+")
    parts = []
    for segment in pattern.split("/"):
        if segment == "**":
            parts.append(None)
            continue
        out = []
        i = 0
        while i < len(segment):
            c = segment[i]
            if c == "*":
                out.append("[^/]*")
            elif c == "?":
                out.append("[^/]")
            elif c == "[":
                end = segment.find("]", i + 1)
                if end < 0:
                    out.append(re.escape(c))
                else:
                    body = segment[i + 1:end].replace("\\", "\\\\")
                    if body.startswith("!"):
                        body = "^" + body[1:]
                    out.append(f"[{body}]")
                    i = end
            else:
                out.append(re.escape(c))
            i += 1
        parts.append("".join(out))
    regex = ""
    for i, part in enumerate(parts):
        if part is None:  # ** : zero or more whole segments
            regex += "(?:[^/]+/)*" if i < len(parts) - 1 else "(?:[^/]+(?:/[^/]+)*)?"
            continue
        regex += part + ("/" if i < len(parts) - 1 else "")
    if regex.endswith("/"):
        regex = regex[:-1]
    return re.compile(regex)


def matches(pattern: str, key: str) -> bool:
    """Whether key is selected by pattern (a glob, or a prefix when it has no glob character)."""
    return _compile(pattern).fullmatch(key) is not None

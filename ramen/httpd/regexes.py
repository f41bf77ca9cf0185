"""Regular expressions that requests bring (grep, exclude, aliasSub, aliasQuery, useSeriesAbove, tag
filters), matched within a time bound.

Python's re backtracks without bound and keeps the GIL meanwhile: `grep(p.f.*.bytes, '(0|00)+X')`
over one series whose name holds a long run of zeros would run for hours, and every request of
httpd would wait with it. The regex module reads re's syntax (graphite-web's users write for re),
takes a timeout, and with `concurrent=True` lets other threads run while it matches.
"""

from __future__ import annotations

import regex

MATCH_TIMEOUT_S = 0.1
"""For one match or substitution in one name: any sane expression takes microseconds."""


class RegexError(ValueError):
    """A bad expression or replacement, or one that backtracks without end; one line."""


class UserRegex:
    """`owner` (the function or parameter that was given it) begins its errors' messages."""

    def __init__(self, pattern: str, owner: str) -> None:
        self.pattern = pattern
        self.owner = owner
        try:
            self._compiled = regex.compile(pattern)
        except regex.error as e:
            raise RegexError(f"{owner}: bad regular expression {pattern!r}: {e}") from None

    def search(self, text: str) -> bool:
        return self._bounded(self._compiled.search, text) is not None

    def match(self, text: str) -> bool:
        """Whether it matches at the start of `text`."""
        return self._bounded(self._compiled.match, text) is not None

    def sub(self, replace: str, text: str) -> str:
        """`text` with every match replaced by `replace` (`\\1` for a group)."""
        try:
            return self._bounded(lambda t, **bound: self._compiled.sub(replace, t, **bound), text)
        except (regex.error, IndexError) as e:
            raise RegexError(f"{self.owner}: bad replacement {replace!r}: {e}") from None

    def _bounded(self, call, text: str):
        try:
            return call(text, timeout=MATCH_TIMEOUT_S, concurrent=True)
        except TimeoutError:
            raise RegexError(f"{self.owner}: regular expression {self.pattern!r} took over {MATCH_TIMEOUT_S:g} s "
                             f"on {text!r}: it backtracks without end; write it without nested repetition") from None

"""The window a function's rows come at: its own; for one without a window (and with an event
time), the one its parents all share, as `top_talkers` over `per_minute`'s minutes, whatever it
does with them; None where there is none or the parents' differ.

A range that cuts such a window cuts the rows of every descendant of it: a replay names those
windows and `--whole-windows` leaves them out (ramen/cli/replay.py), and dashboards chart such a
function at that window's step (ramen/httpd/names.py)."""

from __future__ import annotations

from collections.abc import Mapping

from ramen.program.model import Function, Window


def row_windows(functions: Mapping[str, Function]) -> dict[str, Window | None]:
    """By qualified name, the window each function's rows come at (`functions`: by qualified name,
    every loaded program's)."""
    memo: dict[str, Window | None] = {}

    def window(name: str) -> Window | None:
        if name not in memo:
            memo[name] = None  # a cycle (refused at load) cannot loop here
            function = functions.get(name)
            if function is not None and function.window is not None:
                memo[name] = function.window
            elif function is not None and function.event_time is not None and function.parents:
                shared = {window(p) for p in function.parents}
                memo[name] = shared.pop() if len(shared) == 1 else None
        return memo[name]

    return {name: window(name) for name in functions}

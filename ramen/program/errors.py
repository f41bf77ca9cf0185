"""The one exception a program file can raise, so callers (the CLI, `ramen run`, the HTTP API)
catch one type and show one line."""

from __future__ import annotations


class ProgramError(ValueError):
    """A program that cannot be loaded. str() is the whole story in one line:
    `<file>: <function>: <problem>` (or `<file>: <problem>` when no function is at fault)."""

    def __init__(self, file: str, function: str | None, problem: str):
        self.file = file
        self.function = function
        self.problem = problem
        where = f"{file}: {function}: " if function else f"{file}: "
        super().__init__(where + problem)

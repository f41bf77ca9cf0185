"""Program files: a TOML file of functions, parsed and validated into a frozen Program.

    program = load("examples/net.toml", loaded={"other": other_program})
    program.function("top_talkers").schema        # known before anything runs
    program.version, [f.signature for f in program]
    Program.from_json(program.to_json())           # the form stored under programs/<name>

Every problem is a ProgramError whose message is one line: `<file>: <function>: <problem>`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from ramen.program.durations import format_duration, parse_duration
from ramen.program.errors import ProgramError
from ramen.program.model import (ENGINE_PYTHON, ENGINE_SPARK, KIND_SOURCE, Function, Program, Source, Window,
                                 function_id, qualified, split_qualified)
from ramen.program.parse import parse

__all__ = ["ENGINE_PYTHON", "ENGINE_SPARK", "KIND_SOURCE", "Function", "Program", "ProgramError", "Source", "Window",
           "format_duration", "function_id", "load", "loads", "parse_duration", "qualified", "split_qualified"]


def load(path: str | Path, loaded: Mapping[str, Program] | None = None) -> Program:
    """The program in file `path`, validated against the `loaded` programs (name -> Program) its
    functions may read from. Errors name `path` as given."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ProgramError(file, None, f"cannot read: {getattr(e, 'strerror', None) or e}") from None
    return loads(text, file, loaded, path=str(Path(path).resolve()))


def loads(text: str, file: str = "<string>", loaded: Mapping[str, Program] | None = None,
          path: str | None = None) -> Program:
    """The program in `text`; `file` names it in errors, `path` (if any) is where `call` modules are
    looked up (see ramen.program.callables)."""
    # Imported here: validation needs networkx (about 0.13 s to import), and the commands that only
    # read stored programs (`ramen replay`, `ramen ps`) never validate.
    from ramen.program.validate import validate
    return validate(parse(text, file), file, loaded, path)

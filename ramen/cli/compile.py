"""`ramen compile FILE`: validate a program file and print its function table, without loading it.

What a user runs before `ramen run`: every mistake comes back as one line naming the file, the
function and the problem, and the table shows what each function will output.
"""

from __future__ import annotations

import sys

from ramen.cli.errors import UserError
from ramen.program import Function, Program, ProgramError, format_duration, load
from ramen.program.schema import describe

NONE = "-"
SIGNATURE_SHOWN = 8
"""Hex digits of signatures and versions in the human table; --json has them whole."""
COLUMNS = ("FUNCTION", "KIND", "LAZY", "FROM", "EVENT_TIME", "WINDOW", "ARCHIVE", "SIGNATURE")


def add_parser(sub) -> None:
    parser = sub.add_parser("compile",
                            description="Validate a program file (see docs/programs.md) and print each "
                                        "function: kind, laziness, parents, event time, window, retention "
                                        "and output schema. Exit 1 with one line if it is invalid.")
    parser.add_argument("file", help="a program file (TOML)")
    parser.add_argument("--with", dest="others", action="append", default=[], metavar="OTHER",
                        help="a program file whose functions FILE may read (`from = [\"other/func\"]`); repeatable")
    parser.add_argument("--json", action="store_true",
                        help="print the program as it is stored in the confserver under programs/<name>")
    parser.set_defaults(run=run)


def run(args) -> int:
    loaded: dict[str, Program] = {}
    try:
        for other in args.others:
            program = load(other, loaded)
            loaded[program.name] = program
        program = load(args.file, loaded)
    except ProgramError as e:
        raise UserError(str(e)) from None
    if args.json:
        print(program.to_json())
    else:
        print_table(program, sys.stdout)
    return 0


def print_table(program: Program, out) -> None:
    print(f"program {program.name}  version {program.version[:SIGNATURE_SHOWN]}  "
          f"({len(program.functions)} functions)\n", file=out)
    rows = [COLUMNS] + [_row(program, f) for f in program]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), file=out)
    print("\nOUTPUT SCHEMAS", file=out)
    width = max(len(f.name) for f in program)
    for function in program:
        print(f"{function.name.ljust(width)}  {describe(function.schema)}  ({function.schema_origin})", file=out)


def _row(program: Program, function: Function) -> tuple[str, ...]:
    parents = [p.split("/", 1)[1] if p.startswith(program.name + "/") else p for p in function.parents]
    window = NONE
    if function.window:
        window = format_duration(function.window.every_us)
        if function.window.lateness_us:
            window += f" (+{format_duration(function.window.lateness_us)} late)"
    return (function.name, function.kind, "yes" if function.lazy else "no", ",".join(parents) or NONE,
            function.event_time or NONE, window,
            format_duration(function.retention_us) if function.archived else NONE,
            function.signature[:SIGNATURE_SHOWN])

"""The `ramen` command: one subcommand per module in ramen.cli, each with its own --help.

User errors end in one line on stderr, `ramen: <command>: <problem>`, and a non-zero exit;
tracebacks only with --debug.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ramen import __version__
from ramen.cli import (archive, archiver, choreographer, confclient, confserver, demo, kill, logbuffer, ps, replay,
                       run, start, stat, supervisor, tail)
from ramen.cli import compile as compile_command
from ramen.cli.errors import UserError
from ramen.memory import retain_freed_memory

COMMANDS = (logbuffer, stat, demo, archive, archiver, confserver, confclient, compile_command,
            run, kill, ps, replay, tail, choreographer, supervisor, start)
EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130
SERVICE_COMMANDS = frozenset({"archiver", "confserver", "choreographer", "supervisor", "start"})
"""Commands that run a service, whose log says what its confserver client does. Other commands
keep the client's reconnections to themselves (the command's result, or its one-line error, says
what came of them), unless --debug."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ramen", description="ramen: stream processing with replayable workers")
    parser.add_argument("--version", action="version", version=f"ramen {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


#: Options whose values often start with "-" (relative times: `--since -2h`), which argparse
#: would otherwise take for options.
NEGATIVE_VALUE_OPTIONS = ("--since", "--until")


def _join_negative_values(argv: list[str]) -> list[str]:
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in NEGATIVE_VALUE_OPTIONS and arg.startswith("-") and not arg.startswith("--"):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    retain_freed_memory()  # `ramen replay` and `ramen tail` keep every message they read
    parser = build_parser()
    args, extra = parser.parse_known_args(_join_negative_values(sys.argv[1:] if argv is None else argv))
    if getattr(args, "passthrough", False):
        args.args = extra  # a service with its own parser (ramen archiver)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.debug and args.command not in SERVICE_COMMANDS:
        logging.getLogger("confserver.remote").setLevel(logging.ERROR)
    try:
        return args.run(args) or 0
    except UserError as e:
        if args.debug:
            raise
        print(f"ramen: {args.command}: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`): not an error worth a traceback.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())

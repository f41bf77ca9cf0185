"""The `ramen` command: one subcommand per module in ramen.cli, each with its own --help.

User errors end in one line on stderr, `ramen: <command>: <problem>`, and a non-zero exit;
tracebacks only with --debug.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from ramen import __version__, paths
from ramen.cli.errors import OutputError, UserError, silence_stdout, writing
from ramen.memory import retain_freed_memory

COMMANDS = {
    # name: (the module whose add_parser() declares it, its line in `ramen --help`)
    "logbuffer": ("ramen.cli.logbuffer", "look into log buffer files"),
    "stat": ("ramen.cli.stat", "print the counters (positions, back pressure, drops, services)"),
    "demo": ("ramen.cli.demo", "stream messages between two processes through a log buffer"),
    "archive": ("ramen.cli.archive", "look into Aeron Archive directories (recordings and their catalog)"),
    "archiver": ("ramen.cli.archiver", "record log buffers into an archive directory until stopped"),
    "confserver": ("ramen.cli.confserver", "run the built-in configuration server until stopped"),
    "confclient": ("ramen.cli.confclient", "get, set, delete, list or watch confserver keys"),
    "compile": ("ramen.cli.compile", "validate a program file and print its functions"),
    "run": ("ramen.cli.run", "validate a program file and load it"),
    "kill": ("ramen.cli.kill", "unload a program (and, with --purge, its archives)"),
    "ps": ("ramen.cli.ps", "list the workers: used, running, counts, CPU, memory"),
    "replay": ("ramen.cli.replay", "what a function produced over a past time range"),
    "tail": ("ramen.cli.tail", "a function's latest output, or follow it"),
    "choreographer": ("ramen.cli.choreographer", "decide which workers must run, until stopped"),
    "supervisor": ("ramen.cli.supervisor", "run the workers and replayers of a site, until stopped"),
    "httpd": ("ramen.cli.httpd", "serve the Graphite API (Grafana), /metrics (Prometheus) and dashboards"),
    "netd": ("ramen.cli.netd", "send and receive streams between sites over UDP (Aeron's protocol), until stopped"),
    "start": ("ramen.cli.start", "run the confserver, choreographer, supervisor and archiver here"),
    "stop": ("ramen.cli.start", "stop what `ramen start --daemon` started"),
}
"""Only the module of the command given is imported: `ramen tail` does not load the archive or
Spark before it starts, and `ramen --help` answers at once."""
EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130
SERVICE_COMMANDS = frozenset({"archiver", "confserver", "choreographer", "supervisor", "httpd", "netd", "start"})
"""Commands that run a service, whose log says what its confserver client does. Other commands
keep the client's reconnections to themselves (the command's result, or its one-line error, says
what came of them), unless --debug."""
EXIT_AT_ONCE_COMMANDS = frozenset({"replay", "tail"})
"""Commands whose process ends as soon as its output is flushed (`entry`): after a replay, the
interpreter's teardown (the result's objects, pyarrow's memory pool, every module) took 60-90 ms
more of `ramen replay`'s 1.3 s, for nothing."""
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""An OSError with one of these is the disk's state, not a bug: one line, not a traceback."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of `ramen`, with the arguments of `command`; the other commands are only named."""
    parser = argparse.ArgumentParser(prog="ramen", description="ramen: stream processing with replayable workers")
    parser.add_argument("--version", action="version", version=f"ramen {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    # Taken out of argv by _take_dir before parsing (it may follow the command): declared for --help.
    parser.add_argument("--dir", metavar="DIR", dest="instance_dir",
                        help="the ramen instance's directory, before or after the command: where `ramen start` "
                             "keeps everything, and how other commands find its confserver "
                             f"(default ${paths.RAMEN_DIR_ENV}, else {paths.ramen_dir()})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    if command in COMMANDS:
        importlib.import_module(COMMANDS[command][0]).add_parser(sub)
    for name, (_, help_line) in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=help_line)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The command `argv` names: its first word that is not an option (ramen's own options take
    no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


DIR_OPTION = "--dir"
OWN_PARSER_COMMANDS = frozenset({"archiver"})
"""Commands with a parser of their own, whose `--dir` after the command is theirs (the archive's)."""


def _take_dir(argv: list[str]) -> tuple[list[str], str | None]:
    """argv without the global `--dir DIR` (or `--dir=DIR`), wherever it is, and DIR (the last
    one given). It names the instance every command works with, so it is applied before any
    parser is built (their defaults are paths under it)."""
    rest: list[str] = []
    directory = None
    command = None
    args = iter(argv)
    for arg in args:
        if arg == "--" or (command in OWN_PARSER_COMMANDS):
            rest.append(arg)
            rest.extend(args)
            break
        if arg == DIR_OPTION:
            directory = next(args, None)
            if directory is None:
                raise UserError(f"{DIR_OPTION} needs a directory")
        elif arg.startswith(f"{DIR_OPTION}="):
            directory = arg.partition("=")[2]
        else:
            if command is None and not arg.startswith("-"):
                command = arg
            rest.append(arg)
    return rest, directory


#: Options whose values often start with "-" (relative times: `--since -2h`, `--before -30d`), which
#: argparse would otherwise take for options.
NEGATIVE_VALUE_OPTIONS = ("--since", "--until", "--before")


def _join_negative_values(argv: list[str]) -> list[str]:
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in NEGATIVE_VALUE_OPTIONS and arg.startswith("-") and not arg.startswith("--"):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None, *, program: bool = False) -> int:
    """The command's exit status. `program`: the `ramen` program itself (`entry`), not a caller in
    this process: the output is flushed here, where a full disk is the command's one-line error,
    and an EXIT_AT_ONCE_COMMANDS command ends the process then."""
    retain_freed_memory()  # `ramen replay` and `ramen tail` keep every message they read
    argv = _join_negative_values(sys.argv[1:] if argv is None else argv)
    try:
        argv, directory = _take_dir(argv)
    except UserError as e:
        print(f"ramen: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    if directory is not None:
        # In the environment: every path of this process, and of every process it starts, agrees.
        os.environ[paths.RAMEN_DIR_ENV] = str(Path(directory).resolve())
    if (problem := _instance_dir_problem(paths.ramen_dir())) is not None:
        if directory is not None:
            given = f"--dir {directory}"
        elif os.environ.get(paths.RAMEN_DIR_ENV):
            given = f"${paths.RAMEN_DIR_ENV} ({paths.ramen_dir()})"
        else:
            given = str(paths.ramen_dir())
        print(f"ramen: {given}: {problem}", file=sys.stderr)
        return EXIT_USER_ERROR
    parser = build_parser(_command_of(argv))
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "passthrough", False):
        args.args = extra  # a service with its own parser (ramen archiver)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.debug and args.command not in SERVICE_COMMANDS:
        # A command's one line says what failed; its clients' retries are noise before it.
        for name in ("confserver.remote", "kazoo"):
            logging.getLogger(name).setLevel(logging.ERROR)
    status = _run(args)
    if program:
        status = _flushed(args.command, status)
        if args.command in EXIT_AT_ONCE_COMMANDS:
            logging.shutdown()
            os._exit(status)
    return status


def _instance_dir_problem(directory: Path) -> str | None:
    """Why `directory` cannot hold an instance (it, or the first of its parents that exists, is not
    a directory), or None: every command would otherwise fail on its first path under it."""
    for path in (directory, *directory.parents):
        if path.exists():
            return None if path.is_dir() else ("not a directory" if path == directory else f"{path} is not a directory")
    return None


def _run(args) -> int:
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
    except OSError as e:
        if args.debug or e.errno not in DISK_FULL_ERRNOS:
            raise
        # worded as an OutputError (ramen/cli/errors.py writing) says it
        print(f"ramen: {args.command}: cannot write {e.filename or 'the output'}: {e.strerror}", file=sys.stderr)
        return EXIT_USER_ERROR


def _flushed(command: str, status: int) -> int:
    """The status once stdout and stderr are flushed: output that cannot be (a full disk) is the
    command's one-line error, where the interpreter would print a traceback at its exit."""
    try:
        with writing():
            sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()  # the reader went away (`| head`): as _run answers it
    except OutputError as e:
        silence_stdout()
        print(f"ramen: {command}: {e}", file=sys.stderr)
        status = status or EXIT_USER_ERROR
    except ValueError:  # stdout closed
        pass
    try:
        sys.stderr.flush()
    except (OSError, ValueError):  # closed after a broken pipe, or gone
        pass
    return status


def entry() -> NoReturn:
    """The `ramen` program (pyproject's script, `python -m ramen.cli.main`)."""
    sys.exit(main(program=True))


if __name__ == "__main__":
    entry()

"""`ramen run FILE [--replace]`: validate a program and load it into the confserver.

The choreographer picks it up from `programs/<name>`; nothing is written if the file is invalid.
"""

from __future__ import annotations

import json
import sys
import time

from ramen import keyspace
from ramen.cli import conf
from ramen.cli.errors import UserError

IDENTITY = "user"


def add_parser(sub) -> None:
    parser = sub.add_parser("run",
                            description="Validate a program file and load it (programs/<name> in the confserver).")
    parser.add_argument("file", help="a program file (TOML, see docs/programs.md)")
    parser.add_argument("--replace", action="store_true", help="replace a loaded program of the same name")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    conf.add_arguments(parser, IDENTITY)
    parser.set_defaults(run=run)


def run(args) -> int:
    with conf.connected(args) as client:
        program, outcome = load_program(client, args.file, replace=args.replace)
    if args.json:
        print(json.dumps({"program": program.name, "version": program.version, "outcome": outcome,
                          "functions": [f.qualified_name for f in program]}))
    else:
        print(f"{outcome} {program.name}: {len(program.functions)} functions, version {program.version[:8]}")
    return 0


def load_program(client, file, *, replace: bool):
    """Validate `file` against the loaded programs and store it; (program, "loaded" | "replaced" |
    "unchanged"). Every problem is a UserError of one line."""
    import confserver
    from ramen.program import ProgramError, load
    loaded = conf.loaded_programs(client)
    try:
        program = load(file, loaded)
    except ProgramError as e:
        raise UserError(str(e)) from None
    check_spark_sql(client, program)
    key = keyspace.program_key(program.name)
    existing = client.get_or_none(key)
    if existing is not None and not replace:
        raise UserError(f"program {program.name} is already loaded: use --replace to replace it")
    if existing is not None and existing.value.get("version") == program.version:
        return program, "unchanged"
    try:
        if existing is None:
            client.create(key, program.to_dict())
        else:
            client.update(key, program.to_dict(), version=existing.version)
    except (confserver.KeyExists, confserver.VersionMismatch):
        raise UserError(f"program {program.name} was changed by someone else meanwhile: run again") from None
    return program, "replaced" if existing is not None else "loaded"


def check_spark_sql(client, program) -> None:
    """Spark analyses every Spark function's SQL against its parents' schemas (UserError if it
    refuses one). Asks `ramen start` for its local Spark (the `spark/wanted` key) if none is up."""
    from ramen.spark.check import SparkSqlError, check_program, spark_functions
    from ramen.spark.session import SparkUnavailable, session
    if not spark_functions(program):
        return
    remote = _spark_remote(client)
    try:
        with session(remote) as spark:
            check_program(spark, program)
    except SparkSqlError as e:
        raise UserError(str(e)) from None
    except SparkUnavailable as e:
        raise UserError(f"cannot check the Spark SQL of {program.name}: Spark at {remote}: {e}") from None


def _spark_remote(client) -> str:
    from ramen.spark.contract import find_server
    from ramen.spark.defaults import READY_TIMEOUT_S
    deadline = time.monotonic() + READY_TIMEOUT_S
    asked = False
    while True:
        server = find_server(client)
        if server is not None:
            return server.remote
        if not asked:
            client.set(keyspace.SPARK_WANTED, {"by": "ramen run", "since_us": time.time_ns() // 1000})
            print("ramen: waiting for Spark to start (ramen start starts it; a cold start takes 10-20 s)",
                  file=sys.stderr, flush=True)
            asked = True
        if time.monotonic() > deadline:
            raise UserError(f"no Spark after {READY_TIMEOUT_S:g} s: is `ramen start` running "
                            f"(or give an endpoint in $RAMEN_SPARK_REMOTE)?")
        time.sleep(0.25)

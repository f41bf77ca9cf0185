"""From TOML text to checked function specs: syntax, keys, value types, names, durations, and the
rules that concern one function alone. Rules that need other functions (parents, cycles, schemas)
are in validate.py. The first problem found ends the parse with a one-line ProgramError."""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ramen import keyspace
from ramen.program.durations import parse_duration
from ramen.program.errors import ProgramError
from ramen.program.model import ENGINE_PYTHON, ENGINE_SPARK, ENGINES, QUALIFIER, Source, Window
from ramen.program.schema import parse_type

NAME = re.compile(r"[A-Za-z0-9_]+")
"""Program and function names become file names and confserver key paths: nothing else is safe."""
TOP_KEYS = ("program", "function")
PROGRAM_KEYS = ("name",)
FUNCTION_KEYS = ("name", "source", "schema", "event_time", "archive", "lazy", "from", "window", "engine", "sql",
                 "call", "factors", "site")
WINDOW_KEYS = ("every", "lateness")
ARCHIVE_KEYS = ("retention",)
SOURCE_KEYS = {
    "generator": ("kind", "rate", "hosts", "seed", "backfill"),
    "csv": ("kind", "path", "follow"),
    "jsonl": ("kind", "path", "follow"),
    "parquet": ("kind", "path", "follow"),
}
GENERATOR_DEFAULTS = {"rate": 1000, "hosts": 10, "seed": 0}
_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_TOML_END = re.compile(r"\s*\(at end of document\)$")


@dataclass(frozen=True)
class FunctionSpec:
    """One [[function]] as written, checked on its own; validate.py turns it into a Function."""
    index: int
    name: str
    source: Source | None
    declared_schema: pa.Schema | None
    parents: tuple[str, ...]
    """As written: `func` (this program) or `prog/func`."""
    lazy: bool
    event_time: str | None
    window: Window | None
    retention_us: int | None
    engine: str | None
    sql: str | None
    call: str | None
    factors: tuple[str, ...] = ()
    site: str | None = None


@dataclass(frozen=True)
class ProgramSpec:
    name: str
    functions: tuple[FunctionSpec, ...]


def parse(text: str, file: str) -> ProgramSpec:
    """The program in `text`; `file` names it in error messages."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProgramError(file, None, _toml_problem(str(e))) from None
    except RecursionError:  # tomllib recurses once a nested array or inline table
        raise ProgramError(file, None, "invalid TOML: arrays or inline tables nested too deeply") from None
    _check_keys(document, TOP_KEYS, file, None, "the file")
    header = document.get("program")
    if not isinstance(header, dict):
        raise ProgramError(file, None, "missing [program] table with the program's name")
    _check_keys(header, PROGRAM_KEYS, file, None, "[program]")
    name = header.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ProgramError(file, None, f"bad program name {name!r}: use only letters, digits and _")
    tables = document.get("function", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ProgramError(file, None, "functions are written as [[function]] tables")
    if not tables:
        raise ProgramError(file, None, "no [[function]] in the program")
    specs, seen = [], {}
    for index, table in enumerate(tables, start=1):
        spec = _parse_function(table, index, file)
        if spec.name in seen:
            raise ProgramError(file, spec.name, f"duplicate function name (functions #{seen[spec.name]} and #{index})")
        seen[spec.name] = index
        specs.append(spec)
    return ProgramSpec(name, tuple(specs))


def _toml_problem(message: str) -> str:
    """tomllib says "Expected '=' ... (at line 3, column 5)"; we lead with the place."""
    if match := _TOML_POSITION.search(message):
        return f"line {match.group(1)}, column {match.group(2)}: invalid TOML: {message[:match.start()]}"
    if match := _TOML_END.search(message):
        return f"at the end: invalid TOML: {message[:match.start()]}"
    return f"invalid TOML: {message}"


def _check_keys(table: dict, allowed, file: str, function: str | None, where: str | None) -> None:
    if problem := _key_problem(table, allowed, where):
        raise ProgramError(file, function, problem)


def _key_problem(table: dict, allowed, where: str | None) -> str | None:
    """The first key of `table` not in `allowed`, said with the closest allowed key (typos are the usual cause)."""
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "expected " + ", ".join(allowed)
            prefix = f"{where} has unknown key" if where else "unknown key"
            return f"{prefix} {key!r} ({hint})"
    return None


def _parse_function(table: dict, index: int, file: str) -> FunctionSpec:
    name = table.get("name")
    if name is None:
        raise ProgramError(file, f"function #{index}", "missing name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ProgramError(file, f"function #{index}", f"bad function name {name!r}: use only letters, digits and _")

    def fail(problem: str):
        raise ProgramError(file, name, problem)

    def typed(key: str, kind: type | tuple, what: str, default: Any = None) -> Any:
        value = table.get(key, default)
        # bool is an int in Python, but `rate = true` is a mistake, not 1.
        if value is not default and (not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)):
            fail(f"{key!r} must be {what}, not {value!r}")
        return value

    _check_keys(table, FUNCTION_KEYS, file, name, None)
    lazy = typed("lazy", bool, "true or false", False)
    event_time = typed("event_time", str, "a field name")
    engine = typed("engine", str, "'python' or 'spark'")
    sql = typed("sql", str, "a string of SQL")
    call = typed("call", str, "'module:function'")
    parents = typed("from", list, "a list of function names", [])
    source = _parse_source(typed("source", dict, "a table such as { kind = \"csv\", path = \"x.csv\" }"), fail)
    schema = _parse_schema(typed("schema", dict, "a table of field = \"type\""), fail)
    window = _parse_window(typed("window", dict, "a table such as { every = \"1 minute\" }"), fail)
    retention_us = _parse_archive(typed("archive", dict, "a table such as { retention = \"7d\" }"), fail)
    factors = typed("factors", list, "a list of field names, such as [\"host\"]", [])
    if not all(isinstance(f, str) for f in factors) or len(set(factors)) != len(factors):
        fail(f"'factors' must be a list of distinct field names, not {factors!r}")
    site = typed("site", str, "a site's name, such as \"edge\"")
    if site is not None:
        try:
            keyspace.check_site(site)
        except ValueError as e:
            fail(str(e))

    for parent in parents:
        parts = parent.split(QUALIFIER) if isinstance(parent, str) else [None]
        if len(parts) > 2 or not all(isinstance(p, str) and NAME.fullmatch(p) for p in parts):
            fail(f"bad parent {parent!r}: expected 'function' or 'program/function'")
    if len(set(parents)) != len(parents):
        fail("a parent is listed twice in 'from'")
    if source is not None:
        if parents:
            fail("a source has no parents: remove 'from' or 'source'")
        for key in ("engine", "sql", "call", "window"):
            if key in table:
                fail(f"a source has no {key!r}")
        if schema is None:
            fail("a source needs a declared 'schema'")
    else:
        if not parents:
            fail("no parents: add 'from' (or 'source' for a source)")
        if engine is None:
            fail("missing engine ('python' or 'spark')")
        if engine not in ENGINES:
            fail(f"unknown engine {engine!r} (expected 'python' or 'spark')")
        if engine == ENGINE_SPARK:
            if sql is None:
                fail("engine 'spark' needs 'sql'")
            if call is not None:
                fail("'call' is for engine 'python'; engine 'spark' runs 'sql'")
        if engine == ENGINE_PYTHON:
            if call is None:
                fail("engine 'python' needs 'call' (\"module:function\")")
            if sql is not None:
                fail("'sql' is for engine 'spark'; engine 'python' runs 'call'")
    if window is not None and event_time is None:
        fail("a window needs an event time: add 'event_time'")
    if retention_us is not None and event_time is None:
        fail("an archive is replayed by event time: add 'event_time'")
    return FunctionSpec(index, name, source, schema, tuple(parents), lazy, event_time, window, retention_us, engine,
                        sql.strip() if sql is not None else None, call, tuple(factors), site)


def _parse_source(table: dict | None, fail) -> Source | None:
    if table is None:
        return None
    kind = table.get("kind")
    if kind not in SOURCE_KEYS:
        fail(f"unknown source kind {kind!r} (expected {', '.join(SOURCE_KEYS)})")
    allowed = SOURCE_KEYS[kind]
    if problem := _key_problem(table, allowed, "source"):
        fail(problem)
    options = {k: v for k, v in table.items() if k != "kind"}
    if kind == "generator":
        options = {**GENERATOR_DEFAULTS, **options}
        for key in ("rate", "hosts"):
            value = options[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                fail(f"source {key!r} must be a positive number, not {value!r}")
        if isinstance(options["seed"], bool) or not isinstance(options["seed"], int):
            fail(f"source 'seed' must be an integer, not {options['seed']!r}")
        if "backfill" in options:  # produce [now - backfill, now) at start, as fast as possible
            try:
                parse_duration(options["backfill"])
            except ValueError as e:
                fail(f"source 'backfill': {e}")
    else:
        if not isinstance(options.get("path"), str) or not options["path"]:
            fail(f"a {kind} source needs 'path' (a file, relative to the program file)")
        if "follow" in allowed:
            options.setdefault("follow", False)
            if not isinstance(options["follow"], bool):
                fail(f"source 'follow' must be true or false, not {options['follow']!r}")
    return Source(kind, tuple(sorted(options.items())))


def _parse_schema(table: dict | None, fail) -> pa.Schema | None:
    if table is None:
        return None
    if not table:
        fail("'schema' has no fields")
    fields = []
    for field_name, type_text in table.items():
        try:
            fields.append(pa.field(field_name, parse_type(type_text)))
        except ValueError as e:
            fail(f"schema field {field_name!r}: {e}")
    return pa.schema(fields)


def _parse_window(table: dict | None, fail) -> Window | None:
    if table is None:
        return None
    if problem := _key_problem(table, WINDOW_KEYS, "window"):
        fail(problem)
    if "every" not in table:
        fail("window needs 'every' (e.g. \"1 minute\")")
    try:
        every = parse_duration(table["every"])
    except ValueError as e:
        fail(f"window 'every': {e}")
    try:
        lateness = parse_duration(table.get("lateness", "0s"), allow_zero=True)
    except ValueError as e:
        fail(f"window 'lateness': {e}")
    return Window(every, lateness)


def _parse_archive(table: dict | None, fail) -> int | None:
    if table is None:
        return None
    if problem := _key_problem(table, ARCHIVE_KEYS, "archive"):
        fail(problem)
    if "retention" not in table:
        fail("archive needs 'retention' (e.g. \"7d\")")
    try:
        return parse_duration(table["retention"])
    except ValueError as e:
        fail(f"archive 'retention': {e}")

"""What a loaded program is: frozen Program and Function values that the choreographer, the
supervisor, the workers and replay planning read, and their JSON form (stored in the confserver
under `programs/<name>`).

A Function's `signature` hashes everything that changes what it outputs, so the choreographer
restarts a worker exactly when its signature changes; the Program's `version` changes whenever
anything in the program does (laziness, retention included).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterator

import pyarrow as pa

from ramen.program.errors import ProgramError
from ramen.program.schema import schema_from_pairs, schema_to_pairs

JSON_FORMAT = 1
"""Bump when the JSON form changes incompatibly."""
SIGNATURE_BYTES = 16
KIND_SOURCE, ENGINE_PYTHON, ENGINE_SPARK = "source", "python", "spark"
ENGINES = (ENGINE_PYTHON, ENGINE_SPARK)
SCHEMA_DECLARED, SCHEMA_INFERRED, SCHEMA_FROM_PARENT = "declared", "inferred", "parent"
QUALIFIER = "/"
"""Between program and function in a qualified name: `net/traffic`."""

STORED = "stored program"
"""Where a stored program that names no file comes from, in its errors."""


def qualified(program: str, function: str) -> str:
    return f"{program}{QUALIFIER}{function}"


def split_qualified(name: str) -> tuple[str, str]:
    program, _, function = name.partition(QUALIFIER)
    return program, function


def function_id(qualified_name: str) -> int:
    """A function's 32-bit id, the same in every process and on every host: its output log's
    session and stream ids (int32 of it), the `source` of the END_OF_REPLAYs its worker forwards,
    and the stream id netd sends its output under to other sites."""
    return int.from_bytes(hashlib.blake2b(qualified_name.encode(), digest_size=4).digest(), "little")


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=SIGNATURE_BYTES).hexdigest()


@dataclass(frozen=True)
class Source:
    """Where a source function's tuples come from: kind "generator", "csv", "parquet" or "jsonl",
    and its options (rate/hosts/seed for the generator, path/follow for files)."""
    kind: str
    options: tuple[tuple[str, Any], ...] = ()

    def option(self, name: str, default: Any = None) -> Any:
        return dict(self.options).get(name, default)

    def to_dict(self) -> dict:
        return {"kind": self.kind, **dict(self.options)}

    @classmethod
    def from_dict(cls, data: dict) -> Source:
        options = {k: v for k, v in data.items() if k != "kind"}
        return cls(data["kind"], tuple(sorted(options.items())))


@dataclass(frozen=True)
class Window:
    """Tumbling event-time windows of `every_us`; a window closes `lateness_us` after its end."""
    every_us: int
    lateness_us: int = 0


@dataclass(frozen=True)
class Function:
    program: str
    name: str
    schema: pa.Schema
    """The output schema, known before the function runs."""
    schema_origin: str = SCHEMA_DECLARED
    source: Source | None = None
    parents: tuple[str, ...] = ()
    """Qualified names (`prog/func`), in the order the program lists them."""
    input_schemas: tuple[tuple[str, pa.Schema], ...] = ()
    """Each parent's output schema, as validated: part of the signature."""
    lazy: bool = False
    event_time: str | None = None
    window: Window | None = None
    retention_us: int | None = None
    """None: not archived."""
    engine: str | None = None
    sql: str | None = None
    call: str | None = None
    code_digest: str | None = None
    """Hash of the Python module that holds `call`, so editing the callable's code restarts the worker."""
    factors: tuple[str, ...] = ()
    """Fields whose values split the output into series for dashboards (`net.traffic.<host>.bytes`).
    They name series, they change no output: not part of the signature."""
    site: str | None = None
    """The one site it runs on; None: every site (each site runs its own). Where it runs changes
    nothing it computes: not part of the signature."""

    @property
    def qualified_name(self) -> str:
        return qualified(self.program, self.name)

    @property
    def kind(self) -> str:
        return KIND_SOURCE if self.source is not None else self.engine

    @property
    def archived(self) -> bool:
        return self.retention_us is not None

    @cached_property
    def signature(self) -> str:
        """Hex digest of what determines the output: the body, parents and their schemas, the
        output schema, event time, window, engine, source. Not the name, laziness or retention:
        changing those never needs the worker restarted."""
        return _digest({
            "kind": self.kind,
            "source": self.source.to_dict() if self.source else None,
            "parents": [[parent, schema_to_pairs(schema)] for parent, schema in self.input_schemas]
            or list(self.parents),
            "schema": schema_to_pairs(self.schema),
            "event_time": self.event_time,
            "window": [self.window.every_us, self.window.lateness_us] if self.window else None,
            "engine": self.engine, "sql": self.sql, "call": self.call, "code": self.code_digest,
        })

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "source": self.source.to_dict() if self.source else None,
            "from": list(self.parents),
            "inputs": [[parent, schema_to_pairs(schema)] for parent, schema in self.input_schemas],
            "lazy": self.lazy,
            "event_time": self.event_time,
            "window": {"every_us": self.window.every_us, "lateness_us": self.window.lateness_us}
            if self.window else None,
            "retention_us": self.retention_us,
            "engine": self.engine,
            "sql": self.sql,
            "call": self.call,
            "code_digest": self.code_digest,
            "factors": list(self.factors),
            "site": self.site,
            "schema": schema_to_pairs(self.schema),
            "schema_origin": self.schema_origin,
            "signature": self.signature,  # for readers that do not recompute it; from_dict does
        }

    @classmethod
    def from_dict(cls, program: str, data: dict) -> Function:
        window = data.get("window")
        return cls(
            program=program, name=data["name"],
            schema=schema_from_pairs(data["schema"]), schema_origin=data["schema_origin"],
            source=Source.from_dict(data["source"]) if data.get("source") else None,
            parents=tuple(data["from"]),
            input_schemas=tuple((parent, schema_from_pairs(pairs)) for parent, pairs in data["inputs"]),
            lazy=data["lazy"], event_time=data["event_time"],
            window=Window(window["every_us"], window["lateness_us"]) if window else None,
            retention_us=data["retention_us"], engine=data["engine"], sql=data["sql"], call=data["call"],
            code_digest=data["code_digest"], factors=tuple(data.get("factors", ())),
            site=data.get("site"),
        )


@dataclass(frozen=True)
class Program:
    name: str
    functions: tuple[Function, ...]
    path: str | None = field(default=None, compare=False)
    """The file it was loaded from (absolute); where `call` modules and relative source paths are
    looked up. Not part of the version: moving a file changes nothing it computes."""

    def __iter__(self) -> Iterator[Function]:
        return iter(self.functions)

    def __contains__(self, name: str) -> bool:
        return any(f.name == name for f in self.functions)

    def function(self, name: str) -> Function:
        """The function called `name` (unqualified); KeyError otherwise."""
        for function in self.functions:
            if function.name == name:
                return function
        raise KeyError(f"{self.name} has no function {name!r}")

    def edges(self) -> Iterator[tuple[str, str]]:
        """(parent, child) qualified names, for the choreographer's graph; parents may be in other programs."""
        for function in self.functions:
            for parent in function.parents:
                yield parent, function.qualified_name

    @cached_property
    def version(self) -> str:
        """Changes whenever anything in the program does (a signature, laziness, retention, a function added)."""
        return _digest({"name": self.name,
                        "functions": [[f.name, f.signature, f.lazy, f.retention_us]
                                      + ([list(f.factors)] if f.factors else []) + ([f.site] if f.site else [])
                                      for f in self.functions]})

    def to_dict(self) -> dict:
        return {"format": JSON_FORMAT, "name": self.name, "version": self.version, "path": self.path,
                "functions": [f.to_dict() for f in self.functions]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict) -> Program:
        """A program as `to_dict` stored it; ProgramError names what makes a stored value
        unreadable (another format, a field missing or of the wrong kind)."""
        if not isinstance(data, dict):
            raise ProgramError(STORED, None, f"a {type(data).__name__}, not a program")
        where = str(data.get("path") or STORED)
        if data.get("format") != JSON_FORMAT:
            raise ProgramError(where, None, f"program JSON format {data.get('format')!r} is not {JSON_FORMAT}")
        try:
            name = data["name"]
            return cls(name, tuple(Function.from_dict(name, f) for f in data["functions"]), data.get("path"))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ProgramError(where, None, f"unreadable ({type(e).__name__}: {e})") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> Program:
        return cls.from_dict(json.loads(text))

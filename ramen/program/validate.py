"""The rules that need more than one function: parents exist (here or in loaded programs), no cycles
(within and across programs), and every output schema known before anything runs, so children,
event times and windows are checked against what their parents really produce."""

from __future__ import annotations

import difflib
import logging
import re
from typing import Mapping

import networkx as nx
import pyarrow as pa

from ramen.program.callables import CallableError, load_callable
from ramen.program.errors import ProgramError
from ramen.program.model import (ENGINE_PYTHON, ENGINE_SPARK, SCHEMA_DECLARED, SCHEMA_FROM_PARENT, SCHEMA_INFERRED,
                                 Function, Program, qualified, split_qualified)
from ramen.program.parse import FunctionSpec, ProgramSpec
from ramen.program.schema import same_fields, type_name

log = logging.getLogger(__name__)
_SELECT_STAR = re.compile(r"\s*select\s+\*\s+from\s+(\w+)(\s+where\s.*)?\s*;?\s*", re.IGNORECASE | re.DOTALL)
"""The one Spark SQL shape whose output schema we infer: a filter of one parent (`SELECT * FROM p WHERE ...`)."""


def validate(spec: ProgramSpec, file: str, loaded: Mapping[str, Program] | None = None,
             path: str | None = None) -> Program:
    """The Program of `spec`, every function's output schema resolved; ProgramError at the first problem.

    `loaded` are the programs already loaded (by name); a program of the same name is the one this
    replaces, so it is ignored except to check that others do not lose a function they read.
    """
    others = {name: program for name, program in (loaded or {}).items() if name != spec.name}
    parents = {f.name: tuple(_resolve_parent(spec, f, p, others, file) for p in f.parents) for f in spec.functions}
    _check_readers_of_replaced(spec, loaded or {}, file)
    graph = _graph(spec, parents, others)
    _check_cycles(spec, graph, file)

    index = {qualified(spec.name, f.name): f for f in spec.functions}
    done: dict[str, Function] = {}
    for node in nx.lexicographical_topological_sort(graph.subgraph(index), key=lambda n: f"{index[n].index:09}"):
        function_spec = index[node]
        inputs = tuple((p, _output_of(p, done, others)) for p in parents[function_spec.name])
        done[node] = _build(spec.name, function_spec, inputs, file, path)
    return Program(spec.name, tuple(done[qualified(spec.name, f.name)] for f in spec.functions), path)


def _resolve_parent(spec: ProgramSpec, function: FunctionSpec, parent: str, others: Mapping[str, Program],
                    file: str) -> str:
    """`parent` as a qualified name, once we know it exists."""
    program, name = split_qualified(parent) if "/" in parent else (spec.name, parent)
    local = [f.name for f in spec.functions]
    if program == spec.name:
        if name not in local:
            close = difflib.get_close_matches(name, local, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ProgramError(file, function.name, f"unknown parent {parent!r}{hint}")
    elif program not in others:
        raise ProgramError(file, function.name, f"unknown parent {parent!r}: program {program!r} is not loaded")
    elif name not in others[program]:
        raise ProgramError(file, function.name, f"unknown parent {parent!r}: program {program!r} has no function "
                                                f"{name!r}")
    return qualified(program, name)


def _check_readers_of_replaced(spec: ProgramSpec, loaded: Mapping[str, Program], file: str) -> None:
    """Replacing a program must not pull a function from under another program that reads it."""
    kept = {qualified(spec.name, f.name) for f in spec.functions}
    for program in loaded.values():
        if program.name == spec.name:
            continue
        for parent, child in program.edges():
            if split_qualified(parent)[0] == spec.name and parent not in kept:
                raise ProgramError(file, None, f"{child} reads {parent}, which this program no longer defines")


def _graph(spec: ProgramSpec, parents: Mapping[str, tuple[str, ...]], others: Mapping[str, Program]) -> nx.DiGraph:
    """Edges parent -> child over every loaded function, so cycles through other programs show."""
    graph = nx.DiGraph()
    for program in others.values():
        graph.add_nodes_from(f.qualified_name for f in program)
        graph.add_edges_from(program.edges())
    for function in spec.functions:
        node = qualified(spec.name, function.name)
        graph.add_node(node)
        graph.add_edges_from((parent, node) for parent in parents[function.name])
    return graph


def _check_cycles(spec: ProgramSpec, graph: nx.DiGraph, file: str) -> None:
    """Name the cycle through the first function (in file order) that is on one."""
    for function in spec.functions:
        node = qualified(spec.name, function.name)
        for child in graph.successors(node):
            if nx.has_path(graph, child, node):
                cycle = [node] + nx.shortest_path(graph, child, node)
                shown = " -> ".join(_short(spec.name, n) for n in cycle)
                raise ProgramError(file, function.name, f"cycle: {shown}")


def _output_of(parent: str, done: Mapping[str, Function], others: Mapping[str, Program]) -> Function:
    if parent in done:
        return done[parent]
    program, name = split_qualified(parent)
    return others[program].function(name)


def _build(program: str, spec: FunctionSpec, parents: tuple[tuple[str, Function], ...], file: str,
           path: str | None) -> Function:
    def fail(problem: str):
        raise ProgramError(file, spec.name, problem)

    code_digest = None
    schema, origin = spec.declared_schema, SCHEMA_DECLARED
    if spec.engine == ENGINE_PYTHON:
        input_schema = _single_input(program, parents, fail)
        try:
            body, code_digest = load_callable(spec.call, path)
        except CallableError as e:
            fail(str(e))
        if schema is None:
            schema, origin = _infer(spec.call, body, input_schema, fail), SCHEMA_INFERRED
    elif spec.engine == ENGINE_SPARK and schema is None:
        schema, origin = _spark_schema(spec, parents, fail), SCHEMA_FROM_PARENT
    for field in schema:
        try:
            type_name(field.type)
        except ValueError as e:
            fail(f"output field {field.name!r}: {e}")

    if spec.event_time is not None:
        if spec.event_time not in schema.names:
            fail(f"event_time {spec.event_time!r} is not an output field (fields: {', '.join(schema.names)})")
        event_type = schema.field(spec.event_time).type
        if not pa.types.is_timestamp(event_type):
            fail(f"event_time {spec.event_time!r} is {type_name(event_type)}, not a timestamp")
    for factor in spec.factors:
        if factor not in schema.names:
            fail(f"factor {factor!r} is not an output field (fields: {', '.join(schema.names)})")
        if factor == spec.event_time:
            fail(f"factor {factor!r} is the event time: a factor names a series, such as a host")
    if spec.window is not None:
        for parent, function in parents:
            if function.event_time is None:
                fail(f"a window needs event times on its input, and parent {_short(program, parent)!r} has no "
                     f"event_time")
    return Function(program=program, name=spec.name, schema=schema, schema_origin=origin, source=spec.source,
                    parents=tuple(p for p, _ in parents),
                    input_schemas=tuple((p, f.schema) for p, f in parents),
                    lazy=spec.lazy, event_time=spec.event_time, window=spec.window, retention_us=spec.retention_us,
                    engine=spec.engine, sql=spec.sql, call=spec.call, code_digest=code_digest, factors=spec.factors,
                    site=spec.site)


def _single_input(program: str, parents: tuple[tuple[str, Function], ...], fail) -> pa.Schema:
    """A Python function reads its parents as one table, so they must agree on its schema."""
    first_name, first = parents[0]
    for name, function in parents[1:]:
        if not same_fields(first.schema, function.schema):
            fail(f"parents {_short(program, first_name)!r} and {_short(program, name)!r} output different schemas; a python function reads its "
                 f"parents as one table")
    return first.schema


def _infer(call: str, body, input_schema: pa.Schema, fail) -> pa.Schema:
    """Run the callable on an empty table of its input: what comes out is its output schema."""
    try:
        result = body(input_schema.empty_table())
    except Exception as e:  # user code; its error is the message
        first_line = (str(e).strip().splitlines() or [""])[0]
        fail(f"call {call!r} raised {type(e).__name__}: {first_line} on an empty table of its input "
             f"(declare 'schema' if it cannot run on empty input)")
    if not isinstance(result, (pa.Table, pa.RecordBatch)):
        fail(f"call {call!r} returned {type(result).__name__}, not a pyarrow.Table")
    log.debug("inferred %s for %s", result.schema, call)
    return result.schema


def _spark_schema(spec: FunctionSpec, parents: tuple[tuple[str, Function], ...], fail) -> pa.Schema:
    match = _SELECT_STAR.fullmatch(spec.sql)
    if match:
        for parent, function in parents:
            if function.name == match.group(1):
                return function.schema
    fail("engine 'spark' needs a declared 'schema' (only SELECT * FROM <parent> [WHERE ...] is inferred)")


def _short(program: str, name: str) -> str:
    return name.split("/", 1)[1] if name.startswith(program + "/") else name

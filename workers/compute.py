"""Running a function's body over Arrow tables: the light (engine = "python") executor.

A python function's callable gets one `pyarrow.Table` and returns one whose columns are the
function's output schema (extra columns are dropped, types are cast when the cast is safe;
anything else is a one-line error naming the function, and the worker exits non-zero):

- without a window, the rows of one or more input messages of one channel, as they arrive;
- with a window, every row of one committed window (of one channel), once. The table's schema
  metadata then says which window: `ramen.window_start_us` and `ramen.window_end_us` (event times in
  µs since the epoch, as decimal strings; the window is [start, end)).

Parents' tables are concatenated (all parents of a python function output the same schema).
Spark functions run in workers/heavy.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

from ramen.program.callables import CallableError, load_callable
from ramen.program.model import ENGINE_PYTHON, Function

WINDOW_START_KEY = b"ramen.window_start_us"
WINDOW_END_KEY = b"ramen.window_end_us"


class ComputeError(RuntimeError):
    """The function cannot run, or its output is wrong; the message is one line naming it."""


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


@dataclass
class PythonRunner:
    function: Function
    body: Callable[[pa.Table], pa.Table]

    def __call__(self, table: pa.Table, window: tuple[int, int] | None = None) -> pa.Table:
        if window is not None:
            table = table.replace_schema_metadata({WINDOW_START_KEY: str(window[0]).encode(),
                                                   WINDOW_END_KEY: str(window[1]).encode()})
        try:
            output = self.body(table)
        except Exception as e:  # the user's code: its message, on one line, is what they need
            raise ComputeError(f"{self.function.qualified_name}: call {self.function.call!r} failed: "
                               f"{type(e).__name__}: {_one_line(e)}") from None
        return conform(self.function, output)


def conform(function: Function, output) -> pa.Table:
    """The output as a table of exactly the function's schema, or ComputeError."""
    name = function.qualified_name
    what = f"call {function.call!r}" if function.call else "its SQL"
    if isinstance(output, pa.RecordBatch):
        output = pa.Table.from_batches([output])
    if not isinstance(output, pa.Table):
        raise ComputeError(f"{name}: {what} returned a {type(output).__name__}, "
                           "not a pyarrow.Table")
    schema = function.schema
    if output.schema.remove_metadata().equals(schema):
        return output.replace_schema_metadata(None) if output.schema.metadata else output
    missing = [f.name for f in schema if f.name not in output.column_names]
    if missing:
        raise ComputeError(f"{name}: {what} returned ({_describe(output.schema)}), "
                           f"expected ({_describe(schema)}): missing {', '.join(missing)}")
    try:
        return output.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise ComputeError(f"{name}: {what} returned ({_describe(output.schema)}), "
                           f"expected ({_describe(schema)}): {_one_line(e)}") from None


def make_runner(function: Function, program_path: str | None) -> PythonRunner:
    """The executor of a python function, or ComputeError (one line) when it cannot run here."""
    if function.engine != ENGINE_PYTHON:
        raise ComputeError(f"{function.qualified_name}: unknown engine {function.engine!r}")
    try:
        body, _ = load_callable(function.call, program_path)
    except CallableError as e:
        raise ComputeError(f"{function.qualified_name}: {e}") from None
    return PythonRunner(function, body)

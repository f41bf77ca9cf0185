"""Output schemas are known before anything runs: declared, inferred from a Python callable run on an
empty table of its input, or a filter's parent's."""

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from ramen.program import ProgramError, loads

PARENT = '''[program]
name = "p"

[[function]]
name = "traffic"
source = { kind = "jsonl", path = "t.jsonl", follow = true }
schema = { ts = "timestamp[ms]", host = "string", bytes = "int64" }
event_time = "ts"
'''


def with_kilobytes(table: pa.Table) -> pa.Table:
    """Adds a float column: what a light function typically does."""
    return table.append_column("kilobytes", pc.divide(pc.cast(table.column("bytes"), pa.float64()), 1000.0))


def program_with(function: str):
    return loads(PARENT + "\n[[function]]\n" + function, "s.toml")


def test_a_python_function_schema_is_inferred_by_calling_it_on_an_empty_table():
    program = program_with('name = "kb"\nfrom = ["traffic"]\nengine = "python"\n'
                           'call = "tests.program.test_schemas:with_kilobytes"\nevent_time = "ts"\n')
    kb = program.function("kb")
    assert [(f.name, f.type) for f in kb.schema] == [
        ("ts", pa.timestamp("ms")), ("host", pa.string()), ("bytes", pa.int64()), ("kilobytes", pa.float64())]
    assert kb.schema_origin == "inferred"
    assert kb.input_schemas == (("p/traffic", program.function("traffic").schema),)


def test_children_are_validated_against_the_inferred_schema():
    with pytest.raises(ProgramError) as caught:
        program_with('name = "kb"\nfrom = ["traffic"]\nengine = "python"\n'
                     'call = "tests.program.test_schemas:with_kilobytes"\nevent_time = "kilobytes"\n')
    assert str(caught.value) == "s.toml: kb: event_time 'kilobytes' is float64, not a timestamp"


def test_a_declared_schema_wins_over_inference():
    program = program_with('name = "kb"\nfrom = ["traffic"]\nengine = "python"\n'
                           'call = "tests.program.test_schemas:with_kilobytes"\nschema = { host = "string" }\n')
    assert program.function("kb").schema.names == ["host"]
    assert program.function("kb").schema_origin == "declared"


def test_a_spark_filter_outputs_its_parent_schema():
    program = program_with('name = "big"\nfrom = ["traffic"]\nengine = "spark"\n'
                           'sql = """SELECT *\n  FROM traffic\n  WHERE bytes > 1000"""\nevent_time = "ts"\n')
    assert program.function("big").schema == program.function("traffic").schema
    assert program.function("big").schema_origin == "parent"


def test_a_python_function_sees_its_parents_as_one_table():
    program = loads(PARENT + PARENT.split("\n", 3)[3].replace('"traffic"', '"traffic2"') + '''
[[function]]
name = "both"
from = ["traffic", "traffic2"]
engine = "python"
call = "tests.program.test_schemas:with_kilobytes"
''', "s.toml")
    assert program.function("both").schema.names[-1] == "kilobytes"

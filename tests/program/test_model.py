"""Programs round-trip through the confserver's JSON form; signatures change exactly when what a
function outputs may change, and the program version whenever anything does."""

import json
from pathlib import Path

import pytest

from ramen.program import Program, ProgramError, load, loads

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "net.toml"
SOURCE = '''[program]
name = "p"

[[function]]
name = "traffic"
source = { kind = "csv", path = "traffic.csv" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
archive = { retention = "7d" }

[[function]]
name = "big"
lazy = true
from = ["traffic"]
window = { every = "1 minute", lateness = "10s" }
engine = "spark"
sql = "SELECT * FROM traffic WHERE bytes > 1000"
event_time = "ts"
'''


def signatures(program):
    return {f.name: f.signature for f in program}


def test_the_example_loads_with_every_schema_known():
    program = load(EXAMPLE)
    assert [(f.name, f.kind, f.lazy) for f in program] == [
        ("traffic", "source", False), ("per_minute", "spark", True), ("top_talkers", "python", True)]
    assert program.function("top_talkers").schema.names == ["start", "host", "bytes"]
    assert program.function("top_talkers").schema_origin == "inferred"
    assert program.function("traffic").retention_us == 7 * 86400 * 1_000_000
    assert program.function("per_minute").window.every_us == 60_000_000
    assert list(program.edges()) == [("net/traffic", "net/per_minute"), ("net/per_minute", "net/top_talkers")]


@pytest.mark.parametrize("text", [SOURCE, EXAMPLE.read_text()])
def test_a_program_round_trips_through_json_with_equal_signatures(text):
    program = loads(text, "x.toml", path=str(EXAMPLE))
    stored = program.to_json()
    again = Program.from_json(stored)
    assert again == program
    assert signatures(again) == signatures(program)
    assert again.version == program.version
    assert json.loads(stored)["name"] == program.name
    assert Program.from_json(again.to_json()).to_json() == stored


def test_json_of_another_format_is_refused():
    data = json.loads(loads(SOURCE).to_json())
    data["format"] = 99
    with pytest.raises(ProgramError, match="format 99"):
        Program.from_dict(data)


def test_signature_changes_when_the_body_changes():
    before, after = loads(SOURCE), loads(SOURCE.replace("bytes > 1000", "bytes > 2000"))
    assert before.function("big").signature != after.function("big").signature
    assert before.function("traffic").signature == after.function("traffic").signature
    assert before.version != after.version


def test_signature_does_not_change_with_comments_or_layout():
    commented = SOURCE.replace('lazy = true', '# nobody pays for this until asked\nlazy   =   true  # lazy!')
    assert signatures(loads(SOURCE)) == signatures(loads(commented))
    assert loads(SOURCE).version == loads(commented).version


def test_the_same_duration_spelled_differently_is_the_same_signature():
    assert signatures(loads(SOURCE)) == signatures(loads(SOURCE.replace('"1 minute"', '"60s"')))


@pytest.mark.parametrize("old, new", [
    ('"1 minute", lateness', '"2 minutes", lateness'), ('lateness = "10s"', 'lateness = "20s"'),
    ('bytes = "int64"', 'bytes = "int32"'), ('"traffic.csv"', '"other.csv"'),
])
def test_signatures_change_with_what_shapes_the_output(old, new):
    assert signatures(loads(SOURCE.replace(old, new, 1))) != signatures(loads(SOURCE))


def test_a_parent_schema_change_changes_the_child_signature():
    changed = loads(SOURCE.replace('host = "string"', 'host = "binary"'))
    assert changed.function("big").signature != loads(SOURCE).function("big").signature


def test_laziness_and_retention_change_the_version_but_no_signature():
    for old, new in (("lazy = true", "lazy = false"), ('retention = "7d"', 'retention = "30d"')):
        changed = loads(SOURCE.replace(old, new))
        assert signatures(changed) == signatures(loads(SOURCE))
        assert changed.version != loads(SOURCE).version


def test_editing_the_python_callable_changes_its_signature(tmp_path):
    module = tmp_path / "edited_callable_for_signature.py"
    program_file = tmp_path / "p.toml"
    program_file.write_text(SOURCE + '''
[[function]]
name = "light"
from = ["traffic"]
engine = "python"
call = "edited_callable_for_signature:same"
''')
    module.write_text("def same(table):\n    return table\n")
    before = load(program_file)
    module.write_text("def same(table):\n    # now with a comment, and maybe a new behaviour\n    return table\n")
    after = load(program_file)
    assert before.function("light").signature != after.function("light").signature
    assert before.function("traffic").signature == after.function("traffic").signature


def test_factors_round_trip_and_change_the_version_but_no_signature():
    with_factors = loads(SOURCE.replace('event_time = "ts"\narchive', 'event_time = "ts"\nfactors = ["host"]\narchive'))
    assert with_factors.function("traffic").factors == ("host",)
    assert Program.from_json(with_factors.to_json()).function("traffic").factors == ("host",)
    assert signatures(with_factors) == signatures(loads(SOURCE))
    assert with_factors.version != loads(SOURCE).version

"""Parents in other loaded programs (`other/func`): checked against what is loaded, cycles found
across programs, and a replaced program cannot drop a function another program reads."""

import pytest

from ramen.program import ProgramError, loads

BASE = '''[program]
name = "base"

[[function]]
name = "traffic"
source = { kind = "parquet", path = "t.parquet" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
'''
REPORTS = '''[program]
name = "reports"

[[function]]
name = "hourly"
lazy = true
from = ["base/traffic"]
window = { every = "1h" }
engine = "spark"
sql = "SELECT window.start AS start, sum(bytes) AS bytes FROM traffic GROUP BY window(ts, '1 hour')"
schema = { start = "timestamp[us]", bytes = "int64" }
event_time = "start"
'''


@pytest.fixture
def base():
    return loads(BASE, "base.toml")


def test_a_parent_in_a_loaded_program_is_found(base):
    reports = loads(REPORTS, "reports.toml", {"base": base})
    hourly = reports.function("hourly")
    assert hourly.parents == ("base/traffic",)
    assert hourly.input_schemas == (("base/traffic", base.function("traffic").schema),)
    assert list(reports.edges()) == [("base/traffic", "reports/hourly")]


def test_without_the_other_program_the_error_names_it():
    with pytest.raises(ProgramError) as caught:
        loads(REPORTS, "reports.toml")
    assert str(caught.value) == "reports.toml: hourly: unknown parent 'base/traffic': program 'base' is not loaded"


def test_a_missing_function_of_a_loaded_program_is_named(base):
    with pytest.raises(ProgramError) as caught:
        loads(REPORTS.replace("base/traffic", "base/trafic"), "reports.toml", {"base": base})
    assert str(caught.value) == ("reports.toml: hourly: unknown parent 'base/trafic': program 'base' has no "
                                 "function 'trafic'")


def test_a_parent_schema_from_another_program_is_checked(base):
    no_event_time = loads(BASE.replace('event_time = "ts"\n', ""), "base.toml")
    with pytest.raises(ProgramError) as caught:
        loads(REPORTS, "reports.toml", {"base": no_event_time})
    assert str(caught.value) == ("reports.toml: hourly: a window needs event times on its input, and parent "
                                 "'base/traffic' has no event_time")


def test_a_cycle_across_programs_is_named(base):
    reports = loads(REPORTS, "reports.toml", {"base": base})
    # base, replaced, now reads reports/hourly, which reads base/traffic.
    replaced = BASE.replace('name = "traffic"', 'name = "traffic"\nfrom = ["reports/hourly"]').replace(
        'source = { kind = "parquet", path = "t.parquet" }\n', 'engine = "spark"\nsql = "SELECT 1"\n')
    with pytest.raises(ProgramError) as caught:
        loads(replaced, "base.toml", {"base": base, "reports": reports})
    assert str(caught.value) == "base.toml: traffic: cycle: traffic -> reports/hourly -> traffic"


def test_replacing_a_program_cannot_remove_what_another_reads(base):
    reports = loads(REPORTS, "reports.toml", {"base": base})
    renamed = BASE.replace('name = "traffic"', 'name = "packets"')
    with pytest.raises(ProgramError) as caught:
        loads(renamed, "base.toml", {"base": base, "reports": reports})
    assert str(caught.value) == "base.toml: reports/hourly reads base/traffic, which this program no longer defines"


def test_a_program_may_name_its_own_functions_qualified(base):
    program = loads(BASE + '\n[[function]]\nname = "big"\nfrom = ["base/traffic"]\nengine = "spark"\n'
                           'sql = "SELECT * FROM traffic WHERE bytes > 10"\n', "base.toml")
    assert program.function("big").parents == ("base/traffic",)

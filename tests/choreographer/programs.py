"""Small programs for the choreographer's tests, written as TOML like a user writes them."""

from __future__ import annotations

from ramen.program import Program, loads

HEADER = '''
[program]
name = "{name}"
'''
SOURCE = '''
[[function]]
name = "{name}"
lazy = {lazy}
source = {{ kind = "generator", rate = 10, hosts = 2, seed = 1 }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
archive = {{ retention = "1d" }}
'''
FILTER = '''
[[function]]
name = "{name}"
lazy = {lazy}
from = [{parents}]
engine = "spark"
sql = "SELECT * FROM {first} WHERE bytes > 0"
event_time = "ts"
'''


def program(name: str, functions: list[tuple], loaded=None) -> Program:
    """functions: (name, lazy, parents) or (name, lazy, parents, site); no parents makes a source."""
    text = HEADER.format(name=name)
    for fname, lazy, parents, *site in functions:
        lazy_text = "true" if lazy else "false"
        if parents:
            text += FILTER.format(name=fname, lazy=lazy_text, parents=", ".join(f'"{p}"' for p in parents),
                                  first=parents[0].split("/")[-1])
        else:
            text += SOURCE.format(name=fname, lazy=lazy_text)
        if site:
            text += f'site = "{site[0]}"\n'
    return loads(text, f"{name}.toml", loaded)

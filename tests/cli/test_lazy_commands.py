"""`ramen` imports only the module of the command it runs: `--help` and light commands answer at
once, and each command's own arguments come from its module."""

import subprocess
import sys

import pytest

from ramen.cli.main import COMMANDS, build_parser

MODULES_LOADED_BY_HELP = """
import sys
from ramen.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(" ".join(sorted(name for name in sys.modules if name.startswith(("ramen.", "pyarrow", "pyspark")))))
"""


def _modules_loaded(*argv: str) -> set[str]:
    result = subprocess.run([sys.executable, "-c", MODULES_LOADED_BY_HELP, *argv], capture_output=True,
                            text=True, check=True, timeout=60)
    return set(result.stdout.split())


def test_help_loads_no_command_module():
    loaded = _modules_loaded("--help")
    assert not {name for name in loaded if name.startswith(("ramen.cli.", "pyarrow", "pyspark"))} - {
        "ramen.cli.main", "ramen.cli.errors"}


def test_a_command_loads_its_module_only():
    loaded = _modules_loaded("stat", "--help")
    assert "ramen.cli.stat" in loaded
    assert not loaded & {"ramen.cli.replay", "ramen.cli.archive", "ramen.cli.start", "ramen.spark.session"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_is_declared_by_its_module(name):
    parser = build_parser(name)
    (commands,) = [action for action in parser._actions if action.dest == "command"]
    own = commands.choices[name]
    placeholder = build_parser(None)
    (named_only,) = [action for action in placeholder._actions if action.dest == "command"]
    def declared(parser):  # what runs it, or actions of its own: not a name alone
        return bool(parser._defaults) or parser._subparsers is not None

    assert declared(own)
    assert not declared(named_only.choices[name])

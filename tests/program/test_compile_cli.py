"""`ramen compile` as a user runs it: the example's table, and one line for a broken program."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "net.toml"
BROKEN = Path(__file__).parent / "programs" / "unknown_parent.toml"


def ramen(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ramen.cli.main", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_compile_prints_the_function_table_of_the_example(tmp_path):
    result = ramen("compile", str(EXAMPLE), cwd=tmp_path)  # callables found from any directory
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("program net  version ")
    assert lines[2].split() == ["FUNCTION", "KIND", "LAZY", "FROM", "EVENT_TIME", "WINDOW", "ARCHIVE", "SIGNATURE"]
    assert lines[3].split()[:7] == ["traffic", "source", "no", "-", "ts", "-", "7d"]
    assert lines[4].split()[:9] == ["per_minute", "spark", "yes", "traffic", "start", "1m", "(+10s", "late)", "-"]
    assert lines[5].split()[:7] == ["top_talkers", "python", "yes", "per_minute", "start", "-", "-"]
    assert "top_talkers  start: timestamp[us], host: string, bytes: int64  (inferred)" in result.stdout


def test_compile_json_is_the_stored_program():
    result = ramen("compile", "--json", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["name"] == "net"
    assert [f["name"] for f in data["functions"]] == ["traffic", "per_minute", "top_talkers"]


def test_compile_of_a_broken_program_is_one_line_and_exit_1():
    result = ramen("compile", str(BROKEN))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == f"ramen: compile: {BROKEN}: top: unknown parent 'trafic' (did you mean 'traffic'?)\n"


def test_compile_with_another_program_resolves_its_functions(tmp_path):
    other = tmp_path / "reports.toml"
    other.write_text('[program]\nname = "reports"\n[[function]]\nname = "big"\nfrom = ["net/traffic"]\n'
                     'engine = "spark"\nsql = "SELECT * FROM traffic WHERE bytes > 1000"\n')
    alone = ramen("compile", str(other))
    assert alone.returncode == 1
    assert "program 'net' is not loaded" in alone.stderr
    result = ramen("compile", str(other), "--with", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert "net/traffic" in result.stdout


def test_compile_has_help():
    result = ramen("compile", "--help")
    assert result.returncode == 0
    assert "usage: ramen compile" in result.stdout


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.toml")), ids=lambda p: p.name)
def test_every_example_compiles(example, tmp_path):
    result = ramen("compile", str(example), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    name = tomllib.loads(example.read_text())["program"]["name"]
    assert result.stdout.startswith(f"program {name} "), result.stdout

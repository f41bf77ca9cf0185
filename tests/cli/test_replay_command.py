"""`ramen replay`: bad input ends in one line and exit 1, before anything is asked of the site."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "net.toml"


@pytest.fixture
def ramen(fresh_confserver, tmp_path):
    env = dict(os.environ, RAMEN_CONFSERVER=fresh_confserver.url,
               RAMEN_CONFSERVER_AUTH=str(fresh_confserver.auth_file), RAMEN_DIR=str(tmp_path / "ramen"))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "ramen.cli.main", *map(str, args)], capture_output=True,
                              text=True, env=env, timeout=60)
    assert run("run", EXAMPLE).returncode == 0
    return run


def one_line_error(result) -> str:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_since_not_before_until(ramen):
    line = one_line_error(ramen("replay", "--since", "2026-11-20T11:00Z", "--until", "2026-11-20T10:00Z",
                                "net/traffic"))
    assert line == "ramen: replay: --since 2026-11-20T11:00Z is not before --until 2026-11-20T10:00Z"


def test_unreadable_time(ramen):
    line = one_line_error(ramen("replay", "--since", "yesterday-ish", "net/traffic"))
    assert line.startswith("ramen: replay: ") and "yesterday-ish" in line


def test_unknown_target(ramen):
    line = one_line_error(ramen("replay", "--since", "-1h", "net/trafic"))
    assert line == "ramen: replay: unknown function net/trafic (did you mean net/traffic?)"


def test_a_range_no_archive_covers(ramen):
    line = one_line_error(ramen("replay", "--since", "2026-11-20T10:00Z", "--until", "2026-11-20T11:00Z",
                                "net/top_talkers"))
    assert line.startswith("ramen: replay: no archive of net/traffic covers 2026-11-20T10:00Z..11:00Z")


def test_an_unreachable_confserver(ramen):
    line = one_line_error(ramen("replay", "--confserver", "ramen://127.0.0.1:1", "--since", "-1h", "net/traffic"))
    assert "cannot reach the confserver at ramen://127.0.0.1:1" in line


def test_a_bad_where(ramen):
    line = one_line_error(ramen("replay", "--since", "-1h", "--where", "bytes >", "net/traffic"))
    assert "expected 'FIELD OP VALUE'" in line


def test_a_function_placed_on_another_site(ramen, tmp_path):
    placed = tmp_path / "placed.toml"
    placed.write_text(EXAMPLE.read_text().replace('name = "net"', 'name = "edge"')
                      .replace('name = "traffic"', 'name = "traffic"\nsite = "edge"'))
    assert ramen("run", placed).returncode == 0
    line = one_line_error(ramen("replay", "--since", "-1h", "edge/traffic"))
    assert line == ("ramen: replay: edge/traffic runs on site edge, not local: replay edge/traffic with --site edge "
                    "--via-confserver (a replay computes on one site; only its sources may be archived on others)")


def test_an_unknown_field(ramen):
    line = one_line_error(ramen("replay", "--since", "-1h", "net/traffic", "ts", "colour"))
    assert line == "ramen: replay: no field 'colour' in the output (fields: ts, host, bytes)"

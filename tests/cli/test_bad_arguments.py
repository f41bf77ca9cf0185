"""Values the CLI must refuse before it uses them: one line naming the value, a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def ramen(tmp_path, *args):
    env = dict(os.environ, RAMEN_DIR=str(tmp_path), RAMEN_CONFSERVER="ramen://127.0.0.1:1")  # nobody there
    return subprocess.run([sys.executable, "-m", "ramen.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=60)


@pytest.mark.parametrize("since", ["99999999999999", "-10000000d", "9999999999999999999999999"])
def test_a_time_beyond_the_calendar_is_one_line(tmp_path, since):
    result = ramen(tmp_path, "replay", "--since", since, "net/traffic")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"ramen: replay: {since!r} is not a time between the years 1970 and 9999"]


@pytest.mark.parametrize("command", [["ps"], ["replay", "--since", "-1h", "net/traffic"], ["tail", "net/traffic"],
                                     ["start"]])
@pytest.mark.parametrize("site", ["../../etc", "a/b", ".hidden", "", "-x"])
def test_a_site_that_is_not_a_name_is_refused(tmp_path, command, site):
    result = ramen(tmp_path, *command, f"--site={site}")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(
        f"argument --site: site {site!r}: a site's name is letters, digits, '_', '.' and '-', "
        f"beginning with a letter or digit")
    assert not (tmp_path / "sites").exists() and not (tmp_path / "etc").exists()


@pytest.mark.parametrize("lines", ["-3", "three"])
def test_tail_of_a_negative_or_unreadable_count_is_refused(tmp_path, lines):
    result = ramen(tmp_path, "tail", "-n", lines, "net/traffic")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(f"argument -n/--lines: {lines!r} is not a whole number >= 0")


def test_replay_json_with_another_format_is_one_line(tmp_path):
    result = ramen(tmp_path, "replay", "--since", "-1h", "--json", "--format", "csv", "net/traffic")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        "ramen: replay: --json is --format jsonl: it cannot go with --format csv"]


def test_replay_of_a_negative_limit_is_refused(tmp_path):
    result = ramen(tmp_path, "replay", "--since", "-1h", "--limit", "-3", "net/traffic")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith("argument --limit: '-3' is not a whole number >= 0")

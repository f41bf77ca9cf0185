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


@pytest.mark.parametrize("timeout", ["-5", "0", "inf", "soon"])
def test_replay_of_a_timeout_not_above_zero_is_refused(tmp_path, timeout):
    result = ramen(tmp_path, "replay", "--since", "-1h", "--timeout", timeout, "net/traffic")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(f"argument --timeout: {timeout!r} is not a number of "
                                                           f"seconds > 0")


@pytest.mark.parametrize("command", [["ps"], ["stop"], ["replay", "--since", "-1h", "net/traffic"]])
def test_a_dir_that_is_a_file_or_under_one_is_one_line(tmp_path, command):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    for given, problem in ((a_file, "not a directory"), (a_file / "below", f"{a_file} is not a directory")):
        result = ramen(tmp_path, "--dir", str(given), *command)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.strip().splitlines() == [f"ramen: --dir {given}: {problem}"]
    result = ramen(a_file, *command)  # $RAMEN_DIR
    assert result.stderr.strip().splitlines() == [f"ramen: $RAMEN_DIR ({a_file}): not a directory"]


@pytest.mark.parametrize("options, problem", [
    (["--httpd-listen", "0.0.0.0:0"], "httpd would listen on 0.0.0.0, beyond this host, with no credentials: give "
                                      "--httpd-auth FILE"),
    (["--httpd-listen", "nowhere"], "--httpd-listen 'nowhere': expected HOST:PORT"),
    (["--httpd-auth", "BINARY"], "is not text (expected `bearer TOKEN` or `basic USER PASSWORD` lines)"),
])
def test_start_refuses_httpd_options_httpd_would_refuse_before_anything_starts(tmp_path, options, problem):
    binary = tmp_path / "binary.auth"
    binary.write_bytes(bytes(range(256)))
    options = [str(binary) if option == "BINARY" else option for option in options]
    for daemon in ([], ["--daemon"]):
        result = ramen(tmp_path / "instance", "start", *daemon, *options)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("ramen: start: httpd: ") and problem in line
    assert not (tmp_path / "instance").exists()  # nothing started, nothing made


def test_a_setup_key_netd_cannot_use_is_one_line_from_start_and_netd_before_anything_starts(tmp_path):
    key = tmp_path / "setup.key"
    key.write_text("too short\n")
    key.chmod(0o600)
    for daemon in ([], ["--daemon"]):
        result = ramen(tmp_path / "instance", "start", *daemon, "--netd-setup-key", str(key))
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.strip().splitlines() == [
            f"ramen: start: netd: setup key {key}: a setup key of 9 bytes, fewer than 16"]
    assert not (tmp_path / "instance").exists()
    result = ramen(tmp_path / "instance", "netd", "--setup-key", str(tmp_path / "missing.key"))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"ramen: netd: setup key {tmp_path / 'missing.key'}: No such file or directory"]


def test_an_unreachable_zookeeper_is_one_line_without_its_clients_retries(tmp_path):
    result = ramen(tmp_path, "ps", "--confserver", "zk://127.0.0.1:1/nowhere")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()  # not kazoo's retries, nor a word about ACLs it never set
    assert line.startswith("ramen: ps: zookeeper at 127.0.0.1:1 did not answer")

"""The `ramen` command as a user runs it: real processes, one-line errors, exit codes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ramen.transport import CountersFile, ExclusivePublication, Image, LogBuffer, LogBufferParams

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def ramen(*args, env_dir=None, check=False):
    env = dict(os.environ)
    if env_dir is not None:
        env["RAMEN_DIR"] = str(env_dir)
    return subprocess.run([sys.executable, "-m", "ramen.cli.main", *args], capture_output=True, text=True,
                          env=env, check=check, timeout=120)


def assert_one_line_error(result, *fragments):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize("command", [[], ["logbuffer"], ["logbuffer", "inspect"], ["stat"], ["demo"], ["archive"],
                                     ["archive", "describe"], ["archive", "dump"], ["archive", "verify"],
                                     ["archive", "purge"], ["archiver"], ["confserver"], ["confclient"],
                                     ["confclient", "get"], ["confclient", "watch"], ["compile"], ["run"], ["kill"],
                                     ["ps"], ["choreographer"], ["replay"], ["tail"], ["start"], ["stop"]])
def test_every_command_has_help(command):
    result = ramen(*command, "--help")
    assert result.returncode == 0
    assert "usage: ramen" in result.stdout


@pytest.mark.parametrize("what", ["a program's functions", "a log buffer's messages"])
def test_an_output_on_a_full_disk_is_a_one_line_error(tmp_path, what):
    if what == "a program's functions":
        args = ["compile", str(EXAMPLES / "net.toml")]
    else:
        path = tmp_path / "x.logbuffer"
        with LogBuffer.create(path, LogBufferParams(term_length=65536)) as log:
            publication = ExclusivePublication(log)
            for i in range(200):
                assert publication.offer(f"hello {i}".encode()) > 0
            publication.close()
        args = ["logbuffer", "inspect", str(path)]
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "ramen.cli.main", *args], stdout=full, stderr=subprocess.PIPE,
                                text=True, timeout=120)
    assert_one_line_error(result, f"ramen: {args[0]}: cannot write", "No space left on device")


def test_inspect_of_a_missing_file_is_a_one_line_error(tmp_path):
    assert_one_line_error(ramen("logbuffer", "inspect", str(tmp_path / "nope")), "no such log buffer file")


def test_inspect_of_a_truncated_log_buffer_names_the_problem(tmp_path):
    path = tmp_path / "a.logbuffer"
    LogBuffer.create(path, LogBufferParams(term_length=65536)).close()
    with open(path, "r+b") as f:
        f.truncate(3 * 65536)
    assert_one_line_error(ramen("logbuffer", "inspect", str(path)), str(path))


def test_inspect_of_a_file_that_is_not_a_log_buffer_is_refused(tmp_path):
    path = tmp_path / "junk"
    path.write_bytes(os.urandom(3 * 65536 + 4096))
    assert_one_line_error(ramen("logbuffer", "inspect", str(path)), str(path), "term length")


def test_inspect_prints_metadata_and_messages_for_people(tmp_path):
    path = tmp_path / "a.logbuffer"
    with LogBuffer.create(path, LogBufferParams(term_length=65536, session_id=9, stream_id=3)) as log:
        publication = ExclusivePublication(log)
        for i in range(5):
            assert publication.offer(f"hello {i}".encode()) > 0
        publication.close()
    out = ramen("logbuffer", "inspect", str(path), check=True).stdout
    assert "initial_term_id" in out and "mtu_length" in out and "tail[0]" in out
    assert "5 messages" in out
    assert "'hello 4'" in out


def test_inspect_names_a_damaged_frame_it_skipped_and_exits_non_zero(tmp_path):
    import struct
    path = tmp_path / "a.logbuffer"
    with LogBuffer.create(path, LogBufferParams(term_length=65536, session_id=9, stream_id=3)) as log:
        publication = ExclusivePublication(log)
        for i in range(20):
            assert publication.offer(f"hello {i}".encode()) > 0
        publication.close()
        log.terms[0][5 * 64:5 * 64 + 4] = struct.pack("<i", 0x7FFFFFF0)  # the 6th frame's length

    result = ramen("logbuffer", "inspect", str(path))

    assert result.returncode == 1 and "19 messages" in result.stdout
    assert result.stderr.strip().splitlines() == [
        f"ramen: logbuffer: {path}: damaged frame skipped at term 0 offset 320 (term id 0): frame length "
        f"2147483632 runs past the end of its term (position 65536)"]


def test_stat_without_a_counters_file_says_nothing_runs(tmp_path):
    assert_one_line_error(ramen("stat", env_dir=tmp_path), "no counters file")


def test_stat_shows_the_positions_of_a_publication_and_its_subscriber(tmp_path):
    counters = CountersFile.open(tmp_path / "counters.dat")
    log = LogBuffer.create(tmp_path / "s.logbuffer", LogBufferParams(term_length=65536, session_id=4, stream_id=2))
    image = Image(LogBuffer.open(tmp_path / "s.logbuffer"), counters, join_position=0, name="reader")
    publication = ExclusivePublication(log, counters)
    for _ in range(3):
        assert publication.is_connected
        assert publication.offer(b"x" * 100) > 0
    image.poll(lambda *a: None, 10)

    snapshot = json.loads(ramen("stat", "--json", env_dir=tmp_path, check=True).stdout)
    by_type = {c["type"]: c for c in snapshot["counters"]}
    assert by_type["pub-pos"]["value"] == publication.position == 3 * 160
    assert by_type["sub-pos"]["value"] == image.position == publication.position
    assert by_type["pub-lmt"]["value"] == publication.position_limit
    assert by_type["sub-pos"]["owner_pid"] == os.getpid()

    human = ramen("stat", env_dir=tmp_path, check=True).stdout
    assert "pub-pos: 4 2 s.logbuffer" in human and "sub-pos: 4 2 reader" in human


def test_demo_streams_between_processes_and_checks_every_message(tmp_path):
    result = ramen("demo", "--messages", "20000", "--size", "100", env_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "reader checked 20,000 messages in order" in result.stdout
    assert (tmp_path / "demo" / "stream.logbuffer").exists()


def test_demo_refuses_a_size_it_cannot_carry(tmp_path):
    assert_one_line_error(ramen("demo", "--size", "4", env_dir=tmp_path), "--size")

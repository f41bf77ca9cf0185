"""`ramen replay` over a damaged archive, end to end (`ramen start`: every process real): the client
prints the replayer's one line naming the file and offset and exits 1 at once, instead of waiting
for its 300 s timeout; a damaged time index is rebuilt and the replay gives the right rows; ranges
away from the damage replay as before. The archive is the live one, its recording active.
"""

from __future__ import annotations

import re
import struct

import pytest

from ramen.archive.catalog import Catalog
from ramen.archive.coverage import function_channel
from ramen.archive.segment import segment_file_base_position, segment_file_name
from ramen.archive.time_index import TimeIndex, index_path
from tests.e2e.test_replay import PROGRAM, Stack, minute_range

CLIENT_TIMEOUT_S = 60
"""Far below the replay's own timeout (300 s): a client still waiting then has hung."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(tmp_path_factory.mktemp("e2e-damage"))
    try:
        yield stack.start("e2e", PROGRAM, "e2e/traffic")
    finally:
        stack.stop()


def archive_dir(stack: Stack):
    return stack.base / "sites" / "local" / "archive"


def recording(stack: Stack):
    with Catalog.open(archive_dir(stack)) as catalog:
        return next(d for d in catalog if d.stripped_channel == function_channel("e2e/traffic"))


def replay(stack: Stack, since: int, until: int):
    return stack.ramen("replay", "--since", f"{since / 1e6:.6f}", "--until", f"{until / 1e6:.6f}", "--format", "csv",
                       "e2e/traffic", timeout=CLIENT_TIMEOUT_S)


def test_a_replay_over_a_damaged_frame_fails_at_once_with_the_replayers_line(stack):
    d = recording(stack)
    away = minute_range(9, 2)
    rows_away = replay(stack, *away)
    assert rows_away.returncode == 0, rows_away.stderr
    damaged = minute_range(6, 2)
    index = TimeIndex.open(index_path(archive_dir(stack), d.recording_id))
    position = index.seek(damaged[0] + 30_000_000)  # a message in the middle of the range
    index.close()
    base = segment_file_base_position(d.start_position, position, d.term_buffer_length, d.segment_file_length)
    segment = archive_dir(stack) / segment_file_name(d.recording_id, base)
    with open(segment, "r+b") as f:
        f.seek(position - base)
        sound = f.read(4)
        f.seek(position - base)
        f.write(struct.pack("<i", 0x7FFFFFF0))  # the frame length
    try:
        result = replay(stack, *damaged)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        [line] = result.stderr.strip().splitlines()
        assert re.match(rf"ramen: replay: replayer \d+ of e2e/traffic: recording {d.recording_id}: corrupt frame at "
                        rf"{re.escape(str(segment))} offset {position - base} \(position {position}\): frame length "
                        rf"2147483632 runs past the end of its term", line), line
        assert replay(stack, *away).stdout == rows_away.stdout  # away from the damage, as before
    finally:
        with open(segment, "r+b") as f:  # for the next test
            f.seek(position - base)
            f.write(sound)


def test_a_zeroed_time_index_of_the_active_recording_is_rebuilt_and_the_rows_are_right(stack):
    d = recording(stack)
    since, until = minute_range(4, 2)
    before = replay(stack, since, until)
    assert before.returncode == 0 and len(before.stdout.splitlines()) > 60 * 1000, before.stderr
    path = index_path(archive_dir(stack), d.recording_id)
    path.write_bytes(bytes(path.stat().st_size))

    after = replay(stack, since, until)
    assert after.returncode == 0, after.stderr
    assert after.stdout == before.stdout
    assert "rebuilt from the recording's segments" in after.stderr and "in memory only" in after.stderr

"""archive-mark.dat: one live archiver per directory, taken over when stale, released on clean close."""

import os
import signal
import struct
import subprocess
import sys

import pytest

from ramen.archive.markfile import (ACTIVITY_TIMESTAMP_OFFSET, LIVENESS_TIMEOUT_MS, MARK_FILE_NAME, SEMANTIC_VERSION,
                                    ArchiveMarkFile, MarkFileError, epoch_ms, read_info)
from tests.archive.helpers import ARCHIVES

HOLDER = """
import sys
from ramen.archive.markfile import ArchiveMarkFile
mark = ArchiveMarkFile.acquire(sys.argv[1])
print("acquired", flush=True)
if sys.stdin.readline().strip() == "close":
    mark.close()
    print("closed", flush=True)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process that acquires the mark file of tmp_path and holds it until told to close."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "acquired"
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def set_activity(directory, timestamp_ms):
    with open(directory / MARK_FILE_NAME, "r+b") as f:
        f.seek(ACTIVITY_TIMESTAMP_OFFSET)
        f.write(struct.pack("<q", timestamp_ms))


@pytest.mark.parametrize("name", ARCHIVES)
def test_aerons_mark_files_read_as_cleanly_closed(aeron_vectors, name):
    directory = aeron_vectors / "archives" / name
    info = read_info(directory)
    assert (directory / MARK_FILE_NAME).stat().st_size == 1056768
    assert info.version == SEMANTIC_VERSION == 0x030100
    assert info.activity_timestamp == -1 and not info.is_active()
    assert (info.pid, info.archive_id) == (22509 if name == "archive_plain" else 22535, 1)
    assert info.start_timestamp > 1_700_000_000_000


def test_acquire_writes_aerons_header_layout(tmp_path):
    before = epoch_ms()
    with ArchiveMarkFile.acquire(tmp_path, archive_id=7, local_control_channel="aeron:ipc",
                                 aeron_directory="/dev/shm/aeron") as mark:
        assert not read_info(tmp_path).is_ready  # until the owner has recovered its catalog
        mark.signal_ready()
        data = (tmp_path / MARK_FILE_NAME).read_bytes()
    assert len(data) == 8192 + 1024 * 1024
    assert struct.unpack_from("<HHHH", data, 0) == (128, 200, 100, 2)  # SBE message header
    version, _, activity, start, pid = struct.unpack_from("<iiqqq", data, 8)
    assert (version, pid) == (SEMANTIC_VERSION, os.getpid())
    assert before <= start == activity <= epoch_ms()
    assert struct.unpack_from("<iiiiiiq", data, 40) == (10, 10, 30, 8192, 1024 * 1024, 0, 7)
    assert struct.unpack_from("<I", data, 136) == (0,)
    assert data[140:144 + 9] == struct.pack("<I", 9) + b"aeron:ipc"


def test_a_second_archiver_is_refused_while_the_first_is_live_and_admitted_after_it_closes(tmp_path, holder):
    with pytest.raises(MarkFileError) as refused:
        ArchiveMarkFile.acquire(tmp_path)
    message = str(refused.value)
    assert str(tmp_path) in message
    assert f"pid {holder.pid}" in message
    assert "s ago" in message

    holder.stdin.write("close\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "closed"
    assert read_info(tmp_path).activity_timestamp == -1
    with ArchiveMarkFile.acquire(tmp_path) as mark:
        assert mark.info.pid == os.getpid()


def test_a_live_archiver_whose_activity_is_10_s_old_is_taken_over(tmp_path, holder):
    """A hung owner: its process lives, but it stopped proving it (Aeron's liveness timeout)."""
    set_activity(tmp_path, epoch_ms() - LIVENESS_TIMEOUT_MS + 2000)  # 8 s: still live
    with pytest.raises(MarkFileError, match=f"pid {holder.pid}, last activity 8"):
        ArchiveMarkFile.acquire(tmp_path)

    set_activity(tmp_path, epoch_ms() - LIVENESS_TIMEOUT_MS - 1000)  # 11 s
    with ArchiveMarkFile.acquire(tmp_path) as mark:
        info = mark.info
        assert info.pid == os.getpid()
        assert info.is_active()


def test_a_killed_archivers_directory_is_taken_over_at_once_since_its_pid_is_gone(tmp_path, holder):
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    assert read_info(tmp_path).is_active()  # by its timestamp alone it would still look live
    with ArchiveMarkFile.acquire(tmp_path) as mark:
        assert mark.info.pid == os.getpid()


def test_update_activity_stores_epoch_ms_and_a_clean_close_stores_minus_one(tmp_path):
    mark = ArchiveMarkFile.acquire(tmp_path)
    mark.update_activity(1_800_000_000_000)
    assert read_info(tmp_path).activity_timestamp == 1_800_000_000_000
    mark.update_activity()
    assert abs(read_info(tmp_path).age_ms()) < LIVENESS_TIMEOUT_MS
    mark.close()
    mark.close()
    assert read_info(tmp_path).activity_timestamp == -1


def test_a_mark_file_of_another_major_version_is_refused(tmp_path):
    ArchiveMarkFile.acquire(tmp_path).close()
    with open(tmp_path / MARK_FILE_NAME, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<i", 2 << 16))
    with pytest.raises(MarkFileError, match="version 2.0.0 is not an Aeron Archive 3.x mark file"):
        ArchiveMarkFile.acquire(tmp_path)

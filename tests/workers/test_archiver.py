"""The archiver service as a real process: one per directory, and nothing lost to a kill -9."""

import json
import signal
import subprocess
import sys
import time


from ramen.archive.catalog import NULL_POSITION, Catalog
from ramen.archive.markfile import MarkFileError, read_info
from ramen.archive.recorder import RECORDING_POSITION_TYPE_ID
from ramen.transport import ADMIN_ACTION, CountersFile, ExclusivePublication, LogBuffer, LogBufferParams
from tests.waiting import wait_for

WAIT_S = 30.0


def start_archiver(tmp_path, *args):
    return subprocess.Popen([sys.executable, "-m", "workers.archiver", "--dir", str(tmp_path / "archive"),
                             "--counters", str(tmp_path / "counters.dat"), "--segment-length", str(256 * 1024), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(process):
    """SIGTERM, then the exit code; a failure shows what the archiver said."""
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=WAIT_S)
    if process.returncode:
        print(err, file=sys.stderr)
    return process.returncode


def _mark_file(archive_dir):
    """The mark file's header, or None while the archiver is still creating it (a file shorter
    than its header is damage to a reader that finds it so for good, not to one waiting for it)."""
    try:
        return read_info(archive_dir)
    except MarkFileError:
        return None


def test_a_second_archiver_on_the_same_directory_is_refused(tmp_path):
    first = start_archiver(tmp_path)
    try:
        wait_for(lambda: (info := _mark_file(tmp_path / "archive")) and info.is_ready and info.is_active(), "the first archiver")
        second = start_archiver(tmp_path)
        _, err = second.communicate(timeout=WAIT_S)
        assert second.returncode == 1
        assert "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
        assert str(first.pid) in err and "archive" in err
    finally:
        assert stop(first) == 0
    assert read_info(tmp_path / "archive").activity_timestamp == -1  # a clean shutdown


def test_an_archiver_killed_mid_recording_recovers_the_stop_position_at_restart(tmp_path):
    counters = CountersFile.open(tmp_path / "counters.dat")
    log = LogBuffer.create(tmp_path / "live.logbuffer", LogBufferParams(term_length=64 * 1024, session_id=5, stream_id=6))
    archiver = start_archiver(tmp_path, "--record", str(log.path))
    publication = ExclusivePublication(log, counters)
    wait_for(lambda: publication.is_connected, "the recorder to subscribe")
    rec_pos = wait_for(lambda: counters.find(RECORDING_POSITION_TYPE_ID, 0), "the recording position counter")[0]

    sent = []  # (end position, payload)
    i = 0
    deadline = time.monotonic() + WAIT_S
    while counters.get(rec_pos) < 600_000:  # several segments in, the writer still going
        # Every frame 1024 bytes, so none straddles a page: a last frame torn across one is refused
        # at restart, as Aeron refuses it (tests/archive/test_segments.py), not repaired.
        payload = bytes([i % 251]) * (961 + (i * 7) % 32)
        result = publication.offer(payload)
        if result > 0:
            sent.append((result, payload))
            i += 1
        elif result != ADMIN_ACTION:
            time.sleep(0.0005)
        assert time.monotonic() < deadline, "the recorder fell behind for good"
    archiver.send_signal(signal.SIGKILL)
    archiver.wait(timeout=WAIT_S)
    recorded_before_kill = counters.get(rec_pos)

    with Catalog.open(tmp_path / "archive") as catalog:
        assert catalog.get(0).stop_position == NULL_POSITION  # nobody closed the recording

    restarted = start_archiver(tmp_path)
    try:
        wait_for(lambda: (info := _mark_file(tmp_path / "archive")) and info.is_ready and info.pid == restarted.pid,
                 "the restarted archiver")
        with Catalog.open(tmp_path / "archive") as catalog:
            stop_position = catalog.get(0).stop_position
    finally:
        assert stop(restarted) == 0
    # The refresh found the end of the last whole frame: at least what the counter had shown.
    assert recorded_before_kill <= stop_position <= publication.position
    assert stop_position in {end for end, _ in sent}

    verify = subprocess.run([sys.executable, "-m", "ramen.cli.main", "archive", "verify", str(tmp_path / "archive")],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    dump = subprocess.run([sys.executable, "-m", "ramen.cli.main", "archive", "dump", "--json",
                           str(tmp_path / "archive"), "0"], capture_output=True, text=True, check=True)
    dumped = [json.loads(line) for line in dump.stdout.splitlines()]
    expected = [(end, payload) for end, payload in sent if end <= stop_position]
    assert [d["position"] for d in dumped] == [end for end, _ in expected]
    assert all(d["length"] == len(p) for d, (_, p) in zip(dumped, expected))


def test_the_archiver_counts_the_bytes_it_records_and_frees_its_counter_when_it_stops(tmp_path):
    counters = CountersFile.open(tmp_path / "counters.dat")
    log = LogBuffer.create(tmp_path / "live.logbuffer", LogBufferParams(term_length=64 * 1024, session_id=5, stream_id=6))
    archiver = start_archiver(tmp_path, "--record", str(log.path))
    try:
        publication = ExclusivePublication(log, counters)
        wait_for(lambda: publication.is_connected, "the recorder to subscribe")
        for i in range(100):  # past a term: the padding at its end is recorded too
            wait_for(lambda: publication.offer(bytes([i]) * 1000) > 0, "room in the log")
        rec_pos = wait_for(lambda: counters.find(RECORDING_POSITION_TYPE_ID, 0), "the recording position counter")[0]
        wait_for(lambda: counters.get(rec_pos) == publication.position, "everything recorded")
        [recorded] = wait_for(lambda: [c for c in counters.counters() if c.type_name == "archiver-bytes-recorded"
                                       and c.value == publication.position], "the bytes counted")
        assert recorded.label == f"archiver {tmp_path / 'archive'} bytes recorded" and recorded.owner_id == archiver.pid
    finally:
        assert stop(archiver) == 0
    assert not [c for c in counters.counters() if c.type_name == "archiver-bytes-recorded"]

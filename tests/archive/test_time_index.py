"""The event-time index finds where a replay of [since, until) starts and stops, exactly; its
checksums catch damage, and a damaged (or version-1) index is rebuilt from the segments."""

import logging
import os
import random

import numpy as np
import pytest

from ramen.archive.time_index import (ENTRY, ENTRY_DTYPE, ENTRY_LENGTH, INDEX_HEADER_LENGTH, INDEX_VERSION,
                                      VERSION_OFFSET, TimeIndex, TimeIndexError, TimeIndexWriter, index_path,
                                      write_index)
from tests.archive.damage import _to_legacy_index
from tests.archive.test_record_replay import Rig, ramen_message


def build(tmp_path, messages, recording_id=7):
    writer = TimeIndexWriter(index_path(tmp_path, recording_id), recording_id)
    for position, low, high in messages:
        writer.append(position, low, high)
    writer.close()
    return TimeIndex.open(index_path(tmp_path, recording_id), recording_id)


def disordered_messages(count, seed, max_disorder_us=5_000):
    rng = random.Random(seed)
    messages, position, clock = [], 0, 1_000_000
    for _ in range(count):
        clock += rng.randrange(0, 2_000)
        low = clock - rng.randrange(0, max_disorder_us)
        high = clock + rng.randrange(0, 1_000)
        messages.append((position, low, high))
        position += 32 * rng.randrange(1, 100)
    return messages


@pytest.mark.parametrize("seed", range(5))
def test_seek_and_stop_bracket_exactly_the_messages_that_can_hold_the_range(tmp_path, seed):
    messages = disordered_messages(2000, seed)
    index = build(tmp_path, messages)
    rng = random.Random(seed + 100)
    for _ in range(200):
        since = rng.randrange(messages[0][1] - 10_000, messages[-1][2] + 10_000)
        until = since + rng.randrange(1, 200_000)
        start, stop = index.seek(since), index.stop(until)
        needed = [p for p, low, high in messages if high >= since and low < until]
        if not needed:
            continue
        assert start is not None and start <= needed[0]
        assert stop is None or stop > needed[-1]
        # The seek is tight: the message just before `start` cannot hold anything >= since.
        before = [m for m in messages if m[0] < start]
        assert all(high < since for _, _, high in before)


def test_an_ordered_stream_has_no_disorder_and_a_tight_stop(tmp_path):
    messages = [(i * 64, 1000 * i, 1000 * i + 999) for i in range(100)]
    index = build(tmp_path, messages)
    assert index.disorder_us == 0
    assert index.seek(10_500) == 10 * 64
    assert index.stop(20_000) == 20 * 64  # message 19 ends at 19,999; message 20 starts at 20,000


def test_seek_past_the_end_finds_nothing(tmp_path):
    index = build(tmp_path, [(0, 0, 10), (64, 11, 20)])
    assert index.seek(21) is None
    assert index.stop(5) == 64


def test_a_reopened_writer_appends_after_a_torn_last_entry(tmp_path):
    path = index_path(tmp_path, 3)
    writer = TimeIndexWriter(path, 3)
    writer.append(0, 0, 10)
    writer.append(64, 5, 20)
    writer.close()
    with open(path, "ab") as f:
        f.write(b"\1" * 17)  # a crash mid-append
    writer = TimeIndexWriter(path, 3)
    assert writer.entries == 2 and writer.disorder_us == 5
    writer.append(128, 21, 30)
    writer.close()
    index = TimeIndex.open(path, 3)
    assert list(index.entries["position"]) == [0, 64, 128]
    assert list(index.entries["running_max"]) == [10, 20, 30]


def test_an_index_of_another_recording_is_refused(tmp_path):
    build(tmp_path, [(0, 0, 1)], recording_id=1)
    with pytest.raises(TimeIndexError, match="belongs to recording 1, not 2"):
        TimeIndex.open(index_path(tmp_path, 1), 2)


# -- checksums, damage and rebuilding -----------------------------------------------------------------


def test_a_flush_writes_only_the_new_entries_and_the_header(tmp_path, monkeypatch):
    """The recorder flushes every 0.1 s: the entries' checksum is extended by what is added, never
    computed again over the whole index."""
    path = index_path(tmp_path, 4)
    writer = TimeIndexWriter(path, 4)
    for i in range(5000):
        writer.append(i * 64, i, i + 1)
    writer.flush()
    calls = []
    real_pwrite, real_pread = os.pwrite, os.pread
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: calls.append(("write", offset, len(data))) or
                        real_pwrite(fd, data, offset))
    monkeypatch.setattr(os, "pread", lambda fd, n, offset: calls.append(("read", offset, n)) or
                        real_pread(fd, n, offset))
    for i in range(5000, 5003):
        writer.append(i * 64, i, i + 1)
    writer.flush()
    monkeypatch.undo()
    assert calls == [("write", INDEX_HEADER_LENGTH + 5000 * ENTRY_LENGTH, 3 * ENTRY_LENGTH),
                     ("write", 0, INDEX_HEADER_LENGTH)]
    writer.close()
    index = TimeIndex.open(path, 4)
    assert len(index) == 5003 and index.seek(5002) == 5001 * 64


def recorded(tmp_path, count=300, *, stop=True):
    rng = random.Random(3)
    rig = Rig(tmp_path)
    rig.publish(ramen_message(i, rng) for i in range(count))
    if stop:
        rig.stop()
    else:
        rig.recorder.index.flush()
    path = index_path(tmp_path / "archive", rig.recorder.recording_id)
    index = TimeIndex.open(path, rig.recorder.recording_id)
    entries, disorder = index.entries.copy(), index.disorder_us
    index.close()
    assert len(entries) == count and disorder > 0
    return rig, path, entries, disorder


def flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(data)


DAMAGED_INDEXES = {
    "zeroed": lambda path: path.write_bytes(bytes(path.stat().st_size)),
    "truncated inside the header": lambda path: os.truncate(path, 40),
    "truncated inside the entries": lambda path: os.truncate(path, INDEX_HEADER_LENGTH + 100 * ENTRY_LENGTH + 5),
    "an entry flipped": lambda path: flip(path, INDEX_HEADER_LENGTH + 150 * ENTRY_LENGTH + 17),
    "the disorder flipped": lambda path: flip(path, 24),
    "of another recording": lambda path: write_index(path, 99, 0, np.zeros(0, dtype=ENTRY_DTYPE)),
}


@pytest.mark.parametrize("how", DAMAGED_INDEXES)
def test_a_damaged_index_of_a_stopped_recording_is_rebuilt_from_the_segments_and_written_back(tmp_path, how, caplog):
    rig, path, entries, disorder = recorded(tmp_path)
    DAMAGED_INDEXES[how](path)
    with caplog.at_level(logging.WARNING):
        index = TimeIndex.open(path, rig.recorder.recording_id)
    assert np.array_equal(index.entries, entries) and index.disorder_us == disorder
    assert "rebuilt from the recording's segments (300 entries) and written back" in caplog.text
    index.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        index = TimeIndex.open(path, rig.recorder.recording_id)
    assert np.array_equal(index.entries, entries) and caplog.text == ""  # sound now


def test_a_damaged_index_of_an_active_recording_is_rebuilt_in_memory_and_left_to_its_recorder(tmp_path, caplog):
    rig, path, entries, _ = recorded(tmp_path, stop=False)
    flip(path, INDEX_HEADER_LENGTH + 10 * ENTRY_LENGTH + 3)
    damaged = path.read_bytes()
    with caplog.at_level(logging.WARNING):
        index = TimeIndex.open(path, rig.recorder.recording_id)
    assert np.array_equal(index.entries, entries)
    assert "in memory only: the recording is active" in caplog.text
    assert path.read_bytes() == damaged  # its recorder still appends to that file
    index.close()
    rig.publish(ramen_message(i, random.Random(i)) for i in range(300, 320))
    rig.recorder.index.flush()
    index = TimeIndex.open(path, rig.recorder.recording_id)
    assert len(index) == 320 and np.array_equal(index.entries[:300], entries)


def test_a_damaged_index_without_segments_to_rebuild_it_from_is_an_error_naming_it(tmp_path):
    build(tmp_path, [(0, 0, 1), (64, 2, 3)], recording_id=5)
    flip(index_path(tmp_path, 5), INDEX_HEADER_LENGTH + 8)
    with pytest.raises(TimeIndexError, match=r"5.tindex offset 40: the checksum of its 2 entries does not match .*"
                                             r"cannot rebuild it from the segments"):
        TimeIndex.open(index_path(tmp_path, 5), 5)


@pytest.mark.parametrize("how", ["an entry flipped", "truncated inside the entries", "zeroed"])
def test_a_reopened_writer_rebuilds_a_damaged_index_in_place_and_appends_after_it(tmp_path, how):
    rig, path, entries, disorder = recorded(tmp_path)
    DAMAGED_INDEXES[how](path)
    inode = path.stat().st_ino
    writer = TimeIndexWriter(path, rig.recorder.recording_id)
    assert (writer.entries, writer.disorder_us) == (300, disorder)
    last = int(entries["position"][-1])
    writer.append(last + 4096, 10**9, 10**9 + 1)
    writer.close()
    assert path.stat().st_ino == inode  # the file the writer had: another writer could hold it too
    index = TimeIndex.open(path, rig.recorder.recording_id)
    assert np.array_equal(index.entries[:300], entries) and int(index.entries["position"][300]) == last + 4096


def test_a_reopened_writer_catches_up_with_what_was_recorded_after_its_last_flush(tmp_path):
    """A crash between the segments' writes and the index's flush leaves the index behind: reopened
    to extend the recording, its writer adds what the segments hold past its last entry."""
    rig, path, entries, _ = recorded(tmp_path)
    write_index(path, rig.recorder.recording_id, 0, entries[:200])  # what the last flush before the crash had
    writer = TimeIndexWriter(path, rig.recorder.recording_id)
    assert writer.entries == 300
    writer.close()
    index = TimeIndex.open(path, rig.recorder.recording_id)
    assert np.array_equal(index.entries, entries)


def test_a_reopened_writer_drops_what_its_header_does_not_cover(tmp_path):
    path = index_path(tmp_path, 3)
    writer = TimeIndexWriter(path, 3)
    writer.append(0, 0, 10)
    writer.close()
    with open(path, "ab") as f:  # a flush that wrote its entries but not its header
        f.write(ENTRY.pack(64, 5, 20, 20))
    writer = TimeIndexWriter(path, 3)
    assert writer.entries == 1
    writer.close()
    assert path.stat().st_size == INDEX_HEADER_LENGTH + ENTRY_LENGTH


def test_a_version_1_index_is_rebuilt_as_version_2(tmp_path):
    rig, path, entries, disorder = recorded(tmp_path)
    _to_legacy_index(path)
    index = TimeIndex.open(path, rig.recorder.recording_id)
    assert np.array_equal(index.entries, entries) and index.disorder_us == disorder
    index.close()
    assert int.from_bytes(path.read_bytes()[VERSION_OFFSET:VERSION_OFFSET + 4], "little") == INDEX_VERSION


def test_a_version_1_index_with_nothing_to_rebuild_it_from_is_read_as_it_is(tmp_path):
    index = build(tmp_path, [(0, 0, 10), (64, 5, 20)], recording_id=2)
    index.close()
    _to_legacy_index(index_path(tmp_path, 2))
    index = TimeIndex.open(index_path(tmp_path, 2), 2)
    assert list(index.entries["running_max"]) == [10, 20] and index.disorder_us == 5


def test_a_reader_racing_the_recorders_append_reads_the_index_and_never_rebuilds_it(tmp_path, monkeypatch, caplog):
    """The recorder appends entries, then rewrites the header that covers them: a reader that took
    the file's size just before an append, and its header just after, took the active recording's
    index for truncated and rebuilt it from every segment (seen with no damage at all)."""
    path = index_path(tmp_path, 5)
    writer = TimeIndexWriter(path, 5)
    for i in range(100):
        writer.append(i * 64, i, i + 1)
    writer.flush()
    for i in range(100, 110):
        writer.append(i * 64, i, i + 1)
    real_fstat = os.fstat

    def fstat_then_append(fd):
        found = real_fstat(fd)
        writer.flush()  # the recorder's flush lands between the reader's two looks
        return found
    monkeypatch.setattr(os, "fstat", fstat_then_append)
    with caplog.at_level(logging.WARNING):
        index = TimeIndex.open(path, 5)
    monkeypatch.undo()

    assert len(index) in (100, 110)
    assert not [r for r in caplog.records if "rebuilt" in r.getMessage()]
    writer.close()

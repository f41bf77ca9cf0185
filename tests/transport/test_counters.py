"""The counters file: Aeron's cnc.dat layout, allocation across processes, reclaiming, bad files."""

import multiprocessing
import os
import struct
import traceback

import pytest

from ramen.transport import CountersFile
from ramen.transport import counters as ctr
from ramen.transport.counters import CounterShareExceeded, CountersFileError

SPAWN = multiprocessing.get_context("spawn")
CHILD_TIMEOUT_S = 30


# -- child processes (top level, so that spawn can find them) -------------------------------------

def _allocate_many(path, capacity, count, barrier, results):
    try:
        # Both children race to create the file, each taking more than a process's default share.
        counters = CountersFile.open(path, capacity=capacity, process_share=1.0)
        barrier.wait(CHILD_TIMEOUT_S)
        ids = [counters.allocate(ctr.SYSTEM_COUNTER_TYPE_ID, f"pid {os.getpid()} #{i}").id for i in range(count)]
        results.put(("ok", os.getpid(), ids))
    except BaseException:
        results.put(("error", os.getpid(), traceback.format_exc()))


def _allocate_and_die(path, count, results):
    try:
        counters = CountersFile.open(path, create=False, process_share=1.0)
        ids = [counters.allocate(ctr.SYSTEM_COUNTER_TYPE_ID, f"orphan #{i}").id for i in range(count)]
        results.put(("ok", os.getpid(), ids))
    except BaseException:
        results.put(("error", os.getpid(), traceback.format_exc()))
    # The counters are left allocated: a process that dies frees nothing.


def _child_results(processes, results) -> list[tuple[int, list[int]]]:
    out = []
    for _ in processes:
        status, pid, value = results.get(timeout=CHILD_TIMEOUT_S)
        assert status == "ok", f"child {pid} failed:\n{value}"
        out.append((pid, value))
    for process in processes:
        process.join(CHILD_TIMEOUT_S)
        assert process.exitcode == 0
    return out


# -- layout --------------------------------------------------------------------------------------

def test_new_counters_file_has_aeron_cnc_header_and_no_driver_buffers(tmp_path):
    path = tmp_path / "cnc.dat"
    CountersFile.open(path, capacity=16).close()

    data = path.read_bytes()
    assert len(data) == 128 + 16 * (512 + 128)
    version, to_driver, to_clients, meta_length, values_length, error_log = struct.unpack_from("<iiiiii", data, 0)
    assert version == (0 << 16) | (2 << 8) | 0
    assert (to_driver, to_clients, error_log) == (0, 0, 0)
    assert (meta_length, values_length) == (16 * 512, 16 * 128)
    assert struct.unpack_from("<q", data, 40)[0] == os.getpid()


def test_allocated_counter_records_its_type_label_key_registration_and_owner(tmp_path):
    path = tmp_path / "cnc.dat"
    counters = CountersFile.open(path, capacity=16)
    key = ctr.STREAM_KEY.pack(77, 5, 6, ctr.KEY_FLAG_TETHERED)

    counter = counters.allocate(ctr.SUBSCRIBER_POSITION_TYPE_ID, "sub-pos: 5 6 x", key=key, registration_id=77)
    counter.set(1234)
    counter.add(6)

    info, = counters.counters()
    assert (info.id, info.type_id, info.type_name, info.label) == (0, 4, "sub-pos", "sub-pos: 5 6 x")
    assert info.key == key.ljust(112, b"\0")
    assert (info.value, info.registration_id, info.owner_id) == (1240, 77, os.getpid())
    # The same bytes at Aeron's record offsets: state, type id, label length and label; value, registration, owner.
    data = path.read_bytes()
    meta, values = 128, 128 + 16 * 512
    assert struct.unpack_from("<ii", data, meta) == (ctr.RECORD_ALLOCATED, 4)
    assert struct.unpack_from("<i", data, meta + 128)[0] == len("sub-pos: 5 6 x")
    assert data[meta + 132:meta + 132 + 14] == b"sub-pos: 5 6 x"
    assert struct.unpack_from("<qqq", data, values) == (1240, 77, os.getpid())


def test_counters_are_numbered_in_order_and_found_by_type_and_registration(tmp_path):
    counters = CountersFile.open(tmp_path / "cnc.dat", capacity=16)
    ids = [counters.allocate(type_id, f"c{i}", registration_id=reg).id
           for i, (type_id, reg) in enumerate([(4, 1), (4, 2), (1, 1), (4, 1)])]

    assert ids == [0, 1, 2, 3]
    assert counters.find(4, 1) == [0, 3]
    assert counters.find(1, 1) == [2]
    assert [info.label for info in counters.counters()] == ["c0", "c1", "c2", "c3"]


def test_label_round_trips_utf8_and_is_cut_to_the_record_size(tmp_path):
    counters = CountersFile.open(tmp_path / "cnc.dat", capacity=16)

    short = counters.allocate(0, "débit: net/per_minute")
    long = counters.allocate(0, "x" * 500)

    assert short.label == "débit: net/per_minute"
    assert long.label == "x" * 380


def test_key_longer_than_the_record_is_refused(tmp_path):
    counters = CountersFile.open(tmp_path / "cnc.dat", capacity=16)
    with pytest.raises(ValueError, match="113 bytes exceeds 112"):
        counters.allocate(0, "k", key=bytes(113))


def test_value_set_in_one_mapping_is_read_in_another(tmp_path):
    writer = CountersFile.open(tmp_path / "cnc.dat", capacity=16)
    reader = CountersFile.open(tmp_path / "cnc.dat", create=False)
    counter = writer.allocate(0, "shared")

    counter.set(-42)

    assert reader.get(counter.id) == -42
    assert reader.label(counter.id) == "shared"


# -- free and reuse ------------------------------------------------------------------------------

def test_freed_counter_disappears_and_is_not_reused_before_the_delay(tmp_path):
    counters = CountersFile.open(tmp_path / "cnc.dat", capacity=16)
    first = counters.allocate(0, "first")
    counters.allocate(0, "second")

    first.close()
    third = counters.allocate(0, "third")

    assert counters.state(first.id) == ctr.RECORD_RECLAIMED
    assert [info.label for info in counters.counters()] == ["second", "third"]
    assert third.id == 2


def test_freed_counter_is_reused_after_the_delay_and_starts_clean(tmp_path, monkeypatch):
    monkeypatch.setattr(ctr, "COUNTER_FREE_TO_REUSE_DELAY_S", 0)
    counters = CountersFile.open(tmp_path / "cnc.dat", capacity=16)
    first = counters.allocate(1, "first", key=b"old key", registration_id=9)
    first.set(99)
    first.close()

    again = counters.allocate(4, "again")

    assert again.id == first.id
    info, = counters.counters()
    assert (info.type_id, info.label, info.value, info.registration_id) == (4, "again", 0, 0)
    assert info.key == bytes(112)


def test_full_file_of_live_counters_raises_counters_file_error(tmp_path):
    path = tmp_path / "cnc.dat"
    counters = CountersFile.open(path, capacity=2, process_share=1.0)
    counters.allocate(0, "a")
    counters.allocate(0, "b")

    with pytest.raises(CountersFileError) as error:
        counters.allocate(0, "c")

    assert str(path) in str(error.value) and "all 2 counters are in use" in str(error.value)


def test_a_process_past_its_share_is_refused_while_the_file_has_room_for_others(tmp_path):
    path = tmp_path / "cnc.dat"
    counters = CountersFile.open(path, capacity=16, process_share=0.25)
    held = [counters.allocate(0, f"mine #{i}") for i in range(4)]

    with pytest.raises(CounterShareExceeded) as error:
        counters.allocate(0, "one too many")

    assert f"process {os.getpid()} holds 4 of its 16 counters, its share; refused 'one too many'" in str(error.value)
    assert str(path) in str(error.value)
    held.pop().close()
    assert counters.allocate(0, "after one was freed").id >= 4  # the freed record waits out its reuse delay


# -- several processes ---------------------------------------------------------------------------

def test_two_processes_allocating_concurrently_never_get_the_same_id(tmp_path):
    path = tmp_path / "cnc.dat"
    barrier = SPAWN.Barrier(2)
    results = SPAWN.Queue()
    processes = [SPAWN.Process(target=_allocate_many, args=(path, 512, 200, barrier, results)) for _ in range(2)]
    for process in processes:
        process.start()

    (pid_a, ids_a), (pid_b, ids_b) = _child_results(processes, results)

    assert len(set(ids_a)) == len(set(ids_b)) == 200
    assert not set(ids_a) & set(ids_b)
    counters = CountersFile.open(path, create=False)
    assert counters.capacity == 512  # created once, by whichever child came first
    infos = {info.id: info for info in counters.counters()}
    assert sorted(infos) == sorted(ids_a + ids_b) == list(range(400))
    for pid, ids in ((pid_a, ids_a), (pid_b, ids_b)):
        assert all(infos[i].owner_id == pid and infos[i].label.startswith(f"pid {pid} #") for i in ids)


def test_a_process_holding_its_share_leaves_the_others_theirs(tmp_path):
    path = tmp_path / "cnc.dat"
    hog = CountersFile.open(path, capacity=16, process_share=0.25)
    for i in range(4):
        hog.allocate(0, f"hog #{i}")
    with pytest.raises(CounterShareExceeded):
        hog.allocate(0, "hog #4")
    results = SPAWN.Queue()
    process = SPAWN.Process(target=_allocate_and_die, args=(path, 12, results))
    process.start()

    (pid, ids), = _child_results([process], results)

    assert sorted(ids) == list(range(4, 16))


def test_full_file_reclaims_the_counters_of_dead_processes(tmp_path):
    path = tmp_path / "cnc.dat"
    counters = CountersFile.open(path, capacity=4, process_share=1.0)
    mine = counters.allocate(0, "mine")
    results = SPAWN.Queue()
    process = SPAWN.Process(target=_allocate_and_die, args=(path, 3, results))
    process.start()
    (dead_pid, orphan_ids), = _child_results([process], results)
    assert sorted(orphan_ids) == [1, 2, 3]

    reused = counters.allocate(0, "after the orphans")

    assert reused.id in orphan_ids
    infos = list(counters.counters())
    assert [(info.label, info.owner_id) for info in infos] == [("mine", os.getpid()),
                                                               ("after the orphans", os.getpid())]
    assert all(info.owner_id != dead_pid for info in infos)
    assert mine.label == "mine"


# -- bad files -----------------------------------------------------------------------------------

def test_opening_a_missing_counters_file_without_create_fails(tmp_path):
    path = tmp_path / "absent.dat"
    with pytest.raises(CountersFileError, match="no counters file") as error:
        CountersFile.open(path, create=False)
    assert str(path) in str(error.value)
    assert not path.exists()


def test_a_counters_file_its_creator_has_not_written_yet_is_not_there_yet(tmp_path):
    path = tmp_path / "counters.dat"
    path.touch()  # created, its creator not yet holding the lock that writes it
    with pytest.raises(CountersFileError, match="no counters file yet"):
        CountersFile.open(path, create=False)
    CountersFile.open(path).close()  # the creator then makes it whole
    CountersFile.open(path, create=False).close()


def _too_short(path):
    path.write_bytes(bytes(10))


def _wrong_version(path):
    CountersFile.open(path, capacity=4).close()
    with open(path, "r+b") as f:
        f.write(struct.pack("<i", 0x0300))


def _inconsistent_lengths(path):
    CountersFile.open(path, capacity=4).close()
    with open(path, "r+b") as f:
        f.seek(16)
        f.write(struct.pack("<i", 3 * 128))  # values for 3 counters, metadata for 4


def _truncated(path):
    CountersFile.open(path, capacity=4).close()
    os.truncate(path, 128 + 4 * 512)


@pytest.mark.parametrize("damage, problem", [
    (_too_short, "10 bytes is too short for a counters file"),
    (_wrong_version, "counters file version 0x300, expected 0x200"),
    (_inconsistent_lengths, "inconsistent counters buffer lengths 2048 and 384"),
    (_truncated, "file is 2176 bytes, its header needs 2688 (truncated?)"),
], ids=["too-short", "wrong-version", "inconsistent-lengths", "truncated"])
def test_opening_a_damaged_counters_file_raises_counters_file_error_naming_it(tmp_path, damage, problem):
    path = tmp_path / "cnc.dat"
    damage(path)

    with pytest.raises(CountersFileError) as error:
        CountersFile.open(path)

    assert str(path) in str(error.value)
    assert problem in str(error.value)

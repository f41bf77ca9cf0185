"""A service's counters as attributes: in memory, or allocated in the counters file."""

import pytest

from ramen.transport.counters import SERVICE_COUNTER_TYPE_IDS, TYPE_NAMES, CountersFile
from ramen.transport.service_counters import Count, ServiceCounters, allocate_service_counter
from supervisor.counters import SupervisorCounters


def test_every_counter_of_a_service_has_a_type_id_of_its_own():
    ids = [type_id for ids in SERVICE_COUNTER_TYPE_IDS.values() for type_id in ids.values()]
    assert len(ids) == len(set(ids))
    assert set(SupervisorCounters.NAMES) == set(SERVICE_COUNTER_TYPE_IDS["supervisor"])
    assert TYPE_NAMES[SERVICE_COUNTER_TYPE_IDS["supervisor"]["merged_requests"]] == "supervisor-merged-requests"


def test_a_counter_without_a_type_id_is_refused_when_its_class_is_made():
    with pytest.raises(TypeError, match="no type id for supervisor \\['restart_storms'\\]"):
        class Wrong(ServiceCounters, service="supervisor"):
            restart_storms = Count("not in SERVICE_COUNTER_TYPE_IDS")


def test_counters_in_memory_count_without_a_file():
    counters = SupervisorCounters()
    counters.restarts += 2
    counters.merged_requests += 1
    assert counters.restarts == 2 and counters.to_dict()["merged_requests"] == 1 and counters.starts == 0


def test_allocated_counters_are_labelled_in_the_file_and_count_there(tmp_path):
    file = CountersFile.open(tmp_path / "counters.dat")
    counters = SupervisorCounters.allocate(file, "s1")
    counters.merged_requests += 3
    counters.merged_requests += 1
    rows = {c.label: c for c in file.counters()}
    assert len(rows) == len(SupervisorCounters.NAMES)
    merged = rows["supervisor s1 merged requests"]
    assert merged.value == 4 == counters.merged_requests
    assert merged.type_id == SERVICE_COUNTER_TYPE_IDS["supervisor"]["merged_requests"]
    assert merged.key.rstrip(b"\0") == b"s1"


def test_close_frees_the_counters_and_keeps_their_last_values(tmp_path):
    file = CountersFile.open(tmp_path / "counters.dat")
    counters = SupervisorCounters.allocate(file, "s1")
    counters.kills += 5
    counters.close()
    assert list(file.counters()) == []
    assert counters.kills == 5
    counters.kills += 1  # a late count after close is not lost, nor written into a freed record
    assert counters.kills == 6 and list(file.counters()) == []


def test_the_replayer_helper_allocates_its_bytes_read_counter(tmp_path):
    file = CountersFile.open(tmp_path / "counters.dat")
    counter = allocate_service_counter(file, "replayer", "bytes_read", "7")
    counter.set(1024)
    [row] = file.counters()
    assert (row.label, row.type_id, row.value) == ("replayer 7 bytes read", SERVICE_COUNTER_TYPE_IDS["replayer"]["bytes_read"], 1024)

"""The supervisor's counters in counters.dat, where `ramen stat` reads them, are what its stats key says."""

from __future__ import annotations

from ramen import supervisor_stats
from ramen.transport.counters import SERVICE_COUNTER_TYPE_IDS, CountersFile
from supervisor.counters import SupervisorCounters
from supervisor.workers import RestartPolicy
from tests.supervisor.conftest import SITE, set_worker, wait_for


def test_restarts_and_quarantines_are_counted_in_the_counters_file_and_the_stats_key(admin, start_supervisor,
                                                                                      tmp_path):
    file = CountersFile.open(tmp_path / "counters.dat")
    counters = SupervisorCounters.allocate(file, SITE)
    try:
        set_worker(admin, "p/crash")
        policy = RestartPolicy(initial_s=0.05, quarantine_failures=3, quarantine_window_s=60.0, quarantine_s=600.0)
        start_supervisor(policy=policy, counters=counters)
        ids = SERVICE_COUNTER_TYPE_IDS["supervisor"]

        def in_file(name: str) -> int:
            return {c.type_id: c.value for c in file.counters()}[ids[name]]

        wait_for(lambda: in_file("quarantines") == 1, what="the quarantine counted in counters.dat")
        assert in_file("starts") == 3 and in_file("restarts") == 2 and in_file("crashes") == 3
        stats = wait_for(lambda: (s := supervisor_stats.read(admin, SITE)) and s.counters["quarantines"] and s,
                         what="the quarantine in the stats key")
        assert {name: stats.counters[name] for name in ids} == {name: in_file(name) for name in ids}
    finally:
        counters.close()
        file.close()

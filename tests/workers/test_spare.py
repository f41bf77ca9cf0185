"""A spare worker (python -m workers.worker --spare ID): started before its function is known, it
runs the function its key names, logging where that function's worker logs; it (and a warm
replayer) exits once the supervisor that started it is gone."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest

from ramen import keyspace, paths
from ramen.tuples import encode_tuples
from tests.supervisor.conftest import pid_alive
from tests.waiting import wait_for
from tests.workers.test_worker import ROOT, TRAFFIC, WAIT_S, Rig


def start_spare(rig: Rig, spare_id: int, *args: str, log_path=None) -> subprocess.Popen:
    out = open(log_path, "ab") if log_path is not None else subprocess.PIPE
    process = subprocess.Popen([sys.executable, "-m", "workers.worker", "--site", rig.site, "--spare", str(spare_id),
                                *args], cwd=ROOT, env=rig.env, stdout=out, stderr=out, text=True)
    if log_path is not None:
        out.close()
    rig.processes.append(process)
    return process


def test_a_spare_runs_the_function_its_key_names_and_logs_where_that_worker_logs(rig, tmp_path):
    rig.load(backfill="2s")
    rig.worker_key("traffic")
    spare_log, worker_log = tmp_path / "spare-7.log", tmp_path / "traffic.log"
    spare = start_spare(rig, 7, log_path=spare_log)
    wait_for(lambda: "waiting for its function" in spare_log.read_text(), "the spare to wait")
    assert not paths.output_log(rig.site, rig.qualified("traffic")).exists()  # nothing runs yet

    rig.admin.set(keyspace.spare_key(rig.site, 7), {"function": rig.qualified("traffic"), "log": str(worker_log),
                                                     "spare_log": str(spare_log)})
    reader = rig.reader(paths.output_log(rig.site, rig.qualified("traffic")), TRAFFIC, join_position=0)
    reader.read_until(lambda: reader.rows >= 2000, "the back-fill of the function the spare was given")
    assert rig.stop(spare) == 0
    assert f"worker {rig.qualified('traffic')} on site {rig.site} running" in worker_log.read_text()
    assert not spare_log.exists()


def test_a_spare_nobody_needs_exits_0_after_its_wait(rig):
    spare = start_spare(rig, 8, "--wait-for-key", "0.5")
    out, err = spare.communicate(timeout=WAIT_S)
    assert spare.returncode == 0
    assert "spare worker 8: no function came" in err


def test_a_spare_given_no_function_fails_in_one_line(rig):
    rig.admin.set(keyspace.spare_key(rig.site, 9), {"function": "nothing"})
    assert rig.error_of(start_spare(rig, 9)) == (1, "ramen: worker spare 9: its key names 'nothing', not PROG/FUNC")


ORPHANING_PARENT = """
import os, subprocess, sys
child = subprocess.Popen([*sys.argv[1:], "--parent", str(os.getpid())])
print(child.pid, flush=True)
"""


@pytest.mark.parametrize("command", [("workers.worker", "--spare", "10"),
                                     ("workers.replayer", "--id", "10", "--wait-for-key", "600")],
                         ids=["spare worker", "warm replayer"])
def test_a_process_started_ahead_whose_supervisor_died_exits(rig, command):
    """Started ahead, it is only its supervisor's: orphaned (its parent killed), it goes instead of waiting."""
    module, *args = command
    parent = subprocess.Popen([sys.executable, "-c", ORPHANING_PARENT, sys.executable, "-m", module,
                               "--site", rig.site, *args], cwd=ROOT, env=rig.env, stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    parent.wait(timeout=WAIT_S)  # the parent exits at once: the child is orphaned while it starts or waits
    wait_for(lambda: not pid_alive(child_pid), "the orphan to exit", timeout_s=WAIT_S)


FIRST_BATCH = """
import sys
import pyarrow as pa
from ramen.tuples import decode_tuples
from workers.spare import warm_up_arrow
from workers.windows import WindowState
if sys.argv[1] == "warm":
    warm_up_arrow()
elif sys.argv[1] == "warm without pandas":
    warm_up_arrow(pandas=False)
sent = sys.stdin.buffer.read()
schema = pa.schema([("ts", pa.timestamp("us")), ("bytes", pa.int64())])
before = set(sys.modules)
batch = decode_tuples(sent, schema)
WindowState(every_us=60_000_000, lateness_us=0).add(pa.Table.from_batches([batch]), "ts")
pa.Table.from_batches([batch]).group_by("ts").aggregate([("bytes", "sum")])  # what user functions do
print(" ".join(sorted(set(sys.modules) - before)))
print("pandas" in sys.modules, type(pa.Table.from_batches([batch]).to_pandas()).__name__)
"""


@pytest.mark.parametrize("start", ["warm", "warm without pandas", "cold"])
def test_after_the_warm_up_a_first_batch_imports_nothing(start):
    """The warm-up pays pyarrow's lazy imports (pandas, when installed; Acero) before any replay: a spare
    worker's or a warm replayer's first batch then imports nothing. Cold, that batch pays them. A
    replayer's warm-up leaves pandas out, and to_pandas still finds it when asked."""
    schema = pa.schema([("ts", pa.timestamp("us")), ("bytes", pa.int64())])
    sent = encode_tuples(pa.RecordBatch.from_pydict({"ts": [1, 70_000_000], "bytes": [3, 4]}, schema), "ts")
    result = subprocess.run([sys.executable, "-c", FIRST_BATCH, start], cwd=ROOT, input=bytes(sent),
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    imported_line, pandas_line = result.stdout.decode().splitlines()
    imported = imported_line.split()
    if start.startswith("warm"):
        assert imported == []
        pandas_imported = start == "warm"
        assert pandas_line == f"{pandas_imported} DataFrame"
    else:
        assert "pandas" in imported  # what the warm-up is for (pandas comes with pyspark)
        assert "pyarrow.acero" in imported


def test_work_handed_over_just_before_the_supervisor_died_is_still_taken(rig):
    """The supervisor writes the key, then dies before the waiting process has seen it: the process
    finds its parent gone, but the key is there, so it does the work (the next supervisor adopts it
    and would otherwise wait for a process that left quietly)."""
    from workers.spare import wait_for_key
    key = keyspace.spare_key(rig.site, 11)
    real_get = rig.admin.get_or_none
    looks = []

    def first_look_then_hand_over(k):
        entry = real_get(k)
        if not looks:
            rig.admin.set(key, {"function": "e2e/per_minute"})  # right after our first look
        looks.append(entry)
        return entry

    rig.admin.get_or_none = first_look_then_hand_over
    not_our_parent = -1  # as if the supervisor that started us had died
    entry = wait_for_key(rig.admin, key, WAIT_S, parent=not_our_parent)
    assert looks[0] is None and entry is not None and entry.value == {"function": "e2e/per_minute"}
    rig.admin.delete(key)
    assert wait_for_key(rig.admin, key, WAIT_S, parent=not_our_parent) is None  # no key: it leaves

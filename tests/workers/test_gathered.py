"""A heavy worker's gathered rows: staged to Parquet as they arrive (a staging store) or kept in
memory (none), read back whole, and gone without a trace once discarded."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workers import heavy
from ramen.spark.staging import StagingStore
from workers.heavy import Gathered

SCHEMA = pa.schema([("ts", pa.timestamp("us")), ("host", pa.string()), ("bytes", pa.int64())])


def batch(first: int, rows: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(first, first + rows), pa.int64()).cast(pa.timestamp("us")),
                            pa.array([f"h{i % 3}" for i in range(rows)]), pa.array(range(rows), pa.int64())],
                           schema=SCHEMA)


@pytest.fixture
def writer():
    with ThreadPoolExecutor(1) as pool:
        yield pool


def test_staged_rows_go_to_one_parquet_file_per_file_rows_and_come_back_whole(tmp_path, writer, monkeypatch):
    monkeypatch.setattr(heavy, "SPARK_STAGING_FILE_ROWS", 100)
    gathered = Gathered(StagingStore(str(tmp_path)), "job", writer)
    for i in range(7):
        gathered.add("p/traffic", batch(i * 40, 40))
    gathered.add("q/other", batch(0, 5))
    assert gathered.rows == 285 and len(gathered.batches["p/traffic"]) == 1  # 3 x 40 rows staged twice
    directories = gathered.staged()

    assert directories == {"p/traffic": f"{tmp_path}/job/traffic", "q/other": f"{tmp_path}/job/other"}
    files = sorted(p.name for p in (tmp_path / "job" / "traffic").iterdir())
    assert files == ["00000.parquet", "00001.parquet", "00002.parquet"]
    staged = pq.read_table(directories["p/traffic"]).sort_by("ts")
    assert staged.num_rows == 280 and staged["ts"].type == pa.timestamp("us", tz="UTC")  # marked UTC for Spark
    assert staged["ts"].cast(pa.int64()).to_pylist() == list(range(280))
    assert gathered.in_memory()["q/other"].num_rows == 5  # read back, for a Spark that went remote

    gathered.discard()
    assert not (tmp_path / "job").exists() and gathered.rows == 0 and not gathered


def test_without_staging_rows_stay_in_memory_and_a_job_is_due_at_job_rows(tmp_path, writer, monkeypatch):
    monkeypatch.setattr(heavy, "SPARK_JOB_ROWS", 100)
    monkeypatch.setattr(heavy, "SPARK_STAGED_JOB_ROWS", 1000)
    in_memory, staging = Gathered(None, "job", writer), Gathered(StagingStore(str(tmp_path)), "job", writer)
    for gathered in (in_memory, staging):
        gathered.add("p/traffic", batch(0, 60))
        gathered.add("p/traffic", batch(60, 60))
    assert in_memory.job_due and not staging.job_due  # staged rows are on disk: bigger jobs
    tables = in_memory.in_memory()
    assert tables["p/traffic"]["ts"].cast(pa.int64()).to_pylist() == list(range(120))
    assert not (tmp_path / "job").exists()  # under a file's worth of rows: nothing written yet

"""Sources: the deterministic generator (backfill, real time, recomputation) and file sources."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workers.sources import (FileSource, GeneratorSource, SourceError, generate_rows, resume_start, rows_between,
                             step_of)

SCHEMA = pa.schema([("ts", pa.timestamp("us")), ("host", pa.string()), ("bytes", pa.int64())])
SECOND_US = 1_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_generated_rows_are_a_pure_function_of_seed_and_event_time_whatever_the_batching():
    whole = generate_rows(SCHEMA, "ts", seed=3, hosts=5, step_us=1000, first_index=10, count=100)
    parts = [generate_rows(SCHEMA, "ts", seed=3, hosts=5, step_us=1000, first_index=10 + i, count=n)
             for i, n in ((0, 30), (30, 1), (31, 69))]
    assert pa.Table.from_batches(parts).equals(pa.Table.from_batches([whole]))
    other_seed = generate_rows(SCHEMA, "ts", seed=4, hosts=5, step_us=1000, first_index=10, count=100)
    assert not other_seed.column("bytes").equals(whole.column("bytes"))
    assert whole.column("ts").cast(pa.int64()).to_pylist() == [i * 1000 for i in range(10, 110)]
    assert set(whole.column("host").to_pylist()) <= {f"host{i:02d}" for i in range(5)}
    byte_counts = whole.column("bytes").to_pylist()
    assert all(40 <= b < 1540 for b in byte_counts) and len(set(byte_counts)) > 50


def test_generator_backfills_fast_in_batches_then_follows_real_time():
    source = GeneratorSource(SCHEMA, "ts", rate=1000, hosts=3, seed=1, backfill_us=10 * SECOND_US,
                             batch_rows=4000, flush_interval_s=0.2)
    now_us = 1_000_000 * SECOND_US
    batches = []
    while (batch := source.poll(now_us)) is not None:
        batches.append(batch)
    assert [b.num_rows for b in batches] == [4000, 4000, 2000]
    table = pa.Table.from_batches(batches)
    first, count = rows_between(now_us - 10 * SECOND_US, now_us, step_of(1000))
    assert table.equals(pa.Table.from_batches([generate_rows(SCHEMA, "ts", seed=1, hosts=3, step_us=1000,
                                                             first_index=first, count=count)]))
    assert source.poll(now_us + 50_000) is None  # 50 fresh rows due: gathered for the flush interval
    assert source.poll(now_us + 250_000).num_rows == 250


def test_generator_starting_at_a_given_time_continues_a_previous_run():
    source = GeneratorSource(SCHEMA, "ts", rate=500, start_us=7 * SECOND_US + 1, batch_rows=10)
    batch = source.poll(60 * SECOND_US)
    assert batch.column("ts").cast(pa.int64())[0].as_py() == 7 * SECOND_US + 2000


def write_csv(path, rows):
    path.write_text("ts,host,bytes\n" + "".join(f"{ts},{host},{b}\n" for ts, host, b in rows))


def drain(source):
    batches = []
    while (batch := source.poll(0)) is not None:
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=SCHEMA) if batches else SCHEMA.empty_table()


def test_csv_directory_is_read_in_event_time_order(tmp_path):
    write_csv(tmp_path / "b.csv", [("2026-01-01T00:00:03", "h1", 30), ("2026-01-01T00:00:01", "h2", 10)])
    write_csv(tmp_path / "a.csv", [("2026-01-01T00:00:02", "h3", 20)])
    (tmp_path / "notes.txt").write_text("not data")
    table = drain(FileSource("csv", tmp_path, SCHEMA, "ts", batch_rows=2))
    assert table.column("bytes").to_pylist() == [10, 20, 30]
    assert table.schema == SCHEMA


def test_jsonl_and_parquet_files_are_read_with_the_function_schema(tmp_path):
    lines = [{"ts": "2026-01-01T00:00:02", "host": "a", "bytes": 2, "extra": 1},
             {"ts": "2026-01-01T00:00:01", "host": "b", "bytes": 1}]
    (tmp_path / "x.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert drain(FileSource("jsonl", tmp_path / "x.jsonl", SCHEMA, "ts")).column("host").to_pylist() == ["b", "a"]
    pq.write_table(pa.table({"bytes": [5, 6], "host": ["p", "q"],
                             "ts": pa.array([20, 10], pa.timestamp("s"))}), tmp_path / "y.parquet")
    table = drain(FileSource("parquet", tmp_path, SCHEMA, "ts"))
    assert table.column("bytes").to_pylist() == [6, 5] and table.schema == SCHEMA


def test_follow_reads_appended_lines_and_new_files(tmp_path):
    clock = FakeClock()
    path = tmp_path / "live.csv"
    write_csv(path, [("2026-01-01T00:00:01", "h", 1)])
    with open(path, "a") as f:
        f.write("2026-01-01T00:00:02,h,")  # a line being written: not read yet
    source = FileSource("csv", tmp_path, SCHEMA, "ts", follow=True, clock=clock)
    assert drain(source).column("bytes").to_pylist() == [1]
    with open(path, "a") as f:
        f.write("2\n")
    write_csv(tmp_path / "more.csv", [("2026-01-01T00:00:03", "h", 3)])
    assert drain(source).num_rows == 0  # not looked at again before the follow interval
    clock.now += 1.0
    assert drain(source).column("bytes").to_pylist() == [2, 3]


def test_a_missing_file_or_a_missing_column_is_a_one_line_error(tmp_path):
    with pytest.raises(SourceError, match="no such file"):
        drain(FileSource("csv", tmp_path / "nope.csv", SCHEMA, "ts"))
    (tmp_path / "bad.csv").write_text("ts,host\n2026-01-01T00:00:01,h\n")
    with pytest.raises(SourceError, match="no column 'bytes'"):
        drain(FileSource("csv", tmp_path / "bad.csv", SCHEMA, "ts"))


def test_a_restarted_generator_resumes_after_its_last_row_but_never_further_back_than_its_backfill():
    now_us = 1_000_000 * SECOND_US
    assert resume_start(now_us - 3 * SECOND_US, 10 * SECOND_US, now_us) == now_us - 3 * SECOND_US
    assert resume_start(now_us - 3 * 86_400 * SECOND_US, 10 * SECOND_US, now_us) == now_us - 10 * SECOND_US
    assert resume_start(now_us - 3 * SECOND_US, 0, now_us) == now_us  # no backfill: from now on

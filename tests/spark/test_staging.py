"""The staging store heavy workers share with Spark: named by a path or a URI, checked writable,
and nothing left after a delete."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ramen.spark.staging import StagingError, StagingStore


@pytest.mark.parametrize("name", ["{}", "file://{}"])
def test_a_directory_or_file_uri_stores_and_names_files_as_spark_reads_them(tmp_path, name):
    store = StagingStore(name.format(tmp_path) + "/")
    store.check()
    table = pa.table({"a": [1, 2, 3]})
    store.write("job/traffic/00000.parquet", table)
    assert (tmp_path / "job" / "traffic" / "00000.parquet").exists()
    assert store.read("job/traffic").equals(table)
    assert store.spark_path("job/traffic") == name.format(tmp_path) + "/job/traffic"
    store.delete("job")
    store.delete("job")  # gone already: nothing to say
    assert list(tmp_path.iterdir()) == []  # the check's probe is gone too


@pytest.mark.parametrize("name, says", [("relative/dir", "not an absolute path"),
                                        ("ftp://host/dir", "unknown filesystem 'ftp'")])
def test_a_name_spark_and_the_workers_cannot_share_is_refused_in_one_line(name, says):
    with pytest.raises(StagingError, match=says) as raised:
        StagingStore(name)
    assert "\n" not in str(raised.value)


def test_a_store_that_cannot_be_written_fails_its_check_in_one_line(tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(StagingError, match="cannot write there") as raised:
        StagingStore(str(tmp_path / "a-file" / "staging")).check()
    assert "\n" not in str(raised.value)

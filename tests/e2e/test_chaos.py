"""A short chaos soak (bench/chaos.py): kill -9 of every kind of ramen process while replays run,
then nothing lost, duplicated or wrong in the archive, each minute the archived aggregate covers
whole and right, every replay right or a one-line error,
no hang and no leak. The bench's full soak is 100 kills over 10 minutes (bench/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHAOS = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


def test_a_short_chaos_soak_loses_duplicates_and_leaks_nothing(tmp_path):
    result = subprocess.run([sys.executable, str(CHAOS), "--kills", "10", "--minutes", "1", "--seed", "19",
                             "--settle", "15", "--dir", str(tmp_path / "chaos"), "--json"],
                            capture_output=True, text=True, timeout=600)
    assert result.stdout.strip(), result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert sum(report["kills"].values()) == 10, result.stderr
    assert report["archived_rows"] > 100_000
    assert (report["duplicated_rows"], report["missing_rows"], report["wrong_rows"]) == (0, 0, 0), report
    assert report["derived_windows"] > 0
    assert (report["derived_windows_wrong"], report["derived_windows_duplicated"]) == (0, 0), report
    assert report["replays"].get("ok", 0) > 0, report
    assert not {"wrong", "hang", "unclear"} & set(report["replays"]), report["replay_failures"]
    assert report["leaks"] == [], report["leaks"]
    assert report["passed"] and result.returncode == 0

"""Archive coverage: which event times each function's recordings can replay, read from the
catalog and the time indexes only, and which recordings (and positions) a replay must read."""

import random

import pytest

from ramen import message
from ramen.archive.catalog import Catalog, RecordingState
from ramen.archive.coverage import (FUNCTION_CHANNEL_PREFIX, Interval, RecordingRange, archive_coverage,
                                    function_channel, function_of_channel, merge, recordings_for)
from ramen.archive.recorder import Recorder
from ramen.archive.replay import positions_for_times
from ramen.archive.segment import list_segment_files
from ramen.archive.time_index import index_path
from ramen.program import loads
from ramen.replay.plan import ReplayGapError, plan_replay
from ramen.transport import ADMIN_ACTION, CountersFile, ExclusivePublication, LogBuffer, LogBufferParams

TERM = 64 * 1024
SEGMENT = 256 * 1024
SAFETY_CYCLES = 200_000
SECOND = 1_000_000
BASE_US = 1_795_168_800 * SECOND
"""2026-11-20T10:00Z."""


def tuples(min_us: int, max_us: int, size: int = 200) -> bytes:
    header = message.MessageHeader(message.KIND_TUPLES, min_event_time_us=min_us, max_event_time_us=max_us)
    return message.encode(header, bytes(size))


def schema_message() -> bytes:
    """No event time: not indexed, so it covers nothing."""
    return message.encode(message.MessageHeader(message.KIND_SCHEMA), b"schema")


class Site:
    """One archive directory and its counters, recording functions as the archiver does."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.archive = tmp_path / "archive"
        self.counters = CountersFile.open(tmp_path / "counters.dat")
        self.catalog = Catalog.create(self.archive)
        self.session_ids = iter(range(1, 1000))

    def record(self, channel: str, payloads, *, stop: bool = True, index: bool = True) -> int:
        """Record one worker's run: a new log buffer, a Recorder on it, the payloads published
        and recorded; the recording is stopped (end of stream) unless `stop` is False."""
        session_id = next(self.session_ids)
        path = self.tmp / f"out-{session_id}.logbuffer"
        log = LogBuffer.create(path, LogBufferParams(term_length=TERM, session_id=session_id, stream_id=1))
        recorder = Recorder(self.catalog, LogBuffer.open(path), self.counters, segment_length=SEGMENT,
                            channel=channel, source_identity="test", index_event_time=index)
        publication = ExclusivePublication(log, self.counters)
        for payload in payloads:
            for _ in range(SAFETY_CYCLES):
                result = publication.offer(payload)
                if result > 0:
                    break
                if result != ADMIN_ACTION:
                    recorder.do_work()
            else:
                pytest.fail("the publication never got past back pressure")
        while recorder.do_work():
            pass
        if stop:
            publication.close()
            for _ in range(SAFETY_CYCLES):
                recorder.do_work()
                if recorder.is_stopped:
                    break
            else:
                pytest.fail("the recorder did not stop at the end of the stream")
        elif recorder.index is not None:
            recorder.index.flush()
        return recorder.recording_id

    def function(self, name: str, spans, **kwargs) -> int:
        """Record `name` producing one message per (min, max) seconds after BASE."""
        return self.record(function_channel(name), [schema_message()] + [
            tuples(BASE_US + round(low * SECOND), BASE_US + round(high * SECOND)) for low, high in spans], **kwargs)


TRAFFIC_PROGRAM = """[program]
name = "net"

[[function]]
name = "traffic"
source = { kind = "parquet", path = "t.parquet" }
schema = { ts = "timestamp[us]", bytes = "int64" }
event_time = "ts"
archive = { retention = "7d" }
"""


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path)


def seconds(low: float, high: float) -> Interval:
    """[BASE + low s, BASE + high s + 1 µs): the +1 µs makes the last tuple's time covered."""
    return Interval(BASE_US + round(low * SECOND), BASE_US + round(high * SECOND) + 1)


def test_function_channels_name_the_function_and_read_back():
    assert FUNCTION_CHANNEL_PREFIX == "ramen:"
    assert function_channel("net/traffic") == "ramen:net/traffic"
    assert function_of_channel("ramen:net/traffic") == "net/traffic"
    assert function_of_channel("aeron:ipc") is None
    assert function_of_channel("ramen:") is None


def test_restarts_make_several_recordings_whose_coverage_is_merged(site):
    site.function("net/traffic", [(0, 10), (10, 20), (20, 30)])
    site.function("net/traffic", [(30, 40), (40, 50)])           # touches the first: merged
    site.function("net/traffic", [(45, 60)])                     # overlaps: merged
    site.function("net/traffic", [(100, 110), (110, 120)])       # the worker was down 60..100: a gap
    site.function("net/dns", [(5, 6)])
    site.record("aeron:ipc", [tuples(BASE_US, BASE_US + SECOND)])  # no function's: ignored
    # Touching means the next recording starts 1 µs after the last covered time.
    assert archive_coverage(site.archive) == {
        "net/traffic": [Interval(BASE_US, BASE_US + 60 * SECOND + 1), seconds(100, 120)],
        "net/dns": [seconds(5, 6)],
    }


def test_recordings_that_touch_at_the_microsecond_merge_and_one_microsecond_apart_do_not(site):
    site.record(function_channel("p/f"), [tuples(BASE_US, BASE_US + 999)])
    site.record(function_channel("p/f"), [tuples(BASE_US + 1000, BASE_US + 2000)])
    site.record(function_channel("p/f"), [tuples(BASE_US + 2002, BASE_US + 3000)])
    assert archive_coverage(site.archive)["p/f"] == [Interval(BASE_US, BASE_US + 2001),
                                                     Interval(BASE_US + 2002, BASE_US + 3001)]


def test_a_restarted_source_that_says_where_it_resumes_covers_on_from_there(site):
    """A generator resumes 1 µs past its last row and its first row comes a grid step later: the
    RESUMED message it writes first makes its new recording touch the old one; without it, the step
    between them would be a gap, and a replay across the restart refused."""
    from ramen.tuples import resumed
    site.record(function_channel("p/f"), [tuples(BASE_US, BASE_US + 999)])
    site.record(function_channel("p/f"), [resumed(BASE_US + 1000, source=7), tuples(BASE_US + 1333, BASE_US + 2000)])
    site.record(function_channel("p/g"), [tuples(BASE_US, BASE_US + 999)])
    site.record(function_channel("p/g"), [tuples(BASE_US + 1333, BASE_US + 2000)])
    coverage = archive_coverage(site.archive)
    assert coverage["p/f"] == [Interval(BASE_US, BASE_US + 2001)]
    assert coverage["p/g"] == [Interval(BASE_US, BASE_US + 1000), Interval(BASE_US + 1333, BASE_US + 2001)]


def test_a_gap_a_worker_wrote_in_its_recording_is_left_out_of_the_coverage_and_purged_with_it(site):
    """A windowed worker restarted mid-window goes on in the same log, so in the same recording:
    the GAP it writes first is what tells the windows it may have missed from whole ones (a window
    of 7,892 of 30,030 rows was covered, and replayed as if whole)."""
    from ramen.archive.gaps import gaps_path, read_gaps
    from ramen.archive.retention import delete_recording
    from ramen.tuples import gap
    recording = site.function("p/w", [(0, 0), (10, 10)], stop=False)
    site.record(function_channel("p/other"), [gap(BASE_US, BASE_US + 50 * SECOND, source=1)])  # no rows: nothing
    # The restart, in the same log (one recording here too): windows 20 and 30 may miss rows.
    recording = site.record(function_channel("p/w"), [
        tuples(BASE_US, BASE_US), tuples(BASE_US + 10 * SECOND, BASE_US + 10 * SECOND),
        gap(BASE_US + 20 * SECOND, BASE_US + 40 * SECOND, source=1),
        tuples(BASE_US + 30 * SECOND, BASE_US + 30 * SECOND), tuples(BASE_US + 40 * SECOND, BASE_US + 40 * SECOND),
        tuples(BASE_US + 50 * SECOND, BASE_US + 50 * SECOND)])

    assert read_gaps(gaps_path(site.archive, recording)) == [(BASE_US + 20 * SECOND, BASE_US + 40 * SECOND)]
    assert archive_coverage(site.archive)["p/w"] == [Interval(BASE_US, BASE_US + 20 * SECOND), seconds(40, 50)]
    assert "p/other" not in archive_coverage(site.archive)
    delete_recording(site.catalog, recording)
    assert not gaps_path(site.archive, recording).exists()


def test_a_torn_last_gap_record_is_ignored(tmp_path):
    from ramen.archive.gaps import GAP_RECORD, append_gap, read_gaps
    path = tmp_path / "3.gaps"
    append_gap(path, 10, 20)
    with open(path, "ab") as f:
        f.write(GAP_RECORD.pack(30, 40)[:9])  # a recorder killed mid-write
    assert read_gaps(path) == [(10, 20)]


def test_an_empty_recording_covers_nothing(site):
    site.record(function_channel("net/idle"), [])
    site.record(function_channel("net/schema_only"), [schema_message()])
    site.function("net/traffic", [(0, 10)])
    site.record(function_channel("net/traffic"), [])
    assert archive_coverage(site.archive) == {"net/traffic": [seconds(0, 10)]}


def test_a_stopped_recording_whose_time_index_is_missing_gets_it_rebuilt_from_its_segments(site):
    """Recorded is never lost: a deleted index is rebuilt (and written back) the first time it is needed."""
    site.function("net/traffic", [(0, 10)], index=False)
    site.function("net/traffic", [(20, 30)])
    assert not index_path(site.archive, 0).exists()
    assert archive_coverage(site.archive) == {"net/traffic": [seconds(0, 10), seconds(20, 30)]}
    assert index_path(site.archive, 0).exists()


def test_an_active_recording_without_a_time_index_covers_nothing(site):
    site.function("net/traffic", [(0, 10)], index=False, stop=False)
    site.function("net/traffic", [(20, 30)])
    assert not index_path(site.archive, 0).exists()
    assert archive_coverage(site.archive) == {"net/traffic": [seconds(20, 30)]}


@pytest.mark.parametrize("state", [RecordingState.DELETED, RecordingState.INVALID])
def test_deleted_and_invalid_recordings_are_ignored(site, state):
    gone = site.function("net/traffic", [(0, 10)])
    site.function("net/traffic", [(20, 30)])
    site.catalog.change_state(gone, state)
    assert archive_coverage(site.archive) == {"net/traffic": [seconds(20, 30)]}
    assert [r.recording_id for r in recordings_for(site.archive, "net/traffic", BASE_US, BASE_US + 40 * SECOND)] \
        == [gone + 1]


def test_the_end_of_coverage_is_the_latest_time_even_when_the_last_message_is_late(site):
    site.function("net/traffic", [(0, 10), (10, 50), (20, 25)])
    assert archive_coverage(site.archive) == {"net/traffic": [seconds(0, 50)]}


def test_coverage_reads_the_index_files_never_the_segments(site):
    site.function("net/traffic", [(low, low + 1) for low in range(0, 3000, 2)])  # several segments
    before = archive_coverage(site.archive)
    segments = [path for paths in list_segment_files(site.archive).values() for path in paths]
    assert len(segments) >= 1
    for path in site.archive.glob("*.rec"):
        path.chmod(0)  # unreadable: any read would fail
    try:
        assert archive_coverage(site.archive) == before == {"net/traffic": [seconds(0, 2999)]}
    finally:
        for path in site.archive.glob("*.rec"):
            path.chmod(0o644)


def test_an_archive_directory_without_a_catalog_has_no_coverage(tmp_path):
    assert archive_coverage(tmp_path / "nowhere") == {}
    assert recordings_for(tmp_path / "nowhere", "net/traffic", 0, 1) == []


def test_recordings_for_a_range_are_those_that_hold_it_with_their_index_positions(site):
    first = site.function("net/traffic", [(s, s + 1) for s in range(0, 600, 2)])
    site.function("net/traffic", [(s, s + 1) for s in range(1300, 1400, 2)])  # after the range
    third = site.function("net/traffic", [(s, s + 1) for s in range(900, 1200, 2)])
    site.function("net/traffic", [(s, s + 1) for s in range(400, 450, 2)])    # before the range
    site.function("net/dns", [(s, s + 1) for s in range(0, 1200, 2)])
    since, until = BASE_US + 500 * SECOND, BASE_US + 1000 * SECOND
    ranges = recordings_for(site.archive, "net/traffic", since, until)
    assert [r.recording_id for r in ranges] == [first, third]
    for r in ranges:
        descriptor = site.catalog.get(r.recording_id)
        start, stop = positions_for_times(site.archive, descriptor, since, until)
        assert r == RecordingRange(r.recording_id, start, descriptor.stop_position if stop is None else stop)
        assert descriptor.start_position <= r.start_position < r.stop_position <= descriptor.stop_position
    assert ranges[0].start_position > 0                               # seeks past the first 500 s
    assert ranges[0].stop_position == site.catalog.get(first).stop_position  # read to its end
    assert ranges[1].stop_position < site.catalog.get(third).stop_position  # stops before 1000 s


def test_an_active_recording_has_no_stop_position_yet(site):
    active = site.function("net/traffic", [(0, 10), (10, 20)], stop=False)
    [only] = recordings_for(site.archive, "net/traffic", BASE_US + 15 * SECOND, BASE_US + 60 * SECOND)
    assert (only.recording_id, only.stop_position) == (active, None)


def test_a_plan_from_a_real_archive_replays_the_covering_functions(site):
    programs = {"net": loads(TRAFFIC_PROGRAM + '''
[[function]]
name = "per_minute"
lazy = true
from = ["traffic"]
window = { every = "1 minute" }
engine = "spark"
sql = "SELECT ts, bytes FROM traffic"
schema = { ts = "timestamp[us]", bytes = "int64" }
event_time = "ts"
archive = { retention = "7d" }
''', "net.toml")}
    rng = random.Random(1)
    site.function("net/traffic", [(s, s + 1 + rng.random()) for s in range(3600)])
    site.function("net/per_minute", [(s, s) for s in range(1800, 3600, 60)])  # stamped with the window start
    coverage = archive_coverage(site.archive)
    plan = plan_replay("net/per_minute", BASE_US, BASE_US + 3600 * SECOND, programs, coverage)
    assert (plan.sources, plan.links) == (("net/traffic",), (("net/traffic", "net/per_minute"),))
    plan = plan_replay("net/per_minute", BASE_US + 1800 * SECOND, BASE_US + 3600 * SECOND, programs, coverage)
    assert plan.sources == ("net/per_minute",)
    with pytest.raises(ReplayGapError) as caught:
        plan_replay("net/per_minute", BASE_US - 3600 * SECOND, BASE_US + 3600 * SECOND, programs, coverage)
    assert str(caught.value) == "no archive of net/traffic before 2026-11-20T10:00Z"


def test_an_explanation_names_the_recordings_a_replay_would_read_and_what_is_not_covered(site):
    """`ramen replay --explain`: the plan, with each source's recordings and positions from its
    time index; a range partly covered is explained as the part covered, one not covered at all too."""
    from ramen.replay.explain import explain
    programs = {"net": loads(TRAFFIC_PROGRAM, "net.toml")}
    first = site.function("net/traffic", [(s, s) for s in range(0, 20)])
    second = site.function("net/traffic", [(s, s) for s in range(30, 60)])
    coverage = archive_coverage(site.archive)
    found = explain("net/traffic", BASE_US - 60 * SECOND, BASE_US + 40 * SECOND, programs, coverage, site.archive)
    assert (found.plan.since_us, found.plan.until_us) == (BASE_US, BASE_US + 40 * SECOND)
    [source] = found.sources
    assert [r.recording_id for r in source.recordings] == [first, second]
    assert source.recordings == tuple(recordings_for(site.archive, "net/traffic", BASE_US, BASE_US + 40 * SECOND))
    as_json = found.to_dict()
    assert as_json["requested"] == {"since": "2026-11-20T09:59:00Z", "until": "2026-11-20T10:00:40Z"}
    assert as_json["covered"] == {"since": "2026-11-20T10:00:00Z", "until": "2026-11-20T10:00:40Z"}
    assert as_json["functions"] == ["net/traffic"]
    assert [(u["since"], u["until"]) for u in as_json["uncovered"]] == [
        ("2026-11-20T09:59:00Z", "2026-11-20T10:00:00Z"), ("2026-11-20T10:00:19.000001Z", "2026-11-20T10:00:30Z")]
    assert any(line.startswith(f"  recording {first}: positions ") for line in found.lines())
    nothing = explain("net/traffic", BASE_US - 600 * SECOND, BASE_US - 60 * SECOND, programs, coverage, site.archive)
    assert nothing.plan is None and nothing.to_dict()["covered"] is None and nothing.sources == ()
    assert nothing.problem.startswith("no archive of net/traffic covers")

    # A range that ends now, half a second past the archive's newest row: the newest tuples are on
    # their way to the disk, as the replay takes it (replay_to_newest), not a gap to note.
    now_us = BASE_US + 59 * SECOND + SECOND // 2
    found = explain("net/traffic", BASE_US + 40 * SECOND, now_us, programs, coverage, site.archive, to_newest=True)
    assert found.problem is None and found.to_dict()["uncovered"] == []
    assert found.plan.until_us < now_us
    noted = explain("net/traffic", BASE_US + 40 * SECOND, now_us, programs, coverage, site.archive)
    assert [(u["since"], u["until"]) for u in noted.to_dict()["uncovered"]] == [
        ("2026-11-20T10:00:59.000001Z", "2026-11-20T10:00:59.5Z")]
    strict = explain("net/traffic", BASE_US + 40 * SECOND, now_us, programs, coverage, site.archive, strict=True,
                     to_newest=True)
    assert strict.problem is None and strict.plan.until_us < now_us


def test_merge_sorts_and_joins_overlapping_and_touching_intervals():
    assert merge([Interval(5, 8), Interval(0, 2), Interval(2, 3), Interval(7, 9), Interval(20, 21)]) == [
        Interval(0, 3), Interval(5, 9), Interval(20, 21)]
    with pytest.raises(ValueError):
        Interval(2, 1)

"""The archiver in follow mode, as a real process against a real confserver: it records the live
output of archived, used functions under their function channel, and stops when they are unused or
their log is gone. `build_archive` is also what the replayer's tests replay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import confserver
from ramen import keyspace, paths
from ramen.archive.catalog import NULL_POSITION, Catalog
from ramen.archive.coverage import Interval, archive_coverage, function_channel
from ramen.archive.coverage_key import ArchiveCoverage
from ramen.archive.recorder import RECORDING_POSITION_TYPE_ID
from ramen.program import loads
from ramen.times import format_range
from ramen.transport import ADMIN_ACTION, CountersFile, ExclusivePublication, Image, LogBuffer, LogBufferParams
from ramen.transport.defaults import IPC_MTU_LENGTH
from ramen.tuples import decode_tuples, encode_tuples
from tests.waiting import wait_for

WAIT_S = 30.0
TERM_LENGTH = 256 * 1024  # several terms (and PAD frames) in a small archive
SEGMENT_LENGTH = 512 * 1024  # several segment files too
BASE_US = 1_700_000_000_000_000
ROW_SPACING_US = 1000
BATCHES_PER_RECORDING = 60
PROGRAM = '''
[program]
name = "{name}"

[[function]]
name = "src"
source = {{ kind = "generator", rate = 10, hosts = 2, seed = 1 }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
archive = {{ retention = "1d" }}

[[function]]
name = "other"
source = {{ kind = "generator", rate = 10, hosts = 2, seed = 2 }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
archive = {{ retention = "1d" }}

[[function]]
name = "unarchived"
source = {{ kind = "generator", rate = 10, hosts = 2, seed = 3 }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
'''


def process_env(server, ramen_dir: Path) -> dict:
    return {**os.environ, "RAMEN_CONFSERVER": server.url, "RAMEN_CONFSERVER_AUTH": str(server.auth_file),
            "RAMEN_DIR": str(ramen_dir)}


@dataclass
class SiteArchive:
    """A site whose function `src` was published by hand and recorded by a follow-mode archiver."""
    server: object
    ramen_dir: Path
    site: str
    program: str
    schema: pa.Schema
    batches: list[pa.RecordBatch] = field(default_factory=list)
    stop_positions: list[int] = field(default_factory=list)

    @property
    def source(self) -> str:
        return f"{self.program}/src"

    @property
    def archive_dir(self) -> Path:
        return paths.archive_dir(self.site)

    @property
    def table(self) -> pa.Table:
        return pa.Table.from_batches(self.batches, self.schema)

    @property
    def env(self) -> dict:
        return process_env(self.server, self.ramen_dir)


def make_batch(schema: pa.Schema, first_row: int, rows: int, rng: np.random.Generator) -> pa.RecordBatch:
    """Rows `first_row`.. with event times 1 ms apart, shuffled within the batch (streams are not
    perfectly ordered); `bytes` holds the row number, a unique id."""
    ids = np.arange(first_row, first_row + rows, dtype=np.int64)
    rng.shuffle(ids)
    ts = pa.array(BASE_US + ids * ROW_SPACING_US, pa.int64()).cast(pa.timestamp("us"))
    hosts = pa.array([f"h{i % 7}" for i in ids.tolist()], pa.string())
    return pa.RecordBatch.from_arrays([ts, hosts, pa.array(ids)], schema=schema)


def worker_value(program, function: str, *, is_used: bool, archived: bool = True) -> dict:
    f = program.function(function)
    return {"program": program.name, "function": function, "is_used": is_used, "live": is_used, "replays": [],
            "lazy": False, "kind": f.kind, "archived": archived, "parents": [], "children": [],
            "signature": f.signature, "program_version": program.version}


def start_archiver(site: str, env: dict, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workers.archiver", "--dir", str(Path(env["RAMEN_DIR"]) / "sites" /
                             site / "archive"), "--counters", str(Path(env["RAMEN_DIR"]) / "counters.dat"),
                             "--segment-length", str(SEGMENT_LENGTH), "--checksum", "crc32",
                             "--follow-site", site, *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop_process(process: subprocess.Popen) -> tuple[int, str]:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
    return process.returncode, err


def publish(publication: ExclusivePublication, payload: bytes) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        result = publication.offer(payload)
        if result > 0:
            return
        assert time.monotonic() < deadline, f"could not publish (status {result})"
        if result != ADMIN_ACTION:
            time.sleep(0.0005)


def active_recording(archive_dir: Path, channel: str) -> int | None:
    if not (archive_dir / "archive.catalog").exists():
        return None
    with Catalog.open(archive_dir) as catalog:
        active = [d.recording_id for d in catalog if d.stripped_channel == channel and d.stop_position == NULL_POSITION]
    return active[0] if active else None


def recorded_up_to(counters: CountersFile, archive_dir: Path, channel: str, position: int) -> bool:
    recording_id = active_recording(archive_dir, channel)
    if recording_id is None:
        return False
    ids = counters.find(RECORDING_POSITION_TYPE_ID, recording_id)
    return bool(ids) and counters.get(ids[0]) >= position


def stopped_recordings(archive_dir: Path) -> dict[str, list[int]]:
    """Function channel -> stop positions of its stopped recordings (empty before any catalog)."""
    out: dict[str, list[int]] = {}
    if not (archive_dir / "archive.catalog").exists():
        return out
    with Catalog.open(archive_dir) as catalog:
        for d in catalog.descriptors():
            if d.stop_position != NULL_POSITION:
                out.setdefault(d.stripped_channel, []).append(d.stop_position)
    return out


def record_batches(state: SiteArchive, publication: ExclusivePublication, counters: CountersFile, count: int,
                   rng: np.random.Generator) -> None:
    """Once the archiver records `src`: publish `count` batches of rows numbered on from the last
    (kept in state.batches), wait until they are recorded, and keep where the log then stands."""
    channel = function_channel(state.source)
    # The recorder's image has joined once its recording is in the catalog (is_connected could
    # still be true from the previous recorder's image).
    wait_for(lambda: active_recording(state.archive_dir, channel) is not None, "the archiver to record src")
    row = sum(b.num_rows for b in state.batches)
    for i in range(count):
        rows = 150 + (i * 37) % 120
        batch = make_batch(state.schema, row, rows, rng)
        row += rows
        publish(publication, encode_tuples(batch, "ts"))
        state.batches.append(batch)
    end = publication.position
    wait_for(lambda: recorded_up_to(counters, state.archive_dir, channel, end), "the recorder to catch up")
    state.stop_positions.append(end)


def build_archive(server, ramen_dir: Path, checks=None, mtu_length: int | None = None) -> SiteArchive:
    """Two recordings of `src` (recorded, unused, its log created anew, used again), by a
    follow-mode archiver; `checks`, if given, is called at each step with (step, state) for the
    follow-mode tests to look in.
    `mtu_length`: the source log's (whole messages in one frame with IPC_MTU_LENGTH).
    $RAMEN_DIR must already be `ramen_dir` (monkeypatch it)."""
    site = f"follow-{uuid.uuid4().hex[:8]}"
    name = f"rp{uuid.uuid4().hex[:8]}"
    program = loads(PROGRAM.format(name=name), f"{name}.toml")
    admin = confserver.connect(server.url, identity="admin", auth_file=server.auth_file)
    chor = confserver.connect(server.url, identity="choreographer", auth_file=server.auth_file)
    state = SiteArchive(server, ramen_dir, site, name, program.function("src").schema)
    counters = CountersFile.open(paths.counters_path())
    archiver = start_archiver(site, state.env)
    log_buffers = []
    publication = None
    try:
        admin.set(keyspace.program_key(name), program.to_dict())
        src, other = f"{name}/src", f"{name}/other"
        params = LogBufferParams(term_length=TERM_LENGTH, session_id=7, stream_id=1,
                                 **({"mtu_length": mtu_length} if mtu_length else {}))
        for qualified in (src, other, f"{name}/unarchived"):
            paths.output_log(site, qualified).parent.mkdir(parents=True, exist_ok=True)
            log_buffers.append(LogBuffer.create(paths.output_log(site, qualified), params))
        publication = ExclusivePublication(log_buffers[0], counters)
        chor.set(keyspace.worker_key(site, src), worker_value(program, "src", is_used=True))
        chor.set(keyspace.worker_key(site, other), worker_value(program, "other", is_used=True))
        chor.set(keyspace.worker_key(site, f"{name}/unarchived"),
                 worker_value(program, "unarchived", is_used=True, archived=False))
        rng = np.random.default_rng(6)
        for recording_id in (0, 1):
            record_batches(state, publication, counters, BATCHES_PER_RECORDING, rng)
            if checks:
                checks(f"recorded {recording_id}", state)
            chor.set(keyspace.worker_key(site, src), worker_value(program, "src", is_used=False))
            wait_for(lambda: len(stopped_recordings(state.archive_dir).get(function_channel(src), [])) ==
                     recording_id + 1, "the recording to stop once src is unused")
            if recording_id == 0:
                # A log created anew (another log id): its recording cannot go on with the first.
                publication.close()
                paths.output_log(site, src).unlink()
                log_buffers.append(LogBuffer.create(paths.output_log(site, src), params))
                publication = ExclusivePublication(log_buffers[-1], counters)
                chor.set(keyspace.worker_key(site, src), worker_value(program, "src", is_used=True))
        # `other` is recorded until its log goes away.
        if checks:
            checks("before unlink", state)
        paths.output_log(site, other).unlink()
        wait_for(lambda: function_channel(other) in stopped_recordings(state.archive_dir),
                 "the recording of other to stop once its log is gone")
        code, err = stop_process(archiver)
        assert code == 0, err
        if checks:
            checks("stopped", state)
        return state
    finally:
        if archiver.poll() is None:
            stop_process(archiver)
        if publication is not None:
            publication.close()
        for lb in log_buffers:
            lb.close()
        for qualified in (f"{name}/src", f"{name}/other", f"{name}/unarchived"):
            paths.output_log(site, qualified).unlink(missing_ok=True)
        counters.close()
        admin.close()
        chor.close()


@pytest.fixture(scope="module")
def follow_run(builtin_server, tmp_path_factory):
    """The archive and what the archiver looked like at each step."""
    ramen_dir = tmp_path_factory.mktemp("ramen")
    seen: dict[str, dict] = {}

    def checks(step: str, state: SiteArchive) -> None:
        with Catalog.open(state.archive_dir) as catalog:
            seen[step] = {d.recording_id: d for d in catalog.descriptors()}

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAMEN_DIR", str(ramen_dir))
        state = build_archive(builtin_server, ramen_dir, checks)
        yield state, seen


def test_an_archived_used_function_is_recorded_under_its_function_channel(follow_run):
    state, seen = follow_run
    recordings = seen["recorded 0"]
    channels = sorted(d.stripped_channel for d in recordings.values())
    assert channels == sorted([function_channel(state.source), function_channel(f"{state.program}/other")])
    for d in recordings.values():
        assert d.original_channel.startswith(d.stripped_channel + "?log-id=")
        assert d.term_buffer_length == TERM_LENGTH


def test_an_unarchived_function_is_not_recorded(follow_run):
    state, seen = follow_run
    with Catalog.open(state.archive_dir) as catalog:
        assert function_channel(f"{state.program}/unarchived") not in {d.stripped_channel for d in catalog}


def test_an_unused_function_stops_being_recorded_and_a_new_log_of_it_is_recorded_anew_when_used_again(follow_run):
    state, _ = follow_run
    with Catalog.open(state.archive_dir) as catalog:
        src = [d for d in catalog if d.stripped_channel == function_channel(state.source)]
    assert len(src) == 2
    assert [d.stop_position for d in src] == state.stop_positions
    assert src[1].start_position == 0  # the new log, from its start
    assert src[0].original_channel != src[1].original_channel  # two logs


def test_a_function_whose_log_is_gone_stops_being_recorded(follow_run):
    state, seen = follow_run
    other = [d for d in seen["before unlink"].values() if d.stripped_channel.endswith("/other")]
    assert len(other) == 1 and other[0].stop_position == NULL_POSITION
    assert function_channel(f"{state.program}/other") in stopped_recordings(state.archive_dir)


def test_the_recordings_cover_every_published_event_time(follow_run):
    state, _ = follow_run
    coverage = archive_coverage(state.archive_dir)[state.source]
    assert len(coverage) == 2  # one per recording: 1 ms between the last row of one and the first of the next
    for batches, interval in zip((state.batches[:BATCHES_PER_RECORDING], state.batches[BATCHES_PER_RECORDING:]),
                                 coverage):
        times = pa.Table.from_batches(batches).column("ts").cast(pa.int64()).to_numpy()
        assert (interval.since_us, interval.until_us) == (times.min(), times.max() + 1)


def test_the_archiver_publishes_what_its_archive_covers_for_clients_without_its_files(follow_run):
    state, _ = follow_run
    with confserver.connect(state.server.url, identity="admin", auth_file=state.server.auth_file) as client:
        entry = client.get(keyspace.archive_coverage_key(state.site))
    published = ArchiveCoverage.from_value(entry.value)
    assert published.intervals() == archive_coverage(state.archive_dir)  # as of its stop
    assert state.source in published.functions


def test_follow_mode_without_a_confserver_is_a_one_line_error(tmp_path):
    env = {**os.environ, "RAMEN_CONFSERVER": "ramen://127.0.0.1:9", "RAMEN_DIR": str(tmp_path)}
    process = start_archiver("nowhere", env, "--connect-timeout", "1")
    try:
        _, err = process.communicate(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "nowhere" in err


# -- going on with a recording ------------------------------------------------------------------

class OneSource:
    """A site with one archived function `src`, whose log the test writes (IPC MTU: a message a
    frame), recorded by follow-mode archivers the test starts and kills."""

    def __init__(self, server, ramen_dir: Path, *, term_length: int = TERM_LENGTH) -> None:
        self.site = f"extend-{uuid.uuid4().hex[:8]}"
        self.name = f"rx{uuid.uuid4().hex[:8]}"
        self.program = loads(PROGRAM.format(name=self.name), f"{self.name}.toml")
        self.schema = self.program.function("src").schema
        self.env = process_env(server, ramen_dir)
        self.admin = confserver.connect(server.url, identity="admin", auth_file=server.auth_file)
        self.admin.set(keyspace.program_key(self.name), self.program.to_dict())
        self.counters = CountersFile.open(paths.counters_path())
        self.path = paths.output_log(self.site, self.source)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.log = LogBuffer.create(self.path, LogBufferParams(term_length=term_length, session_id=7, stream_id=1,
                                                               mtu_length=IPC_MTU_LENGTH))
        self.publication = ExclusivePublication(self.log, self.counters)
        self.batches: list[pa.RecordBatch] = []
        self.rng = np.random.default_rng(8)
        self.archivers: list[subprocess.Popen] = []

    @property
    def source(self) -> str:
        return f"{self.name}/src"

    @property
    def archive_dir(self) -> Path:
        return paths.archive_dir(self.site)

    def use(self, used: bool = True) -> None:
        self.admin.set(keyspace.worker_key(self.site, self.source), worker_value(self.program, "src", is_used=used))

    def start_archiver(self, *extra: str) -> subprocess.Popen:
        archiver = start_archiver(self.site, self.env, *extra)
        self.archivers.append(archiver)
        return archiver

    def publish(self, batches: int, downstream: Image | None = None) -> None:
        """`downstream`: a reader (a child function's worker) polled meanwhile, which keeps the
        writer connected once no recorder holds it."""
        for _ in range(batches):
            batch = make_batch(self.schema, sum(b.num_rows for b in self.batches), 200, self.rng)
            payload = encode_tuples(batch, "ts")
            deadline = time.monotonic() + WAIT_S
            while (result := self.publication.offer(payload)) < 0:
                assert time.monotonic() < deadline, f"could not publish (status {result})"
                if downstream is not None:
                    downstream.poll(lambda *fragment: None, 1 << 10)
                time.sleep(0.0005)
            self.batches.append(batch)

    def recorded_to_the_end(self) -> bool:
        return recorded_up_to(self.counters, self.archive_dir, function_channel(self.source), self.publication.position)

    def recordings(self) -> list:
        with Catalog.open(self.archive_dir) as catalog:
            return [d for d in catalog if d.stripped_channel == function_channel(self.source)]

    def recorded_table(self) -> pa.Table:
        """Every row of every recording of src, in recording and position order."""
        from ramen.archive.segment import SegmentReader
        batches = []
        for descriptor in self.recordings():
            with SegmentReader.for_recording(self.archive_dir, descriptor) as reader:
                stop = None if descriptor.stop_position == NULL_POSITION else descriptor.stop_position
                batches.extend(decode_tuples(f.payload(), self.schema) for f in reader.frames(None, stop)
                               if f.is_data)
        return pa.Table.from_batches(batches, self.schema)

    def close(self) -> None:
        for archiver in self.archivers:
            if archiver.poll() is None:
                archiver.kill()
            archiver.communicate()
        self.publication.close()
        self.log.close()
        self.counters.close()
        self.admin.delete_tree(f"sites/{self.site}")
        self.admin.close()


@pytest.fixture
def one_source(builtin_server, tmp_path, monkeypatch):
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path))
    source = OneSource(builtin_server, tmp_path)
    try:
        yield source
    finally:
        source.close()


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
def test_an_archiver_stopped_and_restarted_within_the_hold_goes_on_with_its_recording_and_loses_nothing(
        one_source, stop):
    """Killed with -9 (or stopped while its writer still writes) while its writer writes on: the
    writer waits for it (its tether's hold); the next archiver goes on with the same recording from
    where the first one's segments end (Aeron's extendRecording), so the recording holds every row
    once. The writer wrote more than half a term meanwhile: it was held, not let run over what was
    not recorded."""
    source = one_source
    source.use()
    first = source.start_archiver()
    wait_for(lambda: active_recording(source.archive_dir, function_channel(source.source)) is not None,
             "the first archiver to record src")
    source.publish(20)
    wait_for(source.recorded_to_the_end, "the first archiver to catch up")
    first.send_signal(getattr(signal, stop))
    first.communicate()

    writer = threading.Thread(target=source.publish, args=(100,))  # 470 KB: a message of 200 rows is 4.7 KB
    writer.start()
    wait_for(lambda: source.publication.back_pressure_events > 0, "the writer held by the dead recorder's tether")
    second = source.start_archiver()
    writer.join(WAIT_S)
    assert not writer.is_alive()
    wait_for(source.recorded_to_the_end, "the second archiver to catch up")
    assert stop_process(second)[0] == 0

    recordings = source.recordings()
    assert len(recordings) == 1 and recordings[0].stop_position == source.publication.position
    recorded = source.recorded_table()
    assert recorded.num_rows == 120 * 200 and recorded.equals(pa.Table.from_batches(source.batches, source.schema))
    assert archive_coverage(source.archive_dir)[source.source] == [
        Interval(BASE_US, BASE_US + (120 * 200 - 1) * ROW_SPACING_US + 1)]


def test_a_function_used_again_goes_on_with_its_recording(one_source):
    source = one_source
    source.use()
    archiver = source.start_archiver()
    wait_for(lambda: active_recording(source.archive_dir, function_channel(source.source)) is not None,
             "src recorded")
    source.publish(5)
    wait_for(source.recorded_to_the_end, "the recorder to catch up")
    source.use(False)
    wait_for(lambda: active_recording(source.archive_dir, function_channel(source.source)) is None, "the stop")
    source.use()
    wait_for(lambda: active_recording(source.archive_dir, function_channel(source.source)) is not None,
             "src recorded again")
    source.publish(5)
    wait_for(source.recorded_to_the_end, "the recorder to catch up")
    assert stop_process(archiver)[0] == 0
    assert len(source.recordings()) == 1
    assert source.recorded_table().equals(pa.Table.from_batches(source.batches, source.schema))


def test_an_archiver_down_longer_than_the_hold_records_on_from_what_the_log_still_holds_and_the_gap_shows(
        one_source):
    """Its writer waited the hold (here 0.5 s), then went on for its other reader, over more than
    two terms: the next archiver starts a new recording at the oldest frame the log still holds,
    and the archive's coverage has a gap where the rows it never saw were."""
    source = one_source
    downstream = Image(source.log, source.counters, name="downstream")
    source.use()
    first = source.start_archiver("--tether-hold", "0.5")
    wait_for(lambda: active_recording(source.archive_dir, function_channel(source.source)) is not None,
             "the first archiver to record src")
    source.publish(20)
    wait_for(source.recorded_to_the_end, "the first archiver to catch up")
    first.kill()
    first.communicate()
    source.publish(3 * TERM_LENGTH // 4_000, downstream)  # held 0.5 s, then on, over three terms
    downstream.close()
    second = source.start_archiver()
    wait_for(source.recorded_to_the_end, "the second archiver to catch up")
    code, err = stop_process(second)
    assert code == 0

    first_recording, second_recording = source.recordings()
    assert second_recording.start_position > first_recording.stop_position
    assert "were never recorded" in err and "the archive has a gap there" in err
    coverage = archive_coverage(source.archive_dir)[source.source]
    assert len(coverage) == 2 and coverage[0].until_us < coverage[1].since_us  # the gap
    described = subprocess.run([sys.executable, "-m", "ramen.cli.main", "archive", "describe", source.archive_dir],
                               capture_output=True, text=True, env=source.env, timeout=WAIT_S)
    gap_s = (coverage[1].since_us - coverage[0].until_us) / 1e6
    assert f"  gap                  {format_range(coverage[0].until_us, coverage[1].since_us)} ({gap_s:g} s of " \
           f"event time no recording holds)" in described.stdout.splitlines(), described.stdout + described.stderr
    ids = np.sort(source.recorded_table().column("bytes").to_numpy())
    assert (ids[:20 * 200] == np.arange(20 * 200)).all()  # the first recording whole
    assert ids[-1] == sum(b.num_rows for b in source.batches) - 1  # the second to the end

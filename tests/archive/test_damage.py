"""The damage matrix: an archive ramen recorded (a real follow-mode archiver, with its default CRC-32C
frame checksums), damaged in copies one way each, and for every damage: `archive verify` exits 1
naming the file and offset; `archive dump` exits 1 with one line (never 0 with a short output),
unless the damage is to the time index, which dump does not read; `archive describe` never gives a
traceback; a replay over the damaged range fails at once with one line naming the file and offset,
on both of the replayer's paths (in place, one channel; through its own reader, two channels), or,
for a damaged time index, rebuilds the index and returns the right rows; and a replay of a range
away from the damage still works."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import confserver
from ramen import keyspace, paths
from ramen.archive import checksum as checksums
from ramen.archive.catalog import STOP_POSITION_OFFSET, Catalog
from ramen.archive.coverage import function_channel
from ramen.archive.segment import SegmentReader
from ramen.archive.time_index import INDEX_VERSION, VERSION_OFFSET, TimeIndex, index_path
from ramen.program import loads
from ramen.transport import CountersFile, ExclusivePublication, LogBuffer, LogBufferParams
from tests.archive.damage import CATALOG, DAMAGES, INDEX, Damage, _set_descriptor_i64, _to_legacy_index, find_victims
from tests.archive.helpers import ramen
from tests.waiting import wait_for
from tests.workers.test_archiver_follow import (BASE_US, ROW_SPACING_US, SiteArchive, process_env, publish,
                                                record_batches, recorded_up_to, stop_process, stopped_recordings,
                                                worker_value)
from tests.workers.test_replayer import expected_rows, new_id, replay, write_key

TERM_LENGTH = 64 * 1024
SEGMENT_LENGTH = 128 * 1024  # several segment files per recording
BATCHES = (110, 20)  # messages of recordings 0 and 1: ~5 KiB each, several 1408-byte fragments
PROGRAM = '''
[program]
name = "{name}"

[[function]]
name = "src"
source = {{ kind = "generator", rate = 10, hosts = 2, seed = 1 }}
schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}
event_time = "ts"
archive = {{ retention = "1d" }}
'''
FILE_AND_OFFSET = re.compile(r"/[^ :]+(\.rec|archive\.catalog|\.tindex)\b.*\boffset \d+")
"""A line that names a file of the archive, then an offset in it."""
MEMORY_LIMIT_BYTES = 2 << 30
"""Address space given to a verify or dump of a descriptor that claims a huge stop position: a walk
whose memory followed the descriptor would die on it rather than take the machine's."""
BOUNDED_RSS_BYTES = 300 << 20


def build_site(server, ramen_dir: Path) -> SiteArchive:
    """Two recordings of `src` (two logs: one after the other) by a follow-mode archiver started with
    its defaults (so CRC-32C)."""
    site = f"damage-{uuid.uuid4().hex[:8]}"
    name = f"dm{uuid.uuid4().hex[:8]}"
    program = loads(PROGRAM.format(name=name), f"{name}.toml")
    state = SiteArchive(server, ramen_dir, site, name, program.function("src").schema)
    src = state.source
    admin = confserver.connect(server.url, identity="admin", auth_file=server.auth_file)
    chor = confserver.connect(server.url, identity="choreographer", auth_file=server.auth_file)
    counters = CountersFile.open(paths.counters_path())
    archiver = subprocess.Popen([sys.executable, "-m", "workers.archiver", "--dir", str(state.archive_dir),
                                 "--counters", str(paths.counters_path()), "--segment-length", str(SEGMENT_LENGTH),
                                 "--follow-site", site], env=state.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    log_buffer = publication = None
    try:
        admin.set(keyspace.program_key(name), program.to_dict())
        paths.output_log(site, src).parent.mkdir(parents=True, exist_ok=True)
        log_buffer = LogBuffer.create(paths.output_log(site, src),
                                      LogBufferParams(term_length=TERM_LENGTH, session_id=7, stream_id=1))
        publication = ExclusivePublication(log_buffer, counters)
        rng = np.random.default_rng(19)
        for recording, batches in enumerate(BATCHES):
            chor.set(keyspace.worker_key(site, src), worker_value(program, "src", is_used=True))
            record_batches(state, publication, counters, batches, rng)
            chor.set(keyspace.worker_key(site, src), worker_value(program, "src", is_used=False))
            wait_for(lambda: len(stopped_recordings(state.archive_dir).get(function_channel(src), [])) ==
                     recording + 1, "the recording to stop once src is unused")
            # A log created anew (another log id), so that the next recording cannot go on with this one.
            publication.close()
            log_buffer.close()
            paths.output_log(site, src).unlink()
            log_buffer = LogBuffer.create(paths.output_log(site, src),
                                          LogBufferParams(term_length=TERM_LENGTH, session_id=7, stream_id=1))
            publication = ExclusivePublication(log_buffer, counters)
        code, err = stop_process(archiver)
        assert code == 0, err
        return state
    finally:
        if archiver.poll() is None:
            stop_process(archiver)
        if publication is not None:
            publication.close()
        if log_buffer is not None:
            log_buffer.close()
        paths.output_log(site, src).unlink(missing_ok=True)
        counters.close()
        admin.close()
        chor.close()


@pytest.fixture(scope="module")
def site(builtin_server, tmp_path_factory):
    ramen_dir = tmp_path_factory.mktemp("ramen")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAMEN_DIR", str(ramen_dir))
        yield build_site(builtin_server, ramen_dir)


@pytest.fixture(scope="module")
def victims(site):
    return find_victims(site.archive_dir, function_channel(site.source))


@pytest.fixture(scope="module")
def sound_dump(site) -> str:
    result = ramen("archive", "dump", site.archive_dir, 0, "--json")
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def ramen_env(site, monkeypatch):
    monkeypatch.setenv("RAMEN_DIR", str(site.ramen_dir))
    return site


def us(row: float) -> int:
    return int(BASE_US + row * ROW_SPACING_US)


def ranges(site: SiteArchive, victims) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """Event-time ranges: all of recording 0 (over the damage); the messages of its first segment
    file (away from it); all of recording 1."""
    rows0 = sum(b.num_rows for b in site.batches[:len(site.batches) - BATCHES[1]])
    index = TimeIndex.open(index_path(site.archive_dir, victims.descriptor.recording_id))
    try:
        # The first message that starts past the first segment file, and whose rows the replay then leaves out.
        first_out = int(np.searchsorted(index.entries["position"], victims.descriptor.segment_file_length))
        away_until = int(index.entries["min_time"][first_out - 1])
    finally:
        index.close()
    return (us(0), us(rows0)), (us(0), away_until), (us(rows0), us(rows0 + 10_000))


def damaged_copy(site: SiteArchive, victims, damage: Damage, tmp_path: Path) -> Path:
    copy = tmp_path / "archive"
    shutil.copytree(site.archive_dir, copy)
    damage.apply(victims, copy)
    return copy


def one_line(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def assert_replay_fails_naming_file_and_offset(site, copy: Path, since: int, until: int, channels: int) -> str:
    """The replayer exits 1 with one line naming the file and offset, and puts that line into the
    requests of the replays it serves (`replays/<channel>`, which a client watches)."""
    replayer_id = new_id()
    chans = [(new_id(), since, until) for _ in range(channels)]
    write_key(site, replayer_id, chans, archive_dir=copy)
    with confserver.connect(site.server.url, identity="user", auth_file=site.server.auth_file) as client:
        for channel, _, _ in chans:
            client.create(keyspace.replay_key(channel), {"target": site.source}, ephemeral=True)
        result = replay(site, replayer_id, [c for c, _, _ in chans], join_position=None)  # where the log starts
        errors = [client.get(keyspace.replay_key(c)).value.get("error") for c, _, _ in chans]
        for channel, _, _ in chans:
            client.delete(keyspace.replay_key(channel))
    assert result.returncode == 1, result.stderr
    line = one_line(result)
    assert FILE_AND_OFFSET.search(line), line
    assert not result.eors  # no channel ended as if it were whole
    prefix = f"ramen: replayer {replayer_id}: "
    assert line.startswith(prefix)
    assert errors == [f"replayer {replayer_id} of {site.source}: {line[len(prefix):]}"] * channels
    return line


def assert_replay_gives_the_rows(site, copy: Path, since: int, until: int, channels: int) -> None:
    replayer_id = new_id()
    chans = [(200 + i, since, until) for i in range(channels)]
    write_key(site, replayer_id, chans, archive_dir=copy)
    result = replay(site, replayer_id, [c for c, _, _ in chans], join_position=None)  # where the log starts
    assert result.returncode == 0, result.stderr
    expected = expected_rows(site, since, until)
    for channel, _, _ in chans:
        got = pa.Table.from_batches(result.tables[channel], site.schema)
        assert got.num_rows == expected.num_rows > 0 and got.equals(expected)


@pytest.mark.parametrize("damage", DAMAGES, ids=[d.name for d in DAMAGES])
def test_damage_is_named_with_file_and_offset_by_every_reader_and_never_hangs_or_falsifies_a_replay(
        ramen_env, victims, sound_dump, damage, tmp_path):
    site = ramen_env
    whole, away, other = ranges(site, victims)
    copy = damaged_copy(site, victims, damage, tmp_path)

    verify = ramen("archive", "verify", copy)
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert "Traceback" not in verify.stderr
    problems = verify.stdout.strip().splitlines()
    assert 1 <= len(problems) <= 2 and all(FILE_AND_OFFSET.search(p) for p in problems), verify.stdout

    dump = ramen("archive", "dump", copy, 0, "--json")
    describe = ramen("archive", "describe", copy)
    assert "Traceback" not in describe.stderr
    if damage.where == INDEX:  # dump and describe do not read the time index
        assert (dump.returncode, dump.stdout) == (0, sound_dump)
        assert describe.returncode == 0
    else:
        assert dump.returncode == 1
        assert FILE_AND_OFFSET.search(one_line(dump))
        assert describe.returncode == (1 if not damage.untouched_replays else 0), describe.stderr

    for channels in (1, 2):  # in place (a ReplaySession), then through the replayer's own reader
        if damage.where == INDEX:
            assert_replay_gives_the_rows(site, copy, *whole, channels)
        else:
            assert_replay_fails_naming_file_and_offset(site, copy, *whole, channels)
    if damage.where == INDEX:  # rebuilt, and written back: the recording is stopped
        assert ramen("archive", "verify", copy).returncode == 0
    if damage.untouched_replays:
        untouched = other if damage.where == CATALOG else away
        assert_replay_gives_the_rows(site, copy, *untouched, 1)


def test_a_version_1_time_index_is_rebuilt_as_version_2_and_replays_the_right_rows(ramen_env, victims, tmp_path):
    site = ramen_env
    whole, _, _ = ranges(site, victims)
    copy = tmp_path / "archive"
    shutil.copytree(site.archive_dir, copy)
    path = index_path(copy, victims.descriptor.recording_id)
    _to_legacy_index(path)
    assert ramen("archive", "verify", copy).returncode == 0  # old but sound: its entries match the segments
    assert_replay_gives_the_rows(site, copy, *whole, 1)
    assert int.from_bytes(path.read_bytes()[VERSION_OFFSET:VERSION_OFFSET + 4], "little") == INDEX_VERSION


def run_limited(*args) -> tuple[subprocess.CompletedProcess, int]:
    """`ramen *args` in a process of its own with MEMORY_LIMIT_BYTES of address space; its peak RSS."""
    probe = ("import resource, subprocess, sys\n"
             f"resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT_BYTES}, {MEMORY_LIMIT_BYTES}))\n"
             "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "sys.stdout.write(r.stdout); sys.stderr.write(r.stderr)\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, file=sys.stderr)\n"
             "sys.exit(r.returncode)\n")
    result = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "ramen.cli.main", *map(str, args)],
                            capture_output=True, text=True, timeout=120)
    *stderr, rss = result.stderr.strip().splitlines()
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout, "\n".join(stderr)), int(rss)


def test_verify_and_dump_of_a_far_stop_position_use_bounded_memory(ramen_env, victims, tmp_path):
    """A stop position a stream could reach but the segments do not (2^46 with 64 KiB terms: 2^29
    segment files): reported as past the segments' end by verify, and where the data ends by dump,
    each in bounded memory."""
    site = ramen_env
    copy = tmp_path / "archive"
    shutil.copytree(site.archive_dir, copy)
    _set_descriptor_i64(victims, copy, STOP_POSITION_OFFSET, 1 << 46, fix_checksum=True)
    verify, rss = run_limited("archive", "verify", copy)
    assert verify.returncode == 1 and "Traceback" not in verify.stderr, verify.stderr
    [problem] = verify.stdout.strip().splitlines()
    assert "lies past the end of its segment files" in problem and FILE_AND_OFFSET.search(problem)
    assert rss < BOUNDED_RSS_BYTES
    dump, rss = run_limited("archive", "dump", copy, 0)
    assert dump.returncode == 1
    assert "the data ends here, before position 70368744177664" in one_line(dump)
    assert rss < BOUNDED_RSS_BYTES


def test_the_archiver_records_crc32c_frame_and_descriptor_checksums_by_default(site, victims):
    crc = checksums.get("crc32c")
    with Catalog.open(site.archive_dir) as catalog:
        assert [catalog.descriptor_checksum(d.recording_id) for d in catalog] == [crc, crc]
    with SegmentReader.for_recording(site.archive_dir, victims.descriptor) as reader:
        checked = [crc.compute(f.padded_payload()) == f.session_id for f in reader.frames() if f.is_data]
    assert len(checked) > 100 and all(checked)


def test_the_archiver_records_without_checksums_when_told_to(tmp_path):
    counters = CountersFile.open(tmp_path / "counters.dat")
    log_buffer = LogBuffer.create(tmp_path / "live.logbuffer", LogBufferParams(term_length=TERM_LENGTH, session_id=5))
    archiver = subprocess.Popen([sys.executable, "-m", "workers.archiver", "--dir", str(tmp_path / "archive"),
                                 "--counters", str(counters.path), "--record", str(log_buffer.path),
                                 "--checksum", "none"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    publication = ExclusivePublication(log_buffer, counters)
    try:
        wait_for(lambda: publication.is_connected, "the recorder to subscribe")
        for i in range(10):
            publish(publication, bytes([i]) * 3000)
        end = publication.position
        wait_for(lambda: recorded_up_to(counters, tmp_path / "archive", f"ramen:log?path={log_buffer.path}", end),
                 "the recorder to catch up")
    finally:
        code, err = stop_process(archiver)
        publication.close()
        log_buffer.close()
        counters.close()
    assert code == 0, err
    with Catalog.open(tmp_path / "archive") as catalog:
        [d] = catalog.descriptors()
        assert d.checksum == 0 and catalog.descriptor_checksum(d.recording_id) is None
    with SegmentReader.for_recording(tmp_path / "archive", d) as reader:
        assert {f.session_id for f in reader.frames() if f.is_data} == {5}  # the stream's, no checksum in it


def test_a_replay_asked_of_a_site_whose_catalog_is_damaged_is_one_line_naming_it(fresh_confserver, tmp_path):
    env = process_env(fresh_confserver, tmp_path / "ramen")
    program = loads(PROGRAM.format(name="net"), "net.toml")
    with confserver.connect(fresh_confserver.url, identity="admin", auth_file=fresh_confserver.auth_file) as admin:
        admin.set(keyspace.program_key("net"), program.to_dict())
    archive_dir = tmp_path / "ramen" / "sites" / keyspace.DEFAULT_SITE / "archive"
    Catalog.create(archive_dir).close()
    with open(archive_dir / "archive.catalog", "r+b") as f:
        f.write(bytes(4))  # the version field
    result = subprocess.run([sys.executable, "-m", "ramen.cli.main", "replay", "--since", "-1h", "net/src"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    line = one_line(result)
    assert line.startswith("ramen: replay: ") and f"{archive_dir / 'archive.catalog'} offset 0: not an Aeron" in line

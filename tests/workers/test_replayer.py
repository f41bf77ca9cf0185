"""The replayer as a real process over a real archive (made by a follow-mode archiver) and a real
confserver: each channel gets exactly the rows of its range, cut at the edges, then one
END_OF_REPLAY; the archive is read once for all channels; bad input is a one-line error."""

from __future__ import annotations

import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import confserver
from ramen import keyspace, message, paths
from ramen.archive.coverage import recordings_for
from ramen.archive.catalog import Catalog
from ramen.archive.segment import SegmentReader
from ramen.transport import CountersFile, FragmentAssembler, Image, LogBuffer, LogBufferError
from ramen.tuples import decode_tuples
from tests.workers.test_archiver_follow import (BASE_US, PROGRAM, ROW_SPACING_US, WAIT_S, SiteArchive, build_archive,
                                                wait_for)
from ramen.transport.defaults import IPC_MTU_LENGTH
from ramen.transport.frame import BEGIN_FLAG, HDR_TYPE_PAD
from ramen.archive.reader import RecordingReader, reassemble
from ramen.clocks import ManualClock
from ramen.transport import ExclusivePublication, LogBufferParams
from ramen.program import loads
from ramen.replay import summary
from ramen.replay.contract import ChannelRange, Rider, Summary
from tests.workers.test_served import Recipient
from workers import replayer_process
from workers.replayer import ReplayerError
from ramen.transport.counters import REPLAYER_BYTES_READ_TYPE_ID


@pytest.fixture(scope="module")
def archive(builtin_server, tmp_path_factory):
    ramen_dir = tmp_path_factory.mktemp("ramen")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAMEN_DIR", str(ramen_dir))
        yield build_archive(builtin_server, ramen_dir)


@pytest.fixture
def ramen_env(archive, monkeypatch):
    monkeypatch.setenv("RAMEN_DIR", str(archive.ramen_dir))
    return archive


@dataclass
class Replayed:
    returncode: int
    stderr: str
    tables: dict[int, list[pa.RecordBatch]] = field(default_factory=dict)
    eors: list[tuple[int, int]] = field(default_factory=list)  # (channel, source)
    after_eor: int = 0  # TUPLES of a channel after its END_OF_REPLAY
    joined_at: int | None = None


def us(row: float) -> int:
    """The event time of row number `row` (fractions fall between two rows)."""
    return int(BASE_US + row * ROW_SPACING_US)


def write_key(archive: SiteArchive, replayer_id: int, channels: list[tuple[int, ...] | ChannelRange], *,
              archive_dir: Path | None = None, source: str | None = None, readers: int = 1) -> None:
    with confserver.connect(archive.server.url, identity="supervisor", auth_file=archive.server.auth_file) as c:
        c.set(keyspace.replayer_key(archive.site, replayer_id), {
            "id": replayer_id, "source": source or archive.source,
            "log": str(paths.replayer_log(archive.site, replayer_id)),
            "archive_dir": str(archive_dir or archive.archive_dir), "readers": readers,
            "channels": [c.to_value() if isinstance(c, ChannelRange) else
                         {"channel": c[0], "since_us": c[1], "until_us": c[2], **({"tag": c[3]} if c[3:] else {})}
                         for c in channels]})


def start_replayer(archive: SiteArchive, replayer_id: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workers.replayer", "--site", archive.site, "--id", str(replayer_id)],
                            env=archive.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def open_log(path: Path, process: subprocess.Popen) -> LogBuffer | None:
    """The replayer's log once it is whole; None if the replayer exited first."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            return LogBuffer.open(path)
        except LogBufferError:
            time.sleep(0.01)
    return None


def replay(archive: SiteArchive, replayer_id: int, channels: list[int], join_position: int | None = 0) -> Replayed:
    """Run the replayer (its key written already), read its log as a worker would, until every
    channel has ended or the process has exited. `join_position` None joins where the log is, as
    a worker does; the log's first position is then in `result.joined_at`."""
    process = start_replayer(archive, replayer_id)
    result = Replayed(0, "", {ch: [] for ch in channels})
    counters = CountersFile.open(paths.counters_path())
    log_buffer = image = None
    try:
        log_buffer = open_log(paths.replayer_log(archive.site, replayer_id), process)
        if log_buffer is not None:
            image = Image(log_buffer, counters, join_position=join_position, name=f"test reader {replayer_id}")
            result.joined_at = image.position

            def on_message(buffer, offset, length, header):
                data = bytes(buffer[offset:offset + length])
                h = message.decode_header(data)
                if h.kind == message.KIND_END_OF_REPLAY:
                    result.eors.append((h.channel, h.source))
                elif h.kind == message.KIND_TUPLES:
                    if h.channel in {ch for ch, _ in result.eors}:
                        result.after_eor += 1
                    result.tables.setdefault(h.channel, []).append(decode_tuples(data, archive.schema))

            assembler = FragmentAssembler(on_message)
            deadline = time.monotonic() + WAIT_S
            while len(result.eors) < len(channels) and time.monotonic() < deadline:
                if image.poll(assembler.on_fragment, 256) == 0:
                    if process.poll() is not None and image.position >= log_buffer.producer_position():
                        break
                    time.sleep(0.001)
        _, result.stderr = process.communicate(timeout=WAIT_S)
        result.returncode = process.returncode
        return result
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if image is not None:
            image.close()
        if log_buffer is not None:
            log_buffer.close()
        paths.replayer_log(archive.site, replayer_id).unlink(missing_ok=True)
        counters.close()


def expected_rows(archive: SiteArchive, since_us: int, until_us: int) -> pa.Table:
    table = archive.table
    times = table.column("ts").cast(pa.int64())
    return table.filter(pc.and_(pc.greater_equal(times, since_us), pc.less(times, until_us)))


def new_id() -> int:
    return uuid.uuid4().int & 0x7FFFFFFF


def cuts_a_message(archive: SiteArchive, time_us: int) -> bool:
    """Whether a published batch holds rows on both sides of time_us."""
    for batch in archive.batches:
        times = batch.column("ts").cast(pa.int64())
        low, high = pc.min(times).as_py(), pc.max(times).as_py()
        if low < time_us <= high:
            return True
    return False


# Two overlapping ranges inside the archive's ~25,000 rows, every edge falling inside a batch (a
# batch holds 150..270 rows) and between two rows.
CHANNEL_A = (101, us(1_000.5), us(14_000.5))
CHANNEL_B = (102, us(9_000.5), us(20_000.5))


@pytest.fixture(scope="module")
def two_channels(archive):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAMEN_DIR", str(archive.ramen_dir))
        replayer_id = new_id()
        write_key(archive, replayer_id, [CHANNEL_A, CHANNEL_B])
        yield replayer_id, replay(archive, replayer_id, [CHANNEL_A[0], CHANNEL_B[0]])


def test_each_channel_gets_exactly_the_rows_of_its_range_cut_at_both_edges(ramen_env, two_channels):
    archive = ramen_env
    _, result = two_channels
    assert result.returncode == 0, result.stderr
    for channel, since, until in (CHANNEL_A, CHANNEL_B):
        assert cuts_a_message(archive, since) and cuts_a_message(archive, until)
        got = pa.Table.from_batches(result.tables[channel], archive.schema)
        expected = expected_rows(archive, since, until)
        assert got.num_rows == expected.num_rows > 0
        assert got.equals(expected)  # same rows, in the archive's order


def test_each_channel_ends_with_one_end_of_replay_from_the_replayer(ramen_env, two_channels):
    replayer_id, result = two_channels
    assert sorted(result.eors) == [(CHANNEL_A[0], replayer_id), (CHANNEL_B[0], replayer_id)]
    assert result.after_eor == 0


def test_the_archive_is_read_once_for_both_channels(ramen_env, two_channels):
    archive = ramen_env
    replayer_id, result = two_channels
    ranges = recordings_for(archive.archive_dir, archive.source, CHANNEL_A[1], CHANNEL_B[2])
    range_bytes = sum(r.stop_position - r.start_position for r in ranges)
    with confserver.connect(archive.server.url, identity="admin", auth_file=archive.server.auth_file) as c:
        stats = c.get(keyspace.replayer_stats_key(archive.site, replayer_id)).value
    assert stats["bytes_read"] == range_bytes
    assert stats["rows_out"] == sum(stats["channels"].values())
    for channel, since, until in (CHANNEL_A, CHANNEL_B):
        assert stats["channels"][str(channel)] == expected_rows(archive, since, until).num_rows
    counters = CountersFile.open(paths.counters_path())
    try:
        mine = [c for c in counters.counters() if c.label == f"replayer {replayer_id} bytes read"]
    finally:
        counters.close()
    assert len(mine) == 1 and mine[0].type_id == REPLAYER_BYTES_READ_TYPE_ID and mine[0].value == range_bytes


def test_the_archive_read_skips_what_no_channel_wants(ramen_env, two_channels):
    archive = ramen_env
    _, result = two_channels
    with Catalog.open(archive.archive_dir) as catalog:
        recorded = sum(d.stop_position - d.start_position for d in catalog
                       if d.stripped_channel.endswith(archive.source))
    ranges = recordings_for(archive.archive_dir, archive.source, CHANNEL_A[1], CHANNEL_B[2])
    assert sum(r.stop_position - r.start_position for r in ranges) < recorded


@pytest.mark.parametrize("mtu", ["fragmented", "unfragmented"])
def test_one_channel_is_replayed_in_place_cut_at_both_edges(request, monkeypatch, mtu):
    """One channel: the first recording's range goes from the segments straight into the log, whose
    positions line up with the recording's (it starts where the range does), the messages outside
    the range become padding and the two cut at its edges are filtered in place; the rows are those
    of the range, exactly, and each archive byte is read once."""
    archive = request.getfixturevalue("archive" if mtu == "fragmented" else "unfragmented")
    monkeypatch.setenv("RAMEN_DIR", str(archive.ramen_dir))
    channel, since, until = CHANNEL_A
    assert cuts_a_message(archive, since) and cuts_a_message(archive, until)
    replayer_id = new_id()
    write_key(archive, replayer_id, [CHANNEL_A])
    result = replay(archive, replayer_id, [channel], join_position=None)
    assert result.returncode == 0, result.stderr
    ranges = recordings_for(archive.archive_dir, archive.source, since, until)
    assert result.joined_at == ranges[0].start_position > 0  # lined up with the recording
    got = pa.Table.from_batches(result.tables[channel], archive.schema)
    expected = expected_rows(archive, since, until)
    assert got.num_rows == expected.num_rows > 0 and got.equals(expected)
    assert result.eors == [(channel, replayer_id)] and result.after_eor == 0
    assert result.stderr == ""  # no edge message outgrew its place
    with confserver.connect(archive.server.url, identity="admin", auth_file=archive.server.auth_file) as c:
        stats = c.get(keyspace.replayer_stats_key(archive.site, replayer_id)).value
    assert stats["bytes_read"] == sum(r.stop_position - r.start_position for r in ranges)
    assert stats["rows_out"] == stats["channels"][str(channel)] == expected.num_rows


def test_channels_of_one_range_share_its_messages_under_the_first_ones_tag_in_place(ramen_env, monkeypatch):
    """A dashboard's charts of several functions over one source and range: the rows go to the log
    once, tagged with the first channel (in place, as for one channel), and each channel still gets
    its own END_OF_REPLAY and its count."""
    archive = ramen_env
    monkeypatch.setenv("RAMEN_DIR", str(archive.ramen_dir))
    channel, since, until = CHANNEL_A
    follower = channel + 50
    replayer_id = new_id()
    write_key(archive, replayer_id, [CHANNEL_A, (follower, since, until, channel)])
    result = replay(archive, replayer_id, [channel, follower], join_position=None)
    assert result.returncode == 0, result.stderr
    ranges = recordings_for(archive.archive_dir, archive.source, since, until)
    assert result.joined_at == ranges[0].start_position > 0  # in place
    assert set(result.tables) == {channel, follower} and result.tables[follower] == []
    got = pa.Table.from_batches(result.tables[channel], archive.schema)
    assert got.equals(expected_rows(archive, since, until))
    assert sorted(result.eors) == [(channel, replayer_id), (follower, replayer_id)] and result.after_eor == 0
    with confserver.connect(archive.server.url, identity="admin", auth_file=archive.server.auth_file) as c:
        stats = c.get(keyspace.replayer_stats_key(archive.site, replayer_id)).value
    assert stats["channels"] == {str(channel): got.num_rows, str(follower): got.num_rows}


SERVED_SUMMARY = Summary(1, ("host",), ("bytes",))


@pytest.mark.parametrize("with_log", [False, True], ids=["alone", "beside a log channel in place"])
def test_a_summarised_replay_it_serves_gets_the_buckets_of_its_range_and_its_keys_go(ramen_env, with_log):
    """A chart of the source (ChannelRange.recipient): the replayer writes the buckets of the rows
    of its range, cut at both edges, to the client and its rider, then their ENDs, and deletes
    their replay keys; alone it writes no log, beside a channel of the log that one is in place."""
    archive = ramen_env
    (channel, since, until), rider = CHANNEL_A, CHANNEL_A[0] + 1
    counters = CountersFile.open(paths.counters_path())
    paths.recipient_logs_dir().mkdir(parents=True, exist_ok=True)
    recipients = {c: Recipient(paths.recipient_logs_dir(), c, counters) for c in (channel, rider)}
    served = ChannelRange(channel, since, until, recipient=str(recipients[channel].path),
                          also=(Rider(rider, str(recipients[rider].path)),), summary=SERVED_SUMMARY)
    logged = (channel + 2, *CHANNEL_B[1:])
    replayer_id = new_id()
    try:
        with confserver.connect(archive.server.url, identity="user", auth_file=archive.server.auth_file) as c:
            for key in (channel, rider):
                c.set(keyspace.replay_key(key), {"asked_by": "test"})
            write_key(archive, replayer_id, [served, logged] if with_log else [served], readers=int(with_log))
            result = replay(archive, replayer_id, [logged[0]] if with_log else [], join_position=None)
            assert result.returncode == 0, result.stderr
            for r in recipients.values():
                r.poll()
            assert c.get_or_none(keyspace.replay_key(channel)) is None
            assert c.get_or_none(keyspace.replay_key(rider)) is None
    finally:
        for r in recipients.values():
            r.close()
            r.path.unlink()
        counters.close()
    function = loads(PROGRAM.format(name=archive.program), f"{archive.program}.toml").function("src")
    rows = expected_rows(archive, since, until)
    wanted = summary.combine(SERVED_SUMMARY, function, [summary.aggregate(SERVED_SUMMARY, function, rows)])
    for c, r in recipients.items():
        assert r.buckets(function, SERVED_SUMMARY).equals(wanted)
        assert {(h.channel, h.source) for h in r.headers()} == {(c, replayer_id)}
        assert r.headers()[-1].kind == message.KIND_END_OF_REPLAY
    if with_log:
        ranges = recordings_for(archive.archive_dir, archive.source, since, logged[2])  # the replayer's range
        assert result.joined_at == ranges[0].start_position > 0  # in place
        assert pa.Table.from_batches(result.tables[logged[0]], archive.schema).equals(
            expected_rows(archive, *logged[1:]))
        assert result.eors == [(logged[0], replayer_id)]
    else:
        assert result.joined_at is None  # no log


def test_waiting_for_two_readers_writes_nothing_while_one_has_subscribed(tmp_path):
    """The replayer's wait for its readers, driven by a clock the test moves: with one reader of
    two it goes on waiting (and the log stays empty) until the second comes, and gives up with a
    one-line error past its timeout."""
    counters = CountersFile.open(tmp_path / "counters.dat")
    log_buffer = LogBuffer.create(tmp_path / "replay.logbuffer", LogBufferParams(term_length=64 * 1024))
    publication = ExclusivePublication(log_buffer, counters)
    first = Image(log_buffer, counters, name="first reader")
    clock = ManualClock()
    idles = []

    class SecondReaderAfterTenSeconds:
        def idle(self, work: int) -> None:
            assert publication.position == 0
            idles.append(clock.seconds())
            clock.advance(1.0)
            if len(idles) == 10:
                idles.append(Image(log_buffer, counters, name="second reader"))

    replayer_process.wait_for_reader(publication, threading.Event(), 2, clock=clock,
                                     idle=SecondReaderAfterTenSeconds())
    assert len(idles) == 11 and publication.subscriber_count == 2
    idles[-1].close()

    class Idle:
        def idle(self, work: int) -> None:
            clock.advance(1.0)
    with pytest.raises(ReplayerError, match="1 of the 2 expected readers subscribed to .* within 30 s"):
        replayer_process.wait_for_reader(publication, threading.Event(), 2, clock=clock, idle=Idle())
    first.close()
    publication.close()
    counters.close()


def test_a_replayer_read_by_two_workers_writes_nothing_until_both_subscribed(ramen_env):
    """Two children of a source read its replayer's log, each joining where the log is (as a
    worker's image does): the second, subscribing after the first, still gets the replay from its
    start (that the replayer waits for it meanwhile is the test above's)."""
    archive = ramen_env
    replayer_id, (_, since, until) = new_id(), CHANNEL_A
    write_key(archive, replayer_id, [CHANNEL_A], readers=2)
    process = start_replayer(archive, replayer_id)
    counters = CountersFile.open(paths.counters_path())
    log_buffer = open_log(paths.replayer_log(archive.site, replayer_id), process)
    images, tables, ends = [], [[], []], [0, 0]
    try:
        assert log_buffer is not None, process.communicate(timeout=WAIT_S)[1]
        initial = log_buffer.producer_position()  # a log lined up with the recording starts where the range does
        for reader in range(2):
            images.append(Image(log_buffer, counters, name=f"test reader {reader}"))
            if reader == 0:
                assert log_buffer.producer_position() == initial

        def on_message(reader):
            def handler(buffer, offset, length, header):
                data = bytes(buffer[offset:offset + length])
                h = message.decode_header(data)
                if h.kind == message.KIND_END_OF_REPLAY:
                    ends[reader] += 1
                elif h.kind == message.KIND_TUPLES:
                    tables[reader].append(decode_tuples(data, archive.schema))
            return FragmentAssembler(handler)
        assemblers = [on_message(0), on_message(1)]
        deadline = time.monotonic() + WAIT_S
        while ends != [1, 1] and time.monotonic() < deadline:
            if sum(image.poll(a.on_fragment, 256) for image, a in zip(images, assemblers)) == 0:
                time.sleep(0.001)
        assert process.wait(WAIT_S) == 0, process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for image in images:
            image.close()
        if log_buffer is not None:
            log_buffer.close()
        paths.replayer_log(archive.site, replayer_id).unlink(missing_ok=True)
        counters.close()
    expected = expected_rows(archive, since, until)
    for batches in tables:
        assert pa.Table.from_batches(batches, archive.schema).equals(expected)


def publication_counter(log_path: Path) -> bool:
    """Whether a publication of the log at log_path has its position counter in counters.dat."""
    counters = CountersFile.open(paths.counters_path())
    try:
        return any(c.type_name == "pub-pos" and c.label.endswith(log_path.name) for c in counters.counters())
    finally:
        counters.close()


def test_a_missing_key_is_a_one_line_error(ramen_env):
    result = replay(ramen_env, new_id(), [1])
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "no replayer key" in result.stderr


def test_a_range_without_recordings_is_a_one_line_error(ramen_env):
    replayer_id = new_id()
    write_key(ramen_env, replayer_id, [(5, us(-10_000), us(-5_000))])
    result = replay(ramen_env, replayer_id, [5])
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "no recording of" in result.stderr


def corrupted_copy(archive: SiteArchive, tmp_path: Path, how: str) -> Path:
    """A copy of the archive with one frame in the middle of the first recording damaged: its
    header (a corrupt segment), one payload byte (caught by the frame checksum), the BEGIN flag of
    a message's first fragment, or a later fragment made a PAD."""
    copy = tmp_path / "archive"
    shutil.copytree(archive.archive_dir, copy)
    with Catalog.open(copy) as catalog:
        descriptor = min((d for d in catalog if d.stripped_channel.endswith(archive.source)),
                         key=lambda d: d.recording_id)
    with SegmentReader.for_recording(copy, descriptor) as reader:
        frames = [(f.position, f.file_offset, f.segment_base, f.flags) for f in reader.frames() if f.is_data]
    wanted = {"begin": lambda flags: flags == BEGIN_FLAG, "pad": lambda flags: not flags & BEGIN_FLAG}.get(
        how, lambda flags: True)
    position, file_offset, base, flags = next(f for f in frames[len(frames) // 2:] if wanted(f[3]))
    segment = copy / f"{descriptor.recording_id}-{base}.rec"
    with open(segment, "r+b") as f:
        if how == "begin":
            f.seek(file_offset + 5)
            f.write(bytes([flags & ~BEGIN_FLAG]))
        elif how == "pad":
            f.seek(file_offset + 6)
            f.write(struct.pack("<H", HDR_TYPE_PAD))
        elif how == "header":
            f.seek(file_offset + 8)  # the term offset
            f.write(b"\x7f\x7f\x7f\x7f")
        else:
            f.seek(file_offset + 40)
            byte = f.read(1)
            f.seek(file_offset + 40)
            f.write(bytes([byte[0] ^ 0xFF]))
    return copy


@pytest.mark.parametrize("how, problem", [("header", "corrupt frame"),
                                          ("payload", "checksum mismatch"),
                                          ("begin", "fragment without a beginning"),
                                          ("pad", "padding inside the message begun at position")])
def test_a_damaged_segment_is_a_one_line_error_naming_file_and_offset(ramen_env, tmp_path, how, problem):
    copy = corrupted_copy(ramen_env, tmp_path, how)
    replayer_id = new_id()
    write_key(ramen_env, replayer_id, [(7, us(0), us(30_000))], archive_dir=copy)
    result = replay(ramen_env, replayer_id, [7])
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and problem in result.stderr
    assert re.search(rf"{copy}/\d+-\d+\.rec offset \d+ \(position \d+\)", result.stderr), result.stderr
    assert "Traceback" not in result.stderr


def test_sigterm_stops_a_replayer_waiting_for_its_reader_with_exit_0(ramen_env):
    replayer_id = new_id()
    write_key(ramen_env, replayer_id, [(9, us(0), us(100))])
    process = start_replayer(ramen_env, replayer_id)
    try:
        # Its publication's position counter comes after the log and before the wait for a reader.
        wait_for(lambda: publication_counter(paths.replayer_log(ramen_env.site, replayer_id)),
                 "the replayer's publication")
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=WAIT_S)
        assert process.returncode == 0, err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        paths.replayer_log(ramen_env.site, replayer_id).unlink(missing_ok=True)


def test_a_warm_replayer_without_a_key_gives_up_quietly(ramen_env):
    result = subprocess.run([sys.executable, "-m", "workers.replayer", "--site", ramen_env.site, "--id",
                             str(new_id()), "--wait-for-key", "0.5"], env=ramen_env.env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == ""


def test_a_warm_replayer_replays_once_its_key_comes(ramen_env, tmp_path):
    replayer_id = new_id()
    stderr = tmp_path / "replayer.stderr"
    with open(stderr, "w") as err:
        process = subprocess.Popen([sys.executable, "-m", "workers.replayer", "--site", ramen_env.site, "--id",
                                    str(replayer_id), "--wait-for-key", "30", "--debug"], env=ramen_env.env,
                                   stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        wait_for(lambda: "waiting up to 30 s for its key" in stderr.read_text() or process.poll() is not None,
                 "the warm replayer to wait for its key")
        assert process.poll() is None, stderr.read_text()
        write_key(ramen_env, replayer_id, [CHANNEL_A])
        log_buffer = open_log(paths.replayer_log(ramen_env.site, replayer_id), process)
        assert log_buffer is not None, stderr.read_text()
        log_buffer.close()
    finally:
        process.terminate()
        process.wait(10)



@pytest.fixture(scope="module")
def unfragmented(builtin_server, tmp_path_factory):
    """The same archive with the IPC MTU: each message one frame, read in place, not reassembled."""
    ramen_dir = tmp_path_factory.mktemp("ramen-ipc-mtu")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAMEN_DIR", str(ramen_dir))
        yield build_archive(builtin_server, ramen_dir, mtu_length=IPC_MTU_LENGTH)


@pytest.mark.parametrize("mtu", ["fragmented", "unfragmented"])
@pytest.mark.parametrize("chunk_length", [1, 4096, 100_000], ids=["smallest", "4K", "100K"])
def test_messages_come_back_whole_whatever_frames_the_chunks_cut(request, monkeypatch, mtu, chunk_length):
    """A frame cut by the end of a chunk is carried to the front of the buffer: the messages already
    returned from that buffer must not be overwritten by it."""
    site = request.getfixturevalue("archive" if mtu == "fragmented" else "unfragmented")
    monkeypatch.setenv("RAMEN_DIR", str(site.ramen_dir))
    with Catalog.open(site.archive_dir) as catalog:
        descriptors = [catalog.get(r.recording_id) for r in recordings_for(site.archive_dir, site.source, 0, 2**62)]
    got = []
    for descriptor, stop in zip(descriptors, site.stop_positions):
        reader = RecordingReader(site.archive_dir, descriptor, descriptor.start_position, stop,
                                 chunk_length=chunk_length)
        while not reader.done:
            got.extend(decode_tuples(reassemble(m), site.schema) for m in reader.read())
        reader.close()
    assert len(descriptors) == 2 and pa.Table.from_batches(got, site.schema).equals(site.table)

"""Recording a live publication and replaying it: whole, bounded, followed, back-pressured, checked."""

import random

import pytest

from ramen import message
from ramen.archive import checksum as checksums
from ramen.archive.catalog import NULL_POSITION, Catalog
from ramen.archive.recorder import Recorder, recording_position
from ramen.archive.replay import (DONE, FAILED, ReplayError, ReplaySession, ReplayStats, positions_for_times,
                                  replay_log_params)
from ramen.archive.segment import segment_file_name
from ramen.archive.time_index import TimeIndex, index_path
from ramen.transport import (ADMIN_ACTION, CountersFile, ExclusivePublication, FragmentAssembler, Image,
                             LogBuffer, LogBufferParams)
from ramen.transport import counters as ctr
from ramen.transport.defaults import DEFAULT_MTU_LENGTH, IPC_MTU_LENGTH

TERM = 64 * 1024
SEGMENT = 256 * 1024
SAFETY_CYCLES = 200_000


def ramen_message(i: int, rng: random.Random) -> bytes:
    """Message i: event times around i ms, a body of 0..3000 bytes (some fragmented)."""
    low = i * 1000 - rng.randrange(0, 3000)
    header = message.MessageHeader(message.KIND_TUPLES, min_event_time_us=low, max_event_time_us=i * 1000 + 500)
    return message.encode(header, bytes([i % 256]) * rng.choice([0, 10, 500, 1500, 3000]))


class Rig:
    """A live publication, its recorder, and helpers to pump them in one thread."""

    def __init__(self, tmp_path, *, checksum=None, index=True, term_length=TERM, mtu_length=DEFAULT_MTU_LENGTH,
                 segment_length=SEGMENT):
        self.tmp = tmp_path
        self.counters = CountersFile.open(tmp_path / "counters.dat")
        self.catalog = Catalog.create(tmp_path / "archive", checksum=checksum)
        self.log = LogBuffer.create(tmp_path / "live.logbuffer",
                                    LogBufferParams(term_length=term_length, mtu_length=mtu_length, session_id=3,
                                                    stream_id=9, initial_term_id=-7))
        self.recorder = Recorder(self.catalog, LogBuffer.open(self.log.path), self.counters,
                                 segment_length=segment_length,
                                 checksum=checksum, channel="aeron:ipc", source_identity="test",
                                 index_event_time=index)
        self.publication = ExclusivePublication(self.log, self.counters)
        self.sent: list[tuple[int, bytes]] = []  # (end position, payload)

    def publish(self, payloads):
        for payload in payloads:
            for _ in range(SAFETY_CYCLES):
                result = self.publication.offer(payload)
                if result > 0:
                    self.sent.append((result, payload))
                    break
                if result != ADMIN_ACTION:
                    self.recorder.do_work()
            else:
                pytest.fail("the publication never got past back pressure")
        while self.recorder.do_work():
            pass

    def stop(self):
        self.publication.close()
        for _ in range(SAFETY_CYCLES):
            self.recorder.do_work()
            if self.recorder.is_stopped:
                return
        pytest.fail("the recorder did not stop at the end of the stream")


def replay(rig, *, start=None, stop=None, follow=None, checksum=None, reader_counters=None, pump=None,
           buffer_length=1024 * 1024, stats=None, fragments_per_cycle=64):
    """Replay a recording into a new log and read it back; returns (session, [(position, payload)])."""
    descriptor = rig.catalog.get(rig.recorder.recording_id)
    start_position = descriptor.start_position if start is None else start
    path = rig.tmp / f"replay-{random.getrandbits(32)}.logbuffer"
    replay_log = LogBuffer.create(path, replay_log_params(descriptor, start_position, session_id=77, stream_id=5))
    publication = ExclusivePublication(replay_log, reader_counters)
    image = Image(LogBuffer.open(path), reader_counters, join_position=start_position)
    session = ReplaySession(rig.catalog.path.parent, descriptor, publication, start_position=start, stop_position=stop,
                            follow=follow, checksum=checksum, replay_buffer_length=buffer_length, stats=stats)
    got = []
    assembler = FragmentAssembler(lambda buf, off, length, hdr: got.append((hdr.position, bytes(buf[off:off + length]))))
    for _ in range(SAFETY_CYCLES):
        work = session.do_work()
        work += image.poll(assembler, fragments_per_cycle)
        if pump is not None:
            work += pump()
        if session.is_done and not image.poll(assembler, 1_000_000):
            break
    else:
        pytest.fail(f"replay did not finish (state {session.state}, position {session.position})")
    return session, got


def test_a_recorded_stream_replays_every_message_at_its_position(tmp_path):
    rng = random.Random(1)
    rig = Rig(tmp_path)
    rig.publish(ramen_message(i, rng) for i in range(1500))
    rig.stop()
    descriptor = rig.catalog.get(rig.recorder.recording_id)
    assert (descriptor.start_position, descriptor.stop_position) == (0, rig.publication.position)
    assert descriptor.stop_position > 4 * SEGMENT  # rolled over several segment files
    assert (tmp_path / "archive" / segment_file_name(descriptor.recording_id, 4 * SEGMENT)).exists()
    assert (descriptor.initial_term_id, descriptor.session_id, descriptor.stream_id) == (-7, 3, 9)
    stats = ReplayStats(*(rig.counters.allocate(ctr.SYSTEM_COUNTER_TYPE_ID, name)
                          for name in ("bytes read", "read ns", "max read ns")))
    session, got = replay(rig, stats=stats)
    assert session.state == DONE
    assert got == rig.sent
    assert stats.bytes_read.get() == descriptor.stop_position  # every byte read once


def test_a_bounded_replay_returns_exactly_the_messages_between_its_positions(tmp_path):
    rng = random.Random(2)
    rig = Rig(tmp_path)
    rig.publish(ramen_message(i, rng) for i in range(600))
    rig.stop()
    start = rig.sent[99][0]  # just after message 99
    stop = rig.sent[399][0]
    session, got = replay(rig, start=start, stop=stop)
    assert session.state == DONE
    assert got == rig.sent[100:400]


def test_a_replay_follows_an_active_recording_and_ends_when_it_stops(tmp_path):
    rng = random.Random(3)
    rig = Rig(tmp_path)
    rig.publish(ramen_message(i, rng) for i in range(100))
    follow = recording_position(rig.counters, rig.recorder.recording_id)
    assert follow() == rig.publication.position
    more = iter(range(100, 700))
    state = {"stopped": False}

    def keep_publishing():
        i = next(more, None)
        if i is not None:
            rig.publish([ramen_message(i, rng)])
            return 1
        if not state["stopped"]:
            rig.stop()
            state["stopped"] = True
        return 0

    session, got = replay(rig, follow=follow, pump=keep_publishing)
    assert session.state == DONE
    assert follow() == NULL_POSITION
    assert got == rig.sent and len(got) == 700


def test_back_pressure_during_a_replay_loses_and_duplicates_nothing(tmp_path):
    rng = random.Random(4)
    rig = Rig(tmp_path)
    rig.publish(ramen_message(i, rng) for i in range(1200))
    rig.stop()
    # The replay log has flow control and a reader that takes 4 fragments a cycle: the replay
    # is held back half a term ahead of it.
    session, got = replay(rig, reader_counters=rig.counters, buffer_length=64 * 1024, fragments_per_cycle=4)
    assert session.state == DONE
    assert got == rig.sent
    back_pressure = [c for c in rig.counters.counters() if c.type_name == "back-pressure" and "replay-" in c.label]
    assert back_pressure and back_pressure[0].value > 0


def test_a_replay_held_back_by_a_slow_reader_still_reads_back_exactly_the_recording(tmp_path):
    rng = random.Random(42)
    rig = Rig(tmp_path)
    rig.publish(ramen_message(i, rng) for i in range(600))
    rig.stop()
    session, got = replay(rig, reader_counters=rig.counters,
                          buffer_length=16 * 1024, fragments_per_cycle=8)
    assert session.state == DONE
    assert got == rig.sent


def test_a_checksum_mismatch_fails_the_replay_naming_recording_and_position(tmp_path):
    crc = checksums.get("crc32")
    rng = random.Random(5)
    rig = Rig(tmp_path, checksum=crc)
    rig.publish(ramen_message(i, rng) for i in range(300))
    rig.stop()
    session, got = replay(rig, checksum=crc)
    assert session.state == DONE and got == rig.sent  # sound data verifies
    victim = next(i for i in range(150, 300) if 40 < len(rig.sent[i][1]) <= 1376)  # one frame
    victim_end, payload = rig.sent[victim]
    victim_position = victim_end - ((len(payload) + 32 + 31) & ~31)
    base = victim_position - victim_position % SEGMENT
    segment = tmp_path / "archive" / segment_file_name(rig.recorder.recording_id, base)
    data = bytearray(segment.read_bytes())
    data[victim_position - base + 40] ^= 0xFF
    segment.write_bytes(data)
    session, got = replay(rig, checksum=crc)
    assert session.state == FAILED
    assert session.error.startswith(f"recording {rig.recorder.recording_id}: checksum mismatch at {segment} offset "
                                    f"{victim_position - base} (position {victim_position})"), session.error
    assert got == rig.sent[:len(got)] and len(got) <= victim


def test_seeking_by_event_time_starts_the_replay_at_the_first_message_that_can_hold_it(tmp_path):
    rng = random.Random(6)
    rig = Rig(tmp_path)
    messages = [ramen_message(i, rng) for i in range(800)]
    rig.publish(messages)
    rig.stop()
    index = TimeIndex.open(index_path(tmp_path / "archive", rig.recorder.recording_id))
    assert len(index) == 800
    since, until = 300_000, 500_000
    start, stop = positions_for_times(tmp_path / "archive", rig.catalog.get(rig.recorder.recording_id), since, until)
    assert (start, stop) == (index.seek(since), index.stop(until))
    session, got = replay(rig, start=start, stop=stop)
    wanted = [(p, m) for p, m in rig.sent
              if message.event_time_bounds(m)[1] >= since and message.event_time_bounds(m)[0] < until]
    assert set(wanted) <= set(got)
    # Nothing before the seek point could hold a time >= since.
    first = rig.sent.index(got[0])
    assert all(message.event_time_bounds(m)[1] < since for _, m in rig.sent[:first])


@pytest.mark.parametrize("start, problem", [(33, "is not aligned"), (10**9, "is outside the recording")])
def test_a_bad_start_position_is_refused_with_a_clear_error(tmp_path, start, problem):
    rig = Rig(tmp_path)
    rig.publish([b"x" * 100] * 10)
    rig.stop()
    descriptor = rig.catalog.get(rig.recorder.recording_id)
    log = LogBuffer.create(tmp_path / "r.logbuffer", replay_log_params(descriptor, 0, session_id=1, stream_id=1))
    with pytest.raises(ReplayError, match=f"recording {descriptor.recording_id}: start position {start} {problem}"):
        ReplaySession(tmp_path / "archive", descriptor, ExclusivePublication(log), start_position=start)


def test_a_payload_that_looks_like_a_frame_header_does_not_fool_the_replay(tmp_path, monkeypatch):
    """The replay's vectorised frame scan must fall back to walking when a payload mimics a header."""
    calls = spy_on_frame_finders(monkeypatch)
    rig = Rig(tmp_path)
    rig.publish([b"a" * 100] * 3)
    frame_offset = rig.publication.position & (TERM - 1)
    forged = bytearray(b"b" * 600)
    fake_slot = frame_offset + 64  # a 32-byte slot inside the next frame's payload
    forged[32:36] = (64).to_bytes(4, "little")  # a plausible length
    forged[40:44] = fake_slot.to_bytes(4, "little")  # and the slot's own term offset
    rig.publish([bytes(forged)] + [b"c" * 50] * 3)
    rig.stop()
    session, got = replay(rig)
    assert session.state == DONE
    assert got == rig.sent
    assert calls["walk"], "the forged header should have sent the scan to the walk"


def test_purging_before_a_time_uses_the_event_time_index_and_keeps_everything_after(tmp_path):
    import subprocess
    import sys

    rng = random.Random(7)
    rig = Rig(tmp_path)
    rig.publish(ramen_message(i, rng) for i in range(1500))  # message i is around i ms of event time
    rig.stop()
    rig.catalog.close()
    archive = str(tmp_path / "archive")
    result = subprocess.run([sys.executable, "-m", "ramen.cli.main", "archive", "purge", archive, "0",
                             "--before", "1970-01-01T00:00:01Z"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    catalog = Catalog.open(tmp_path / "archive")
    descriptor = catalog.get(0)
    assert descriptor.start_position > 0 and descriptor.start_position % SEGMENT == 0
    # Everything from the first message that can hold 1 s of event time onwards is still there.
    first_needed = next(i for i, (_, m) in enumerate(rig.sent) if message.event_time_bounds(m)[1] >= 1_000_000)
    assert rig.sent[first_needed][0] > descriptor.start_position
    index = TimeIndex.open(index_path(tmp_path / "archive", 0))
    assert int(index.entries["position"][0]) >= descriptor.start_position
    rig.catalog = catalog
    session, got = replay(rig)
    kept = [(p, m) for p, m in rig.sent if p > descriptor.start_position]  # no message spans a segment
    assert session.state == DONE
    assert got == kept


# -- the frame walk and the vectorised scan ------------------------------------------------------

def spy_on_frame_finders(monkeypatch) -> dict:
    """Count the replay session's calls of the frame walker's two ways (frame_walk._walk_each,
    frame_walk._scan), and keep what the walk one frame at a time was given and gave. The session's
    calls are those with its first frame's length (others, the recorder's, come without)."""
    from ramen.transport import frame_walk
    calls = {"walk": 0, "scan": 0, "walks": []}
    original_walk, original_scan = frame_walk._walk_each, frame_walk._scan

    def walk_each(buffer, start, length, term_offset, term_id, first_length, max_frames):
        found = original_walk(buffer, start, length, term_offset, term_id, first_length, max_frames)
        if first_length is not None:
            calls["walk"] += 1
            calls["walks"].append((max_frames, found))
        return found

    def scan(buffer, start, length, term_offset, term_id, first_length):
        calls["scan"] += first_length is not None
        return original_scan(buffer, start, length, term_offset, term_id, first_length)
    monkeypatch.setattr(frame_walk, "_walk_each", walk_each)
    monkeypatch.setattr(frame_walk, "_scan", scan)
    return calls


MESSAGE_SIZES = {"small": 100, "large": 8000}  # large: 6 fragments of the default 1408-byte MTU


@pytest.fixture(params=["walk", "scan"])
def frame_path(request, monkeypatch):
    """Force every block through one of the replay's two frame finders, and count their calls."""
    from ramen.transport import frame_walk
    budget = 10**9 if request.param == "walk" else 0
    monkeypatch.setattr(frame_walk, "walk_budget", lambda length: budget)
    return request.param, spy_on_frame_finders(monkeypatch)


def sized_messages(size: int, count: int) -> list[bytes]:
    return [bytes([i % 251]) * (size - i % 7) for i in range(count)]


def ids_seen(rig, **kwargs):
    """Replay and read back, recording every fragment's (session id, stream id)."""
    descriptor = rig.catalog.get(rig.recorder.recording_id)
    path = rig.tmp / f"replay-{random.getrandbits(32)}.logbuffer"
    log = LogBuffer.create(path, replay_log_params(descriptor, descriptor.start_position, session_id=77, stream_id=5))
    session = ReplaySession(rig.catalog.path.parent, descriptor, ExclusivePublication(log), **kwargs)
    image = Image(LogBuffer.open(path), join_position=descriptor.start_position)
    ids = set()
    for _ in range(SAFETY_CYCLES):
        session.do_work()
        image.poll(lambda buf, off, length, hdr: ids.add((hdr.session_id, hdr.stream_id)), 1000)
        if session.is_done and not image.poll(lambda *a: None, 1):
            break
    return session, ids


@pytest.mark.parametrize("size", MESSAGE_SIZES.values(), ids=MESSAGE_SIZES.keys())
def test_frames_chain_into_whole_messages_and_take_the_replay_ids_on_either_path(tmp_path, frame_path, size):
    path, calls = frame_path
    rig = Rig(tmp_path)
    rig.publish(sized_messages(size, 400))
    rig.stop()
    session, got = replay(rig)
    assert session.state == DONE and got == rig.sent
    assert calls[path] and not calls["scan" if path == "walk" else "walk"]
    session, ids = ids_seen(rig)
    assert session.state == DONE and ids == {(77, 5)}


@pytest.mark.parametrize("size", MESSAGE_SIZES.values(), ids=MESSAGE_SIZES.keys())
def test_a_frame_torn_by_the_end_of_a_read_is_carried_to_the_next_on_either_path(tmp_path, frame_path, size):
    path, calls = frame_path
    rig = Rig(tmp_path)
    rig.publish(sized_messages(size, 300))
    rig.stop()
    descriptor = rig.catalog.get(rig.recorder.recording_id)
    stats = ReplayStats(*(rig.counters.allocate(ctr.SYSTEM_COUNTER_TYPE_ID, name)
                          for name in ("bytes read", "read ns", "max read ns")))
    # 3000 bytes a read cuts frames of either size at most reads.
    session, got = replay(rig, buffer_length=3000, stats=stats)
    assert session.state == DONE and got == rig.sent
    # Complete frames past the last whole message are kept; a torn frame's head is read again.
    assert stats.bytes_read.get() > descriptor.stop_position, "no read tore a frame"
    assert calls[path]


@pytest.mark.parametrize("size", MESSAGE_SIZES.values(), ids=MESSAGE_SIZES.keys())
def test_a_checksum_mismatch_is_caught_on_either_path(tmp_path, frame_path, size):
    path, calls = frame_path
    crc = checksums.get("crc32c")
    rig = Rig(tmp_path, checksum=crc)
    rig.publish(sized_messages(size, 200))
    rig.stop()
    session, got = replay(rig, checksum=crc)
    assert session.state == DONE and got == rig.sent
    victim_position = rig.sent[149][0]  # message 150's first frame
    base = victim_position - victim_position % SEGMENT
    segment = tmp_path / "archive" / segment_file_name(rig.recorder.recording_id, base)
    data = bytearray(segment.read_bytes())
    data[victim_position - base + 40] ^= 0xFF  # in the payload of the frame at victim_position
    segment.write_bytes(data)
    session, got = replay(rig, checksum=crc)
    assert session.state == FAILED
    assert f"checksum mismatch at {segment} offset {victim_position - base} (position {victim_position})" \
        in session.error
    assert got == rig.sent[:len(got)] and len(got) <= 150
    assert calls[path]


def test_the_walk_hands_a_block_of_many_frames_to_the_scan_after_a_bounded_number_of_steps(tmp_path, monkeypatch):
    from ramen.transport import frame_walk
    calls = spy_on_frame_finders(monkeypatch)
    rig = Rig(tmp_path)
    # A first frame as long as the MTU makes the block look walkable; the many small ones after it are not.
    rig.publish([b"x" * 1300] + [b"y" * 10] * 400)
    rig.stop()
    session, got = replay(rig, buffer_length=16 * 1024)  # fewer frames of 1344 bytes than the walk's budget
    assert session.state == DONE and got == rig.sent
    bounded = [found for max_frames, found in calls["walks"] if max_frames is not None]
    assert None in bounded  # the walk gave up after its budget of frames ...
    budget = frame_walk.walk_budget(16 * 1024)
    assert all(found is None or len(found) <= budget for found in bounded)


def test_blocks_of_few_frames_are_walked_and_blocks_of_many_are_scanned(tmp_path, monkeypatch):
    calls = spy_on_frame_finders(monkeypatch)
    rig = Rig(tmp_path)
    rig.publish([b"z" * 1300] * 40)  # 40 frames of 1344 bytes: one term
    rig.stop()
    session, got = replay(rig, buffer_length=8 * 1024)  # 5 frames a read
    assert session.state == DONE and got == rig.sent
    assert calls["scan"] == 0 and calls["walk"] > 0
    calls.update(walk=0, scan=0)
    session, got = replay(rig)  # all 40 frames in one read
    assert session.state == DONE and got == rig.sent
    assert calls["scan"] > 0 and calls["walk"] == 0
    # Frames of ramen's 64 KiB MTU: a 1 MiB read holds about 32 of them, fewer steps than the scan costs.
    calls.update(walk=0, scan=0)
    (tmp_path / "ipc").mkdir()
    rig = Rig(tmp_path / "ipc", term_length=4 * 1024 * 1024, mtu_length=IPC_MTU_LENGTH, segment_length=8 * 1024 * 1024)
    rig.publish([bytes([i]) * 65536 for i in range(48)])
    rig.stop()
    session, got = replay(rig, fragments_per_cycle=1000)
    assert session.state == DONE and got == rig.sent
    assert calls["walk"] > 0 and calls["scan"] == 0

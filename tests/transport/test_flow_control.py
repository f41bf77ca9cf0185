"""Flow control between processes: back pressure, the slowest subscriber, cleaning, dead subscribers,
dead writers, and subscriptions whose images come and go.

Readers and writers run in separate processes (spawned) wherever the behaviour spans processes.
Every message carries its sequence number and a content derived from it, so a reader can tell a
lost, duplicated, torn or overwritten message from a good one.
"""

import multiprocessing
import os
import queue
import signal
import struct
import time
import traceback

import pytest

from ramen.clocks import ManualClock, SystemClock
from ramen.transport import (ABORT, ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED, BackoffIdleStrategy, BufferClaim,
                             CountersFile, ExclusivePublication, Image, LogBuffer, LogBufferParams, Subscription)
from ramen.transport import counters as ctr
from ramen.transport.logbuffer import pack_tail
from ramen.transport.writer_lock import seal_dead_writer_claims
from ramen.transport.writer_lock import LogBufferBusy, acquire_writer_lock, writer_pids
from ramen.transport.status import STATUS_NAMES

SPAWN = multiprocessing.get_context("spawn")
TIMEOUT_S = 30
"""Safety bound for every wait: a test that needs it has failed."""
TERM = 64 * 1024
WINDOW = TERM // 2
PATTERN = bytes(range(1, 256)) * 4  # no zero byte: written space never reads as cleaned space


def align32(value: int) -> int:
    return (value + 31) // 32 * 32


def message(seq: int) -> bytes:
    length = (seq * 37) % 500
    return seq.to_bytes(8, "little") + PATTERN[seq % 251:seq % 251 + length]


def frame_size(seq: int) -> int:
    return align32(len(message(seq)) + 32)


class Deadline:
    def __init__(self, what: str, seconds: float = TIMEOUT_S) -> None:
        self.what = what
        self.end = time.monotonic() + seconds

    def check(self) -> None:
        assert time.monotonic() < self.end, f"gave up after {TIMEOUT_S} s waiting for {self.what}"


def wait_connected(publication: ExclusivePublication) -> None:
    """Until the publication has seen a subscriber (it looks for them every few milliseconds)."""
    deadline = Deadline("the publication to see the subscriber")
    while not publication.is_connected:
        time.sleep(0.001)
        deadline.check()


class Checker:
    """A fragment handler that checks messages arrive in sequence, whole: nothing lost or duplicated."""

    def __init__(self, first: int = 0) -> None:
        self.next = first
        self.errors: list[str] = []

    def __call__(self, buf, offset, length, header) -> None:
        data = bytes(buf[offset:offset + length])
        seq = int.from_bytes(data[:8], "little")
        if (seq != self.next or data != message(seq)) and len(self.errors) < 5:
            self.errors.append(f"at position {header.position}: expected #{self.next}, got #{seq} "
                               f"({length} bytes, {'intact' if data == message(seq) else 'damaged'})")
        self.next = seq + 1


class Writer:
    """Offers message(0), message(1), ... and counts the outcomes."""

    def __init__(self, publication: ExclusivePublication, first: int = 0) -> None:
        self.publication = publication
        self.seq = first
        self.back_pressured = 0

    def offer_next(self) -> int:
        """Offer the next message (retrying a rotation); its end position, or BACK_PRESSURED."""
        result = self.publication.offer(message(self.seq))
        if result == ADMIN_ACTION:
            result = self.publication.offer(message(self.seq))
        if result > 0:
            self.seq += 1
        elif result == BACK_PRESSURED:
            self.back_pressured += 1
        else:
            raise AssertionError(f"offer of #{self.seq} returned {STATUS_NAMES.get(result, result)}")
        return result

    def offer_until_back_pressured(self, on_idle=lambda: None) -> None:
        deadline = Deadline("back pressure")
        while self.offer_next() != BACK_PRESSURED:
            on_idle()
            deadline.check()


def make_log(tmp_path, name: str = "flow", session_id: int = 1) -> tuple[LogBuffer, CountersFile]:
    log = LogBuffer.create(tmp_path / f"{name}.logbuffer",
                           LogBufferParams(term_length=TERM, session_id=session_id, stream_id=2))
    return log, CountersFile.open(tmp_path / "cnc.dat")


def counter_value(counters: CountersFile, type_id: int, log: LogBuffer) -> int:
    """The value of the one counter of a type that belongs to a log, read from the counters file."""
    counter_id, = counters.find(type_id, log.correlation_id)
    return counters.get(counter_id)


# -- child processes -----------------------------------------------------------------------------
# Each runs in a spawned process: `events` carries ("ready", ...) style news to the test and a
# final ("done", result) or ("error", traceback); `stop` asks it to finish.

def _run(target, events, stop, *args) -> None:
    try:
        events.put(("done", target(events, stop, *args)))
    except BaseException:
        events.put(("error", traceback.format_exc()))


def _open(log_path, counters_path) -> tuple[LogBuffer, CountersFile]:
    return LogBuffer.open(log_path), CountersFile.open(counters_path, create=False)


def _slow_reader(events, stop, log_path, counters_path, count):
    """Reads `count` messages, a few a millisecond: far slower than the writer."""
    log, counters = _open(log_path, counters_path)
    image = Image(log, counters, join_position=0, name="slow-reader")
    events.put(("ready", image.position))
    check = Checker()
    deadline = Deadline("the slow reader")
    while check.next < count:
        image.poll(check, 8)
        time.sleep(0.001)
        deadline.check()
    image.close()
    return check.next, check.errors


def _read_to_then_hold(events, stop, log_path, counters_path, target):
    """Reads up to `target`, reports where it stopped, then stays alive there without reading."""
    log, counters = _open(log_path, counters_path)
    image = Image(log, counters, join_position=0, name="holder")
    events.put(("ready", image.position))
    check = Checker()
    idle = BackoffIdleStrategy()
    deadline = Deadline("the holder to reach its target")
    while image.position < target:
        idle.idle(image.poll(check, 1))
        deadline.check()
    events.put(("holding", image.position))
    while not stop.wait(0.005):
        image.controlled_poll(lambda *fragment: ABORT, 1)  # consumes nothing, but is a heartbeat
    return check.next, check.errors


def _join_then_wait(events, stop, log_path, counters_path, tethered=False):
    log, counters = _open(log_path, counters_path)
    image = Image(log, counters, join_position=0, name="doomed", tethered=tethered, tether_hold_s=0.5)
    events.put(("ready", image.position))
    stop.wait(TIMEOUT_S)


def _publish(events, stop, log_path, counters_path, count):
    """Waits for a subscriber, writes `count` messages, and closes the stream."""
    log, counters = _open(log_path, counters_path)
    publication = ExclusivePublication(log, counters)
    idle = BackoffIdleStrategy()
    deadline = Deadline("a subscriber")
    while not publication.is_connected:
        idle.idle(0)
        deadline.check()
    writer = Writer(publication)
    while writer.seq < count:
        idle.idle(writer.offer_next() > 0)
        deadline.check()
    publication.close()
    return writer.seq


CLAIM_LENGTH = 100


def _write_then_die_mid_message(events, stop, log_path, counters_path, count):
    """Commits `count` messages, claims space for one more, and dies by SIGKILL before committing it."""
    log, counters = _open(log_path, counters_path)
    publication = ExclusivePublication(log, counters)
    idle = BackoffIdleStrategy()
    deadline = Deadline("the reader")
    while not publication.is_connected:
        idle.idle(0)
        deadline.check()
    writer = Writer(publication)
    while writer.seq < count:
        idle.idle(writer.offer_next() > 0)
        deadline.check()
    claim = BufferClaim()
    while publication.try_claim(CLAIM_LENGTH, claim) < 0:
        idle.idle(0)
        deadline.check()
    claim.buffer[:8] = count.to_bytes(8, "little")  # half a message
    os.kill(os.getpid(), signal.SIGKILL)


class Child:
    """A spawned process running one of the functions above, and the test's end of its queue."""

    def __init__(self, target, *args) -> None:
        self.events = SPAWN.Queue()
        self.stop = SPAWN.Event()
        self.process = SPAWN.Process(target=_run, args=(target, self.events, self.stop, *args), daemon=True)
        self.process.start()

    def expect(self, kind: str):
        """Wait for the child's next event, which must be `kind`; fail early if it dies silently."""
        deadline = Deadline(f"{kind!r} from the child")
        while True:
            try:
                got, value = self.events.get(timeout=0.05)
                break
            except queue.Empty:
                assert self.process.is_alive() or not self.events.empty(), \
                    f"child process exited with {self.process.exitcode} before sending {kind!r}"
                deadline.check()
        assert got != "error", f"child process failed:\n{value}"
        assert got == kind, f"expected {kind!r} from the child, got {got!r}: {value!r}"
        return value

    def news(self, kind: str):
        """The child's next event if it has one now, else None."""
        try:
            got, value = self.events.get_nowait()
        except queue.Empty:
            return None
        assert got != "error", f"child process failed:\n{value}"
        assert got == kind, f"expected {kind!r} from the child, got {got!r}: {value!r}"
        return value

    def finish(self):
        self.stop.set()
        result = self.expect("done")
        self.process.join(TIMEOUT_S)
        assert self.process.exitcode == 0
        return result

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(TIMEOUT_S)
        assert self.process.exitcode == -signal.SIGKILL


@pytest.fixture
def spawn():
    children = []

    def start(target, *args) -> Child:
        child = Child(target, *args)
        children.append(child)
        return child

    yield start
    for child in children:
        if child.process.is_alive():
            child.process.kill()
        child.process.join(TIMEOUT_S)


# -- back pressure -------------------------------------------------------------------------------

def test_slow_subscriber_in_another_process_back_pressures_the_writer_and_loses_nothing(tmp_path, spawn):
    log, counters = make_log(tmp_path)
    count = 5000
    reader = spawn(_slow_reader, log.path, counters.path, count)
    reader.expect("ready")
    publication = ExclusivePublication(log, counters)
    sub_pos_id, = counters.find(ctr.SUBSCRIBER_POSITION_TYPE_ID, log.correlation_id)
    writer = Writer(publication)
    idle = BackoffIdleStrategy()
    deadline = Deadline("the writer")

    while writer.seq < count:
        seq = writer.seq
        result = writer.offer_next()
        if result > 0:
            # The message started less than half a term ahead of the reader: never on unread data.
            assert result - frame_size(seq) - counters.get(sub_pos_id) < WINDOW
        idle.idle(result > 0)
        deadline.check()

    received, errors = reader.finish()
    assert errors == []
    assert received == count
    assert writer.back_pressured > 0
    assert counter_value(counters, ctr.BACK_PRESSURE_EVENTS_TYPE_ID, log) == writer.back_pressured
    assert publication.position > 3 * 3 * TERM  # the ring was reused several times over


def test_limit_is_half_a_term_past_the_slowest_of_several_subscribers(tmp_path, spawn):
    log, counters = make_log(tmp_path)
    holder = spawn(_read_to_then_hold, log.path, counters.path, TERM // 4)
    holder.expect("ready")
    local = Image(log, counters, join_position=0, name="local")
    publication = ExclusivePublication(log, counters)
    writer = Writer(publication)
    local_check = Checker()

    writer.offer_until_back_pressured()
    held_at = holder.expect("holding")
    assert writer.offer_next() == BACK_PRESSURED
    assert publication.position_limit == min(local.position, held_at) + WINDOW == WINDOW

    while local.poll(local_check, 256):
        pass
    writer.offer_until_back_pressured()

    assert local.position > held_at
    assert publication.position_limit == held_at + WINDOW
    assert counter_value(counters, ctr.PUBLISHER_LIMIT_TYPE_ID, log) == held_at + WINDOW
    assert sorted(counters.get(i) for i in counters.find(ctr.SUBSCRIBER_POSITION_TYPE_ID, log.correlation_id)) == \
        [held_at, local.position]
    assert publication.position >= held_at + WINDOW
    _, errors = holder.finish()
    assert errors == [] and local_check.errors == []


def ring_slices(data: bytes, start: int, end: int) -> list[bytes]:
    """The bytes of the three terms that hold stream positions start..end, in order."""
    out = []
    while start < end:
        partition, offset = (start // TERM) % 3, start % TERM
        length = min(end - start, TERM - offset)
        out.append(data[partition * TERM + offset:partition * TERM + offset + length])
        start += length
    return out


def _messages_in(frames: bytes) -> list[bytes]:
    """The payloads of the DATA frames in a run of whole frames."""
    out, offset = [], 0
    while offset < len(frames):
        length, = struct.unpack_from("<i", frames, offset)
        frame_type, = struct.unpack_from("<H", frames, offset + 6)
        if frame_type == 1:
            out.append(frames[offset + 32:offset + length])
        offset += align32(length)
    return out


def test_space_two_terms_behind_the_slowest_subscriber_is_zeroed_before_the_writer_reuses_it(tmp_path, spawn):
    log, counters = make_log(tmp_path)
    holder = spawn(_read_to_then_hold, log.path, counters.path, 3 * TERM + TERM // 4)
    holder.expect("ready")
    publication = ExclusivePublication(log, counters)
    writer = Writer(publication)
    idle = BackoffIdleStrategy()
    deadline = Deadline("the holder to stop")
    held_at = None
    while True:
        result = writer.offer_next()
        if held_at is None:
            held_at = holder.news("holding")
        elif result == BACK_PRESSURED:
            break  # the writer has seen the holder's final position, and cleaned up to it
        idle.idle(result > 0)
        deadline.check()
    received, errors = holder.finish()
    end = publication.position
    data = log.path.read_bytes()

    # More than two terms behind the subscriber, as far back as the writer will come round to: all zero.
    assert end - 3 * TERM > 0
    assert all(chunk == bytes(len(chunk)) for chunk in ring_slices(data, end - 3 * TERM, held_at - 2 * TERM))
    # The last whole term it read, as written (what a restarted writer or recorder finds there).
    last_term = (held_at - 2 * TERM + TERM - 1) // TERM * TERM
    assert last_term + TERM <= held_at
    read = _messages_in(b"".join(ring_slices(data, last_term, held_at)))
    assert read and read == [message(seq) for seq in range(received - len(read), received)]
    # Ahead of it, up to the writer: every unread message, intact.
    unread = _messages_in(b"".join(ring_slices(data, held_at, end)))
    assert unread == [message(seq) for seq in range(received, writer.seq)]
    assert errors == []


def test_offer_without_a_subscriber_is_not_connected_until_one_joins(tmp_path):
    log, counters = make_log(tmp_path)
    publication = ExclusivePublication(log, counters)

    assert publication.offer(b"nobody") == NOT_CONNECTED
    assert not publication.is_connected and publication.position == 0

    image = Image(log, counters)
    wait_connected(publication)
    assert publication.offer(b"somebody") == 64
    received = []
    image.poll(lambda buf, offset, length, header: received.append(bytes(buf[offset:offset + length])), 10)
    assert received == [b"somebody"]


def test_closed_subscriber_no_longer_holds_the_writer(tmp_path):
    log, counters = make_log(tmp_path)
    reader = Image(log, counters, join_position=0, name="reader")
    leaver = Image(log, counters, join_position=0, name="leaver")
    writer = Writer(ExclusivePublication(log, counters))
    check = Checker()
    writer.offer_until_back_pressured(on_idle=lambda: reader.poll(check, 64))
    assert writer.publication.position_limit == WINDOW  # held by the leaver, which read nothing

    leaver.close()
    writer.offer_until_back_pressured()

    assert writer.publication.position_limit == reader.position + WINDOW > WINDOW
    while reader.poll(check, 256):
        pass
    assert check.errors == [] and check.next == writer.seq


def test_a_term_window_ends_a_quarter_term_past_the_limit(tmp_path):
    """A replay writes a window in place and commits all of it: the window must not take the writer
    a term ahead of the slowest reader, or the cleaning behind that reader, two terms back, zeroes
    what was just written when the reader gets there (a replay held back by a slow reader stalled)."""
    log, counters = make_log(tmp_path)
    reader = Image(log, counters, name="slow reader")
    publication = ExclusivePublication(log, counters)
    wait_connected(publication)
    assert publication.position_limit == TERM // 2
    length, window = publication.term_window(TERM)
    assert length == len(window) == TERM // 2 + TERM // 4  # from position 0: the limit and a quarter term
    window.release()
    reader.close()
    publication.close()


def test_no_message_is_written_after_the_last_subscriber_left(tmp_path):
    """A reader joining later starts where the writer is: whatever went in while nobody read is lost
    to it, so the writer must see the leaving on its very next offer, within its window or not."""
    log, counters = make_log(tmp_path)
    clock = RunAheadClock()
    publication = ExclusivePublication(log, counters, clock=clock)
    leaver = Image(log, counters, name="leaver")
    wait_connected(publication)
    assert publication.offer(b"read") > 0
    leaver.close()
    clock.advance(0.01)  # past the limit's refresh interval, far inside the window

    assert publication.offer(b"nobody reads this") == NOT_CONNECTED
    joiner = Image(log, counters, name="joiner")
    assert joiner.position == publication.position


def test_a_left_subscribers_counter_reused_by_another_counter_of_the_same_log_is_no_subscriber(tmp_path,
                                                                                               monkeypatch):
    """The next reader's other counters (same log, so same registration id) may take the slot the
    last reader's position freed: the writer must not take one of them for a reader at position 0."""
    monkeypatch.setattr(ctr, "COUNTER_FREE_TO_REUSE_DELAY_S", 0.0)
    log, counters = make_log(tmp_path)
    clock = RunAheadClock()
    publication = ExclusivePublication(log, counters, clock=clock)
    leaver = Image(log, counters, name="leaver")
    wait_connected(publication)
    position_slot = leaver._sub_pos.id
    leaver.close()
    reused = counters.allocate(ctr.UNBLOCKED_FRAMES_TYPE_ID, "unblocked: next reader",
                               registration_id=log.correlation_id)
    assert reused.id == position_slot  # the case under test: the very slot, another type
    clock.advance(0.01)  # past the limit's refresh interval

    assert publication.offer(b"nobody reads this") == NOT_CONNECTED


# -- dead and idle subscribers -------------------------------------------------------------------

@pytest.mark.parametrize("tethered", [False, True], ids=["untethered", "tethered"])
def test_dead_subscriber_is_dropped_after_the_liveness_timeout_and_the_writer_proceeds(tmp_path, spawn, tethered):
    """Even a tethered subscriber (a recorder) is dropped, once silent for its hold (here 0.5 s)."""
    log, counters = make_log(tmp_path)
    doomed = spawn(_join_then_wait, log.path, counters.path, tethered)
    doomed.expect("ready")
    doomed.kill()
    live = Image(log, counters, join_position=0, name="live")
    publication = ExclusivePublication(log, counters, subscriber_liveness_timeout_s=0.5)
    writer = Writer(publication)
    check = Checker()
    idle = BackoffIdleStrategy()
    deadline = Deadline("the dead subscriber to be dropped")

    while publication.position < 2 * TERM:  # far past where the dead subscriber held the writer
        result = writer.offer_next()
        idle.idle((result > 0) + live.poll(check, 64))
        deadline.check()

    assert writer.back_pressured > 0  # held by the dead subscriber until it was dropped
    assert counter_value(counters, ctr.SUBSCRIBERS_DROPPED_TYPE_ID, log) == 1
    statuses = {counters.get(i, ctr.OWNER_ID_OFFSET): counters.get(i, ctr.STATUS_OFFSET)
                for i in counters.find(ctr.SUBSCRIBER_POSITION_TYPE_ID, log.correlation_id)}
    assert statuses == {doomed.process.pid: ctr.COUNTER_DROPPED, os.getpid(): ctr.COUNTER_ACTIVE}
    while live.poll(check, 256):
        pass
    assert not live.is_dropped
    assert check.errors == [] and check.next == writer.seq


class RunAheadClock(SystemClock):
    """The host's clocks plus a lead a test moves forward: the subscribers' heartbeats are on the
    real clock, and time passes for the writer without the test sleeping."""

    def __init__(self) -> None:
        self.lead_ns = 0

    def nanos(self) -> int:
        return super().nanos() + self.lead_ns

    def advance(self, seconds: float) -> None:
        self.lead_ns += int(seconds * 1e9)


def held_by_a_tethered_subscriber(tmp_path):
    """A writer back pressured by a tethered subscriber with a 60 s hold that does not read, and
    the clock the writer judges silence by."""
    log, counters = make_log(tmp_path)
    tethered = Image(log, counters, join_position=0, tethered=True, tether_hold_s=60.0, name="tethered")
    clock = RunAheadClock()
    publication = ExclusivePublication(log, counters, subscriber_liveness_timeout_s=0.5, clock=clock)
    writer = Writer(publication)
    writer.offer_until_back_pressured()
    return log, counters, tethered, clock, publication, writer


def test_silent_tethered_subscriber_holds_the_writer_for_its_hold_and_is_then_dropped(tmp_path):
    log, counters, tethered, clock, publication, writer = held_by_a_tethered_subscriber(tmp_path)
    held_at = publication.position

    # Silent for far longer than an untethered subscriber may be, and just short of its hold.
    clock.advance(59.0)
    assert writer.offer_next() == BACK_PRESSURED
    assert counter_value(counters, ctr.SUBSCRIBERS_DROPPED_TYPE_ID, log) == 0
    assert not tethered.is_dropped and publication.position == held_at

    clock.advance(2.0)
    assert publication.offer(message(writer.seq)) == NOT_CONNECTED  # no reader left: no longer held
    assert counter_value(counters, ctr.SUBSCRIBERS_DROPPED_TYPE_ID, log) == 1
    assert tethered.is_dropped


def test_a_subscriber_on_an_injected_clock_is_live_from_its_first_heartbeat(tmp_path):
    """Its counter's first heartbeat is on its clock, not the system's: a clock far ahead of the
    system's (a test's, a simulation's) once made a new subscriber look silent for the difference
    and dropped it before it read anything."""
    log, counters = make_log(tmp_path)
    clock = ManualClock(nanos=time.monotonic_ns() + 10_000 * 1_000_000_000)
    image = Image(log, counters, name="ahead", clock=clock)
    publication = ExclusivePublication(log, counters, subscriber_liveness_timeout_s=0.5, clock=clock)
    assert publication.offer(message(1)) > 0
    assert counter_value(counters, ctr.SUBSCRIBERS_DROPPED_TYPE_ID, log) == 0
    assert not image.is_dropped and image.poll(lambda *fragment: None, 10) == 1


def test_tethered_subscriber_that_reads_within_its_hold_lets_the_writer_on_with_nothing_lost(tmp_path):
    log, counters, tethered, clock, publication, writer = held_by_a_tethered_subscriber(tmp_path)
    clock.advance(30.0)
    assert writer.offer_next() == BACK_PRESSURED

    check = Checker()
    while tethered.poll(check, 256):
        pass
    assert check.errors == [] and check.next == writer.seq
    assert writer.offer_next() > 0
    assert counter_value(counters, ctr.SUBSCRIBERS_DROPPED_TYPE_ID, log) == 0


def test_dropped_image_that_is_still_alive_closes_on_its_next_poll_and_leaves_the_subscription(tmp_path):
    log, counters = make_log(tmp_path)
    active = Image(log, counters, join_position=0, name="active")
    active_counter_ids = counters.find(ctr.SUBSCRIBER_POSITION_TYPE_ID, log.correlation_id)
    idle_image = Image(log, counters, join_position=0, name="idle")
    subscription = Subscription([active, idle_image])
    publication = ExclusivePublication(log, counters, subscriber_liveness_timeout_s=0.5)
    writer = Writer(publication)
    check = Checker()
    idle = BackoffIdleStrategy()
    deadline = Deadline("the idle image to be dropped")

    # Only `active` is polled, directly: `idle_image` stops giving signs of life.
    while counter_value(counters, ctr.SUBSCRIBERS_DROPPED_TYPE_ID, log) == 0 or publication.position < TERM:
        result = writer.offer_next()
        idle.idle((result > 0) + active.poll(check, 64))
        deadline.check()

    assert idle_image.is_dropped and not idle_image.is_closed  # it has not looked yet
    subscription.poll(check, 1 << 20)
    assert idle_image.is_closed
    subscription.poll(check, 1 << 20)
    assert subscription.images == (active,)
    assert idle_image.poll(check, 10) == 0
    assert counters.find(ctr.SUBSCRIBER_POSITION_TYPE_ID, log.correlation_id) == active_counter_ids
    assert check.errors == [] and check.next == writer.seq


# -- dead writers --------------------------------------------------------------------------------

def writer_killed_mid_message(spawn, log, counters, reader: Image, count: int) -> None:
    """A writer commits `count` messages to log, claims one more and dies by SIGKILL; `reader`
    heartbeats meanwhile (it reads nothing yet), so the writer keeps it."""
    dead_writer = spawn(_write_then_die_mid_message, log.path, counters.path, count)
    deadline = Deadline("the writer to die")
    while dead_writer.process.is_alive():
        reader.controlled_poll(lambda *fragment: ABORT, 1)
        time.sleep(0.005)
        deadline.check()
    dead_writer.process.join(TIMEOUT_S)
    assert dead_writer.process.exitcode == -signal.SIGKILL


def test_frame_of_a_writer_killed_mid_message_is_padded_and_a_new_writer_carries_on(tmp_path, spawn):
    log, counters = make_log(tmp_path)
    reader = Image(log, counters, join_position=0, name="reader", unblock_timeout_s=0.3)
    count = 20
    writer_killed_mid_message(spawn, log, counters, reader, count)
    claimed_at = sum(frame_size(seq) for seq in range(count))
    claimed_length = CLAIM_LENGTH + 32
    term = log.terms[0]
    assert struct.unpack_from("<i", term, claimed_at)[0] == -claimed_length  # claimed, never committed

    resumed = ExclusivePublication(LogBuffer.open(log.path), counters)
    assert resumed.position == claimed_at + align32(claimed_length)  # after the claimed frame, per the tail
    writer = Writer(resumed, first=count)
    check = Checker()
    idle = BackoffIdleStrategy()
    deadline = Deadline("the reader to get past the dead frame")
    while check.next < 2 * count:
        work = reader.poll(check, 64)
        if writer.seq < 2 * count:
            work += writer.offer_next() > 0
        idle.idle(work)
        deadline.check()

    assert check.errors == []
    assert struct.unpack_from("<iBBH", term, claimed_at) == (claimed_length, 0, 0xC0, 0)  # now a PAD frame
    assert counter_value(counters, ctr.UNBLOCKED_FRAMES_TYPE_ID, log) == 1


def test_gap_left_by_a_writer_that_died_before_writing_its_header_is_padded(tmp_path):
    log, counters = make_log(tmp_path)
    reader = Image(log, counters, join_position=0, name="reader", unblock_timeout_s=0.3)
    first = ExclusivePublication(log, counters)
    writer = Writer(first)
    for _ in range(3):
        writer.offer_next()
    gap_at = first.position
    log.set_raw_tail(0, pack_tail(0, gap_at + 256))  # the tail moved; then the writer died
    first.close(end_of_stream=False)  # and its writer lock with it

    resumed = ExclusivePublication(LogBuffer.open(log.path), counters)
    writer = Writer(resumed, first=3)
    check = Checker()
    idle = BackoffIdleStrategy()
    deadline = Deadline("the reader to get past the gap")
    while check.next < 6:
        work = reader.poll(check, 64)
        if writer.seq < 6:
            work += writer.offer_next() > 0
        idle.idle(work)
        deadline.check()

    assert check.errors == []
    assert struct.unpack_from("<iBBH", log.terms[0], gap_at) == (256, 0, 0xC0, 0)
    assert counter_value(counters, ctr.UNBLOCKED_FRAMES_TYPE_ID, log) == 1


def test_a_writer_reopening_a_log_pads_at_once_what_its_dead_predecessor_claimed(tmp_path, spawn):
    log, counters = make_log(tmp_path)
    reader = Image(log, counters, join_position=0, name="reader", unblock_timeout_s=3600)
    count = 20
    writer_killed_mid_message(spawn, log, counters, reader, count)
    claimed_at = sum(frame_size(seq) for seq in range(count))
    claimed_length = CLAIM_LENGTH + 32

    reopened = LogBuffer.open(log.path)
    lock = acquire_writer_lock(log.path)  # the predecessor is dead for sure: its lock went with it
    assert seal_dead_writer_claims(reopened) == align32(claimed_length)
    writer = Writer(ExclusivePublication(reopened, counters, writer_lock=lock), first=count)
    writer.offer_next()
    check = Checker()
    while reader.poll(check, 64):
        pass

    assert struct.unpack_from("<iBBH", log.terms[0], claimed_at) == (claimed_length, 0, 0xC0, 0)  # a PAD frame
    assert check.errors == [] and check.next == count + 1  # read past it at once, no unblock timeout
    assert counter_value(counters, ctr.UNBLOCKED_FRAMES_TYPE_ID, log) == 0


def test_a_second_writer_of_a_log_is_refused_naming_the_first(tmp_path, spawn):
    log, counters = make_log(tmp_path)
    first = spawn(_publish, log.path, counters.path, 10)
    deadline = Deadline("the first writer to take the log")
    while log.path not in writer_pids([log.path]):
        time.sleep(0.005)
        deadline.check()

    assert writer_pids([log.path]) == {log.path: first.process.pid}
    with pytest.raises(LogBufferBusy, match=f"already written by pid {first.process.pid}"):
        ExclusivePublication(LogBuffer.open(log.path), counters)
    first.process.kill()
    first.process.join(TIMEOUT_S)
    assert writer_pids([log.path]) == {}
    ExclusivePublication(LogBuffer.open(log.path), counters).close()  # the kernel dropped the dead writer's lock


def test_reopened_log_is_cleaned_of_what_its_previous_writer_left_behind(tmp_path):
    log, counters = make_log(tmp_path)
    reader = Image(log, counters, join_position=0, name="reader")
    first = Writer(ExclusivePublication(log, counters))
    for _ in range(100):  # written before the reader moves: the first writer never cleans behind it
        first.offer_next()
    check = Checker()
    while reader.poll(check, 256):
        pass
    first.publication.close(end_of_stream=False)

    writer = Writer(ExclusivePublication(LogBuffer.open(log.path), counters), first=first.seq)
    deadline = Deadline("the second writer to come round the ring")
    while writer.publication.position < 4 * TERM:
        writer.offer_next()
        reader.poll(check, 256)  # right behind the writer, where stale frames would show first
        deadline.check()
    while reader.poll(check, 256):
        pass

    assert check.errors == []
    assert check.next == writer.seq


# -- subscriptions -------------------------------------------------------------------------------

def test_subscription_reads_images_added_and_removed_while_it_polls(tmp_path, spawn):
    counters = CountersFile.open(tmp_path / "cnc.dat")
    sessions = [101, 102, 103]
    logs = [make_log(tmp_path, f"s{session}", session)[0] for session in sessions]
    count = 400
    writers = [spawn(_publish, log.path, counters.path, count) for log in logs]
    checkers = {session: Checker() for session in sessions}
    subscription = Subscription([Image(logs[0], counters, join_position=0)])
    added, removed = 1, []
    idle = BackoffIdleStrategy()
    deadline = Deadline("every stream to end")

    def on_fragment(buf, offset, length, header):
        checkers[header.session_id](buf, offset, length, header)

    while len(removed) < len(logs):
        work = subscription.poll(on_fragment, 16)
        # Each stream joins once the one before it is under way, and leaves at its end.
        if added < len(logs) and checkers[sessions[added - 1]].next >= count // 4:
            subscription.add_image(Image(logs[added], counters, join_position=0))
            added += 1
        for image in subscription.images:
            if image.is_end_of_stream:
                subscription.remove_image(image)
                removed.append(image.session_id)
        idle.idle(work)
        deadline.check()

    assert [writer.finish() for writer in writers] == [count] * len(logs)
    assert sorted(removed) == sessions
    assert subscription.images == ()
    assert {session: (c.next, c.errors) for session, c in checkers.items()} == \
        {session: (count, []) for session in sessions}
    assert all(counters.find(ctr.SUBSCRIBER_POSITION_TYPE_ID, log.correlation_id) == [] for log in logs)


def test_a_reader_that_holds_back_but_keeps_alive_is_not_dropped(tmp_path):
    """A worker whose own output is back pressured stops reading, on purpose: keep_alive() says it
    is alive, so the writer waits for it instead of dropping it as dead."""
    log, counters = make_log(tmp_path)
    clock = ManualClock(nanos=time.monotonic_ns())  # from the counters' clock, which stamped the first heartbeat
    held = Image(log, counters, join_position=0, name="held back", clock=clock)
    publication = ExclusivePublication(log, counters, subscriber_liveness_timeout_s=0.5, clock=clock)
    writer = Writer(publication)
    writer.offer_until_back_pressured()
    for _ in range(100):  # 1 s, twice the liveness timeout, without a poll
        clock.advance(0.01)
        held.keep_alive()
        assert writer.offer_next() == BACK_PRESSURED
    assert counter_value(counters, ctr.SUBSCRIBERS_DROPPED_TYPE_ID, log) == 0
    check = Checker()
    while held.poll(check, 256):
        pass
    assert not held.is_dropped and check.errors == [] and check.next == writer.seq

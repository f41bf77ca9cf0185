"""The fast paths of the cores give what the frame-by-frame paths give: protocol.data_run vouches only
for runs of plain DATA frames of one image; ImageRebuilder.insert_run and NetworkReceiver.on_datagrams
rebuild the sender's log byte for byte with exact counters; NetworkSender's run of many frames packs
datagrams as its scan does, as views of the log when asked."""

from __future__ import annotations

import random

import pytest

from ramen.clocks import ManualClock
from ramen.transport import ExclusivePublication, LogBuffer, LogBufferParams
from ramen.transport.frame import BEGIN_FLAG, END_FLAG, EOS_FLAG, HEADER_LENGTH, UNFRAGMENTED, align, write_header
from ramen.transport.udp import protocol
from ramen.transport.udp.protocol import (DataFrame, NakFrame, SetupFrame, StatusMessage, data_run, frames_of,
                                          heartbeat, pad_frame)
from ramen.transport.udp.rebuild import INSERTED, NOT_A_RUN, ImageRebuilder
from ramen.transport.udp.receiver import NetworkReceiver
from ramen.transport.udp.sender import NetworkSender

SESSION, STREAM, TERM_ID = 5, 6, 7
TERM_LENGTH = 65536
MTU = 1408
RECEIVER_ID = 3


def frames(lengths: list[int], *, term_offset: int = 4096, flags: list[int] | None = None, session: int = SESSION,
           term_ids: list[int] | None = None) -> bytearray:
    """DATA frames of these lengths back to back (each aligned), chained from term_offset."""
    out = bytearray(sum(align(length) for length in lengths))
    at = 0
    for i, length in enumerate(lengths):
        write_header(out, at, length, UNFRAGMENTED if flags is None else flags[i], protocol.HDR_TYPE_DATA,
                     term_offset + at, session, STREAM, TERM_ID if term_ids is None else term_ids[i])
        out[at + HEADER_LENGTH:at + length] = bytes([i & 0xFF]) * (length - HEADER_LENGTH)
        at += align(length)
    return out


@pytest.mark.parametrize("lengths,segment_size", [
    ([1408], None),  # one frame (a 64 KiB message's fragment at MTU 1408)
    ([64] * 22, None),  # a datagram of 32-byte messages
    ([1408] * 46 + [896], 1408),  # a GRO batch: one message's fragments, the last shorter
    ([64] * 22 * 40, 1408),  # a GRO batch of 40 datagrams of small frames: numpy over the headers
    ([100, 300, 64, 1000, 40, 64, 64, 64, 200, 96], None),  # varied lengths, struct frame by frame
    ([100, 300, 64, 1000, 40, 64, 64, 64, 200, 96] * 30, None),  # varied lengths, numpy
    ([480, 480, 448, 480, 480, 448], 1408),  # two datagrams of three frames each
])
def test_a_run_of_data_frames_of_one_image_is_vouched_for(lengths, segment_size):
    run = frames(lengths)
    assert data_run(memoryview(run), segment_size) == (lengths[0], 4096, SESSION, STREAM, TERM_ID, len(lengths))


def test_the_fragments_of_a_message_make_a_run():
    lengths = [1408] * 5 + [200]
    flags = [BEGIN_FLAG, 0, 0, 0, 0, END_FLAG]
    assert data_run(memoryview(frames(lengths, flags=flags)), 1408)[-1] == 6


def with_eos(run: bytearray, at: int) -> bytearray:
    run[at + 5] |= EOS_FLAG
    return run


@pytest.mark.parametrize("datagram,segment_size", [
    (heartbeat(TERM_ID, 4096, SESSION, STREAM).encode(), None),
    (pad_frame(TERM_ID, 4096, SESSION, STREAM, TERM_LENGTH).encode(), None),
    (frames([64] * 3) + pad_frame(TERM_ID, 4096 + 192, SESSION, STREAM, TERM_LENGTH).encode(), None),
    (SetupFrame(0, SESSION, STREAM, TERM_ID, TERM_ID, TERM_LENGTH, MTU).encode(), None),
    (with_eos(frames([64] * 22), 64 * 21), None),  # EOS on the last frame: the slow path ends the stream
    (with_eos(frames([64] * 400), 64 * 399), None),  # the same past the struct's reach
    (frames([64] * 22, session=9)[:64] + frames([64] * 21, term_offset=4096 + 64), None),  # mixed sessions
    (frames([64] * 3, term_ids=[TERM_ID, TERM_ID, TERM_ID + 1]), None),  # two terms
    (frames([64] * 2) + frames([64], term_offset=4096 + 96), None),  # a chain broken (a gap)
    (frames([100, 64])[:-24], None),  # the last frame cut at its unaligned end
    (frames([480] * 3), 1408),  # the third frame crosses from the first datagram to the second
    (frames([1408] * 3 + [200]), 1024),  # frames longer than the segments
    (frames([64] * 22)[:-20], None),  # damage: a datagram not a multiple of 32 bytes
])
def test_anything_else_is_left_to_the_frame_by_frame_path(datagram, segment_size):
    assert data_run(memoryview(bytes(datagram)), segment_size) is None


# -- the receiver -------------------------------------------------------------------------------


class Pair:
    """A publication, its sender (with the fast run and views) and a receiver, on one ManualClock."""

    def __init__(self, tmp_path, name: str, *, views: bool = True, term_length: int = TERM_LENGTH,
                 pre_touch: bool = False) -> None:
        self.clock = ManualClock()
        self.log = LogBuffer.create(tmp_path / f"{name}.logbuffer", LogBufferParams(
            term_length=term_length, mtu_length=MTU, session_id=SESSION, stream_id=STREAM, initial_term_id=TERM_ID))
        self.publication = ExclusivePublication(self.log)
        self.sender = NetworkSender(self.log, clock=self.clock, views=views, max_datagrams_per_work=64)
        directory = tmp_path / name
        directory.mkdir()
        self.receiver = NetworkReceiver(directory, receiver_id=RECEIVER_ID, clock=self.clock, pre_touch=pre_touch)
        self.receiver.add_subscription(STREAM)
        for _ in range(3):
            self.exchange(lambda datagrams: [self.receiver.on_datagram(d) for d in datagrams])
        assert self.sender.is_connected

    def offer(self, message: bytes) -> None:
        for _ in range(3):  # a message that meets the term's end pads it (ADMIN_ACTION), then goes
            if self.publication.offer(message) > 0:
                return
        raise AssertionError(f"offer of {len(message)} bytes failed at {self.publication.position}")

    def exchange(self, deliver) -> None:
        """One duty cycle each: the sender's datagrams through deliver, the receiver's answers back."""
        self.clock.advance(0.0001)
        deliver(self.sender.do_work())
        for datagram in self.receiver.do_work():
            for item in frames_of(datagram):
                if isinstance(item, StatusMessage):
                    self.sender.on_status(item)
                elif isinstance(item, NakFrame):
                    self.sender.on_nak(item)

    @property
    def image(self):
        return self.receiver.image(SESSION, STREAM)


def gro_batches(datagrams) -> list[tuple[bytes, int]]:
    """What UDP GSO then GRO make of datagrams: runs of one size (the last may be shorter) back to back."""
    batches: list[tuple[bytes, int]] = []
    run: list[bytes] = []
    for datagram in map(bytes, datagrams):
        if run and (len(datagram) > len(run[0]) or len(run[-1]) < len(run[0]) or len(run) == 64):
            batches.append((b"".join(run), len(run[0])))
            run = []
        run.append(datagram)
    if run:
        batches.append((b"".join(run), len(run[0])))
    return batches


@pytest.mark.parametrize("sizes", [[32] * 3500, [8192] * 40, [7, 900, 3000, 64, 64, 8000, 1400] * 20],
                         ids=["small", "fragmented", "varied"])
@pytest.mark.parametrize("batched", [False, True], ids=["on_datagram", "on_datagrams"])
def test_the_image_is_the_publications_log_byte_for_byte(tmp_path, sizes, batched):
    pair = Pair(tmp_path, "p", pre_touch=batched)  # a pre-touched image log is the same log
    rng = random.Random(1)
    written = 0
    deliver = (lambda datagrams: [pair.receiver.on_datagrams(b, size) for b, size in gro_batches(datagrams)]) \
        if batched else (lambda datagrams: [pair.receiver.on_datagram(d) for d in datagrams])
    for _ in range(100_000):  # bounded: a stream that never completes fails, not hangs
        while written < len(sizes) and pair.publication.position + sizes[written] < pair.sender.publisher_limit:
            pair.offer(rng.randbytes(sizes[written]))
            written += 1
        pair.exchange(deliver)
        image = pair.image
        pair.receiver.consumed_to(SESSION, STREAM, image.rebuilt_position)
        if written == len(sizes) and image.rebuilt_position == pair.publication.position:
            break
    end = pair.publication.position
    assert end > 3 * TERM_LENGTH  # the terms were reused
    assert image.rebuilt_position == image.hwm_position == end
    assert image.frames_duplicate == image.frames_over_run == 0 and pair.receiver.garbage == {}
    assert image.runs_inserted > 0  # the fast path was taken (PADs and term ends go frame by frame)
    # The last term's worth of the stream as the publication wrote it (the image cleans what lies
    # further behind its reader).
    position = end - TERM_LENGTH
    while position < end:
        index, offset = (position // TERM_LENGTH) % 3, position % TERM_LENGTH
        stop = min(TERM_LENGTH, offset + end - position)
        assert bytes(image.log.terms[index][offset:stop]) == bytes(pair.log.terms[index][offset:stop]), position
        position += stop - offset


def test_duplicated_and_reordered_batches_are_counted_frame_by_frame(tmp_path):
    pair = Pair(tmp_path, "p")
    for _ in range(200):
        pair.offer(bytes(32))  # 200 frames of 64 bytes
    datagrams = [bytes(d) for d in pair.sender.do_work()]
    assert len(datagrams) == 10  # 9 of 22 frames, one of 2
    receiver = pair.receiver
    receiver.on_datagrams(b"".join(datagrams[2:5]), 1408)  # past a gap, fresh space: one block
    image = pair.image
    assert (image.rebuilt_position, image.hwm_position) == (0, 5 * 1408)
    assert image.runs_inserted == 1
    receiver.on_datagrams(b"".join(datagrams[0:4]), 1408)  # fills the gap, then two duplicates
    assert image.frames_duplicate == 2 * 22
    receiver.on_datagrams(b"".join(datagrams[0:10]), 1408)  # 5 datagrams again, then 5 new
    assert image.frames_duplicate == 2 * 22 + 5 * 22
    assert image.rebuilt_position == image.hwm_position == 200 * 64
    assert image.runs_inserted == 1 + 5  # then datagram by datagram: the batch was not all fresh
    assert image.frames_over_run == 0 and receiver.garbage == {}


def test_a_run_past_the_window_is_refused_whole_and_counted_as_over_runs(tmp_path):
    pair = Pair(tmp_path, "p")
    window = pair.image.rebuilder.window_length
    log = pair.log
    run = frames([1408] * 3, term_offset=window - 1408)  # its first frame fits, the rest do not
    run_view = memoryview(bytes(run))
    rebuilder = pair.image.rebuilder
    # The run is written in the term of the join position (term id TERM_ID): the log's first.
    assert rebuilder.insert_run(run_view, TERM_ID, window - 1408, 1408) == NOT_A_RUN
    pair.receiver.on_datagrams(run_view, 1408)
    assert pair.image.frames_over_run == 2
    assert pair.image.hwm_position == window
    assert log.terms[0][0] == 0  # nothing of the publication was touched


def test_insert_run_commits_the_first_frames_length_last_and_moves_the_positions(tmp_path):
    log = LogBuffer.create(tmp_path / "image.logbuffer", LogBufferParams(
        term_length=TERM_LENGTH, mtu_length=MTU, session_id=SESSION, stream_id=STREAM, initial_term_id=TERM_ID))
    rebuilder = ImageRebuilder(log, 0)
    run = frames([64] * 10, term_offset=0)
    assert rebuilder.insert_run(memoryview(bytes(run)), TERM_ID, 0, 64) == INSERTED
    assert bytes(log.terms[0][:640]) == bytes(run)
    assert rebuilder.rebuilt_position == rebuilder.hwm_position == 640
    # Past a gap: inserted, the hwm moves, the rebuilt position waits for the gap.
    later = frames([64] * 4, term_offset=1024)
    assert rebuilder.insert_run(memoryview(bytes(later)), TERM_ID, 1024, 64) == INSERTED
    assert (rebuilder.rebuilt_position, rebuilder.hwm_position) == (640, 1280)
    # Behind the hwm (filling the gap) is the frame-by-frame path's: nothing done here.
    gap = frames([64] * 6, term_offset=640)
    assert rebuilder.insert_run(memoryview(bytes(gap)), TERM_ID, 640, 64) == NOT_A_RUN
    assert log.terms[0][640] == 0
    for item in frames_of(gap):
        rebuilder.insert(item)
    assert rebuilder.rebuilt_position == 1280
    rebuilder.close()
    log.close()


# -- the sender ---------------------------------------------------------------------------------


RANDOM_SIZES = [random.Random(2).choice([1, 30, 100, 500, 1376, 3000]) for _ in range(300)]
RUNS_OF_SIZES = [32] * 50 + [8000] * 3 + [32] * 30 + [1376] * 5 + [100] * 7 + [8000] + [500] * 40 + [1] * 100


@pytest.mark.parametrize("sizes", [RANDOM_SIZES, RUNS_OF_SIZES], ids=["random", "runs"])
@pytest.mark.parametrize("views", [False, True])
def test_the_senders_datagrams_are_whole_frames_packed_up_to_the_mtu_in_log_order(tmp_path, views, sizes):
    pair = Pair(tmp_path, "p", views=views, term_length=1024 * 1024)
    for size in sizes:
        pair.offer(bytes(size))
    datagrams = pair.sender.do_work()
    assert len(datagrams) == 64 or pair.sender.sender_position == pair.publication.position
    assert all(isinstance(d, memoryview if views else bytes) for d in datagrams)
    at = 0
    for datagram in datagrams:
        items = frames_of(datagram)
        assert all(isinstance(f, DataFrame) and not f.is_pad for f in items)
        assert items[0].term_offset == at
        at += len(datagram)
        # Greedy: the frame after the datagram would not have fitted it.
        following_length = protocol.DATA_HEADER.unpack_from(pair.log.terms[0], at)[0]
        assert following_length == 0 or len(datagram) + align(following_length) > MTU
    assert bytes(pair.log.terms[0][:at]) == b"".join(map(bytes, datagrams))
    assert pair.sender.sender_position == at
    datagrams = None  # views of the log: released before it is closed


def test_a_batch_ending_in_an_eos_heartbeat_takes_each_datagram_by_its_kind(tmp_path):
    pair = Pair(tmp_path, "p")
    for _ in range(44):
        pair.offer(bytes(32))  # two datagrams of 22 frames of 64 bytes
    datagrams = [bytes(d) for d in pair.sender.do_work()]
    assert [len(d) for d in datagrams] == [1408, 1408]
    end = 44 * 64
    eos = heartbeat(TERM_ID + end // TERM_LENGTH, end % TERM_LENGTH, SESSION, STREAM, eos=True).encode()
    pair.receiver.on_datagrams(b"".join(datagrams) + eos, 1408)
    image = pair.image
    assert (image.rebuilt_position, image.hwm_position, image.end_of_stream_position) == (end, end, end)
    assert image.runs_inserted == 2  # each DATA datagram a block, the heartbeat decoded
    assert image.frames_duplicate == image.frames_over_run == 0 and pair.receiver.garbage == {}
    assert bytes(image.log.terms[0][:end]) == bytes(pair.log.terms[0][:end])


def test_a_receiver_window_below_a_frame_is_refused_at_once(tmp_path):
    with pytest.raises(ValueError, match="receiver window 0"):
        NetworkReceiver(tmp_path, receiver_id=RECEIVER_ID, receiver_window=0)


def test_a_larger_receiver_window_is_granted_up_to_half_a_term(tmp_path):
    receiver = NetworkReceiver(tmp_path, receiver_id=RECEIVER_ID, receiver_window=1024 * 1024)
    receiver.add_subscription(STREAM)
    receiver.on_datagram(SetupFrame(0, SESSION, STREAM, TERM_ID, TERM_ID, TERM_LENGTH, MTU).encode())
    [sm] = [item for datagram in receiver.do_work() for item in frames_of(datagram)]
    assert sm.receiver_window == TERM_LENGTH // 2
    receiver.close()

"""The one frame walker: the numpy scan and the walk one frame at a time give the same frames, and
the walk stops where it must (nothing committed, another lap's term id, a frame cut by the end)."""

import pytest

from ramen import message
from ramen.transport import ExclusivePublication, LogBuffer, LogBufferParams, frame
from ramen.transport.frame_walk import headers_fit, last_event_time_us, resume_position, walk
from ramen.transport.scan import scan_frames

TERM = 64 * 1024
WAYS = {"one-by-one": 10**9, "numpy": 0}
"""max_frames that force each way: more frames than any term holds, or none."""


def written_log(tmp_path, lengths, term_id=7):
    log = LogBuffer.create(tmp_path / "walk.logbuffer", LogBufferParams(term_length=TERM, initial_term_id=term_id))
    publication = ExclusivePublication(log)
    for i, length in enumerate(lengths):
        assert publication.offer(bytes([i % 251]) * length) > 0
    return log, publication


def as_tuples(frames):
    return list(zip(frames.starts.tolist(), frames.lengths.tolist(), frames.flags.tolist(), frames.types.tolist()))


@pytest.mark.parametrize("way", WAYS, ids=WAYS.keys())
def test_both_ways_find_every_committed_frame_of_a_term(tmp_path, way):
    lengths = [0, 1, 31, 32, 100, 1377, 3000, 5] * 6  # fragmented ones among them (MTU 1408)
    log, publication = written_log(tmp_path, lengths)
    expected = [(f.term_offset, f.length, f.flags, f.type) for f in scan_frames(log)]
    frames = walk(log.terms[0], max_frames=WAYS[way])
    assert as_tuples(frames) == expected and frames.end == publication.position
    assert headers_fit(frames.headers, term_id=7, mtu_length=log.mtu_length).all()


@pytest.mark.parametrize("way", WAYS, ids=WAYS.keys())
def test_a_stretch_from_mid_term_with_a_frame_cut_by_its_end(tmp_path, way):
    log, _ = written_log(tmp_path, [200] * 20)  # frames of 232 -> 256 bytes
    frames = walk(log.terms[0], 512, 512 + 5 * 256 + 100, max_frames=WAYS[way])
    assert frames.starts.tolist() == [512 + i * 256 for i in range(5)] and frames.end == 512 + 5 * 256


def test_a_payload_that_looks_like_a_header_sends_the_scan_to_the_walk(tmp_path):
    forged = bytearray(b"b" * 600)
    forged[32:36] = (64).to_bytes(4, "little")  # a plausible length ...
    forged[40:44] = (64 + 32 + 32).to_bytes(4, "little")  # ... and its slot's own term offset
    log, publication = written_log(tmp_path, [32])
    publication.offer(bytes(forged))
    publication.offer(b"c" * 50)
    frames = walk(log.terms[0], max_frames=0)
    assert frames.starts.tolist() == [0, 64, 64 + 640] and frames.end == publication.position


@pytest.mark.parametrize("way", WAYS, ids=WAYS.keys())
def test_the_walk_stops_at_a_frame_of_another_lap(tmp_path, way):
    log, publication = written_log(tmp_path, [100] * 10)
    stale_at = 5 * 160
    frame.PLACE.pack_into(log.terms[0], stale_at + frame.TERM_OFFSET_OFFSET, stale_at, 0, 0, 7 - 3)
    frames = walk(log.terms[0], term_id=7, max_frames=WAYS[way])
    assert len(frames) == 5 and frames.end == stale_at


@pytest.mark.parametrize("way", WAYS, ids=WAYS.keys())
def test_a_first_length_kept_aside_is_the_first_frames(tmp_path, way):
    log, _ = written_log(tmp_path, [100] * 4)
    frame.INT32.pack_into(log.terms[0], 0, 0)  # as a replay's window holds it until the commit
    frames = walk(log.terms[0], first_length=132, max_frames=WAYS[way])
    assert frames.starts.tolist() == [0, 160, 320, 480] and frames.lengths.tolist() == [132] * 4


def test_both_ways_answer_alike_from_tuples_and_from_arrays(tmp_path):
    """A walk one by one keeps its header tuples; every answer it gives from them is the scan's."""
    log, _ = written_log(tmp_path, [0, 1377, 100, 3000, 5, 1500])
    cut = int(walk(log.terms[0]).starts[-1])  # the last message's last fragment falls outside
    walked, scanned = (walk(log.terms[0], 0, cut, term_id=7, max_frames=WAYS[way]) for way in ("one-by-one", "numpy"))
    assert (walked.headers == scanned.headers).all() and (walked.starts == scanned.starts).all()
    assert walked.columns() == scanned.columns()
    assert walked.message_frames() == scanned.message_frames() == len(walked) - 1  # the first fragment of 1500 B
    assert walked.end_of(3) == scanned.end_of(3) == int(scanned.ends[3])
    for term_id, mtu, misfit in ((7, log.mtu_length, None), (8, log.mtu_length, 0), (7, 1000, 1)):
        assert walked.first_misfit(term_id=term_id, mtu_length=mtu) == misfit
        assert scanned.first_misfit(term_id=term_id, mtu_length=mtu) == misfit


def test_last_event_time_us_is_the_largest_of_the_tuples_in_the_last_two_terms(tmp_path):
    log = LogBuffer.create(tmp_path / "times.logbuffer", LogBufferParams(term_length=TERM))
    publication = ExclusivePublication(log)

    def tuples(low, high, length=2000):  # fragmented at the default MTU
        return message.encode(message.MessageHeader(message.KIND_TUPLES, min_event_time_us=low,
                                                    max_event_time_us=high), bytes(length))
    assert last_event_time_us(log) is None
    for i in range(100):  # about five terms: the oldest laps are gone
        assert publication.offer(tuples(i * 10, i * 10 + 5)) > 0 or publication.offer(tuples(i * 10, i * 10 + 5)) > 0
    publication.offer(message.encode(message.MessageHeader(message.KIND_END_OF_REPLAY)))
    assert log.active_term_count >= 3
    assert last_event_time_us(log) == 99 * 10 + 5
    # Of the messages before a position: a reader that joined there reads the others (it was taken
    # to have missed rows written after it joined, and wrote a GAP over a window it read whole).
    at = publication.position
    assert publication.offer(tuples(5000, 5005)) > 0
    assert last_event_time_us(log) == 5005 and last_event_time_us(log, before=at) == 99 * 10 + 5


def test_a_reader_resumes_at_the_first_message_reaching_a_time_while_the_log_holds_older_ones(tmp_path):
    """frame_walk.resume_position: where a restarted windowed worker joins its parent's log."""
    log = LogBuffer.create(tmp_path / "resume.logbuffer", LogBufferParams(term_length=TERM))
    publication = ExclusivePublication(log)

    def tuples(high, length=2000):
        return message.encode(message.MessageHeader(message.KIND_TUPLES, min_event_time_us=high - 5,
                                                    max_event_time_us=high), bytes(length))
    assert resume_position(log, 0) is None  # nothing held
    positions = []
    for i in range(10):
        positions.append(publication.position)
        assert publication.offer(tuples(i * 10 + 5)) > 0
    assert resume_position(log, 42) == positions[4]  # 45: the first whose rows reach 42
    assert resume_position(log, 45) == positions[4]
    assert resume_position(log, 500) == log.producer_position()  # none yet: from what comes next
    assert resume_position(log, 5) is None  # the oldest held reaches it: older rows may be gone
    for i in range(10, 100):  # about five terms: the first messages are overwritten
        assert publication.offer(tuples(i * 10 + 5)) > 0 or publication.offer(tuples(i * 10 + 5)) > 0  # (a rotation)
    assert resume_position(log, 42) is None
    walked = [high for high in range(5, 1000, 10) if resume_position(log, high) is not None]
    assert walked and walked[-1] == 995 and walked[0] > 500  # held: the last two terms

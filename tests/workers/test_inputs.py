"""A worker's input logs over real files: a log replaced at its path is read anew from its first
frame (netd rebuilding a remote parent's stream after a restart), never waited on for ever."""

from __future__ import annotations

import os

import pyarrow as pa

from ramen.message import LIVE_CHANNEL
from ramen.program.model import Function
from ramen.transport import CountersFile, ExclusivePublication, LogBuffer, LogBufferParams
from ramen.tuples import encode_tuples
from workers.inputs import Inputs, first_frame_position

SCHEMA = pa.schema([("n", pa.int64())])
TERM = 65536
PARENT = Function("p", "parent", SCHEMA)


def write_log(path, values: list[int], *, term_id: int = 0, term_offset: int = 0, counters=None) -> None:
    """A log at `path` (made aside and renamed there, as netd places an image) holding one message
    per value, its stream starting at (term_id, term_offset)."""
    aside = path.with_name(path.name + ".new")
    log = LogBuffer.create(aside, LogBufferParams(term_length=TERM, session_id=3, stream_id=3, term_id=term_id,
                                                  term_offset=term_offset))
    publication = ExclusivePublication(log)
    for value in values:
        assert publication.offer(encode_tuples(pa.record_batch({"n": [value]}), None)) > 0
    publication.close()
    log.close()
    os.replace(aside, path)


def read_all(inputs: Inputs, now_s: float) -> list[int]:
    inputs.look(now_s)
    values = []
    while True:
        read, inbox = inputs.poll()
        if not read:
            return values
        for _, message in inbox:
            values += decode(message)


def decode(message: bytes) -> list[int]:
    from ramen.tuples import decode_tuples
    return decode_tuples(message, SCHEMA).column("n").to_pylist()


def test_the_first_frame_of_a_stream_that_starts_mid_term_and_of_an_empty_log(tmp_path):
    path = tmp_path / "mid.logbuffer"
    write_log(path, [1, 2], term_id=5, term_offset=4096)
    with LogBuffer.open(path) as log:
        assert first_frame_position(log) == 5 * TERM + 4096
    write_log(path, [])  # nothing written: the tail
    with LogBuffer.open(path) as log:
        assert first_frame_position(log) == 0 == log.producer_position()


def test_a_log_replaced_at_its_path_is_read_anew_from_its_first_frame(tmp_path):
    counters = CountersFile.open(tmp_path / "counters.dat")
    path = tmp_path / "parent.logbuffer"
    write_log(path, [1, 2, 3])
    inputs = Inputs("site", "p/child", counters)
    inputs.use(path, PARENT, LIVE_CHANNEL)
    # Joined at the producer position (a live parent): what follows is read.
    assert read_all(inputs, 0.0) == []
    first = inputs.found[path].image
    write_log(path, [10, 11], term_id=2, term_offset=8192)  # netd's new image of the stream
    inputs.look_now()
    assert read_all(inputs, 1.0) == [10, 11]
    assert inputs.found[path].image is not first and first.is_closed
    counters.close()


def test_another_sites_replayer_log_is_read_from_its_first_frame_and_a_local_one_where_it_is(tmp_path, monkeypatch):
    """netd may have received a window of a lent replayer's stream before its readers came (it holds
    the rest for them): they start at its first frame. A local replayer writes nothing before them."""
    from ramen import paths
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path))
    counters = CountersFile.open(tmp_path / "counters.dat")
    received, local = paths.received_replayer_log("site", 7), paths.replayer_log("site", 8)
    for path in (received, local):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_log(path, [1, 2, 3], term_id=4, term_offset=1024)
    inputs = Inputs("site", "p/child", counters)
    inputs.use(received, PARENT, 5)
    inputs.use(local, PARENT, 5)
    assert read_all(inputs, 0.0) == [1, 2, 3]
    assert inputs.found[received].shared and inputs.found[local].shared
    # Its stream ended (these logs are closed) with no END_OF_REPLAY of channel 5: its sender went away.
    inputs.look_now()
    read_all(inputs, 1.0)
    assert [(path, channels) for path, channels, _ in inputs.lost] == [(received, {5})]
    counters.close()


def test_a_replay_input_rebuilt_anew_after_its_rows_began_is_lost_and_before_them_is_read_whole(tmp_path):
    counters = CountersFile.open(tmp_path / "counters.dat")
    began, empty = tmp_path / "began.logbuffer", tmp_path / "empty.logbuffer"
    write_log(began, [1, 2, 3], term_id=1)
    write_log(empty, [], term_id=1)
    inputs = Inputs("site", "p/child", counters)
    inputs.use(began, PARENT, 5)
    inputs.use(began, PARENT, LIVE_CHANNEL)
    inputs.use(empty, PARENT, 6)
    inputs.found[began].received = True  # joined at its first frame, as another site's replayer's log
    assert read_all(inputs, 0.0) == [1, 2, 3]
    write_log(began, [10], term_id=2)
    write_log(empty, [20, 21], term_id=2)
    inputs.look_now()
    assert sorted(read_all(inputs, 1.0)) == [10, 20, 21]
    # Replay 5 had rows from the old file, and misses what it had not received; replay 6 had none.
    assert [(path, channels) for path, channels, _ in inputs.lost] == [(began, {5})]
    counters.close()


def test_a_received_replayer_log_that_brings_nothing_new_for_the_stall_time_fails_its_replays(tmp_path, monkeypatch):
    from ramen import paths
    from workers.defaults import RECEIVED_STALL_S
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path))
    counters = CountersFile.open(tmp_path / "counters.dat")
    path = paths.received_replayer_log("site", 9)
    path.parent.mkdir(parents=True)
    log = LogBuffer.create(path, LogBufferParams(term_length=TERM, session_id=9, stream_id=9))
    publication = ExclusivePublication(log)  # netd's image, still open: no end of stream
    publication.offer(encode_tuples(pa.record_batch({"n": [1]}), None))
    inputs = Inputs("site", "p/child", counters)
    inputs.use(path, PARENT, 5)
    assert read_all(inputs, 0.0) == [1]

    def look(now_s: float) -> list:
        inputs.look_now()
        inputs.look(now_s)
        return [(p, channels) for p, channels, _ in inputs.lost]
    assert look(1.0) == [] and look(1.0 + RECEIVED_STALL_S) == []
    publication.offer(encode_tuples(pa.record_batch({"n": [2]}), None))  # more came: the stall starts again
    assert look(1.0 + RECEIVED_STALL_S + 1) == []
    assert read_all(inputs, 2.0 + RECEIVED_STALL_S) == [2]
    assert look(3.0 + RECEIVED_STALL_S) == []  # the next look sees where the reader got to
    assert look(3.0 + 2 * RECEIVED_STALL_S) == []
    assert look(3.1 + 2 * RECEIVED_STALL_S) == [(path, {5})]
    assert "brought nothing for" in inputs.lost[0][2]
    publication.close()
    log.close()
    counters.close()


def test_an_input_whose_reader_gets_no_counter_fails_its_replays_and_is_read_once_one_is_free(tmp_path, caplog):
    path = tmp_path / "counters.dat"
    CountersFile.open(path, capacity=16).close()
    counters = CountersFile.open(path)  # this process's share: 4 counters
    live, replayed = tmp_path / "live.logbuffer", tmp_path / "replayed.logbuffer"
    write_log(live, [1, 2], term_id=1)
    write_log(replayed, [3], term_id=1)
    inputs = Inputs("site", "p/child", counters)
    inputs.use(live, PARENT, LIVE_CHANNEL)
    filler = [counters.allocate(0, f"filler {i}") for i in range(3)]  # one counter left: a reader needs two
    inputs.use(replayed, PARENT, 5)

    assert read_all(inputs, 0.0) == []  # refused, not raised: the worker goes on with what it has
    assert [(p, channels) for p, channels, _ in inputs.lost] == [(replayed, {5})]
    assert "cannot be read: " in inputs.lost[0][2] and "its share" in inputs.lost[0][2]
    assert inputs.found[live].image is None
    warnings = [r.getMessage() for r in caplog.records if "cannot read" in r.getMessage()]
    assert len(warnings) == 2  # once a log, however often it is tried
    read_all(inputs, 1.0)
    assert len([r for r in caplog.records if "cannot read" in r.getMessage()]) == 2
    for counter in filler:
        counter.close()
    inputs.look_now()
    read_all(inputs, 2.0)
    assert inputs.found[live].image is not None  # the live stream is read as soon as it can be
    counters.close()

"""The replayer agent in one process, over recorded frames given to it directly: what it writes to
its log for a message taken whole (the recorded frames, re-tagged) and for one cut by a channel's
edge (the rows inside, re-encoded in messages that fit the log)."""

from __future__ import annotations

import pyarrow as pa

from ramen import message as msg
from ramen.replay.contract import ChannelRange, ReplayerAssignment
from ramen.transport import ExclusivePublication, LogBuffer, LogBufferParams
from ramen.transport.scan import scan_messages
from ramen.tuples import decode_tuples, encode_tuples
from workers.replayer import Replayer

SCHEMA = pa.schema({"ts": pa.timestamp("us"), "host": pa.string()})
ROWS = 6000
REPLAYER_ID = 77
WHOLE, CUT = 5, 6


class RecordedFrames:
    """A recording reader that holds one recorded message's frames."""

    def __init__(self, frames: memoryview) -> None:
        self.frames = frames
        self.consumed = 0
        self.done = False

    def read(self) -> list[memoryview]:
        self.done, self.consumed = True, len(self.frames)
        return [self.frames]

    def close(self) -> None:
        pass


def test_a_whole_message_is_forwarded_as_recorded_and_a_cut_one_is_sliced_to_fit_the_log(tmp_path):
    batch = pa.record_batch({"ts": pa.array(range(ROWS), pa.timestamp("us")),
                             "host": [f"host-{i:08d}" for i in range(ROWS)]}, schema=SCHEMA)
    recorded = encode_tuples(batch, "ts")
    # Recorded in a log of long terms, in frames of a smaller MTU than the replay log's.
    recording = LogBuffer.create(tmp_path / "recording.logbuffer",
                                 LogBufferParams(term_length=4 << 20, mtu_length=4096, session_id=3, stream_id=4))
    end = ExclusivePublication(recording).offer(recorded)
    replay_log = LogBuffer.create(tmp_path / "replay.logbuffer", LogBufferParams(term_length=256 * 1024))
    assert len(recorded) > replay_log.max_message_length  # too long to offer, not to forward
    spec = ReplayerAssignment(REPLAYER_ID, "p/f", str(replay_log.path), str(tmp_path),
                              (ChannelRange(WHOLE, 0, ROWS), ChannelRange(CUT, ROWS // 2, ROWS)))
    replayer = Replayer(spec, SCHEMA, "ts", [RecordedFrames(recording.terms[0][:end])],
                        ExclusivePublication(replay_log))
    for _ in range(100):
        if replayer.done:
            break
        replayer.do_work()
    assert replayer.done

    by_channel: dict[int, list[bytes]] = {WHOLE: [], CUT: []}
    ends = []
    for m in scan_messages(replay_log):
        header = msg.decode_header(m.payload)
        if header.kind == msg.KIND_END_OF_REPLAY:
            ends.append((header.channel, header.source))
        else:
            assert header.source == REPLAYER_ID
            by_channel[header.channel].append(m.payload)
    assert sorted(ends) == [(WHOLE, REPLAYER_ID), (CUT, REPLAYER_ID)]
    # Taken whole: the recorded bytes, with only the channel and source changed.
    [whole] = by_channel[WHOLE]
    expected = bytearray(recorded)
    msg.HEADER.pack_into(expected, 0, *msg.HEADER.unpack_from(recorded)[:3], WHOLE, REPLAYER_ID,
                         *msg.HEADER.unpack_from(recorded)[5:])
    assert whole == bytes(expected)
    # Cut: the rows inside the range, in messages each within the log's max message length.
    cut = by_channel[CUT]
    assert len(cut) > 1 and all(len(m) <= replay_log.max_message_length for m in cut)
    assert pa.Table.from_batches([decode_tuples(m, SCHEMA) for m in cut]).equals(
        pa.Table.from_batches([batch.slice(ROWS // 2)]))
    assert replayer.stats.channels == {WHOLE: ROWS, CUT: ROWS - ROWS // 2}


ROLLED_UP_PROGRAM = '''[program]
name = "p"

[[function]]
name = "f"
source = { kind = "generator" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
factors = ["host"]
archive = { retention = "1d" }
'''


class RecordedMessages(RecordedFrames):
    """A recording reader that holds several recorded messages' frames."""

    def __init__(self, messages: list[memoryview]) -> None:
        super().__init__(messages[0])
        self.messages = messages

    def read(self) -> list[memoryview]:
        self.done, self.consumed = True, sum(len(m) for m in self.messages)
        return self.messages


def test_a_chart_of_the_source_itself_gets_the_rollups_alone_where_the_messages_have_them(tmp_path):
    from ramen.program import loads
    from ramen.replay.contract import Summary
    from ramen.rollup import Rollup
    function = loads(ROLLED_UP_PROGRAM).function("f")
    rollup = Rollup.of(function)
    rows, chart, edge = 5, 6, 7
    batches = [pa.record_batch({"ts": pa.array(range(i * 1_000_000, (i + 1) * 1_000_000, 1000), pa.timestamp("us")),
                                "host": [f"h{j % 3}" for j in range(1000)], "bytes": pa.array(range(1000), pa.int64())},
                               schema=function.schema) for i in range(3)]
    recorded = [rollup.appended(encode_tuples(b, "ts"), b) for b in batches[:2]] + [encode_tuples(batches[2], "ts")]
    assert [msg.decode_header(m).rollup_offset > 0 for m in recorded] == [True, True, False]
    recording = LogBuffer.create(tmp_path / "recording.logbuffer",
                                 LogBufferParams(term_length=4 << 20, mtu_length=4096, session_id=3, stream_id=4))
    publication, frames, start = ExclusivePublication(recording), [], 0
    for m in recorded:  # fragmented: the rollup lies in the last fragments
        end = publication.offer(m)
        frames.append(recording.terms[0][start:end])
        start = end
    replay_log = LogBuffer.create(tmp_path / "replay.logbuffer", LogBufferParams(term_length=1 << 20))
    summary = Summary(10, ("host",), ("bytes",))
    spec = ReplayerAssignment(REPLAYER_ID, "p/f", str(replay_log.path), str(tmp_path),
                              (ChannelRange(rows, 0, 3_000_000), ChannelRange(chart, 0, 3_000_000, summary=summary),
                               ChannelRange(edge, 500_000, 3_000_000, summary=summary)))
    replayer = Replayer(spec, function.schema, "ts", [RecordedMessages(frames)], ExclusivePublication(replay_log),
                        rollup=rollup)
    while not replayer.done:
        replayer.do_work()

    by_channel: dict[int, list[bytes]] = {rows: [], chart: [], edge: []}
    for m in scan_messages(replay_log):
        header = msg.decode_header(m.payload)
        if header.kind != msg.KIND_END_OF_REPLAY:
            by_channel[header.channel].append(m.payload)
    kinds = {c: [msg.decode_header(m).kind for m in found] for c, found in by_channel.items()}
    assert kinds[rows] == [msg.KIND_TUPLES] * 3
    # The rollups alone where the messages carry them; the last one's rows, which it has no rollup of.
    assert kinds[chart] == [msg.KIND_ROLLUP, msg.KIND_ROLLUP, msg.KIND_TUPLES]
    assert by_channel[chart][:2] == [rollup.alone(m, chart, REPLAYER_ID) for m in recorded[:2]]
    assert rollup.decode(by_channel[chart][0]).equals(rollup.decode(recorded[0]))
    # A message the range cuts: its rows inside the range, not a rollup of them all.
    assert kinds[edge][0] == msg.KIND_TUPLES and decode_tuples(by_channel[edge][0], function.schema).num_rows == 500
    assert replayer.stats.channels == {rows: 3000, chart: 3000, edge: 2500}

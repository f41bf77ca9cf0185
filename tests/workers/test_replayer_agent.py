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

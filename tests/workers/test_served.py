"""A summarised replay of a source served by its replayer (ChannelRange.recipient), in one process
over recorded frames: the buckets it writes to the client, and to its riders, are those of the
range's rows, whether folded by the messages' rollups or by their rows; a message the range cuts is
folded by the rows inside; each recipient gets one END_OF_REPLAY; the log carries none of it."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from ramen import message as msg
from ramen.program import loads
from ramen.replay import summary
from ramen.replay.client import recipient_params
from ramen.replay.contract import ChannelRange, ReplayerAssignment, Rider, Summary
from ramen.rollup import Rollup
from ramen.transport import CountersFile, ExclusivePublication, FragmentAssembler, Image, LogBuffer, LogBufferParams
from ramen.transport.scan import scan_messages
from ramen.tuples import decode_tuples, encode_tuples
from workers.replayer import Replayer
from workers.served import ServedChannel, ServedError

PROGRAM = '''[program]
name = "p"

[[function]]
name = "src"
source = { kind = "generator" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
factors = ["host"]
archive = { retention = "1d" }
'''
SUMMARY = Summary(10, ("host",), ("bytes",))
REPLAYER_ID = 31
WHOLE, RIDER, CUT, LOGGED = 5, 6, 7, 8
S = 1_000_000
"""Microseconds in a second."""
ROWS_PER_S = 50
"""Enough for a rollup (per second and host) to be worth writing (ROLLUP_MAX_SHARE)."""


@pytest.fixture(scope="module")
def src():
    return loads(PROGRAM).function("src")


def batch_at(first_s: int, seconds: int) -> pa.RecordBatch:
    rows = seconds * ROWS_PER_S
    return pa.record_batch({"ts": pa.array([first_s * S + i * S // ROWS_PER_S for i in range(rows)],
                                           pa.timestamp("us")),
                            "host": [f"h{i % 3}" for i in range(rows)],
                            "bytes": pa.array([first_s * 7 + i for i in range(rows)], pa.int64())})


class Recording:
    """Recorded messages' frames, read in one go as a RecordingReader reads them."""

    def __init__(self, path, messages: list[bytes]) -> None:
        self.log = LogBuffer.create(path, LogBufferParams(term_length=1 << 20, mtu_length=4096))
        publication = ExclusivePublication(self.log)
        self.frames, start = [], 0
        for m in messages:
            end = publication.offer(m)
            self.frames.append(self.log.terms[0][start:end])
            start = end
        self.consumed, self.done = 0, False

    def read(self) -> list[memoryview]:
        self.done, self.consumed = True, sum(len(f) for f in self.frames)
        return self.frames

    def close(self) -> None:
        pass


class Recipient:
    """A replay client's log, subscribed to, and what came on it."""

    def __init__(self, tmp_path, channel: int, counters: CountersFile) -> None:
        self.path = tmp_path / f"{channel}.logbuffer"
        self.log = LogBuffer.create(self.path, recipient_params(channel))
        self.image = Image(self.log, counters, join_position=0, name=f"client {channel}")
        self.messages: list[bytes] = []
        self._assembler = FragmentAssembler(
            lambda buffer, offset, length, header: self.messages.append(bytes(buffer[offset:offset + length])))

    def poll(self) -> None:
        self.image.poll(self._assembler.on_fragment, 64)

    def headers(self) -> list[msg.MessageHeader]:
        return [msg.decode_header(m) for m in self.messages]

    def buckets(self, function, spec: Summary = SUMMARY) -> pa.Table:
        schema = summary.schema(spec, function)
        parts = [pa.Table.from_batches([decode_tuples(m, schema)]) for m in self.messages
                 if msg.decode_header(m).kind == msg.KIND_TUPLES]
        return summary.combine(spec, function, parts)

    def close(self) -> None:
        self.image.close()
        self.log.close()


def expected(function, table: pa.Table, since_us: int, until_us: int) -> pa.Table:
    times = table.column("ts").cast(pa.int64())
    inside = table.filter(pc.and_(pc.greater_equal(times, since_us), pc.less(times, until_us)))
    return summary.combine(SUMMARY, function, [summary.aggregate(SUMMARY, function, inside)])


def run(replayer: Replayer, recipients: list[Recipient]) -> None:
    for _ in range(10_000):
        if replayer.done:
            break
        replayer.do_work()
        for r in recipients:
            r.poll()
    assert replayer.done
    for r in recipients:
        r.poll()


@pytest.fixture
def counters(tmp_path):
    counters = CountersFile.open(tmp_path / "counters.dat")
    yield counters
    counters.close()


def test_served_channels_get_the_buckets_of_their_rows_by_rollups_or_rows_and_the_log_none(src, tmp_path, counters):
    rollup = Rollup.of(src)
    batches = [batch_at(0, 40), batch_at(40, 40), batch_at(80, 40), batch_at(120, 40)]
    messages = [rollup.appended(encode_tuples(b, "ts"), b) for b in batches]
    messages[2] = encode_tuples(batches[2], "ts")  # written without a rollup: its rows are folded
    assert all(msg.decode_header(m).rollup_offset for m in messages[:2] + messages[3:])
    table = pa.Table.from_batches(batches)
    recipients = {c: Recipient(tmp_path, c, counters) for c in (WHOLE, RIDER, CUT, LOGGED)}
    served = ChannelRange(WHOLE, 0, 160 * S, recipient=str(recipients[WHOLE].path),
                          also=(Rider(RIDER, str(recipients[RIDER].path)),), summary=SUMMARY)
    cut = ChannelRange(CUT, 25 * S, 135 * S, recipient=str(recipients[CUT].path), summary=SUMMARY)
    logged = ChannelRange(LOGGED, 10 * S, 100 * S)
    spec = ReplayerAssignment(REPLAYER_ID, "p/src", str(tmp_path / "replayer.logbuffer"), str(tmp_path),
                              (served, cut, logged), readers=1)
    replay_log = LogBuffer.create(spec.log, LogBufferParams(term_length=1 << 20))
    ended = []
    replayer = Replayer(spec, src.schema, "ts", [Recording(tmp_path / "recording.logbuffer", messages)],
                        ExclusivePublication(replay_log), served=[ServedChannel(c, src, REPLAYER_ID, counters)
                                                                   for c in (served, cut)],
                        on_served=lambda channel: ended.append(channel.channels))
    run(replayer, list(recipients.values()))

    whole = expected(src, table, 0, 160 * S)
    assert recipients[WHOLE].buckets(src).equals(whole) and recipients[RIDER].buckets(src).equals(whole)
    assert recipients[CUT].buckets(src).equals(expected(src, table, 25 * S, 135 * S))
    for channel in (WHOLE, RIDER, CUT):
        headers = recipients[channel].headers()
        assert {(h.channel, h.source) for h in headers} == {(channel, REPLAYER_ID)}
        assert [h.kind for h in headers].count(msg.KIND_END_OF_REPLAY) == 1
        assert headers[-1].kind == msg.KIND_END_OF_REPLAY
    # WHOLE folds the three rollups, CUT the one message inside it whole that has one (the second).
    assert replayer.stats.rollups == 4
    assert replayer.stats.channels == {c: seconds * ROWS_PER_S for c, seconds in [(WHOLE, 160), (CUT, 110), (LOGGED, 90)]}
    assert sorted(ended) == [[RIDER, WHOLE], [CUT]]  # the riders' keys go first
    # The log holds the logged channel's rows and its end, and nothing of the served ones.
    on_log = [(msg.decode_header(m.payload), m.payload) for m in scan_messages(replay_log)]
    assert {h.channel for h, _ in on_log} == {LOGGED}
    assert [h.kind for h, _ in on_log].count(msg.KIND_END_OF_REPLAY) == 1
    rows = pa.Table.from_batches([decode_tuples(p, src.schema) for h, p in on_log if h.kind == msg.KIND_TUPLES])
    times = table.column("ts").cast(pa.int64())
    assert rows.equals(table.filter(pc.and_(pc.greater_equal(times, 10 * S), pc.less(times, 100 * S))))
    assert recipients[LOGGED].messages == []


def test_a_replayer_serving_every_channel_writes_no_log_and_skips_a_client_gone(src, tmp_path, counters):
    rollup = Rollup.of(src)
    batches = [batch_at(0, 30), batch_at(30, 30)]
    messages = [rollup.appended(encode_tuples(b, "ts"), b) for b in batches]
    rider = Recipient(tmp_path, RIDER, counters)
    channel = ChannelRange(WHOLE, 0, 60 * S, recipient=str(tmp_path / "gone.logbuffer"),
                           also=(Rider(RIDER, str(rider.path)),), summary=SUMMARY)
    spec = ReplayerAssignment(REPLAYER_ID, "p/src", str(tmp_path / "never.logbuffer"), str(tmp_path), (channel,),
                              readers=0)
    ended = []
    replayer = Replayer(spec, src.schema, "ts", [Recording(tmp_path / "recording.logbuffer", messages)], None,
                        served=[ServedChannel(channel, src, REPLAYER_ID, counters)],
                        on_served=lambda served: ended.append(served.channels))
    run(replayer, [rider])
    assert rider.buckets(src).equals(expected(src, pa.Table.from_batches(batches), 0, 60 * S))
    assert [h.kind for h in rider.headers()][-1] == msg.KIND_END_OF_REPLAY
    assert ended == [[RIDER, WHOLE]] and replayer.stats.rollups == 2


def test_a_summary_the_function_cannot_make_is_refused_in_one_line(src, tmp_path, counters):
    channel = ChannelRange(WHOLE, 0, 60 * S, recipient=str(tmp_path / "r.logbuffer"), summary=Summary(10, ("rack",)))
    with pytest.raises(ServedError, match=r"^replay 5: p/src has no field 'rack' to summarise$"):
        ServedChannel(channel, src, REPLAYER_ID, counters)

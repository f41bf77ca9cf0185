"""The worker's rooms without processes or files: a replay channel's life in workers/channels.py
(inputs used and released, END_OF_REPLAYs counted, the ends written, the keys deleted riders
first) and a heavy function's retry in workers/dispatch.py, on a clock the test moves."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from ramen import keyspace
from ramen.clocks import ManualClock
from ramen.message import KIND_END_OF_REPLAY, KIND_TUPLES, LIVE_CHANNEL, decode_header
from ramen.replay import summary
from ramen.replay.contract import Summary, WorkerReplay
from ramen.spark.session import SparkUnavailable
from ramen.tuples import decode_tuples, encode_tuples
from workers.channels import Channels, ChannelState
from workers.compute import ComputeError
from workers.defaults import SPARK_REPLAY_UNREACHABLE_S, SPARK_RETRY_S
from workers.dispatch import HeavyDispatch
from workers.heavy import Gathered
from workers.inputs import Input
from workers.stats import WorkerCounters

SCHEMA = pa.schema([("n", pa.int64())])


class FakeOutput:
    publication = SimpleNamespace(max_message_length=1 << 20)

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[tuple[bytes, object]] = []
        self.closed = False

    def send(self, message: bytes, rows: int = 0, on_sent=None) -> None:
        self.sent.append((message, on_sent))

    def write_all(self) -> None:
        for _, on_sent in self.sent:
            if on_sent is not None:
                on_sent()

    def close(self) -> None:
        self.closed = True


class FakeOutputs:
    def __init__(self) -> None:
        self.opened: dict[str, FakeOutput] = {}
        self.retired: list[tuple[int, list]] = []

    def for_replay(self, recipient):
        return self.open_recipient(Path(recipient or "replay.logbuffer"))

    def open_recipient(self, path: Path) -> FakeOutput:
        return self.opened.setdefault(str(path), FakeOutput(str(path)))

    def retire(self, channel: int, outputs) -> None:
        self.retired.append((channel, list(outputs)))

    def tear_down(self, channel: int) -> None:
        pass


class FakeInputs:
    def __init__(self) -> None:
        self.users: dict[Path, set] = {}
        self.looked = False

    def use(self, path: Path, function, user, tag=None) -> None:
        self.users.setdefault(path, set()).add(user)

    def release(self, path: Path, user) -> None:
        self.users[path].discard(user)

    def look_now(self) -> None:
        self.looked = True


class FakeClient:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    def delete(self, key: str) -> None:
        self.deleted.append(key)


def part(value: dict) -> WorkerReplay:
    return WorkerReplay.from_value(value, "sites/site/workers/p/f/replays/7")


def channels() -> tuple[Channels, FakeInputs, FakeOutputs, FakeClient]:
    function = SimpleNamespace(qualified_name="p/f", window=None, schema=SCHEMA, event_time=None, factors=())
    parent = SimpleNamespace(qualified_name="p/parent", window=None, schema=SCHEMA, event_time=None, factors=())
    inputs, outputs, client = FakeInputs(), FakeOutputs(), FakeClient()
    return (Channels(client, "site", function, {"p/parent": parent}, 42, inputs, outputs, WorkerCounters("p/f")),
            inputs, outputs, client)


def test_a_target_counts_its_ends_writes_one_per_recipient_and_deletes_the_riders_keys_first():
    rooms, inputs, outputs, client = channels()
    rooms.start(7, part({"channel": 7, "since_us": 0, "until_us": 1, "inputs": ["a", "b"],
                         "parents": ["p/parent", "p/parent"], "expect_eor": 2, "recipient": "r7",
                         "also": [{"channel": 9, "recipient": "r9"}]}))
    assert inputs.users == {Path("a"): {7}, Path("b"): {7}} and inputs.looked
    assert rooms.count_end_of_replay(7, 1, shared=False) is None  # one of two
    state = rooms.count_end_of_replay(7, 2, shared=False)
    assert state is not None and state.ending and rooms.stats.channel(7).eor_received == 2
    rooms.send_end_of_replay(state)
    leader, rider = outputs.opened["r7"], outputs.opened["r9"]
    assert [decode_header(m).channel for m, _ in leader.sent + rider.sent] == [7, 9]
    assert rooms.get(7) is None and 7 in rooms.finished and inputs.users == {Path("a"): set(), Path("b"): set()}
    assert outputs.retired == [(7, [leader, rider])]  # closed once written
    assert client.deleted == []  # nothing written yet
    rider.write_all()
    leader.write_all()
    assert client.deleted == [keyspace.replay_key(9), keyspace.replay_key(7)]
    rooms.start(7, part({"channel": 7, "since_us": 0, "until_us": 1, "inputs": ["a"], "parents": ["p/parent"],
                         "expect_eor": 1}))  # a late rewrite of its key
    assert rooms.get(7) is None


TARGET_OF_7 = {"channel": 7, "since_us": 0, "until_us": 1, "inputs": ["a"], "parents": ["p/parent"],
               "expect_eor": 1, "recipient": "r7"}


def tags(output: FakeOutput) -> list[tuple[int, int]]:
    """(channel, kind) of each message sent."""
    return [(decode_header(m).channel, decode_header(m).kind) for m, _ in output.sent]


def test_a_replay_going_on_from_a_targets_output_gets_it_tagged_with_its_channel_on_the_replay_log():
    rooms, inputs, outputs, client = channels()
    rooms.start(8, part({"channel": 8, "since_us": 0, "until_us": 1, "inputs": [], "expect_eor": 0, "via": 7}))
    assert rooms.get(8) is None and inputs.users == {}  # no state, no input of its own: it waits for 7
    rooms.start(7, part(TARGET_OF_7))
    state = rooms.get(7)
    state.send(encode_tuples(pa.record_batch([pa.array([1, 2])], schema=SCHEMA), None, channel=7), 2)
    rooms.send_end_of_replay(rooms.count_end_of_replay(7, 1, shared=False))
    recipient, replay_log = outputs.opened["r7"], outputs.opened["replay.logbuffer"]
    assert tags(recipient) == [(7, KIND_TUPLES), (7, KIND_END_OF_REPLAY)]
    assert tags(replay_log) == [(8, KIND_TUPLES), (8, KIND_END_OF_REPLAY)]
    recipient.write_all()
    assert client.deleted == []  # its key goes once every end is written, the one going on from it included
    replay_log.write_all()
    assert client.deleted == [keyspace.replay_key(7)]  # 8's key is its own target's to delete
    rooms.end(8, torn_down=True)
    assert rooms.states == {} and rooms.vias == {}


def test_a_via_replay_whose_client_went_goes_on_for_the_replays_going_on_from_it():
    rooms, inputs, outputs, client = channels()
    rooms.start(8, part({"channel": 8, "since_us": 0, "until_us": 1, "inputs": [], "expect_eor": 0, "via": 7}))
    rooms.start(7, part(TARGET_OF_7))
    rooms.end(7, torn_down=True)  # its client deleted replays/7 halfway
    recipient, replay_log = outputs.opened["r7"], outputs.opened["replay.logbuffer"]
    state = rooms.get(7)
    assert recipient.closed and state.output is None and inputs.users == {Path("a"): {7}}
    state.send(encode_tuples(pa.record_batch([pa.array([1])], schema=SCHEMA), None, channel=7), 1)
    rooms.send_end_of_replay(rooms.count_end_of_replay(7, 1, shared=False))
    replay_log.write_all()
    assert tags(recipient) == [] and tags(replay_log) == [(8, KIND_TUPLES), (8, KIND_END_OF_REPLAY)]
    assert client.deleted == [] and rooms.get(7) is None and inputs.users == {Path("a"): set()}


CARRIED_7 = {k: v for k, v in TARGET_OF_7.items() if k != "recipient"} | {"carried": True}


def test_a_carried_key_read_first_starts_the_replay_for_those_going_on_from_it_alone():
    """Its client went before this worker read its key (the worker started for the replay): the
    supervisor kept the key, carried, and the worker reads the inputs for the replays going on."""
    rooms, inputs, outputs, client = channels()
    rooms.start(8, part({"channel": 8, "since_us": 0, "until_us": 1, "inputs": [], "expect_eor": 0, "via": 7}))
    rooms.start(7, part(CARRIED_7))
    state = rooms.get(7)
    assert state.output is None and inputs.users == {Path("a"): {7}} and "r7" not in outputs.opened
    state.send(encode_tuples(pa.record_batch([pa.array([1])], schema=SCHEMA), None, channel=7), 1)
    rooms.send_end_of_replay(rooms.count_end_of_replay(7, 1, shared=False))
    replay_log = outputs.opened["replay.logbuffer"]
    replay_log.write_all()
    assert tags(replay_log) == [(8, KIND_TUPLES), (8, KIND_END_OF_REPLAY)]
    assert client.deleted == [] and rooms.get(7) is None and inputs.users == {Path("a"): set()}


def test_a_carried_rewrite_of_a_running_targets_key_closes_its_recipient_and_goes_on():
    rooms, inputs, outputs, _ = channels()
    rooms.start(8, part({"channel": 8, "since_us": 0, "until_us": 1, "inputs": [], "expect_eor": 0, "via": 7}))
    rooms.start(7, part(TARGET_OF_7))
    rooms.start(7, part(CARRIED_7))
    state = rooms.get(7)
    assert outputs.opened["r7"].closed and state.output is None and state.recipient is None
    assert [c for c, _ in state.through] == [8] and inputs.users == {Path("a"): {7}}


def test_a_via_replay_whose_client_and_followers_all_went_is_dropped():
    rooms, inputs, _, _ = channels()
    rooms.start(8, part({"channel": 8, "since_us": 0, "until_us": 1, "inputs": [], "expect_eor": 0, "via": 7}))
    rooms.start(7, part(TARGET_OF_7))
    rooms.end(7, torn_down=True)
    assert rooms.get(7) is not None
    rooms.end(8, torn_down=True)
    assert rooms.get(7) is None and inputs.users == {Path("a"): set()}


def test_a_summarised_targets_recipients_get_buckets_and_the_replays_going_on_from_it_the_rows():
    rooms, _, outputs, _ = channels()
    rooms.function.event_time = "ts"
    rooms.function.schema = pa.schema([("ts", pa.timestamp("us")), ("n", pa.int64())])
    rooms.start(8, part({"channel": 8, "since_us": 0, "until_us": 1, "inputs": [], "expect_eor": 0, "via": 7}))
    rooms.start(7, part(dict(TARGET_OF_7, summary={"step_s": 60, "fields": ["n"]},
                             also=[{"channel": 9, "recipient": "r9"}])))
    state = rooms.get(7)
    batch = pa.record_batch([pa.array([0, 30_000_000, 90_000_000], pa.timestamp("us")), pa.array([1, 2, 3])],
                            schema=rooms.function.schema)
    state.summarise(batch)
    state.send(encode_tuples(batch, "ts", channel=7), 3)
    rooms.send_end_of_replay(rooms.count_end_of_replay(7, 1, shared=False))
    recipient, rider, replay_log = outputs.opened["r7"], outputs.opened["r9"], outputs.opened["replay.logbuffer"]
    assert tags(recipient) == [(7, KIND_TUPLES), (7, KIND_END_OF_REPLAY)]
    assert tags(rider) == [(9, KIND_TUPLES), (9, KIND_END_OF_REPLAY)]
    buckets = decode_tuples(recipient.sent[0][0], summary.schema(Summary(60, (), ("n",)), rooms.function))
    assert buckets.to_pydict() == {"__bucket_s": [0, 60], "__sum_n": [3.0, 3.0], "__count_n": [2, 1]}
    assert tags(replay_log) == [(8, KIND_TUPLES), (8, KIND_END_OF_REPLAY)]
    assert decode_tuples(replay_log.sent[0][0], rooms.function.schema).num_rows == 3


def test_an_end_of_a_replay_nobody_here_expects_counts_nothing():
    rooms, _, _, _ = channels()
    assert rooms.count_end_of_replay(5, 1, shared=True) is None
    assert rooms.stats.channels == {}


def test_a_replay_naming_a_parent_the_function_does_not_have_is_ignored():
    rooms, inputs, _, _ = channels()
    rooms.start(3, part({"channel": 3, "since_us": 0, "until_us": 1, "inputs": ["x"], "parents": ["p/other"],
                         "expect_eor": 1}))
    assert rooms.get(3) is None and inputs.users == {}


class FlakySpark:
    """A SparkExecutor whose first `failures` jobs find Spark gone."""

    def __init__(self, failures: int) -> None:
        self.function = SimpleNamespace(event_time=None, qualified_name="p/heavy")
        self.failures = failures
        self.calls = 0
        self.jobs = 0
        self.job_s = 0.0

    def gathered(self) -> Gathered:
        return Gathered(None, "job", writer=None)

    def check_progress(self) -> None:
        pass

    def run(self, gathered: Gathered) -> pa.Table:
        self.calls += 1
        if self.calls <= self.failures:
            raise SparkUnavailable("connection refused")
        self.jobs += 1
        return pa.table({"rows": [gathered.rows]})


def test_a_heavy_replay_keeps_its_rows_while_spark_is_gone_and_retries_when_the_clock_says_so():
    clock, spark, emitted = ManualClock(), FlakySpark(failures=2), []
    stats = WorkerCounters("p/heavy")
    dispatch = HeavyDispatch(spark, stats, lambda state, table: emitted.append((state.channel, table)),
                             keep_alive=lambda: None, clock=clock)
    state = ChannelState(7)
    found = Input(Path("log"), SCHEMA, None, "p/parent")
    dispatch.process(state, [(found, pa.record_batch({"n": [1, 2, 3]}))], [(found, b"")])
    assert spark.calls == 0 and state.gathered.rows == 3  # a replay's rows wait for its end
    state.ending = True
    assert dispatch.end(state) is False and spark.calls == 1 and state.gathered.rows == 3
    assert dispatch.retry([state]) == [] and spark.calls == 1  # not before its time
    clock.advance(SPARK_RETRY_S[0])
    assert dispatch.retry([state]) == [] and spark.calls == 2  # tried: gone again, waits longer
    clock.advance(SPARK_RETRY_S[0])
    assert dispatch.retry([state]) == [] and spark.calls == 2
    clock.advance(SPARK_RETRY_S[1] - SPARK_RETRY_S[0])
    assert dispatch.retry([state]) == [state] and spark.calls == 3
    assert [(channel, table.column("rows").to_pylist()) for channel, table in emitted] == [(7, [3])]
    assert state.gathered is None and state.retries == 0 and stats.get("spark jobs") == 1


def test_a_heavy_replay_fails_naming_spark_once_it_was_unreachable_for_the_bound_but_live_waits():
    clock, spark = ManualClock(), FlakySpark(failures=10_000)
    dispatch = HeavyDispatch(spark, WorkerCounters("p/heavy"), lambda state, table: None, keep_alive=lambda: None,
                             clock=clock)
    found = Input(Path("log"), SCHEMA, None, "p/parent")
    replay, live = ChannelState(7), ChannelState(LIVE_CHANNEL)
    for state in (replay, live):
        dispatch.process(state, [(found, pa.record_batch({"n": [1, 2, 3]}))], [(found, b"")])
    replay.ending = True
    assert dispatch.end(replay) is False
    while clock.seconds() - replay.unreachable_since <= SPARK_REPLAY_UNREACHABLE_S:
        dispatch.retry([live])
        assert dispatch.retry([replay]) == []
        clock.advance(SPARK_RETRY_S[-1])
    with pytest.raises(ComputeError, match=r"p/heavy: Spark unreachable for 12\d s during a replay \(connection "
                                           r"refused\)"):
        dispatch.retry([replay])
    assert dispatch.retry([live]) == [] and live.gathered.rows == 3  # live keeps its rows and waits


def test_a_heavy_window_keeps_each_parents_rows_apart_and_counts_late_rows():
    from workers.windows import WindowState
    minute_us = 60_000_000
    spark = FlakySpark(failures=0)
    stats = WorkerCounters("p/heavy")
    dispatch = HeavyDispatch(spark, stats, lambda state, table: None, keep_alive=lambda: None, clock=ManualClock())
    state = ChannelState(7, windows=WindowState(minute_us, 0))
    a, b = (Input(Path(name), None, "ts", f"p/{name}") for name in ("a", "b"))

    def rows(*times_us: int) -> pa.RecordBatch:
        return pa.record_batch({"ts": pa.array(times_us, pa.timestamp("us"))})
    polled = [(a, rows(1, 2)), (b, rows(3)), (a, rows(minute_us + 1)), (b, rows(5))]  # the last one late
    dispatch.process(state, polled, [(found, encode_tuples(batch, "ts")) for found, batch in polled])
    assert {parent: sum(b.num_rows for b in batches) for parent, batches in state.gathered.batches.items()} == \
        {"p/a": 2, "p/b": 1}
    assert stats.get("late") == 1 and stats.channel(7).late == 1 and spark.calls == 0


def test_an_inputs_messages_under_a_tag_are_for_the_channels_that_read_their_rows_there(tmp_path):
    from workers.inputs import Inputs
    inputs = Inputs("site", "p/f", counters=None)
    function = SimpleNamespace(qualified_name="p/parent", schema=SCHEMA, event_time=None, factors=())
    path = tmp_path / "replayer.logbuffer"
    inputs.use(path, function, 7)
    inputs.use(path, function, 9, tag=7)
    inputs.use(path, function, 8, tag=5)  # 5 itself is another worker's
    found = inputs.found[path]
    assert found.channels_of(7) == (7, 9) and found.channels_of(5) == (8,) and found.channels_of(4) == (4,)
    inputs.release(path, 9)
    assert found.channels_of(7) == (7,)

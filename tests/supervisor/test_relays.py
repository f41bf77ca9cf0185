"""supervisor/relays.py against a real log buffer (written as a target writes it) and a real built-in
confserver: a replay's result relayed to replay-results/<channel>/..., bounded, and cleaned up."""

from __future__ import annotations

import base64

import numpy as np
import pyarrow as pa
import pytest

import confserver
from ramen import keyspace, paths
from ramen.clocks import ManualClock
from ramen.replay.contract import RELAY_PART_BYTES, RESULT_MESSAGE_LENGTH, ResultEnd, ResultPart
from ramen.transport import CountersFile, ExclusivePublication, LogBuffer
from ramen.tuples import decode_tuples, encode_tuples, end_of_replay
from supervisor import defaults
from supervisor.relays import Relays, format_bytes, max_bytes_from_env
from tests.supervisor.conftest import SITE

CHANNEL = 7
SCHEMA = pa.schema([("n", pa.int64()), ("payload", pa.binary())])
TIMEOUT_S = 30.0


@pytest.fixture
def supervisor_client(fresh_confserver, ramen_dir):
    with confserver.connect(fresh_confserver.url, identity="supervisor", auth_file=fresh_confserver.auth_file) as c:
        yield c


@pytest.fixture
def anonymous(fresh_confserver):
    with confserver.connect(fresh_confserver.url) as c:
        yield c


@pytest.fixture
def counters(ramen_dir):
    paths.counters_path().parent.mkdir(parents=True, exist_ok=True)
    c = CountersFile.open(paths.counters_path())
    yield c
    c.close()


def batches(count: int, payload_bytes: int) -> list[pa.RecordBatch]:
    """`count` batches of 10 rows, each row carrying `payload_bytes` of incompressible bytes."""
    rng = np.random.default_rng(1)
    return [pa.record_batch([pa.array(range(i * 10, i * 10 + 10), pa.int64()),
                             pa.array([rng.bytes(payload_bytes) for _ in range(10)], pa.binary())], schema=SCHEMA)
            for i in range(count)]


def write_result(path: str, counters: CountersFile, result: list[pa.RecordBatch], *, end: bool = True) -> None:
    """What the target writes to its recipient: TUPLES of the channel (and one of another channel,
    which the relay must leave out), then END_OF_REPLAY."""
    publication = ExclusivePublication(LogBuffer.open(path), counters)
    messages = [encode_tuples(batch, None, channel=CHANNEL) for batch in result]
    messages.insert(1, encode_tuples(result[0], None, channel=CHANNEL + 1))
    if end:
        messages.append(end_of_replay(CHANNEL, 0))
    for message in messages:
        assert publication.offer(message) > 0
    publication.close(end_of_stream=False)


def read_parts(client, channel: int = CHANNEL) -> tuple[list[ResultPart], ResultEnd | None]:
    entries = {e.key.rpartition("/")[2]: e.value for e in client.glob(f"{keyspace.replay_results_key(channel)}/*")}
    end = ResultEnd.from_value(entries.pop("end")) if "end" in entries else None
    parts = [ResultPart.from_value(entries[str(n)]) for n in range(len(entries))]
    return parts, end


def decode(parts: list[ResultPart]) -> list[pa.RecordBatch]:
    """The contract's own reading: parts in order, concatenated, then length-prefixed messages."""
    stream = b"".join(base64.b64decode(p.data) for p in parts)
    out, offset = [], 0
    while offset < len(stream):
        (length,) = RESULT_MESSAGE_LENGTH.unpack_from(stream, offset)
        offset += RESULT_MESSAGE_LENGTH.size
        out.append(decode_tuples(stream[offset:offset + length], SCHEMA))
        offset += length
    return out


def make_relays(client, **options) -> tuple[Relays, list[tuple[int, str]]]:
    failures: list[tuple[int, str]] = []
    options.setdefault("clock", ManualClock())
    return Relays(client, SITE, fail=lambda channel, message: failures.append((channel, message)), **options), failures


def test_parts_in_order_then_the_end(supervisor_client, counters):
    relays, failures = make_relays(supervisor_client)
    path = relays.open(CHANNEL)
    assert path == str(paths.recipient_log(CHANNEL))
    result = batches(8, 10_000)  # ~800 KB: more than 3 parts of 192 KiB
    write_result(path, counters, result)

    relays.do_work(0.0)

    parts, end = read_parts(supervisor_client)
    assert end == ResultEnd(parts=len(parts), rows=80)
    assert len(parts) >= 4
    assert all(len(p.data) <= RELAY_PART_BYTES for p in parts)
    assert sum(p.rows for p in parts) == 80
    got = decode(parts)
    assert [b.equals(r) for b, r in zip(got, result)] == [True] * len(result) and len(got) == len(result)
    assert failures == []
    assert not paths.recipient_log(CHANNEL).exists()  # the relay removed its log at the end


def test_a_result_read_over_several_cycles_streams(supervisor_client, counters):
    """Parts go out as they are read, each cycle reading at most poll_bytes: the client streams."""
    relays, _ = make_relays(supervisor_client, poll_bytes=64 * 1024)
    path = relays.open(CHANNEL)
    result = batches(4, 20_000)
    write_result(path, counters, result)
    seen = []
    for _ in range(40):
        relays.do_work(0.0)
        parts, end = read_parts(supervisor_client)
        seen.append((len(parts), end is not None))
    assert any(count and not ended for count, ended in seen)  # parts before the end
    assert end == ResultEnd(parts=len(parts), rows=40)
    assert [b.equals(r) for b, r in zip(decode(parts), result)] == [True] * 4


def test_over_the_bound_fails_in_one_line_and_drops_the_parts(supervisor_client, counters):
    relays, failures = make_relays(supervisor_client, max_bytes=300 * 1024)
    path = relays.open(CHANNEL)
    write_result(path, counters, batches(8, 10_000))

    relays.do_work(0.0)

    message = (f"the result of replay {CHANNEL} is over 300 KiB, too big for the confserver: replay from a host "
               f"of site {SITE} (without --via-confserver), or a shorter range")
    assert failures == [(CHANNEL, message)]
    parts, end = read_parts(supervisor_client)
    assert parts == [] and end is not None and end.error == message
    assert not paths.recipient_log(CHANNEL).exists()
    relays.do_work(0.0)  # nothing more is written
    assert read_parts(supervisor_client)[0] == []


def test_torn_down_before_its_end_says_so_and_the_keys_go_after_the_timeout(supervisor_client, counters):
    clock = ManualClock()
    relays, failures = make_relays(supervisor_client, clock=clock)
    path = relays.open(CHANNEL)
    write_result(path, counters, batches(2, 100), end=False)
    relays.do_work(0.0)

    relays.finish(CHANNEL, created_us=clock.epoch_us(), timeout_s=TIMEOUT_S)

    parts, end = read_parts(supervisor_client)
    assert sum(p.rows for p in parts) == 20
    assert end == ResultEnd(parts=len(parts), rows=20, error=f"replay {CHANNEL} was torn down before it finished")
    assert not paths.recipient_log(CHANNEL).exists()
    clock.advance(TIMEOUT_S)
    relays.do_work(clock.seconds())
    assert read_parts(supervisor_client)[1] is not None  # its client may still read it
    clock.advance(defaults.RELAY_KEEP_GRACE_S + 1)
    relays.do_work(clock.seconds())
    assert supervisor_client.glob(f"{keyspace.replay_results_key(CHANNEL)}/*") == []
    assert failures == []


def test_the_end_read_at_teardown_is_relayed_whole(supervisor_client, counters):
    """The target deletes the request right after its END_OF_REPLAY: what the relay had not read
    yet is read at teardown, not lost."""
    relays, _ = make_relays(supervisor_client)
    path = relays.open(CHANNEL)
    result = batches(3, 1000)
    write_result(path, counters, result)
    relays.finish(CHANNEL, created_us=0, timeout_s=TIMEOUT_S)
    parts, end = read_parts(supervisor_client)
    assert end == ResultEnd(parts=len(parts), rows=30)
    assert [b.equals(r) for b, r in zip(decode(parts), result)] == [True] * 3


def test_a_client_that_deleted_the_result_before_its_end_gets_no_more_of_it(supervisor_client, anonymous,
                                                                              counters):
    """`--limit`: the client withdraws its request and deletes the result keys; what the target
    wrote meanwhile is not relayed (nobody would read it) and the log goes."""
    relays, _ = make_relays(supervisor_client)
    path = relays.open(CHANNEL)
    publication = ExclusivePublication(LogBuffer.open(path), counters)
    assert publication.offer(encode_tuples(batches(1, 100)[0], None, channel=CHANNEL)) > 0
    relays.do_work(0.0)
    assert len(read_parts(supervisor_client)[0]) == 1
    anonymous.delete_tree(keyspace.replay_results_key(CHANNEL))
    assert publication.offer(encode_tuples(batches(1, 100)[0], None, channel=CHANNEL)) > 0
    publication.close(end_of_stream=False)

    relays.finish(CHANNEL, created_us=0, timeout_s=TIMEOUT_S)

    assert supervisor_client.glob(f"{keyspace.replay_results_key(CHANNEL)}/*") == []
    assert not paths.recipient_log(CHANNEL).exists()


def test_results_nobody_requested_are_found_and_deleted_later(supervisor_client):
    clock = ManualClock()
    supervisor_client.set(keyspace.replay_result_end_key(41), ResultEnd(0, 0).to_value())
    supervisor_client.set(keyspace.replay_result_end_key(42), ResultEnd(0, 0).to_value())
    relays, _ = make_relays(supervisor_client, clock=clock)
    relays.found({42})  # 42's request is still there
    clock.advance(3600)
    relays.do_work(clock.seconds())
    assert supervisor_client.get_or_none(keyspace.replay_result_end_key(41)) is None
    assert supervisor_client.get_or_none(keyspace.replay_result_end_key(42)) is not None


def test_only_the_supervisor_writes_results_anyone_reads_and_deletes(supervisor_client, anonymous):
    key = keyspace.replay_result_part_key(CHANNEL, 0)
    supervisor_client.set(key, ResultPart(1, "").to_value())
    with pytest.raises(confserver.PermissionDenied):
        anonymous.set(keyspace.replay_result_part_key(CHANNEL, 1), ResultPart(1, "").to_value())
    assert anonymous.get(key).value == {"rows": 1, "data": ""}
    anonymous.delete_tree(keyspace.replay_results_key(CHANNEL))
    assert supervisor_client.get_or_none(key) is None


def test_the_bound_from_the_environment():
    assert max_bytes_from_env({}) == defaults.RELAY_MAX_BYTES == 16 * 1024 * 1024
    assert max_bytes_from_env({defaults.RELAY_MAX_BYTES_ENV: "4096"}) == 4096
    assert max_bytes_from_env({defaults.RELAY_MAX_BYTES_ENV: "lots"}) == defaults.RELAY_MAX_BYTES
    assert [format_bytes(n) for n in (16 << 20, 300 << 10, 1000)] == ["16 MiB", "300 KiB", "1000 bytes"]


# -- through the supervisor: a relayed request wired to the supervisor's own log --------------------

def test_the_supervisor_wires_a_relayed_replay_to_its_own_log_and_relays_it(admin, start_supervisor, counters):
    from tests.supervisor.test_replays import request_replay, worker_replay
    from tests.supervisor.conftest import value_of, wait_for
    start_supervisor()
    channel = request_replay(admin, recipient="", relay=True)
    target = wait_for(lambda: worker_replay(admin, "p/t", channel), what="the target's key")
    path = paths.recipient_log(channel)
    assert target["recipient"] == str(path) and path.exists()  # created before the wiring
    result = batches(2, 100)
    publication = ExclusivePublication(LogBuffer.open(path), counters)
    for message in [*(encode_tuples(b, None, channel=channel) for b in result), end_of_replay(channel, 0)]:
        assert publication.offer(message) > 0
    publication.close(end_of_stream=False)
    end = wait_for(lambda: value_of(admin, keyspace.replay_result_end_key(channel)), what="the end key")
    parts, _ = read_parts(admin, channel)
    assert ResultEnd.from_value(end) == ResultEnd(parts=len(parts), rows=20)
    assert [b.equals(r) for b, r in zip(decode(parts), result)] == [True, True]
    wait_for(lambda: not path.exists(), what="the relay's log removed")
    admin.delete(keyspace.replay_key(channel))  # as the target does after its END_OF_REPLAY
    wait_for(lambda: worker_replay(admin, "p/t", channel) is None, what="the teardown")
    assert value_of(admin, keyspace.replay_result_end_key(channel)) is not None  # the client's to read


def test_a_relayed_result_over_the_bound_sets_the_request_error(admin, start_supervisor, counters):
    from tests.supervisor.test_replays import request_replay, worker_replay
    from tests.supervisor.conftest import value_of, wait_for
    service = start_supervisor()
    service.replays.relays.max_bytes = 1024
    channel = request_replay(admin, recipient="", relay=True)
    wait_for(lambda: worker_replay(admin, "p/t", channel), what="the target's key")
    publication = ExclusivePublication(LogBuffer.open(paths.recipient_log(channel)), counters)
    assert publication.offer(encode_tuples(batches(1, 1000)[0], None, channel=channel)) > 0
    error = wait_for(lambda: value_of(admin, keyspace.replay_key(channel)).get("error"), what="the error")
    assert error == (f"the result of replay {channel} is over 1 KiB, too big for the confserver: replay from a "
                     f"host of site {SITE} (without --via-confserver), or a shorter range")
    publication.close(end_of_stream=False)

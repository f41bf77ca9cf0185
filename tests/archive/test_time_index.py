"""The event-time index finds where a replay of [since, until) starts and stops, exactly."""

import random

import pytest

from ramen.archive.time_index import TimeIndex, TimeIndexError, TimeIndexWriter, index_path


def build(tmp_path, messages, recording_id=7):
    writer = TimeIndexWriter(index_path(tmp_path, recording_id), recording_id)
    for position, low, high in messages:
        writer.append(position, low, high)
    writer.close()
    return TimeIndex.open(index_path(tmp_path, recording_id), recording_id)


def disordered_messages(count, seed, max_disorder_us=5_000):
    rng = random.Random(seed)
    messages, position, clock = [], 0, 1_000_000
    for _ in range(count):
        clock += rng.randrange(0, 2_000)
        low = clock - rng.randrange(0, max_disorder_us)
        high = clock + rng.randrange(0, 1_000)
        messages.append((position, low, high))
        position += 32 * rng.randrange(1, 100)
    return messages


@pytest.mark.parametrize("seed", range(5))
def test_seek_and_stop_bracket_exactly_the_messages_that_can_hold_the_range(tmp_path, seed):
    messages = disordered_messages(2000, seed)
    index = build(tmp_path, messages)
    rng = random.Random(seed + 100)
    for _ in range(200):
        since = rng.randrange(messages[0][1] - 10_000, messages[-1][2] + 10_000)
        until = since + rng.randrange(1, 200_000)
        start, stop = index.seek(since), index.stop(until)
        needed = [p for p, low, high in messages if high >= since and low < until]
        if not needed:
            continue
        assert start is not None and start <= needed[0]
        assert stop is None or stop > needed[-1]
        # The seek is tight: the message just before `start` cannot hold anything >= since.
        before = [m for m in messages if m[0] < start]
        assert all(high < since for _, _, high in before)


def test_an_ordered_stream_has_no_disorder_and_a_tight_stop(tmp_path):
    messages = [(i * 64, 1000 * i, 1000 * i + 999) for i in range(100)]
    index = build(tmp_path, messages)
    assert index.disorder_us == 0
    assert index.seek(10_500) == 10 * 64
    assert index.stop(20_000) == 20 * 64  # message 19 ends at 19,999; message 20 starts at 20,000


def test_seek_past_the_end_finds_nothing(tmp_path):
    index = build(tmp_path, [(0, 0, 10), (64, 11, 20)])
    assert index.seek(21) is None
    assert index.stop(5) == 64


def test_a_reopened_writer_appends_after_a_torn_last_entry(tmp_path):
    path = index_path(tmp_path, 3)
    writer = TimeIndexWriter(path, 3)
    writer.append(0, 0, 10)
    writer.append(64, 5, 20)
    writer.close()
    with open(path, "ab") as f:
        f.write(b"\1" * 17)  # a crash mid-append
    writer = TimeIndexWriter(path, 3)
    assert writer.entries == 2 and writer.disorder_us == 5
    writer.append(128, 21, 30)
    writer.close()
    index = TimeIndex.open(path, 3)
    assert list(index.entries["position"]) == [0, 64, 128]
    assert list(index.entries["running_max"]) == [10, 20, 30]


def test_an_index_of_another_recording_is_refused(tmp_path):
    build(tmp_path, [(0, 0, 1)], recording_id=1)
    with pytest.raises(TimeIndexError, match="belongs to recording 1, not 2"):
        TimeIndex.open(index_path(tmp_path, 1), 2)
